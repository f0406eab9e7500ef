"""FED-PRIME's constrained prompt clustering (fedvlp.platform.clustering) on hand-made pools."""
import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from fedvlp.platform.clustering import _loglik_all, cluster_prompts, hungarian_cluster

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
    drift = loops * n_clients * lr  # Adam moves a coordinate by about lr per step
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
    assert torch.allclose(_loglik_all(x, centroids, std), ref, rtol=1e-10, atol=1e-10)


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
