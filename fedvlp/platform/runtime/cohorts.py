"""A round's cohort: which clients train (drawn from the seed), and on which worker each trains."""
from __future__ import annotations

import math

import numpy as np

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


def client_costs(spec, parts: list[np.ndarray]) -> list[int]:
    """Each client's work in a round, as `balance_cohort` weighs it: its local steps per epoch (every client of a
    run trains the same epochs, and a step costs about the same whatever its batch's size)."""
    batch = getattr(spec.method.params, "batch_size", 1)
    return [math.ceil(len(p) / batch) for p in parts]


def balance_cohort(cohort: list[int], home: dict[int, int], cost: list[int], workers: int) -> dict[int, int]:
    """Each cohort client's worker: its home, except where moving a client from the busiest worker to the idlest
    shortens the longer of the two. Of the clients that could move, the one that leaves the two closest to even
    (the lowest id on a tie). Deterministic, and it ends: every move lowers the sum of squared loads.
    `cost[c]` is client c's work (local steps per epoch)."""
    placed = {cid: home[cid] for cid in cohort}
    load = [0] * workers
    for cid in cohort:
        load[placed[cid]] += cost[cid]
    while True:
        busiest = max(range(workers), key=lambda w: (load[w], -w))
        idlest = min(range(workers), key=lambda w: (load[w], w))
        movable = [(max(load[busiest] - cost[c], load[idlest] + cost[c]), c)
                   for c in sorted(placed) if placed[c] == busiest]
        longer, cid = min(movable, default=(load[busiest], -1))
        if longer >= load[busiest]:
            return placed
        placed[cid] = idlest
        load[busiest] -= cost[cid]
        load[idlest] += cost[cid]
