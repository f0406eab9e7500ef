"""Client partitioners (docs/architecture.md, "Shared definitions"), their registry, and the heterogeneity figure.

All draws come from ``numpy_rng(seed, "partition")``. Every partitioner returns one sorted
int64 index array per client; together they hold every sample exactly once.

``partition_heterogeneity`` clusters label sets with k-means (k-means++ seeding, at most
``KMEANS_ITERS`` Lloyd iterations, an empty cluster keeps its previous centre, as
``scipy.cluster.vq.kmeans2(..., minit="++")`` does). It is run on the *distinct* label rows
weighted by how often each occurs, which is the same k-means problem as on all rows (identical
rows always share a cluster), with BLAS distances. ``kmeans2`` itself is not used: its ++
seeding costs O(k^2 n d) and its assignment step is not BLAS, which rules out 1,000,000 x 80
labels for 1,000 clients. Seeding uses an i.i.d. sample of at most ``KMEANS_INIT_SAMPLE`` rows
when there are more rows than that.
"""
from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import sparse
from scipy.spatial.distance import jensenshannon

from fedvlp.registry import Registry
from fedvlp.seeding import numpy_rng

KMEANS_ITERS = 10
KMEANS_INIT_SAMPLE = 50_000
_CHUNK_ELEMENTS = 1 << 22        # rows x clusters per distance block


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_clients(num_clients, num_samples: int) -> int:
    k = _check_int("num_clients", num_clients, 1)
    if k > num_samples:
        raise ValueError(f"num_clients must not exceed the number of samples ({num_samples}), "
                         f"got {k}")
    return k


def _group(client: np.ndarray, num_clients: int) -> list[np.ndarray]:
    order = np.argsort(client, kind="stable").astype(np.int64)
    return np.split(order, np.cumsum(np.bincount(client, minlength=num_clients))[:-1])


def partition_iid(num_samples: int, num_clients: int, seed: int) -> list[np.ndarray]:
    """Shuffle and cut into ``num_clients`` parts whose sizes differ by at most one."""
    n = _check_int("num_samples", num_samples, 0)
    k = _check_clients(num_clients, n)
    perm = numpy_rng(seed, "partition").permutation(n)
    return [np.sort(p).astype(np.int64) for p in np.array_split(perm, k)]


def partition_dirichlet(labels: np.ndarray, num_clients: int, alpha: float,
                        seed: int) -> list[np.ndarray]:
    """Single-label partition: per class, client shares ~ Dir(alpha) over that class's
    shuffled samples (classes in increasing order, one shuffle and one Dirichlet draw each)."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or (labels.size and (not np.issubdtype(labels.dtype, np.integer)
                                             or labels.min() < 0)):
        raise ValueError(f"labels must be a 1-D array of non-negative class ids, got "
                         f"dtype {labels.dtype} shape {labels.shape}")
    k = _check_clients(num_clients, len(labels))
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) \
            or not np.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"dirichlet alpha must be a positive finite number, got {alpha!r}")
    rng = numpy_rng(seed, "partition")
    client = np.empty(len(labels), np.int64)
    by_class = np.argsort(labels, kind="stable")
    counts = np.bincount(labels, minlength=0) if labels.size else np.zeros(0, np.int64)
    for idx in np.split(by_class, np.cumsum(counts)[:-1]):
        if not len(idx):
            continue
        idx = rng.permutation(idx)
        shares = rng.dirichlet(np.full(k, float(alpha)))
        cuts = np.rint(np.cumsum(shares)[:-1] * len(idx)).astype(np.int64)
        client[idx] = np.searchsorted(cuts, np.arange(len(idx)), side="right")
    return _group(client, k)


def partition_heterogeneity(labels: np.ndarray, num_clients: int, t: float,
                            seed: int) -> list[np.ndarray]:
    """Multi-label partition: k-means on L2-normalised label rows into ``num_clients``
    clusters; each sample goes to its cluster's client with probability ``t``, else to a
    uniformly random client. ``labels`` entries > 0 are positives; 0 and -1 (unknown) are not."""
    labels = np.asarray(labels)
    if labels.ndim != 2 or labels.shape[1] < 1:
        raise ValueError(f"labels must be a 2-D multi-hot array [n, C], got shape {labels.shape}")
    n = labels.shape[0]
    k = _check_clients(num_clients, n)
    if isinstance(t, bool) or not isinstance(t, numbers.Real) or not 0 <= t <= 1:
        raise ValueError(f"heterogeneity t must be in [0, 1], got {t!r}")
    rng = numpy_rng(seed, "partition")
    positive = labels > 0
    packed = np.packbits(positive, axis=1)
    rows, inverse, weight = np.unique(
        np.ascontiguousarray(packed).view(np.dtype((np.void, packed.shape[1]))).ravel(),
        return_inverse=True, return_counts=True)
    unique = np.unpackbits(rows.view(np.uint8).reshape(len(rows), -1), axis=1,
                           count=labels.shape[1]).astype(np.float64)
    unique /= np.maximum(np.sqrt(unique.sum(1, keepdims=True)), 1e-12)
    cluster = _weighted_kmeans(unique, weight.astype(np.float64), k, rng)[inverse.ravel()]
    follow = rng.random(n) < t
    random_client = rng.integers(0, k, n)
    return _group(np.where(follow, cluster, random_client), k)


def _nearest(x: np.ndarray, centres: np.ndarray) -> np.ndarray:
    half_sq = 0.5 * np.einsum("ij,ij->i", centres, centres)
    out = np.empty(len(x), np.int64)
    step = max(1, _CHUNK_ELEMENTS // len(centres))
    for s in range(0, len(x), step):
        out[s:s + step] = np.argmin(half_sq - x[s:s + step] @ centres.T, axis=1)
    return out


def _weighted_kmeans(x: np.ndarray, w: np.ndarray, k: int,
                     rng: np.random.Generator) -> np.ndarray:
    """Cluster of each row of ``x`` (row i standing for ``w[i]`` samples)."""
    # k-means++ seeding, on an i.i.d. sample of the samples when there are many.
    total = w.sum()
    if total > KMEANS_INIT_SAMPLE:
        draw = np.searchsorted(np.cumsum(w), rng.random(KMEANS_INIT_SAMPLE) * total,
                               side="right")
        cand, cw = np.unique(np.minimum(draw, len(w) - 1), return_counts=True)
        pool, pw = x[cand], cw.astype(np.float64)
    else:
        pool, pw = x, w
    sq = np.einsum("ij,ij->i", pool, pool)
    centres = np.empty((k, x.shape[1]))
    d2 = np.full(len(pool), np.inf)
    for i in range(k):
        p = pw if i == 0 else pw * d2
        cdf = np.cumsum(p)
        if cdf[-1] > 0:
            j = min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")),
                    len(pool) - 1)
        else:                     # fewer distinct rows than clusters: repeat a random one
            j = int(rng.integers(0, len(pool)))
        centres[i] = pool[j]
        d2 = np.minimum(d2, np.maximum(sq - 2 * pool @ pool[j] + sq[j], 0.0))
    # Lloyd iterations; an empty cluster keeps its previous centre.
    assign = _nearest(x, centres)
    for _ in range(KMEANS_ITERS - 1):
        member = sparse.csr_matrix((w, (assign, np.arange(len(x)))), shape=(k, len(x)))
        mass = np.asarray(member.sum(1)).ravel()
        filled = mass > 0
        centres[filled] = (member @ x)[filled] / mass[filled, None]
        new = _nearest(x, centres)
        if np.array_equal(new, assign):
            break
        assign = new
    return assign


def label_distribution_js(labels: np.ndarray, parts: list[np.ndarray]) -> float:
    """Mean pairwise Jensen-Shannon distance (base 2, in [0, 1]) between the clients' label
    distributions (class counts normalised; multi-hot [n, C] counts entries > 0, single-label
    [n] uses max+1 classes). Clients with no labels are skipped; 0.0 if fewer than two remain."""
    labels = np.asarray(labels)
    if labels.ndim == 2:
        onehot = labels > 0
    elif labels.ndim == 1:
        if labels.size and (not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0):
            raise ValueError(f"labels must hold non-negative class ids, got dtype {labels.dtype}")
        c = int(labels.max()) + 1 if labels.size else 0
        onehot = np.zeros((len(labels), c), bool)
        onehot[np.arange(len(labels)), labels] = True
    else:
        raise ValueError(f"labels must be [n] class ids or [n, C] multi-hot, "
                         f"got shape {labels.shape}")
    counts = np.stack([onehot[np.asarray(p, np.int64)].sum(0) for p in parts]) if parts \
        else np.zeros((0, onehot.shape[1]))
    dist = counts[counts.sum(1) > 0].astype(np.float64)
    m = len(dist)
    if m < 2:
        return 0.0
    dist /= dist.sum(1, keepdims=True)
    total = 0.0
    step = max(1, _CHUNK_ELEMENTS // (m * dist.shape[1]))
    for s in range(0, m - 1, step):
        block = jensenshannon(dist[s:s + step, None, :], dist[None, :, :], base=2, axis=2)
        rows = np.arange(s, min(s + step, m))[:, None]
        upper = np.arange(m)[None, :] > rows
        total += np.nan_to_num(block, nan=0.0)[upper].sum()   # nan only from -0 rounding
    return float(total / (m * (m - 1) / 2))


# ---------------------------------------------------------------- the registry

@dataclass(frozen=True)
class Partitioner:
    """A named client partition rule: `split(labels, num_clients, seed, federation) -> one index array per client`.

    `labels` are multi-hot [n, C] (entries > 0 positive) or class ids [n]; `federation` is the run's
    FederationSpec (its `partition_options` are the rule's own, a dataclass of `options` when declared).
    `labels` says which data it takes: "any", "multilabel" or "single"."""
    name: str
    split: Callable[..., list[np.ndarray]]
    labels: Literal["any", "multilabel", "single"] = "any"
    options: type | None = None
    doc: str = ""


def _check_partitioner(name: str, partitioner: Partitioner) -> None:
    if not isinstance(partitioner, Partitioner) or partitioner.name != name or not callable(partitioner.split):
        raise TypeError(f"partitioner {name!r}: register a Partitioner named {name!r} with a split function")
    if partitioner.labels not in ("any", "multilabel", "single"):
        raise ValueError(f"partitioner {name!r}: labels must be any, multilabel or single")


PARTITIONERS: Registry[Partitioner] = Registry("partitioner", "federation.partition", _check_partitioner)


def register_partitioner(partitioner: Partitioner) -> Partitioner:
    return PARTITIONERS.add(partitioner.name, partitioner)


def _one_hot(labels: np.ndarray) -> np.ndarray:
    return labels if labels.ndim == 2 else np.eye(labels.max() + 1, dtype=np.int8)[labels]


register_partitioner(Partitioner(
    "iid", lambda labels, k, seed, fed: partition_iid(len(labels), k, seed), "any",
    doc="shuffle and cut into equal parts"))
register_partitioner(Partitioner(
    "dirichlet", lambda labels, k, seed, fed: partition_dirichlet(labels, k, fed.dirichlet_alpha, seed), "single",
    doc="per class, client shares ~ Dir(federation.dirichlet_alpha)"))
register_partitioner(Partitioner(
    "heterogeneity", lambda labels, k, seed, fed: partition_heterogeneity(_one_hot(labels), k, fed.heterogeneity, seed),
    "any", doc="k-means label clusters, each sample to its cluster's client with probability federation.heterogeneity"))
