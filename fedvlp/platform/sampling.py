"""Per-round cohort sampling."""
from __future__ import annotations

from fedvlp.seeding import numpy_rng


def cohort_size(num_clients: int, participation: float) -> int:
    return max(1, round(participation * num_clients))


def sample_cohort(seed: int, round_index: int, num_clients: int, participation: float) -> list[int]:
    """max(1, round(rho*N)) client ids drawn without replacement from Generator(seed, round), sorted.

    Depends only on (seed, round, N, rho), so every method sees the same cohorts.
    """
    rng = numpy_rng(seed, "sampling", round_index)
    chosen = rng.choice(num_clients, size=cohort_size(num_clients, participation), replace=False)
    return sorted(int(c) for c in chosen)
