"""Shared numerics of the methods: entropic OT, the asymmetric loss, region aggregation.

Small pure functions over tensors (Flower's aggregate.py style), batched over any leading
dimensions and differentiable, so FedMPT, DualCoOp and FedOTP all call the same code.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

# The early-stop test needs the marginal error on the host (one device sync), so it is only
# computed every few iterations; POT checks every 10th iteration as well.
_CHECK_EVERY = 10
# Widest spread of -C/eps within one problem for which Sinkhorn iterates on scalings (exp domain):
# the shifted kernel then lies in [e^-20, 1], far inside float32's range. A multiply and a sum per
# half-step instead of a logsumexp (six ops, and more in backward) make it ~2x faster forward and
# backward; wider spreads (small epsilon) take the log domain, which cannot underflow.
_EXP_DOMAIN_MAX_SPREAD = 20.0
# Largest |-C/eps| at which partial_transport iterates on float64 scalings: the kernel exp(-C/eps) then lies in
# [e^-600, e^600] (float64 reaches e^709), leaving room for u and v; scalings that still overflow take the log domain.
_FLOAT64_MAX_EXPONENT = 600.0


def _sinkhorn_log(cost: Tensor, log_a: Tensor, log_b: Tensor, epsilon: float, max_iter: int,
                  tol: float) -> tuple[Tensor, int]:
    """Sinkhorn on log-marginals; returns (plan, iterations run). See `sinkhorn`."""
    if epsilon <= 0:
        raise ValueError(f"sinkhorn: epsilon must be > 0, got {epsilon}")
    if max_iter < 1:
        raise ValueError(f"sinkhorn: max_iter must be >= 1, got {max_iter}")
    if cost.dim() < 2:
        raise ValueError(f"sinkhorn: cost must be [..., M, N], got shape {tuple(cost.shape)}")
    m, n = cost.shape[-2:]
    if log_a.shape[-1] != m or log_b.shape[-1] != n:
        raise ValueError(f"sinkhorn: marginals {tuple(log_a.shape)}, {tuple(log_b.shape)} "
                         f"do not match cost {tuple(cost.shape)}")
    # Marginals may broadcast over the batch (e.g. one uniform b for every problem).
    batch = torch.broadcast_shapes(cost.shape[:-2], log_a.shape[:-1], log_b.shape[:-1])
    log_a = log_a.to(cost.dtype).expand(*batch, m)
    log_b = log_b.to(cost.dtype).expand(*batch, n)
    neg_c = -cost / epsilon
    if neg_c.numel():
        with torch.no_grad():
            top = neg_c.amax(dim=(-2, -1), keepdim=True)
            spread = (top - neg_c.amin(dim=(-2, -1), keepdim=True)).max()
        if float(spread) <= _EXP_DOMAIN_MAX_SPREAD:  # a nan or inf spread takes the log domain
            return _sinkhorn_scaling(neg_c - top, log_a.exp(), log_b.exp(), max_iter, tol)
    # Work with the Gibbs kernel's exponent -C/eps and scaled potentials u = f/eps, v = g/eps:
    # every update is a logsumexp, so nothing underflows however small eps is.
    u = torch.zeros_like(log_a)
    v = torch.zeros_like(log_b)
    iters = 0
    for iters in range(1, max_iter + 1):
        u = log_a - torch.logsumexp(neg_c + v.unsqueeze(-2), dim=-1)
        v = log_b - torch.logsumexp(neg_c + u.unsqueeze(-1), dim=-2)
        if iters % _CHECK_EVERY == 0 and iters < max_iter:
            # After the v-update the column marginals are exact, so the row marginals carry the error.
            with torch.no_grad():
                rows = torch.exp(neg_c + u.unsqueeze(-1) + v.unsqueeze(-2)).sum(-1)
                err = (rows - log_a.exp()).abs().sum(-1).max()
            if float(err) < tol:
                break
    plan = torch.exp(neg_c + u.unsqueeze(-1) + v.unsqueeze(-2))
    return plan, iters


def _sinkhorn_scaling(shifted_neg_c: Tensor, a: Tensor, b: Tensor, max_iter: int, tol: float) -> tuple[Tensor, int]:
    """The log domain's iterations on the scalings U = e^u, V = e^v instead (Sinkhorn-Knopp).

    `shifted_neg_c` is -C/eps less each problem's largest entry (a constant, so no gradient): U
    absorbs it at every iteration and the plan U K V is the same, with kernel entries in [e^-20, 1].
    """
    kernel = torch.exp(shifted_neg_c)
    v = torch.ones_like(b)
    iters = 0
    for iters in range(1, max_iter + 1):
        u = a / (kernel * v.unsqueeze(-2)).sum(-1)
        v = b / (kernel * u.unsqueeze(-1)).sum(-2)
        if iters % _CHECK_EVERY == 0 and iters < max_iter:
            with torch.no_grad():
                rows = u * (kernel * v.unsqueeze(-2)).sum(-1)
                err = (rows - a).abs().sum(-1).max()
            if float(err) < tol:
                break
    return u.unsqueeze(-1) * kernel * v.unsqueeze(-2), iters


def sinkhorn(cost: Tensor, a: Tensor, b: Tensor, epsilon: float = 0.1, max_iter: int = 100,
             tol: float = 1e-6) -> Tensor:
    """Entropic OT plan P = argmin <P, C> - epsilon H(P) s.t. P 1 = a, P^T 1 = b, by Sinkhorn.

    cost [..., M, N], a [..., M], b [..., N] (each summing to 1; batch dims broadcast) -> P [..., M, N].
    Iterates on scalings where the Gibbs kernel exp(-C/epsilon) is safely representable, in the log
    domain otherwise (small epsilon); both run the same iterations. Stops once the worst L1
    row-marginal error over the batch is below `tol` (tested every 10 iterations), after at most
    `max_iter` iterations. Differentiable w.r.t. cost (and a, b where they are > 0) by unrolled
    autograd, so memory grows with the iterations run.
    """
    return _sinkhorn_log(cost, torch.log(a), torch.log(b), epsilon, max_iter, tol)[0]


def partial_transport(cost: Tensor, a: Tensor, b: Tensor, epsilon: float = 0.01, max_iter: int = 100,
                      tol: float = 1e-3) -> Tensor:
    """Entropic partial OT: P = argmin <P, C> - epsilon H(P) s.t. P 1 <= a, P^T 1 = b (so sum P = sum b <= sum a).

    FedOTP's unbalanced "COT" variant (HongxiaLee/FedOTP, `entropic_COT_fast`, itself after POT's
    `entropic_partial_wasserstein`): with b a fraction (`top_percent`) of a's mass, each region may ship less than
    its mass, so only the best-matching regions carry the prompts. Iterates, on the Gibbs kernel K = exp(-C/eps),
    u = min(1, a / (K v)), v = b / (K^T u), and stops when v's mean relative change is below `tol` (checked every
    10 iterations) or after `max_iter`. cost [..., M, N], a [..., M], b [..., N] (marginals broadcast over the
    batch) -> P [..., M, N], in cost's dtype. No gradient is needed (FedOTP treats the plan as a constant), so
    callers run it under `no_grad`.

    The iterations run on the scalings u, v in float64 (two small batched matmuls per iteration, about 4x faster
    than logsumexps) wherever float64 holds the kernel: at the reference's eps = 0.01 and cosines in [-1, 1],
    -C/eps spans 200, which float32's kernel cannot hold and float64's can. The clamp u <= 1 is not invariant to
    rescaling K, so K is not shifted. Wider spans, or scalings that leave float64's range, run on log u and log v.
    """
    if epsilon <= 0 or max_iter < 1:
        raise ValueError(f"partial_transport: need epsilon > 0 and max_iter >= 1, got {epsilon}, {max_iter}")
    neg_c = -cost / epsilon
    if neg_c.numel() and float(neg_c.abs().max()) <= _FLOAT64_MAX_EXPONENT:  # a nan or inf takes the log domain
        plan = _partial_transport_scaling(neg_c.double(), a.double(), b.double(), max_iter, tol)
        if torch.isfinite(plan).all():
            return plan.to(cost.dtype)
    return partial_transport_log(neg_c, a, b, max_iter, tol)


def _partial_transport_scaling(neg_c: Tensor, a: Tensor, b: Tensor, max_iter: int, tol: float) -> Tensor:
    """`partial_transport`'s iterations on u and v themselves (see there)."""
    kernel = torch.exp(neg_c)
    kernel_t = kernel.transpose(-1, -2).contiguous()
    batch = neg_c.shape[:-2]
    v = torch.ones(*batch, neg_c.shape[-1], 1, dtype=neg_c.dtype, device=neg_c.device)
    a, b = a.unsqueeze(-1), b.unsqueeze(-1)
    u = v.new_ones(*batch, neg_c.shape[-2], 1)
    for iters in range(1, max_iter + 1):
        u = (a / (kernel @ v)).clamp(max=1.0)
        previous, v = v, b / (kernel_t @ u)
        if iters % _CHECK_EVERY == 0 and float((v / previous - 1).abs().mean()) < tol:
            break
    return u * kernel * v.transpose(-1, -2)


def partial_transport_log(neg_c: Tensor, a: Tensor, b: Tensor, max_iter: int, tol: float) -> Tensor:
    """`partial_transport`'s iterations on log u and log v: no kernel entry can underflow, however small eps."""
    log_a, log_b = torch.log(a).to(neg_c.dtype), torch.log(b).to(neg_c.dtype)
    log_v = torch.zeros_like(log_b)
    for iters in range(1, max_iter + 1):
        log_u = (log_a - torch.logsumexp(neg_c + log_v.unsqueeze(-2), dim=-1)).clamp(max=0.0)  # u <= 1
        previous, log_v = log_v, log_b - torch.logsumexp(neg_c + log_u.unsqueeze(-1), dim=-2)
        if iters % _CHECK_EVERY == 0 and float(torch.expm1(log_v - previous).abs().mean()) < tol:
            break
    return torch.exp(neg_c + log_u.unsqueeze(-1) + log_v.unsqueeze(-2))


def asymmetric_loss(logits: Tensor, targets: Tensor, gamma_neg: float = 4.0, gamma_pos: float = 1.0,
                    clip: float = 0.05, eps: float = 1e-8, reduction: str = "sum",
                    focal_grad: bool = False) -> Tensor:
    """Asymmetric loss (Ridnik et al. 2021, Alibaba-MIIL/ASL AsymmetricLoss) on multi-label logits [B, C].

    targets in {0, 1} or -1 for unknown labels, which contribute nothing. With p = sigmoid(x) and
    p_m = min(1 - p + clip, 1): L = -sum[y (1-p)^gamma_pos log p + (1-y) (1-p_m)^gamma_neg log p_m].
    The focusing weights carry no gradient unless `focal_grad` (the reference's
    disable_torch_grad_focal_loss=True). reduction: "sum" (reference), "mean" over known entries, "none".
    """
    if reduction not in ("sum", "mean", "none"):
        raise ValueError(f"asymmetric_loss: reduction must be sum, mean or none, got {reduction!r}")
    if logits.shape != targets.shape:
        raise ValueError(f"asymmetric_loss: logits {tuple(logits.shape)} vs targets {tuple(targets.shape)}")
    targets = targets.to(logits.dtype)
    known = (targets >= 0).to(logits.dtype)
    y = targets.clamp(min=0) * known  # -1 -> 0 here, and its negative term is masked below
    p = torch.sigmoid(logits)
    # Probability shifting: easy negatives (p < clip) get p_m = 1, i.e. zero loss and zero gradient.
    p_neg = (1 - p + clip).clamp(max=1) if clip > 0 else 1 - p
    loss_pos = y * torch.log(p.clamp(min=eps))
    loss_neg = (1 - y) * known * torch.log(p_neg.clamp(min=eps))
    with torch.set_grad_enabled(focal_grad and torch.is_grad_enabled()):
        # Skip a zero gamma: x**0 = 1, and its gradient would be 0 * x**-1 (nan at x = 0).
        w_pos = (1 - p) ** gamma_pos if gamma_pos != 0 else torch.ones_like(p)
        w_neg = (1 - p_neg) ** gamma_neg if gamma_neg != 0 else torch.ones_like(p)
    loss = -(loss_pos * w_pos + loss_neg * w_neg)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / known.sum().clamp(min=1)


def region_aggregate(similarity: Tensor, temperature: float, guide: Tensor | None = None) -> Tensor:
    """DualCoOp class-specific region aggregation: similarity [..., C, M] (class x region) -> [..., C].

    Returns sum_M softmax_M(guide / temperature) * similarity, with guide = similarity by default;
    DualCoOp passes the positive-prompt map as the guide of the negative one.
    """
    if temperature <= 0:
        raise ValueError(f"region_aggregate: temperature must be > 0, got {temperature}")
    guide = similarity if guide is None else guide
    weights = torch.softmax(guide / temperature, dim=-1)
    return (weights * similarity).sum(-1)


def ot_region_scores(similarity: Tensor, tau: float, epsilon: float = 0.1, max_iter: int = 100,
                     tol: float = 1e-6) -> Tensor:
    """FedMPT condition-guided OT: patch x class similarity S [..., M, C] -> psi [..., C] = sum_m P*_mc S_mc.

    Row marginal a_m = softmax_m(max_c S_mc / tau) (informative patches carry more mass), column
    marginal b = 1/C (every class gets the same chance), cost 1 - S, P* = sinkhorn(cost, a, b, ...).
    Each column of P* holds mass 1/C, so psi is a transport-weighted mean similarity per class
    scaled by 1/C, as the paper defines it; callers rescale. Leading dims batch images and conditions.
    """
    if tau <= 0:
        raise ValueError(f"ot_region_scores: tau must be > 0, got {tau}")
    num_classes = similarity.shape[-1]
    # log_softmax rather than log(softmax): a patch with vanishing mass stays finite in the log domain.
    log_a = torch.log_softmax(similarity.amax(dim=-1) / tau, dim=-1)
    log_b = torch.full((num_classes,), -math.log(num_classes), dtype=similarity.dtype, device=similarity.device)
    plan, _ = _sinkhorn_log(1 - similarity, log_a, log_b, epsilon, max_iter, tol)
    return (plan * similarity).sum(-2)
