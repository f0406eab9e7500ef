import numpy as np
import pytest

from fedvlp.data.partition import label_distribution_js, partition_dirichlet, partition_heterogeneity, partition_iid
from fedvlp.data.scenes import generate_scenes

TS = (0.0, 0.25, 0.5, 0.75, 1.0)


@pytest.fixture(scope="module")
def scene_labels():
    return generate_scenes(3000, "train", 0).labels


def _exact_cover(parts, n, k):
    assert len(parts) == k
    for p in parts:
        assert p.dtype == np.int64 and np.all(np.diff(p) > 0)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(n))


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def _client_of(parts, n):
    out = np.full(n, -1)
    for c, p in enumerate(parts):
        out[p] = c
    return out


@pytest.mark.parametrize("t", TS)
def test_heterogeneity_exact_cover_and_deterministic(scene_labels, t):
    parts = partition_heterogeneity(scene_labels, 10, t, seed=0)
    _exact_cover(parts, len(scene_labels), 10)
    assert _same(parts, partition_heterogeneity(scene_labels, 10, t, seed=0))
    assert not _same(parts, partition_heterogeneity(scene_labels, 10, t, seed=1))


def test_iid_and_dirichlet_exact_cover_and_deterministic():
    parts = partition_iid(1003, 10, seed=4)
    _exact_cover(parts, 1003, 10)
    assert {len(p) for p in parts} == {100, 101}
    assert _same(parts, partition_iid(1003, 10, seed=4))
    assert not _same(parts, partition_iid(1003, 10, seed=5))
    y = np.random.default_rng(0).integers(0, 7, 2000)
    parts = partition_dirichlet(y, 10, 0.5, seed=4)
    _exact_cover(parts, 2000, 10)
    assert _same(parts, partition_dirichlet(y, 10, 0.5, seed=4))
    assert not _same(parts, partition_dirichlet(y, 10, 0.5, seed=5))


def test_t1_gives_each_client_one_pattern():
    # 6 well-separated co-occurrence patterns, 6 clients: each pattern lands wholly on its
    # own client.
    rng = np.random.default_rng(0)
    patterns = np.zeros((6, 12), np.int8)
    for i in range(6):
        patterns[i, [2 * i, 2 * i + 1]] = 1
    which = rng.integers(0, 6, 1200)
    labels = patterns[which]
    parts = partition_heterogeneity(labels, 6, 1.0, seed=3)
    _exact_cover(parts, 1200, 6)
    client = _client_of(parts, 1200)
    owner = [set(client[which == i]) for i in range(6)]
    assert all(len(o) == 1 for o in owner)
    assert len(set().union(*owner)) == 6
    # at t=0.5 the same patterns are spread over many clients
    client = _client_of(partition_heterogeneity(labels, 6, 0.5, seed=3), 1200)
    assert all(len(set(client[which == i])) == 6 for i in range(6))


def test_t1_identical_label_sets_share_a_client(scene_labels):
    client = _client_of(partition_heterogeneity(scene_labels, 10, 1.0, seed=0), len(scene_labels))
    _, pattern = np.unique(scene_labels, axis=0, return_inverse=True)
    pattern = pattern.ravel()
    for p in np.unique(pattern):
        assert len(set(client[pattern == p])) == 1


def test_unknown_entries_count_as_negative(scene_labels):
    masked = scene_labels.astype(np.int8)
    hide = np.random.default_rng(1).random(masked.shape) < 0.3
    masked[hide & (masked == 0)] = -1
    assert _same(partition_heterogeneity(masked, 10, 0.6, seed=2),
                 partition_heterogeneity(scene_labels, 10, 0.6, seed=2))


def test_t0_is_near_uniform(scene_labels):
    parts = partition_heterogeneity(scene_labels, 10, 0.0, seed=0)
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() > 220 and sizes.max() < 380             # 300 +- ~5 sd
    overall = scene_labels.sum(0) / scene_labels.sum()
    for p in parts:
        dist = scene_labels[p].sum(0) / scene_labels[p].sum()
        assert np.abs(dist - overall).max() < 0.035
    assert label_distribution_js(scene_labels, parts) < 0.15


def test_js_rises_monotonically_with_t(scene_labels):
    js = [label_distribution_js(scene_labels, partition_heterogeneity(scene_labels, 10, t, 0))
          for t in TS]
    assert all(b > a + 0.05 for a, b in zip(js, js[1:])), js
    assert js[0] < 0.15 and js[-1] > 0.6, js


def test_dirichlet_small_alpha_is_more_skewed():
    y = np.random.default_rng(0).integers(0, 10, 5000)
    js = {a: label_distribution_js(y, partition_dirichlet(y, 10, a, seed=0))
          for a in (0.1, 1.0, 100.0)}
    assert js[0.1] > js[1.0] + 0.1 > js[100.0] + 0.2, js
    assert js[100.0] < 0.1


def test_label_distribution_js_known_values():
    multi = np.array([[1, 0], [1, 0], [0, 1], [0, 1]])
    assert label_distribution_js(multi, [np.array([0, 1]), np.array([2, 3])]) == pytest.approx(1.0)
    assert label_distribution_js(multi, [np.array([0, 2]), np.array([1, 3])]) == pytest.approx(0.0)
    # empty clients are skipped; single-label agrees with its one-hot form
    single = np.array([0, 0, 1, 1, 2, 2])
    parts = [np.array([0, 2]), np.array([], np.int64), np.array([1, 4, 5]), np.array([3])]
    onehot = np.eye(3, dtype=np.uint8)[single]
    a = label_distribution_js(single, parts)
    assert a == pytest.approx(label_distribution_js(onehot, parts))
    p = [np.array([.5, .5, 0]), np.array([1 / 3, 0, 2 / 3]), np.array([0, 1, 0])]
    from scipy.spatial.distance import jensenshannon
    expect = np.mean([jensenshannon(p[i], p[j], base=2) for i, j in ((0, 1), (0, 2), (1, 2))])
    assert a == pytest.approx(expect)
    assert label_distribution_js(single, [np.arange(6)]) == 0.0


def test_scales_to_many_clients():
    rng = np.random.default_rng(0)
    labels = (rng.random((60_000, 80)) < 0.04).astype(np.uint8)
    parts = partition_heterogeneity(labels, 200, 0.9, seed=0)
    _exact_cover(parts, 60_000, 200)
    assert sum(len(p) > 0 for p in parts) == 200


@pytest.mark.parametrize("call, word", [
    (lambda L: partition_heterogeneity(L, 10, 1.5, 0), "heterogeneity t"),
    (lambda L: partition_heterogeneity(L, 10, -0.1, 0), "heterogeneity t"),
    (lambda L: partition_heterogeneity(L, 0, 0.5, 0), "num_clients"),
    (lambda L: partition_heterogeneity(L, 101, 0.5, 0), "num_clients"),
    (lambda L: partition_heterogeneity(L[:, 0], 10, 0.5, 0), "labels"),
    (lambda L: partition_dirichlet(L.argmax(1), 10, 0.0, 0), "alpha"),
    (lambda L: partition_dirichlet(L.argmax(1), 2.5, 1.0, 0), "num_clients"),
    (lambda L: partition_dirichlet(L.astype(float), 10, 1.0, 0), "labels"),
    (lambda L: partition_iid(-1, 10, 0), "num_samples"),
    (lambda L: partition_iid(100, 0, 0), "num_clients"),
])
def test_bad_arguments(call, word):
    labels = np.eye(4, dtype=np.uint8)[np.arange(100) % 4]
    with pytest.raises(ValueError, match=word):
        call(labels)
