"""The shared numerics: Sinkhorn and partial OT against POT, ASL against its formula, region aggregation,
FedMPT's OT scores."""
from __future__ import annotations

import math

import numpy as np
import ot
import pytest
import torch
import torch.nn.functional as F

from fedvlp.methods import numerics
from fedvlp.methods.numerics import asymmetric_loss, ot_region_scores, region_aggregate, sinkhorn


def _simplex(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """Random non-uniform histograms on the last axis, float64, bounded away from 0."""
    w = torch.rand(*shape, generator=gen, dtype=torch.float64) + 0.1
    return w / w.sum(-1, keepdim=True)


# ----------------------------------------------------------------------------------------------
# sinkhorn


@pytest.mark.parametrize("m,n,epsilon", [(3, 5, 0.1), (7, 4, 0.1), (10, 10, 0.05), (12, 3, 0.2), (1, 6, 0.1)])
def test_sinkhorn_matches_pot(m, n, epsilon):
    gen = torch.Generator().manual_seed(m * 100 + n)
    cost = torch.rand(m, n, generator=gen, dtype=torch.float64)
    a, b = _simplex(gen, m), _simplex(gen, n)
    plan = sinkhorn(cost, a, b, epsilon=epsilon, max_iter=5000, tol=1e-13)
    ref = ot.sinkhorn(a.numpy(), b.numpy(), cost.numpy(), reg=epsilon, numItermax=100000, stopThr=1e-15)
    assert plan.dtype == torch.float64 and plan.shape == (m, n)
    np.testing.assert_allclose(plan.numpy(), ref, atol=1e-9, rtol=0)
    np.testing.assert_allclose(plan.sum(-1).numpy(), a.numpy(), atol=1e-10)
    np.testing.assert_allclose(plan.sum(-2).numpy(), b.numpy(), atol=1e-10)


def test_sinkhorn_batched_equals_per_problem():
    gen = torch.Generator().manual_seed(0)
    cost = torch.rand(2, 3, 6, 4, generator=gen, dtype=torch.float64)
    a, b = _simplex(gen, 2, 3, 6), _simplex(gen, 2, 3, 4)
    plan = sinkhorn(cost, a, b, epsilon=0.1, max_iter=2000, tol=1e-12)
    assert plan.shape == (2, 3, 6, 4)
    for i in range(2):
        for j in range(3):
            single = sinkhorn(cost[i, j], a[i, j], b[i, j], epsilon=0.1, max_iter=2000, tol=1e-12)
            torch.testing.assert_close(plan[i, j], single, atol=1e-11, rtol=0)
    # A marginal shared by the whole batch broadcasts.
    shared = sinkhorn(cost, a, b[0, 0], epsilon=0.1, max_iter=2000, tol=1e-12)
    torch.testing.assert_close(shared[1, 2], sinkhorn(cost[1, 2], a[1, 2], b[0, 0], 0.1, 2000, 1e-12))


def test_sinkhorn_small_epsilon_stays_finite_where_the_kernel_underflows():
    gen = torch.Generator().manual_seed(1)
    cost64 = 1.5 + 0.5 * torch.rand(8, 5, generator=gen, dtype=torch.float64)  # 1 - cos, far from 0
    a64, b64 = _simplex(gen, 8), _simplex(gen, 5)
    cost, a, b = cost64.float(), a64.float(), b64.float()
    epsilon = 0.01
    # The exp-domain kernel is exp(-150..-200): all zero in float32, so u = a / (K v) is inf and P is nan.
    kernel = torch.exp(-cost / epsilon)
    assert torch.all(kernel == 0)
    u = a / (kernel @ (torch.ones(5) / 5))
    assert not torch.isfinite(u).any() and torch.isnan(u[:, None] * kernel).all()

    plan = sinkhorn(cost, a, b, epsilon=epsilon, max_iter=3000, tol=1e-6)
    assert plan.dtype == torch.float32 and torch.isfinite(plan).all()
    torch.testing.assert_close(plan.sum(-1), a, atol=1e-5, rtol=0)
    torch.testing.assert_close(plan.sum(-2), b, atol=1e-5, rtol=0)
    # POT's own log-domain solver in float64 is the reference (the float32 a and b differ in total
    # mass by rounding, which would leave a float64 solver unconverged).
    ref = ot.sinkhorn(a64.numpy(), b64.numpy(), cost64.numpy(), reg=epsilon, method="sinkhorn_log",
                      numItermax=100000, stopThr=1e-12)
    np.testing.assert_allclose(plan.double().numpy(), ref, atol=1e-5)


def test_sinkhorn_stops_early_with_a_loose_tolerance():
    gen = torch.Generator().manual_seed(2)
    cost = torch.rand(4, 9, 7, generator=gen, dtype=torch.float64)
    log_a, log_b = _simplex(gen, 4, 9).log(), _simplex(gen, 4, 7).log()
    counts = [numerics._sinkhorn_log(cost, log_a, log_b, 0.05, 500, tol=tol)[1] for tol in (1e-1, 1e-3, 1e-6, 1e-10)]
    _, never = numerics._sinkhorn_log(cost, log_a, log_b, 0.05, 500, tol=0.0)
    assert counts[0] < counts[-1] < never == 500
    assert counts == sorted(counts)
    assert all(c % 10 == 0 for c in counts)  # tested every 10 iterations only, to spare device syncs
    plan, iters = numerics._sinkhorn_log(cost, log_a, log_b, 0.05, 500, tol=1e-8)
    assert iters < 500
    # The stop rule's own criterion (worst L1 row error over the batch) holds at return.
    assert (plan.sum(-1) - log_a.exp()).abs().sum(-1).max() < 1e-8
    # The public function returns that same plan.
    torch.testing.assert_close(sinkhorn(cost, log_a.exp(), log_b.exp(), 0.05, 500, 1e-8), plan)


def test_sinkhorn_is_differentiable_wrt_cost():
    gen = torch.Generator().manual_seed(3)
    cost = torch.rand(3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    a, b = _simplex(gen, 3), _simplex(gen, 4)
    # tol=0 fixes the iteration count, so finite differences see the same unrolled function.
    assert torch.autograd.gradcheck(lambda c: sinkhorn(c, a, b, epsilon=0.2, max_iter=30, tol=0.0), (cost,))
    # Converged, d<P, C>_eps/dC = P (envelope theorem) for the regularised objective's value.
    plan = sinkhorn(cost, a, b, epsilon=0.2, max_iter=2000, tol=1e-13)
    value = (plan * cost).sum() + 0.2 * (plan * (plan.log() - 1)).sum()
    (grad,) = torch.autograd.grad(value, cost)
    torch.testing.assert_close(grad, plan.detach(), atol=1e-8, rtol=0)


def test_sinkhorn_rejects_bad_arguments():
    cost = torch.rand(3, 4)
    with pytest.raises(ValueError):
        sinkhorn(cost, torch.full((4,), 0.25), torch.full((4,), 0.25))
    with pytest.raises(ValueError):
        sinkhorn(cost, torch.full((3,), 1 / 3), torch.full((4,), 0.25), epsilon=0.0)


# ----------------------------------------------------------------------------------------------
# asymmetric_loss


def test_asl_hand_case_shift_and_focusing():
    # x = 0 -> p = .5, positive, gamma+ = 1:  -(1 - .5)^1 * ln .5           = .5 ln 2       = 0.3465736
    # x = ln 3 -> p = .75, negative, clip .05: p_m = .25 + .05 = .30;
    #   gamma- = 2:  -(1 - .30)^2 * ln .30 = .49 * 1.2039728                                  = 0.5899467
    # x = ln(1/49) -> p = .02 < clip, negative: p_m = min(1, 1.03) = 1 -> ln 1 = 0           = 0
    # x = 5, target -1 (unknown): nothing
    logits = torch.tensor([[0.0, math.log(3.0), math.log(1 / 49), 5.0]], dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([[1, 0, 0, -1]])
    loss = asymmetric_loss(logits, targets, gamma_neg=2.0, gamma_pos=1.0, clip=0.05)
    expected = 0.5 * math.log(2) + 0.49 * -math.log(0.30)
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    mean = asymmetric_loss(logits, targets, gamma_neg=2.0, gamma_pos=1.0, clip=0.05, reduction="mean")
    assert mean.item() == pytest.approx(expected / 3, abs=1e-12)  # 3 known entries
    per = asymmetric_loss(logits, targets, gamma_neg=2.0, gamma_pos=1.0, clip=0.05, reduction="none")
    torch.testing.assert_close(per.detach(), torch.tensor([[0.5 * math.log(2), -0.49 * math.log(0.3), 0, 0]],
                                                          dtype=torch.float64))
    loss.backward()
    g = logits.grad[0]
    # Focusing weights carry no gradient: d/dx[-w ln p] = -w (1 - p) = -.5 * .5 for the positive;
    # d/dx[-w ln(1 - p + clip)] = w p (1 - p) / p_m = .49 * .75 * .25 / .30 for the negative.
    assert g[0].item() == pytest.approx(-0.25, abs=1e-12)
    assert g[1].item() == pytest.approx(0.49 * 0.75 * 0.25 / 0.30, abs=1e-12)
    assert g[2].item() == 0.0 and g[3].item() == 0.0  # clipped negative, unknown label


def test_asl_hand_case_strong_focusing_without_clip():
    # x = ln 9 -> p = .9, positive, gamma+ = 2:  -(.1)^2 ln .9  = .01 * .1053605 = 0.001053605
    # x = ln .25 -> p = .2, negative, clip 0, gamma- = 4: p_m = .8, -(.2)^4 ln .8 = .0016 * .2231436 = 0.000357030
    logits = torch.tensor([[math.log(9.0), math.log(0.25)]], dtype=torch.float64)
    targets = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    loss = asymmetric_loss(logits, targets, gamma_neg=4.0, gamma_pos=2.0, clip=0.0)
    assert loss.item() == pytest.approx(0.01 * -math.log(0.9) + 0.0016 * -math.log(0.8), abs=1e-14)


def test_asl_focal_grad_flag():
    # L = -(1 - p) ln p at x = 0: with the weight's gradient, dL/dx = p(1-p) ln p - (1-p)^2 = -.25 (1 + ln 2).
    x = torch.zeros(1, 1, dtype=torch.float64, requires_grad=True)
    asymmetric_loss(x, torch.ones(1, 1), gamma_pos=1.0, focal_grad=True).backward()
    assert x.grad.item() == pytest.approx(-0.25 * (1 + math.log(2)), abs=1e-12)
    x.grad = None
    asymmetric_loss(x, torch.ones(1, 1), gamma_pos=1.0, focal_grad=False).backward()
    assert x.grad.item() == pytest.approx(-0.25, abs=1e-12)


def test_asl_without_shift_or_focusing_is_bce_with_logits():
    gen = torch.Generator().manual_seed(4)
    logits = (torch.randn(6, 5, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    targets = (torch.rand(6, 5, generator=gen) < 0.4).double()
    ours = asymmetric_loss(logits, targets, gamma_neg=0.0, gamma_pos=0.0, clip=0.0)
    ref = F.binary_cross_entropy_with_logits(logits, targets, reduction="sum")
    torch.testing.assert_close(ours, ref, atol=1e-9, rtol=1e-9)
    (g_ours,) = torch.autograd.grad(ours, logits)
    (g_ref,) = torch.autograd.grad(ref, logits)
    torch.testing.assert_close(g_ours, g_ref, atol=1e-9, rtol=1e-9)
    # Unknown labels are masked out, like BCE with a 0/1 weight.
    partial = targets.clone()
    partial[::2, 1:3] = -1
    known = (partial >= 0).double()
    ours = asymmetric_loss(logits, partial, gamma_neg=0.0, gamma_pos=0.0, clip=0.0, reduction="mean")
    ref = F.binary_cross_entropy_with_logits(logits, partial.clamp(min=0), weight=known, reduction="sum") / known.sum()
    torch.testing.assert_close(ours, ref, atol=1e-9, rtol=1e-9)


def test_asl_gradient_flows_to_logits():
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 6, generator=gen, requires_grad=True)
    targets = torch.randint(-1, 2, (4, 6), generator=gen)
    asymmetric_loss(logits, targets).backward()
    assert torch.isfinite(logits.grad).all()
    assert (logits.grad[targets == 1] < 0).all()  # raising a positive's logit lowers the loss
    assert (logits.grad[targets == -1] == 0).all()
    with pytest.raises(ValueError):
        asymmetric_loss(logits, targets, reduction="max")


# ----------------------------------------------------------------------------------------------
# region_aggregate


def test_region_aggregate_hand_case():
    # Two regions with similarity 1 and 0 at temperature 1: weights e/(e+1), 1/(e+1); score e/(e+1) = 0.7310586.
    sim = torch.tensor([[[1.0, 0.0], [0.0, 0.0]]], dtype=torch.float64)  # [B=1, C=2, M=2]
    out = region_aggregate(sim, temperature=1.0)
    assert out.shape == (1, 2)
    assert out[0, 0].item() == pytest.approx(math.e / (math.e + 1), abs=1e-12)
    assert out[0, 1].item() == 0.0
    # At temperature 0.5 the weights are e^2/(e^2+1), so the score is that.
    assert region_aggregate(sim, 0.5)[0, 0].item() == pytest.approx(math.e**2 / (math.e**2 + 1), abs=1e-12)


def test_region_aggregate_tends_to_max_and_mean():
    gen = torch.Generator().manual_seed(6)
    sim = torch.randn(3, 4, 7, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(region_aggregate(sim, 1e-4), sim.amax(-1), atol=1e-8, rtol=0)
    torch.testing.assert_close(region_aggregate(sim, 1e6), sim.mean(-1), atol=1e-5, rtol=0)


def test_region_aggregate_guide_weights_another_map():
    # DualCoOp: the negative map is pooled with the positive map's weights.
    pos = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    neg = torch.tensor([[2.0, 4.0]], dtype=torch.float64)
    w = math.e / (math.e + 1)
    assert region_aggregate(neg, 1.0, guide=pos).item() == pytest.approx(2 * w + 4 * (1 - w), abs=1e-12)


# ----------------------------------------------------------------------------------------------
# ot_region_scores


def test_ot_region_scores_inner_plan_respects_marginals(monkeypatch):
    plans = []
    inner = numerics._sinkhorn_log

    def spy(*args, **kwargs):
        plan, iters = inner(*args, **kwargs)
        plans.append(plan)
        return plan, iters

    monkeypatch.setattr(numerics, "_sinkhorn_log", spy)
    gen = torch.Generator().manual_seed(7)
    sim = torch.rand(2, 3, 10, 4, generator=gen, dtype=torch.float64) * 2 - 1  # [B, N cond, M patches, C]
    tau = 0.5
    psi = ot_region_scores(sim, tau=tau, epsilon=0.1, max_iter=2000, tol=1e-12)
    (plan,) = plans
    assert plan.shape == sim.shape and psi.shape == (2, 3, 4)
    torch.testing.assert_close(plan.sum(-1), torch.softmax(sim.amax(-1) / tau, dim=-1), atol=1e-10, rtol=0)
    torch.testing.assert_close(plan.sum(-2), torch.full((2, 3, 4), 0.25, dtype=torch.float64), atol=1e-10, rtol=0)
    torch.testing.assert_close(psi, (plan * sim).sum(-2))
    # The same plan as POT's for one (image, condition) with cost 1 - S and those marginals.
    a = torch.softmax(sim[1, 2].amax(-1) / tau, dim=-1)
    ref = ot.sinkhorn(a.numpy(), np.full(4, 0.25), (1 - sim[1, 2]).numpy(), reg=0.1, numItermax=100000, stopThr=1e-15)
    np.testing.assert_allclose(plan[1, 2].numpy(), ref, atol=1e-9)


def test_ot_region_scores_uniform_similarity_is_s_over_c():
    sim = torch.full((2, 9, 5), 0.3, dtype=torch.float64)
    psi = ot_region_scores(sim, tau=0.07)
    torch.testing.assert_close(psi, torch.full((2, 5), 0.3 / 5, dtype=torch.float64), atol=1e-12, rtol=0)


def test_ot_region_scores_batched_and_differentiable():
    gen = torch.Generator().manual_seed(8)
    sim = (torch.rand(3, 2, 6, 5, generator=gen) * 2 - 1).requires_grad_()
    psi = ot_region_scores(sim, tau=0.1, epsilon=0.1)
    assert psi.shape == (3, 2, 5) and torch.isfinite(psi).all()
    single = ot_region_scores(sim[2, 1].detach(), tau=0.1, epsilon=0.1)
    torch.testing.assert_close(psi[2, 1].detach(), single, atol=1e-5, rtol=0)
    psi[..., 0].sum().backward()
    assert torch.isfinite(sim.grad).all() and sim.grad.abs().sum() > 0
    # The gradient is right, through both the cost and the row marginal (fixed iteration count).
    small = torch.rand(4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s: ot_region_scores(s, tau=0.5, epsilon=0.2, max_iter=20, tol=0.0), (small,))


@pytest.mark.parametrize("epsilon", [0.05, 0.01])
def test_partial_transport_is_pots_entropic_partial_wasserstein(epsilon):
    """FedOTP's COT: the prompts take 80 % of the patches' mass, each patch ships at most its own."""
    from fedvlp.methods.numerics import partial_transport

    gen = torch.Generator().manual_seed(0)
    cost = 1 - (torch.rand(3, 16, 2, generator=gen, dtype=torch.float64) * 0.6 + 0.2)
    a, b = torch.full((3, 16), 1 / 16, dtype=torch.float64), torch.full((3, 2), 0.4, dtype=torch.float64)
    plan = partial_transport(cost, a, b, epsilon=epsilon, max_iter=5000, tol=1e-12)
    assert torch.allclose(plan.sum(-2), b, atol=1e-9) and (plan.sum(-1) <= a + 1e-9).all()
    for i in range(3):
        reference = ot.partial.entropic_partial_wasserstein(a[i].numpy(), b[i].numpy(), cost[i].numpy(), reg=epsilon,
                                                            m=0.8, numItermax=5000, stopThr=1e-14)
        assert np.abs(reference - plan[i].numpy()).max() < 1e-7
    # FedOTP's call: a batch of problems [B, C, M, N] sharing one pair of marginals [M], [N]
    shared = partial_transport(cost, a[0], b[0], epsilon=epsilon, max_iter=5000, tol=1e-12)
    assert torch.allclose(shared, plan, atol=1e-12)
    # float32 at a cost spread of 2 (cosines from -1 to 1): exp(-C/eps) underflows, the log-domain plan does not
    wide = (torch.rand(64, 16, 2, generator=gen) * 2).float()
    plan32 = partial_transport(wide, a[0].float(), b[0].float(), epsilon=0.01, max_iter=2000, tol=1e-7)
    assert torch.isfinite(plan32).all() and torch.allclose(plan32.sum(-2), b[0].float().expand(64, 2), atol=1e-4)
    assert plan32.dtype == torch.float32


def test_partial_transport_scalings_and_log_domain_agree():
    """The float64 scalings (fast) and the log domain run the same iterations: the same plan at FedOTP's settings
    (100 iterations, stopped early or not); a span float64 cannot hold (eps = 0.001) takes the log domain."""
    from fedvlp.methods.numerics import partial_transport, partial_transport_log

    gen = torch.Generator().manual_seed(3)
    sim = torch.rand(8, 5, 16, 2, generator=gen) * 2 - 1  # [B, C, M patches, N prompts], cosines over [-1, 1]
    a, b = torch.full((16,), 1 / 16), torch.full((2,), 0.4)
    for tol in (0.0, 1e-3):
        log_domain = partial_transport_log(-(1 - sim.double()) / 0.01, a.double(), b.double(), 100, tol)
        plan = partial_transport(1 - sim, a, b, epsilon=0.01, max_iter=100, tol=tol)
        assert plan.dtype == torch.float32
        assert (plan.double() - log_domain).abs().max() < 1e-7
    tiny_eps = partial_transport((1 - sim).double(), a.double(), b.double(), epsilon=0.001, max_iter=200, tol=1e-9)
    assert torch.isfinite(tiny_eps).all() and torch.allclose(tiny_eps.sum(-2), b.double().expand(8, 5, 2), atol=1e-9)
    assert torch.equal(tiny_eps, partial_transport_log(-(1 - sim.double()) / 0.001, a.double(), b.double(), 200, 1e-9))
