"""The placement of a round's cohort on the workers (`balance_cohort`), by hand; on real actors in
test_engine.py::test_same_seed_same_metrics_with_one_or_two_workers."""
import itertools

import numpy as np

from fedvlp.platform.runtime.cohorts import balance_cohort


def loads(placed: dict[int, int], cost: list[int], workers: int) -> list[int]:
    out = [0] * workers
    for cid, worker in placed.items():
        out[worker] += cost[cid]
    return out


def test_an_uneven_cohort_is_evened_out_by_the_move_that_leaves_the_two_closest():
    # clients 0, 2, 4, 6 are homed on worker 0 (loads 4 + 3 + 2 + 1 = 10), client 1 on worker 1 (load 2)
    home = {c: c % 2 for c in range(8)}
    cost = [4, 2, 3, 9, 2, 9, 1, 9]
    placed = balance_cohort([0, 1, 2, 4, 6], home, cost, 2)
    # moving client 0 (4 steps) gives 6 and 6 at once; client 2 (3) would give 7 and 5, client 4 (2) 8 and 4
    assert placed == {0: 1, 1: 1, 2: 0, 4: 0, 6: 0}
    assert loads(placed, cost, 2) == [6, 6]


def test_a_balanced_cohort_stays_at_home():
    home = {c: c % 2 for c in range(4)}
    assert balance_cohort([0, 1, 2, 3], home, [5, 5, 5, 5], 2) == home
    # a move that would only swap which worker is busiest is not made
    assert balance_cohort([0, 1], home, [5, 3], 2) == {0: 0, 1: 1}
    assert balance_cohort([0, 2], {0: 0, 2: 0}, [5, 0, 0], 1) == {0: 0, 2: 0}  # one worker: nowhere to go


def test_balancing_never_lengthens_a_round_and_stays_within_one_client_of_the_best_split():
    rng = np.random.default_rng(0)
    for _ in range(200):
        workers = int(rng.integers(2, 4))
        cost = [int(c) for c in rng.integers(1, 12, 30)]
        home = {c: c % workers for c in range(30)}
        cohort = sorted(int(c) for c in rng.choice(30, int(rng.integers(1, 7)), replace=False))
        placed = balance_cohort(cohort, home, cost, workers)
        assert sorted(placed) == cohort
        assert placed == balance_cohort(cohort, home, cost, workers)  # deterministic
        at_home = max(loads({c: home[c] for c in cohort}, cost, workers))
        balanced = max(loads(placed, cost, workers))
        assert balanced <= at_home
        if workers == 2:  # within one client's cost of the best split, found by brute force
            best = min(max(loads(dict(zip(cohort, split)), cost, 2)) for split in itertools.product(range(2),
                                                                                                     repeat=len(cohort)))
            assert balanced <= best + max(cost[c] for c in cohort)
