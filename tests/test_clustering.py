"""FED-PRIME's constrained prompt clustering (fedvlp.platform.aggregation.prompt_clustering, and the rule in
fedvlp.platform.aggregation.hungarian) on hand-made pools."""
import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from fedvlp.platform.aggregation import HungarianOptions, RuleInputs, apply_rule
from fedvlp.platform.aggregation.hungarian import hungarian_cluster, hungarian_cluster_report
from fedvlp.platform.aggregation.prompt_clustering import (
    MAX_POOL_FACTOR,
    SCHEDULES,
    _gaussian_terms,
    _loglik_all,
    cluster_pool,
    cluster_prompts,
)

KEY = "inter_pool.prompts"


@pytest.fixture(autouse=True)
def one_thread():
    """These problems are tiny: intra-op threads only add contention (50x slower on a busy 2-core box)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def two_groups(n_clients: int, dim: int, seed: int, scale: float = 0.1, noise: float = 0.02):
    """Every client holds one prompt near a and one near b (noise * scale per coordinate), in a random
    order. Prompt scale 0.1 is FED-PRIME-like (its prompts start in U(+-0.044)); the model's std is a
    sigmoid, < 1, so it can only merge prompts whose spread is well under 1 per coordinate."""
    gen = torch.Generator().manual_seed(seed)
    a, b = scale * torch.randn(dim, generator=gen), scale * torch.randn(dim, generator=gen)
    pools, groups = [], []
    for _ in range(n_clients):
        pa = a + noise * scale * torch.randn(dim, generator=gen)
        pb = b + noise * scale * torch.randn(dim, generator=gen)
        flip = bool(torch.rand(1, generator=gen) < 0.5)
        pools.append(torch.stack([pb, pa] if flip else [pa, pb]))
        groups.append([1, 0] if flip else [0, 1])
    groups = np.array(groups)
    means = torch.stack([torch.stack([p[g == k][0] for p, g in zip(pools, groups)]).mean(0) for k in (0, 1)])
    return pools, groups, means


def match_rows(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Order-free comparison: distance of each row of `want` to its Hungarian-matched row of `got`."""
    dist = torch.cdist(want.double(), got.double())
    rows, cols = linear_sum_assignment(dist.numpy())
    return dist[rows, cols]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_shuffled_groups_give_two_clusters(seed):
    pools, groups, means = two_groups(n_clients=5, dim=32, seed=seed)
    result = cluster_prompts(pools, torch.Generator().manual_seed(seed))
    assert result.assignment.shape == (5, 2) and result.assignment.dtype == np.int64
    # one prompt per centroid per client
    assert all(len(set(row)) == len(row) for row in result.assignment.tolist())
    cluster_a = set(result.assignment[groups == 0].tolist())
    cluster_b = set(result.assignment[groups == 1].tolist())
    assert len(cluster_a) == 1 and len(cluster_b) == 1 and cluster_a != cluster_b
    assert sorted(result.used.tolist()) == sorted(cluster_a | cluster_b)
    assert sorted(result.counts[result.used].tolist()) == [5, 5]
    sep = (means[0] - means[1]).norm()
    for cluster, near, far in ((cluster_a, means[0], means[1]), (cluster_b, means[1], means[0])):
        centroid = result.centroids[cluster.pop()]
        assert (centroid - near).norm() < 0.25 * sep < (centroid - far).norm()


def test_hungarian_cluster_returns_the_group_means():
    pools, _, means = two_groups(n_clients=6, dim=32, seed=3)
    states = [{KEY: pool} for pool in pools]
    out = hungarian_cluster(states, [10] * 6, generator=torch.Generator().manual_seed(0))
    assert set(out) == {KEY} and out[KEY].shape == (2, 32) and out[KEY].dtype == torch.float32
    sep = (means[0] - means[1]).norm().item()
    # the centroids move with Adam (about lr per coordinate per step), so "close" is relative
    assert match_rows(out[KEY], means).max().item() < 0.25 * sep


def test_same_seed_same_result_and_global_rng_untouched():
    pools, _, _ = two_groups(n_clients=4, dim=16, seed=5)
    torch_state, np_state = torch.get_rng_state(), np.random.get_state()
    first = cluster_prompts(pools, torch.Generator().manual_seed(7))
    second = cluster_prompts(pools, torch.Generator().manual_seed(7))
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert all(np.array_equal(x, y) for x, y in zip(np.random.get_state(), np_state))
    assert torch.equal(first.centroids, second.centroids)
    assert torch.equal(first.popularity, second.popularity)
    assert np.array_equal(first.assignment, second.assignment)
    states = [{KEY: p} for p in pools]
    out1 = hungarian_cluster(states, [1] * 4, generator=torch.Generator().manual_seed(7))
    out2 = hungarian_cluster(states, [1] * 4, generator=torch.Generator().manual_seed(7))
    assert torch.equal(out1[KEY], out2[KEY])
    assert torch.equal(torch.get_rng_state(), torch_state)
    # the generator is the only source of randomness: another seed draws another initial map
    other = cluster_prompts(pools, torch.Generator().manual_seed(8), outer_loops=0)
    assert not np.array_equal(other.assignment, cluster_prompts(
        pools, torch.Generator().manual_seed(7), outer_loops=0).assignment)


def test_identical_pools_collapse_onto_those_prompts():
    n_clients, tau, dim, lr, loops = 6, 3, 16, 1e-3, 5
    prompts = 0.1 * torch.randn(tau, dim, generator=torch.Generator().manual_seed(11))
    pools = [prompts.clone() for _ in range(n_clients)]
    result = cluster_prompts(pools, torch.Generator().manual_seed(0), outer_loops=loops, lr=lr)
    assert len(result.used) == tau
    assert all(sorted(row) == sorted(result.assignment[0]) for row in result.assignment.tolist())
    # prompt j of every client sits in the same centroid, and that centroid is prompt j up to Adam's drift
    drift = loops * lr  # one Adam step per outer loop moves a coordinate by about lr
    for j in range(tau):
        assert len(set(result.assignment[:, j].tolist())) == 1
        centroid = result.centroids[result.assignment[0, j]]
        assert (centroid - prompts[j]).abs().max() <= 1.5 * drift
    states = [{KEY: p} for p in pools]
    out = hungarian_cluster(states, [1] * n_clients, generator=torch.Generator().manual_seed(0),
                            outer_loops=loops, lr=lr)[KEY]
    assert out.shape == prompts.shape
    assert match_rows(out, prompts).max().item() <= 1.5 * drift * dim ** 0.5


def test_shapes_and_dtypes_are_preserved():
    gen = torch.Generator().manual_seed(0)
    states = [{"pool": 0.1 * torch.randn(4, 8, dtype=torch.float64, generator=gen),
               "tokens": (0.1 * torch.randn(3, 2, 5, generator=gen)).to(torch.bfloat16)} for _ in range(3)]
    out = hungarian_cluster(states, [5, 1, 2], generator=torch.Generator().manual_seed(1), outer_loops=2)
    assert list(out) == ["pool", "tokens"]
    for key in out:
        assert out[key].shape == states[0][key].shape and out[key].dtype == states[0][key].dtype
    result = cluster_prompts([s["pool"] for s in states], torch.Generator().manual_seed(1), outer_loops=2)
    assert result.centroids.shape == (12, 8) and result.centroids.dtype == torch.float64
    assert result.popularity.shape == (12,) and result.popularity.dtype == torch.float64
    assert bool(((result.popularity > 0) & (result.popularity < 1)).all())
    assert result.assignment.shape == (3, 4) and len(result.used) >= 4
    assert result.used_centroids.shape == (len(result.used), 8)
    ranked = result.ranked()
    assert sorted(ranked.tolist()) == result.used.tolist()
    assert list(result.counts[ranked]) == sorted(result.counts[ranked], reverse=True)
    # the inputs are not modified
    assert states[0]["pool"].dtype == torch.float64 and not states[0]["pool"].requires_grad


def test_vectorised_loglik_matches_torch_distributions():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 16, generator=gen, dtype=torch.float64)
    centroids = torch.randn(7, 16, generator=gen, dtype=torch.float64)
    std = 0.1 + torch.rand(7, 16, generator=gen, dtype=torch.float64)
    normal = torch.distributions.Normal(centroids[None], std[None])
    ref = torch.distributions.Independent(normal, 1).log_prob(x[:, None])
    assert torch.allclose(_loglik_all(x, _gaussian_terms(centroids, std)), ref, rtol=1e-10, atol=1e-10)


def client_groups(n_clients: int, split: int, tau: int, dim: int, seed: int, scale: float = 0.1,
                  noise: float = 0.02):
    """Clients 0..split-1 hold tau prompts near the modes a_1..a_tau, the others near b_1..b_tau, each client in
    its own shuffled order. Returns the pools and each prompt's mode id [n_clients, tau] (a_j: j, b_j: tau + j)."""
    gen = torch.Generator().manual_seed(seed)
    modes = scale * torch.randn(2 * tau, dim, generator=gen)
    pools, mode_of = [], []
    for t in range(n_clients):
        ids = torch.randperm(tau, generator=gen) + (0 if t < split else tau)
        pools.append(modes[ids] + noise * scale * torch.randn(tau, dim, generator=gen))
        mode_of.append(ids.numpy())
    return pools, np.stack(mode_of), modes


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_client_groups_merge_within_each_group_and_never_across(seed):
    n_clients, split, tau = 7, 3, 3
    pools, mode_of, modes = client_groups(n_clients, split, tau, dim=32, seed=seed)
    group_of_client = np.arange(n_clients) >= split
    first = cluster_pool(pools, torch.Generator().manual_seed(seed))           # defaults: selected, used
    for centroid in first.clustering.used:                                     # never across groups, from round 1
        assert len(set(group_of_client[np.nonzero(first.clustering.assignment == centroid)[0]].tolist())) == 1
    # the next round starts from this round's popularity network, as the rule "hungarian" does
    update = cluster_pool(pools, torch.Generator().manual_seed(seed), popularity=first.clustering.popularity_state)
    result = update.clustering
    for centroid in result.used:
        holders = np.nonzero(result.assignment == centroid)
        # never across groups, and each cluster is one mode held by every client of its group
        assert len(set(group_of_client[holders[0]].tolist())) == 1
        assert len(set(mode_of[holders].tolist())) == 1
        assert len(holders[0]) == (split if not group_of_client[holders[0][0]] else n_clients - split)
    assert len(result.used) == 2 * tau and update.prompts.shape == (2 * tau, 32)
    assert update.diagnostics["centroids_used"] == 2 * tau and update.diagnostics["shared_clusters"] == 1.0
    # the new pool is the 2 tau modes, up to the noise and Adam's drift (5 steps of 1e-3 per coordinate)
    assert match_rows(update.prompts, modes).max().item() < 0.01 * 32 ** 0.5 + 5e-3 * 32 ** 0.5


def test_only_the_selected_rows_are_clustered_and_the_rest_dropped_or_carried():
    n_clients, tau, dim = 4, 6, 16
    prompts = 0.1 * torch.randn(tau, dim, generator=torch.Generator().manual_seed(3))
    pools = [prompts + 1e-3 * torch.randn(tau, dim, generator=torch.Generator().manual_seed(t))
             for t in range(n_clients)]
    pools = [torch.cat([p[:4], prompts[4:]]) for p in pools]      # rows 4 and 5: untouched by every client
    selected = [np.array([True, True, False, False, False, False]), np.array([False, True, True, False, False, False]),
                np.array([False, False, False, True, False, False]), np.zeros(tau, bool)]
    used = cluster_pool(pools, torch.Generator().manual_seed(0), selected=selected)
    assert used.rows.tolist() == [0, 1, 2, 3]                   # the union, from every client
    assert used.clustering.assignment.shape == (n_clients, 4)
    assert used.prompts.shape == (4, dim) and len(used.carried) == 0
    assert match_rows(used.prompts, prompts[:4]).max().item() < 0.05
    top = cluster_pool(pools, torch.Generator().manual_seed(0), selected=selected, keep="top")
    assert top.prompts.shape == (tau, dim) and top.carried.tolist() == [4, 5]
    assert torch.allclose(top.prompts[4:], prompts[4:])         # carried over as they were
    everything = cluster_pool(pools, torch.Generator().manual_seed(0), selected=selected, prompts="all")
    assert everything.rows.tolist() == list(range(tau)) and everything.prompts.shape == (tau, dim)


def test_keep_used_returns_every_used_centroid_up_to_max_pool():
    n_clients, tau, dim = 5, 2, 8
    gen = torch.Generator().manual_seed(0)
    pools = [5.0 * torch.randn(tau, dim, generator=gen) for _ in range(n_clients)]   # far apart: no merging
    update = cluster_pool(pools, torch.Generator().manual_seed(0), max_pool=100)
    assert update.prompts.shape == (n_clients * tau, dim) and update.diagnostics["centroids_used"] == n_clients * tau
    assert update.diagnostics["shared_clusters"] == 0.0
    assert update.diagnostics["client_to_centroid"] < 5 * 1e-3 * dim ** 0.5 * 1.5     # only Adam's drift
    capped = cluster_pool(pools, torch.Generator().manual_seed(0))
    assert capped.prompts.shape == (MAX_POOL_FACTOR * tau, dim)
    assert np.array_equal(capped.kept, update.kept[:MAX_POOL_FACTOR * tau])   # the most-assigned first
    assert cluster_pool(pools, torch.Generator().manual_seed(0), pool_size=3, max_pool=7).prompts.shape == (7, dim)


def test_report_names_the_diagnostics_of_every_key_and_measures_the_move():
    pools, _, _ = two_groups(n_clients=4, dim=16, seed=5)
    states = [{KEY: p} for p in pools]
    previous = {KEY: torch.stack([p for p in pools[0]])}
    out, report = hungarian_cluster_report(states, [1] * 4, generator=torch.Generator().manual_seed(0),
                                           previous=previous)
    assert torch.equal(out[KEY], hungarian_cluster(states, [1] * 4, generator=torch.Generator().manual_seed(0))[KEY])
    assert set(report) == {f"{KEY}/{name}" for name in
                           ("centroids_used", "pool_size", "shared_clusters", "client_to_centroid", "moved",
                            "centroid_movement", "popularity_spread", "popularity_change")}
    assert report[f"{KEY}/centroids_used"] == 2 and report[f"{KEY}/pool_size"] == 2
    assert report[f"{KEY}/shared_clusters"] == 1.0
    # the new prompts are the group means: as far from client 0's prompts as its noise, nowhere near the groups' gap
    gap = (pools[0][0] - pools[0][1]).norm().item()
    assert report[f"{KEY}/moved"] < 0.1 * gap and report[f"{KEY}/client_to_centroid"] < 0.1 * gap
    # the fit's own figures, from the clustering itself: how far the used centroids moved from the prompts they
    # started at, and how far pi spreads over them and changed in this round (fresh networks: 5 Adam steps)
    result = cluster_pool(pools, torch.Generator().manual_seed(0), keep="top").clustering
    used = torch.from_numpy(result.used)
    start = torch.stack(pools).reshape(-1, 16)[used]
    assert report[f"{KEY}/centroid_movement"] == pytest.approx((result.centroids[used] - start).norm(dim=1).mean())
    assert 0 < report[f"{KEY}/centroid_movement"] <= 1.5 * 5 * 1e-3 * 16 ** 0.5      # Adam: about lr a step
    assert report[f"{KEY}/popularity_spread"] == pytest.approx(result.popularity[used].std(correction=0))
    pi, pi_start = result.popularity[used], result.initial_popularity[used]
    assert report[f"{KEY}/popularity_change"] == pytest.approx((pi - pi_start).abs().mean())
    assert report[f"{KEY}/popularity_change"] > 0
    # nothing learned, nothing moved
    _, still = hungarian_cluster_report(states, [1] * 4, generator=torch.Generator().manual_seed(0), lr=0.0)
    assert still[f"{KEY}/centroid_movement"] == 0.0 and still[f"{KEY}/popularity_change"] == 0.0


def test_bad_input_is_rejected():
    with pytest.raises(ValueError):
        hungarian_cluster([], [], generator=torch.Generator())
    with pytest.raises(ValueError):
        hungarian_cluster([{KEY: torch.zeros(2, 3)}], [1, 2], generator=torch.Generator())
    with pytest.raises(ValueError):
        cluster_prompts([torch.zeros(2, 3), torch.zeros(3, 3)], torch.Generator())
    with pytest.raises(ValueError):
        cluster_prompts([torch.zeros(2, 3, 4)], torch.Generator())
    with pytest.raises(ValueError, match="NaN"):
        cluster_prompts([torch.zeros(2, 3), torch.full((2, 3), float("nan"))], torch.Generator())
    with pytest.raises(ValueError, match="schedule"):
        cluster_prompts([torch.zeros(2, 3)], torch.Generator(), schedule="mine")
    carried = cluster_prompts([torch.zeros(2, 3)], torch.Generator(), outer_loops=1).popularity_state
    with pytest.raises(ValueError, match="popularity state"):                 # the prompts' width changed
        cluster_prompts([torch.zeros(2, 4)], torch.Generator(), popularity=carried)
    pools = [torch.zeros(2, 3), torch.ones(2, 3)]
    for options, word in ((dict(prompts="mine"), "prompts"), (dict(keep="all"), "keep"),
                          (dict(selected=[np.ones(2, bool)]), "masks"),
                          (dict(selected=[np.ones(3, bool)] * 2), "shape"),
                          (dict(selected=[np.zeros(2, bool)] * 2), "no client selected"),
                          (dict(pool_size=3, max_pool=2), "max_pool")):
        with pytest.raises(ValueError, match=word):
            cluster_pool(pools, torch.Generator(), **options)


def modes_and_loners(n_clients: int, loners: tuple[int, ...], dim: int, seed: int, round_index: int,
                     scale: float = 0.1, noise: float = 0.1):
    """One round's pools of 3 prompts. Most clients hold one prompt near each of 3 shared modes (scale per
    coordinate), in a shuffled order; the loners hold 3 prompts of their own, 3 * scale per coordinate, far from
    every mode. The modes and the loners' prompts are the same every round, the noise (noise * scale per
    coordinate) is drawn afresh. Returns the pools, each prompt's mode id [n_clients, 3] (-1: a loner's), the modes."""
    gen = torch.Generator().manual_seed(seed)
    modes = scale * torch.randn(3, dim, generator=gen)
    own = 3 * scale * torch.randn(n_clients, 3, dim, generator=gen)
    gen = torch.Generator().manual_seed(1000 * seed + round_index)
    pools, mode_of = [], []
    for t in range(n_clients):
        ids = torch.randperm(3, generator=gen)
        pools.append((own[t] if t in loners else modes[ids]) + noise * scale * torch.randn(3, dim, generator=gen))
        mode_of.append([-1] * 3 if t in loners else ids.tolist())
    return pools, np.array(mode_of), modes


@pytest.mark.parametrize("schedule,rounds", [("batched", 24), ("per_client", 8)])
def test_carried_popularity_learns_that_shared_modes_are_popular_and_lone_prompts_are_not(schedule, rounds):
    """Rounds of the same planted clients, carrying the popularity network as the rule does: the new pool is the
    three modes, and pi ranks the modes' centroids above every loner's. Fails with a constant pi and with networks
    that do not move (lr 0); batched, also with a fresh popularity network every round (5 Adam steps a round leave
    pi at its random start; per_client takes 5 per client, 60 here, and separates within a round, by less)."""
    n_clients, loners = 12, (0, 5)
    popularity, gaps = None, []
    for r in range(rounds):
        pools, mode_of, modes = modes_and_loners(n_clients, loners, dim=64, seed=0, round_index=r)
        update = cluster_pool(pools, torch.Generator().manual_seed(r), prompts="all", keep="top", pool_size=3,
                              schedule=schedule, popularity=popularity)
        result, popularity = update.clustering, update.clustering.popularity_state
        lone = np.unique(result.assignment[mode_of < 0])
        gaps.append(float(result.popularity[update.kept].min() - result.popularity[lone].max()))
    # the new pool: one merged centroid per mode, nearest that mode, holding no loner's prompt
    holders = [mode_of[result.assignment == centroid] for centroid in update.kept]
    assert all((h == h[0]).all() and h[0] >= 0 and len(h) >= 2 for h in holders)
    assert sorted(int(h[0]) for h in holders) == [0, 1, 2]
    assert torch.cdist(update.prompts, modes).argmin(1).tolist() == [int(h[0]) for h in holders]
    # pi: every mode's centroid above every loner's, by a margin
    assert gaps[-1] > 0.05, gaps


def test_per_client_schedule_steps_once_per_client():
    pools, _, _ = two_groups(n_clients=4, dim=16, seed=5)
    batched = cluster_prompts(pools, torch.Generator().manual_seed(0), outer_loops=3)
    per_client = cluster_prompts(pools, torch.Generator().manual_seed(0), outer_loops=3, schedule="per_client")
    assert float(batched.popularity_state["step"]) == 3 and float(per_client.popularity_state["step"]) == 3 * 4
    assert not torch.equal(batched.centroids, per_client.centroids)
    # one client: one step per outer loop either way, the same result
    alone = [cluster_prompts(pools[:1], torch.Generator().manual_seed(0), schedule=s) for s in SCHEDULES]
    assert torch.equal(alone[0].centroids, alone[1].centroids)
    assert torch.equal(alone[0].popularity, alone[1].popularity)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_the_rule_carries_the_popularity_network_and_a_restored_state_continues_bitwise(schedule, tmp_path):
    pools, _, _ = two_groups(n_clients=4, dim=16, seed=5)
    states = [{KEY: pool} for pool in pools]
    options = HungarianOptions(prompts="all", keep="top", schedule=schedule)
    steps = 5 * (4 if schedule == "per_client" else 1)       # Adam steps a round

    def round_(state: dict, index: int):
        return apply_rule("hungarian", RuleInputs(states, [1] * 4, {KEY: pools[0]}, state,
                                                  torch.Generator().manual_seed(index), options))

    _, first, _ = round_({}, 1)
    assert set(first) == {KEY} and all(isinstance(t, torch.Tensor) for t in first[KEY].values())
    assert float(first[KEY]["step"]) == steps
    new, second, metrics = round_(first, 2)
    assert float(second[KEY]["step"]) == 2 * steps and metrics[f"{KEY}/popularity_change"] > 0
    # round 2 went on from round 1's popularity network, not from a fresh draw
    assert not torch.equal(second[KEY]["w1"], round_({}, 2)[1][KEY]["w1"])
    # the coordinator's checkpoint (torch.save; load_checkpoint reads it weights_only) and a resumed round 2
    torch.save({"rule_states": {"hungarian": first}}, tmp_path / "checkpoint.pt")
    restored = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["rule_states"]["hungarian"]
    again, resumed, _ = round_(restored, 2)
    assert torch.equal(again[KEY], new[KEY])
    assert set(resumed[KEY]) == set(second[KEY])
    assert all(torch.equal(resumed[KEY][name], value) for name, value in second[KEY].items())
