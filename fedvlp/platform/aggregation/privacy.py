"""Client-level differential privacy: DP-FedAvg (McMahan et al., 2018, "Learning Differentially Private
Recurrent Language Models") and its privacy accounting.

The unit of privacy is one client's whole data: every client's update (its state minus the round's global
state) is clipped to L2 norm C over all parameters jointly, the coordinator sums the clipped updates, adds
Gaussian noise N(0, (sigma C)^2 I) to the SUM and divides by the fixed denominator m (the cohort size). The
noise multiplier sigma is therefore the ratio of the noise's standard deviation to the clip norm.

Departures from the paper:

* Cohorts here are drawn with a fixed size m WITHOUT replacement (`fedvlp.platform.runtime.cohorts`), not
  by Poisson sampling with expected size qN, so the estimator divides by the actual, public, m and the accounting
  uses the bound for sampling without replacement (`epsilon`).
* Weighting is uniform. The paper's weighted estimator needs a bound on each weight; with sample-count
  weights a client's influence on the sum, and so its sensitivity, would grow with its data size.

The averaging functions are pure (float64 arithmetic, results in each parameter's dtype); the accounting uses
Google's `dp-accounting` package, imported on use. A run's driver does the accounting only, so torch too is
imported where the averaging runs.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    State = dict[str, torch.Tensor]

# A neighbouring dataset here replaces one client's data by another's (the population size N is public). The
# sum of clipped updates then changes by u - u' with ||u - u'|| <= 2C: its replace-one L2 sensitivity is 2C,
# so noise of standard deviation sigma * C is a Gaussian mechanism of noise multiplier sigma / 2 relative to
# that sensitivity (dp_accounting's GaussianDpEvent takes std / sensitivity).
REPLACE_ONE_SENSITIVITY = 2.0  # in units of the clip norm C


# ---------------------------------------------------------------- clipping and the noisy average

def _check_keys(state: State, previous: State, name: str) -> None:
    if set(state) != set(previous):
        raise ValueError(f"{name}: keys {sorted(state)} differ from previous's {sorted(previous)}")


def _delta(state: State, previous: State) -> dict[str, torch.Tensor]:
    return {key: state[key].double() - previous[key].double() for key in sorted(previous)}


def _norm(delta: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float(d.square().sum()) for d in delta.values()))


def _clip_factor(norm: float, clip_norm: float) -> float:
    return 1.0 if norm <= clip_norm else clip_norm / norm


def update_norm(state: State, previous: State) -> float:
    """The L2 norm of the client's update state - previous over all keys jointly, in float64."""
    _check_keys(state, previous, "state")
    return _norm(_delta(state, previous))


def clip_update(state: State, previous: State, clip_norm: float) -> State:
    """previous + delta * min(1, C / ||delta||), delta = state - previous over all keys jointly (one factor for
    the whole update, so its direction is kept), computed in float64 and returned in each parameter's dtype."""
    if not clip_norm > 0:
        raise ValueError(f"clip_update: clip_norm must be > 0, got {clip_norm}")
    _check_keys(state, previous, "state")
    delta = _delta(state, previous)
    factor = _clip_factor(_norm(delta), clip_norm)
    return {key: (previous[key].double() + factor * d).to(previous[key].dtype) for key, d in delta.items()}


def private_average(states: Sequence[State], previous: State, clip_norm: float, noise_multiplier: float,
                    generator: torch.Generator) -> State:
    """The DP-FedAvg estimate previous + (sum_k clip(delta_k) + N(0, (sigma C)^2 I)) / m, with m = len(states).

    Weighting is uniform: under client-level DP every client must move the sum by at most C, which sample-count
    weights would break. `noise_multiplier` is sigma: the noise on the SUM of the clipped updates has standard
    deviation sigma * C per coordinate (so sigma * C / m on the average). The denominator is the cohort size, not
    the number of clients whose update was non-zero, so it reveals nothing beyond the public m.

    The noise is drawn from `generator` in float64, key by key in sorted key order (`torch.randn` of each
    parameter's shape), so it is reproducible and does not depend on the dicts' insertion order. The result is in
    each parameter's dtype.
    """
    if not states:
        raise ValueError("private_average: states is empty")
    if not clip_norm > 0:
        raise ValueError(f"private_average: clip_norm must be > 0, got {clip_norm}")
    if not noise_multiplier >= 0:
        raise ValueError(f"private_average: noise_multiplier must be >= 0, got {noise_multiplier}")
    import torch

    keys = sorted(previous)
    total = {key: torch.zeros(previous[key].shape, dtype=torch.float64) for key in keys}
    for index, state in enumerate(states):
        _check_keys(state, previous, f"states[{index}]")
        delta = _delta(state, previous)
        factor = _clip_factor(_norm(delta), clip_norm)
        for key in keys:
            total[key] += factor * delta[key]
    mean = noisy_mean(total, len(states), clip_norm, noise_multiplier, generator)
    return {key: (previous[key].double() + mean[key]).to(previous[key].dtype) for key in keys}


def noisy_mean(total: State, count: int, clip_norm: float, noise_multiplier: float,
               generator: torch.Generator) -> State:
    """(total + N(0, (sigma C)^2 I)) / count in float64, the noise drawn key by key in sorted key order: the
    noise step of `private_average`, also applied to a securely aggregated sum of clipped client states."""
    import torch

    std = noise_multiplier * clip_norm
    return {key: (total[key].double() + torch.randn(total[key].shape, generator=generator, dtype=torch.float64) * std)
            / count for key in sorted(total)}


# ---------------------------------------------------------------- accounting (dp-accounting's RDP accountant)

def _check_accounting(num_clients: int, cohort_size: int, rounds: int, delta: float) -> None:
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if not 1 <= cohort_size <= num_clients:
        raise ValueError(f"cohort_size must be in [1, num_clients={num_clients}], got {cohort_size}")
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")


def dp_event(noise_multiplier: float, num_clients: int, cohort_size: int, rounds: int, sampled: bool = True):
    """The dp_accounting event of `rounds` rounds of `private_average` on fixed-size cohorts: the Gaussian
    mechanism of noise multiplier sigma / REPLACE_ONE_SENSITIVITY (see that constant), applied to `cohort_size`
    clients sampled uniformly without replacement from `num_clients`, self-composed `rounds` times. Without
    sampling (cohort_size == num_clients, or `sampled` False) just the Gaussian, which ignores the amplification
    by sampling."""
    import dp_accounting

    gaussian = dp_accounting.GaussianDpEvent(noise_multiplier / REPLACE_ONE_SENSITIVITY)
    if sampled and cohort_size < num_clients:
        gaussian = dp_accounting.SampledWithoutReplacementDpEvent(num_clients, cohort_size, gaussian)
    return dp_accounting.SelfComposedDpEvent(gaussian, rounds)


def _accountant():
    import dp_accounting

    return dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)


def _epsilon_of(event, delta: float) -> float:
    accountant = _accountant()
    accountant.compose(event)
    return float(accountant.get_epsilon(delta))


def _bounds(num_clients: int, cohort_size: int) -> tuple[bool, ...]:
    """Which of `dp_event`'s bounds apply: with and without the sampling, or only the latter without sampling."""
    return (True, False) if cohort_size < num_clients else (False,)


def epsilon(noise_multiplier: float, num_clients: int, cohort_size: int, rounds: int, delta: float) -> float:
    """The epsilon at `delta` of `rounds` rounds of `private_average` with noise multiplier sigma, each on a
    fixed-size cohort of `cohort_size` clients drawn uniformly WITHOUT replacement from `num_clients`.

    Neighbouring datasets differ in ONE CLIENT'S WHOLE DATA, replaced by another client's (N is public): this is
    client-level, not example-level, privacy. Accountant: dp_accounting's RDP accountant with the REPLACE_ONE
    relation on `dp_event` (the subsampled-RDP bound of Wang, Balle & Kasiviswanathan, 2019, Theorem 27, for
    sampling without replacement; the plain Gaussian RDP alpha / (2 s^2) when the whole population takes part),
    composed over rounds and converted to (epsilon, delta) with the library's improved conversion. Both the
    sampled bound and the unsampled Gaussian bound hold for a sampled cohort (given any cohort the round is that
    Gaussian, so sampling cannot hurt), and at small sigma or large cohorts the former can be the looser of the
    two (e.g. sigma 1, 50 of 100 clients), so the smaller epsilon is returned.

    Caveats: the bound for sampling without replacement is an upper bound and looser than the Poisson-sampling
    analysis of McMahan et al. (add/remove relation); the two relations are not interchangeable (replace-one
    doubles the sensitivity to 2C, accounted for by REPLACE_ONE_SENSITIVITY), so this epsilon is not comparable
    to a Poisson/add-remove epsilon at the same sigma. It holds only if clipping, uniform weights, the fixed
    denominator and fresh noise each round are actually applied, and the cohorts really are uniform samples.
    noise_multiplier 0 means no privacy: infinity.
    """
    _check_accounting(num_clients, cohort_size, rounds, delta)
    if not noise_multiplier >= 0:
        raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
    if rounds == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    return min(_epsilon_of(dp_event(noise_multiplier, num_clients, cohort_size, rounds, sampled), delta)
               for sampled in _bounds(num_clients, cohort_size))


MIN_NOISE = 1e-3  # noise_for_epsilon searches noise multipliers from here up


def noise_for_epsilon(target_epsilon: float, num_clients: int, cohort_size: int, rounds: int,
                      delta: float) -> float:
    """The smallest noise multiplier whose `epsilon` (same arguments) is at most `target_epsilon`, found with
    dp_accounting's `calibrate_dp_mechanism` (Brent's method on the accountant; the value is within 1e-6 of the
    optimum and on its private side), once for each of `epsilon`'s two bounds: the smaller of the two noises
    meets the target. Raises ValueError for an impossible target: epsilon <= 0 or not finite, no rounds to spend
    it on, or so large that noise below MIN_NOISE already meets it (no meaningful privacy)."""
    import dp_accounting

    _check_accounting(num_clients, cohort_size, rounds, delta)
    if not 0 < target_epsilon < math.inf:
        raise ValueError(f"target_epsilon must be finite and > 0, got {target_epsilon}")
    if rounds == 0:
        raise ValueError("rounds must be >= 1 to calibrate noise (0 rounds spend no privacy)")
    if epsilon(MIN_NOISE, num_clients, cohort_size, rounds, delta) <= target_epsilon:
        raise ValueError(f"target_epsilon {target_epsilon} is met by noise multipliers below {MIN_NOISE}: "
                         "no meaningful privacy; ask for a smaller epsilon")
    noises = []
    for sampled in _bounds(num_clients, cohort_size):
        try:
            noises.append(dp_accounting.calibrate_dp_mechanism(
                _accountant, lambda s, sampled=sampled: dp_event(s, num_clients, cohort_size, rounds, sampled),
                target_epsilon, delta, bracket_interval=dp_accounting.LowerEndpointAndGuess(MIN_NOISE, 1.0)))
        except dp_accounting.mechanism_calibration.NoBracketIntervalFoundError as err:
            raise ValueError(f"target_epsilon {target_epsilon} is not reachable at delta {delta}: {err}") from err
    return float(min(noises))
