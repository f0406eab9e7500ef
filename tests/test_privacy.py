"""Client-level DP (fedvlp.platform.aggregation.privacy): clipping and the noisy average against hand computations
with a seeded generator, and the accounting against the published RDP bounds written out here: the Gaussian's closed
form without sampling, and Wang, Balle & Kasiviswanathan's bounds for cohorts drawn without replacement."""
from __future__ import annotations

import decimal
import math

import numpy as np
import pytest
import torch
from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS
from scipy.special import gammaln, logsumexp

from fedvlp.platform.aggregation import privacy


def _t(values, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


# ---------------------------------------------------------------- norms and clipping

def test_update_norm_by_hand():
    previous = {"w": _t([1.0, 0.0]), "b": _t([[-1.0]], torch.float64)}
    state = {"w": _t([1.0, 2.0]), "b": _t([[3.0]], torch.float64)}  # delta: [0, 2] and [[4]]
    assert privacy.update_norm(state, previous) == pytest.approx(math.sqrt(20.0), rel=1e-15)
    assert privacy.update_norm(previous, previous) == 0.0


def test_clip_update_scales_the_whole_update_by_hand():
    previous = {"w": _t([1.0, 1.0]), "b": _t([0.5], torch.float64)}
    state = {"w": _t([4.0, 1.0]), "b": _t([4.5], torch.float64)}  # delta [3, 0] and [4]: norm 5
    clipped = privacy.clip_update(state, previous, clip_norm=2.0)  # factor 2 / 5
    torch.testing.assert_close(clipped["w"], _t([1.0 + 1.2, 1.0]), rtol=0, atol=1e-7)
    torch.testing.assert_close(clipped["b"], _t([0.5 + 1.6], torch.float64), rtol=0, atol=1e-15)
    assert clipped["w"].dtype == torch.float32 and clipped["b"].dtype == torch.float64
    assert privacy.update_norm(clipped, previous) == pytest.approx(2.0, rel=1e-7)
    for loose in (5.0, 10.0):  # a norm at or below C is left alone
        unclipped = privacy.clip_update(state, previous, clip_norm=loose)
        assert all(torch.equal(unclipped[k], state[k]) for k in state)
    assert all(torch.equal(privacy.clip_update(previous, previous, 1.0)[k], previous[k]) for k in previous)


def test_bad_arguments_raise():
    state = {"w": _t([1.0])}
    with pytest.raises(ValueError, match="clip_norm"):
        privacy.clip_update(state, state, 0.0)
    with pytest.raises(ValueError, match="keys"):
        privacy.update_norm({"v": _t([1.0])}, state)
    with pytest.raises(ValueError, match="states"):
        privacy.private_average([], state, 1.0, 1.0, torch.Generator())
    with pytest.raises(ValueError, match="noise_multiplier"):
        privacy.private_average([state], state, 1.0, -1.0, torch.Generator())


# ---------------------------------------------------------------- the noisy average

def _clients():
    """Three clients around `previous`, inserted in unsorted key order; their update norms are 5, 0.5 and 2."""
    previous = {"z": _t([1.0, -1.0]), "a": _t([[0.0], [2.0]], torch.float64)}
    deltas = [([3.0, 0.0], [[0.0], [4.0]]), ([0.3, 0.0], [[0.4], [0.0]]), ([0.0, 2.0], [[0.0], [0.0]])]
    states = [{"z": previous["z"] + _t(z), "a": previous["a"] + _t(a, torch.float64)} for z, a in deltas]
    # clipped to C = 1 by hand: factors 1/5, 1 and 1/2
    clipped_sum = {"z": _t([0.6 + 0.3, 1.0], torch.float64), "a": _t([[0.4], [0.8]], torch.float64)}
    return states, previous, clipped_sum


def test_private_average_by_hand():
    states, previous, clipped_sum = _clients()
    sigma, clip = 0.7, 1.0
    got = privacy.private_average(states, previous, clip, sigma, torch.Generator().manual_seed(123))
    reference = torch.Generator().manual_seed(123)
    noise = {key: torch.randn(previous[key].shape, generator=reference, dtype=torch.float64) * sigma * clip
             for key in sorted(previous)}  # sorted key order: "a" first, though "z" was inserted first
    for key in previous:
        expected = previous[key].double() + (clipped_sum[key] + noise[key]) / 3
        assert got[key].dtype == previous[key].dtype
        torch.testing.assert_close(got[key], expected.to(previous[key].dtype), rtol=1e-12, atol=1e-12)


def test_private_average_without_noise_is_the_mean_of_clipped_updates():
    states, previous, clipped_sum = _clients()
    got = privacy.private_average(states, previous, 1.0, 0.0, torch.Generator().manual_seed(0))
    for key in previous:
        expected = (previous[key].double() + clipped_sum[key] / 3).to(previous[key].dtype)
        torch.testing.assert_close(got[key], expected, rtol=1e-12, atol=1e-12)


def test_noise_on_the_sum_has_std_sigma_times_clip():
    n, m, sigma, clip = 200_000, 4, 2.0, 0.5
    previous = {"w": torch.zeros(n, dtype=torch.float64)}
    got = privacy.private_average([previous] * m, previous, clip, sigma, torch.Generator().manual_seed(7))
    noise_on_sum = got["w"] * m
    # sample std of n Gaussians: relative standard error 1 / sqrt(2n) = 0.16 %; 1 % is six of them
    assert noise_on_sum.std().item() == pytest.approx(sigma * clip, rel=0.01)
    assert abs(noise_on_sum.mean().item()) < 6 * sigma * clip / math.sqrt(n)


def test_private_average_is_deterministic_in_the_generator():
    states, previous, _ = _clients()
    run = lambda s: privacy.private_average(states, previous, 1.0, 1.0, torch.Generator().manual_seed(s))
    first, again, other = run(5), run(5), run(6)
    for key in previous:
        assert torch.equal(first[key], again[key])
        assert (first[key] != other[key]).all()
    reordered = [dict(reversed(list(s.items()))) for s in states]  # insertion order does not matter
    swapped = privacy.private_average(reordered, dict(reversed(list(previous.items()))), 1.0, 1.0,
                                      torch.Generator().manual_seed(5))
    assert all(torch.equal(first[k], swapped[k]) for k in previous)


# ---------------------------------------------------------------- accounting, against the published bounds

DELTA = 1e-5
ORDERS = [a for a in DEFAULT_RDP_ORDERS if a > 1.01]  # fedvlp's accountant's, but those too near 1 to convert
# Epsilon is a minimum over orders, so the bounds for sampled cohorts are taken at the integer orders fedvlp
# evaluates too; it also evaluates fractional orders between them, so its epsilon may be a little smaller.
INTEGER_ORDERS = [int(a) for a in ORDERS if float(a).is_integer()]
# Theorem 27 needs forward differences up to order + 1; fedvlp's accountant applies it up to order 256
GAUSSIAN_ORDERS = [a for a in INTEGER_ORDERS if a <= 256]
# measured over CASES: fedvlp's epsilon lies at most 1.8e-4 (relative) below the integer-order bound
INTERPOLATION_GAP = 1e-3
# (sigma, N, m, T): little and much noise, cohorts from 1 of 50 to 100 of 100,000, 1 to 500 rounds, and cases
# where the unsampled bound is the smaller (1.0, 10, 5, 500; 4.0, 10, 5, 20)
CASES = [(0.7, 50, 1, 1), (1.0, 10, 5, 20), (1.0, 10, 5, 500), (1.5, 100_000, 100, 20), (2.0, 1000, 10, 500),
         (3.0, 100, 10, 20), (4.0, 10, 5, 20), (4.0, 1000, 10, 500), (8.0, 100, 10, 20), (8.0, 50, 1, 1)]


def _gaussian_rdp(order, sigma: float):
    """One round's RDP without sampling: noise sigma C on a sum of replace-one sensitivity 2C is the Gaussian
    mechanism of multiplier s = sigma / 2, of RDP alpha / (2 s^2) = 2 alpha / sigma^2 (Mironov, 2017)."""
    return order / (2 * (sigma / 2) ** 2)


def _to_epsilon(rdp: float, order: float, delta: float = DELTA) -> float:
    """(alpha, rdp)-RDP implies (rdp + log(1 - 1/alpha) - log(delta alpha) / (alpha - 1), delta)-DP (Canonne,
    Kamath & Steinke, 2020, Proposition 12)."""
    return rdp + math.log1p(-1 / order) - math.log(delta * order) / (order - 1)


def _unsampled_epsilon(sigma: float, rounds: int, delta: float = DELTA) -> float:
    """T rounds of the Gaussian: the RDP adds up; epsilon is the conversion's minimum over the orders."""
    return min(_to_epsilon(rounds * _gaussian_rdp(a, sigma), a, delta) for a in ORDERS)


def _log_even_differences(sigma: float, max_order: int) -> np.ndarray:
    """log Delta^(2l) g(0) for 2l <= max_order + 1: the forward differences of g(i) = exp((i - 1) eps(i)), eps the
    Gaussian's RDP, in 120-digit decimal arithmetic (they cancel far beyond float64's 16 digits)."""
    context = decimal.Context(prec=120)
    two_s2 = 2 * context.power(decimal.Decimal(sigma / 2), 2)
    row = [context.exp(context.divide((i - 1) * i, two_s2)) for i in range(max_order + 2)]
    logs = []
    for k in range(max_order + 2):
        if k % 2 == 0:
            logs.append(float(row[0].ln(context)))
        row = [context.subtract(b, a) for a, b in zip(row, row[1:])]
    return np.array(logs)


def _log_moment(order: int, sigma: float, gamma: float, log_even_differences=None) -> float:
    """log A, A = exp((alpha - 1) eps'(alpha)), of one round on a cohort drawn without replacement with ratio gamma =
    m / N, replace-one relation, at an integer order alpha >= 2, base mechanism the Gaussian (eps(j) its RDP,
    eps(inf) = inf so min{2, (e^eps(inf) - 1)^j} = 2). Wang, Balle & Kasiviswanathan (AISTATS 2019), Theorem 9:
        A <= 1 + gamma^2 C(alpha, 2) min{4 (e^eps(2) - 1), 2 e^eps(2)}
               + sum_{j=3..alpha} gamma^j C(alpha, j) 2 e^((j - 1) eps(j)).
    Given the log Delta^(2l) g(0) of `_log_even_differences`, their Theorem 27 (for mechanisms such as the Gaussian):
    the j-th term may take 4 sqrt(Delta^(2 floor(j/2)) g(0) Delta^(2 ceil(j/2)) g(0)) instead of 2 e^((j - 1) eps(j)).
    In log space, so large orders do not overflow."""
    log_comb = lambda j: gammaln(order + 1) - gammaln(j + 1) - gammaln(order - j + 1)  # noqa: E731
    eps2 = _gaussian_rdp(2, sigma)
    second = 2 * math.log(gamma) + log_comb(2) + min(math.log(4) + eps2 + math.log(-math.expm1(-eps2)),
                                                     math.log(2) + eps2)
    j = np.arange(3, order + 1)
    term = math.log(2) + (j - 1) * _gaussian_rdp(j, sigma)
    if log_even_differences is not None:
        tighter = math.log(4) + (log_even_differences[j // 2] + log_even_differences[(j + 1) // 2]) / 2
        term = np.minimum(term, tighter)
    return float(logsumexp([0.0, second, *(j * math.log(gamma) + log_comb(j) + term)]))


def _sampled_epsilon(sigma, num_clients, cohort, rounds, orders, log_even_differences=None) -> float:
    gamma = cohort / num_clients
    return min(_to_epsilon(rounds * _log_moment(a, sigma, gamma, log_even_differences) / (a - 1), a) for a in orders)


@pytest.mark.parametrize("sigma,num_clients,cohort,rounds", CASES)
def test_epsilon_is_wang_balle_kasiviswanathans_bound_for_sampling_without_replacement(sigma, num_clients, cohort,
                                                                                        rounds):
    """Theorem 9 (any mechanism) and Theorem 27 (the Gaussian) both bound a round on a sampled cohort, and so does
    the unsampled Gaussian: fedvlp's epsilon is the smallest, less the little its fractional orders gain. Theorem 27
    is the tighter only where the per-round RDP is small (sigma >= 3 here).

    No second accountant runs here: Opacus (not a dependency) accounts Poisson sampling under add/remove, another
    mechanism and relation. autodp (by the paper's first author; not a dependency) implements both theorems: checked
    once offline, its RDP agrees with `_log_moment`'s to 7e-12 at every order up to 256 of every case here."""
    got = privacy.epsilon(sigma, num_clients, cohort, rounds, DELTA)
    unsampled = _unsampled_epsilon(sigma, rounds)
    general = min(unsampled, _sampled_epsilon(sigma, num_clients, cohort, rounds, INTEGER_ORDERS))
    differences = _log_even_differences(sigma, GAUSSIAN_ORDERS[-1])
    gaussian = min(unsampled, _sampled_epsilon(sigma, num_clients, cohort, rounds, GAUSSIAN_ORDERS, differences))
    assert got <= general * (1 + 1e-12) and got <= gaussian * (1 + 1e-9)
    assert got >= gaussian * (1 - INTERPOLATION_GAP)
    if sigma <= 2:  # Theorem 27's terms do not bind: the general bound is as tight
        assert got >= general * (1 - INTERPOLATION_GAP)


def test_epsilon_without_sampling_by_hand():
    """A Gaussian of noise sigma C on a sum of sensitivity 2C has RDP alpha * (2C)^2 / (2 (sigma C)^2) =
    2 alpha / sigma^2 per round; T rounds add up; epsilon is the conversion minimised over the orders."""
    sigma, rounds, delta = 3.0, 40, 1e-6
    by_hand = _unsampled_epsilon(sigma, rounds, delta)
    got = privacy.epsilon(sigma, 25, 25, rounds, delta)
    assert got == pytest.approx(by_hand, rel=1e-12)
    rho = rounds * 2 / sigma ** 2  # the same as rho-zCDP: the classic conversion is looser
    assert got < rho + 2 * math.sqrt(rho * math.log(1 / delta))


def test_epsilon_moves_the_right_way():
    eps = lambda sigma=1.0, n=100, m=10, t=50: privacy.epsilon(sigma, n, m, t, 1e-5)
    by_sigma = [eps(sigma=s) for s in (0.8, 1.0, 1.5, 3.0)]
    by_rounds = [eps(t=t) for t in (1, 10, 100)]
    by_cohort = [eps(sigma=2.0, m=m) for m in (1, 10, 50, 100)]  # at sigma 1 the sampled bound is no better at m=50
    assert by_sigma == sorted(by_sigma, reverse=True) and len(set(by_sigma)) == 4
    assert by_rounds == sorted(by_rounds) and len(set(by_rounds)) == 3
    assert by_cohort == sorted(by_cohort) and len(set(by_cohort)) == 4
    assert privacy.epsilon(1.0, 10, 5, 0, 1e-5) == 0.0
    assert privacy.epsilon(0.0, 10, 5, 3, 1e-5) == math.inf


def test_epsilon_never_exceeds_the_unsampled_bound():
    """At tiny noise the bound for sampling without replacement is looser than the Gaussian's; sampling cannot
    hurt, so the smaller applies."""
    assert privacy.epsilon(0.01, 10, 5, 20, 1e-5) == pytest.approx(privacy.epsilon(0.01, 10, 10, 20, 1e-5))


@pytest.mark.parametrize("target,num_clients,cohort,rounds", [(2.0, 100, 10, 50), (8.0, 20, 20, 30)])
def test_noise_for_epsilon_inverts_epsilon(target, num_clients, cohort, rounds):
    delta = 1e-5
    sigma = privacy.noise_for_epsilon(target, num_clients, cohort, rounds, delta)
    reached = privacy.epsilon(sigma, num_clients, cohort, rounds, delta)
    assert reached == pytest.approx(target, rel=0.01) and reached <= target * (1 + 1e-9)
    assert privacy.epsilon(sigma * 1.01, num_clients, cohort, rounds, delta) < target
    assert privacy.epsilon(sigma * 0.99, num_clients, cohort, rounds, delta) > target


@pytest.mark.parametrize("kwargs,name", [
    (dict(target_epsilon=0.0), "target_epsilon"), (dict(target_epsilon=-1.0), "target_epsilon"),
    (dict(target_epsilon=math.inf), "target_epsilon"), (dict(target_epsilon=1e12), "target_epsilon"),
    (dict(delta=0.0), "delta"), (dict(delta=1.0), "delta"), (dict(cohort_size=11), "cohort_size"),
    (dict(rounds=0), "rounds"),
])
def test_noise_for_epsilon_rejects_impossible_targets(kwargs, name):
    arguments = dict(target_epsilon=1.0, num_clients=10, cohort_size=5, rounds=20, delta=1e-5) | kwargs
    with pytest.raises(ValueError, match=name):
        privacy.noise_for_epsilon(**arguments)
