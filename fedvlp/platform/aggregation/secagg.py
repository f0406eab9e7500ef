"""Secure aggregation by pairwise masking (Bonawitz et al., 2017, "Practical Secure Aggregation for
Privacy-Preserving Machine Learning"), simulated in one process.

Every client of the cohort quantises its weighted update to fixed point (FRACTION_BITS fraction bits, round to
nearest) in the ring Z_{2^64} (numpy uint64, whose arithmetic wraps) and adds, for every other cohort member j,
a pairwise mask expanded from a seed s_ij the two of them share: client i ADDS PRG(s_ij) for j > i and
SUBTRACTS PRG(s_ji) for j < i. Summed over the cohort every mask appears once with each sign and cancels
EXACTLY, so the server's sum is the exact sum of the quantised updates. When clients drop out after masking,
the server removes the masks the survivors added for them, from the dropped clients' seeds.

What this protects: the coordinator only ever sees individual clients' masked vectors, each uniformly random
over the ring on its own (its masks are uniform and independent of the update), and the sum of the delivered
updates; it never holds one client's update in the clear.

What it does not (this is a simulation in ONE trust domain):

* the same process derives every seed from the run seed (`fedvlp.seeding`, stream "secagg"): there is no
  Diffie-Hellman key agreement, no Shamir secret sharing of the seeds (the real server reconstructs a dropped
  client's seeds from t shares held by the survivors), no authentication and no encryption of the shares;
* the paper's second, self mask b_i (double masking) is omitted, so a client whose vector arrives after the
  server has recovered its pairwise seeds would be exposed; the real protocol prevents that;
* no protection against an actively malicious server or colluding clients (in the paper the secret-sharing
  threshold t must exceed the number of corrupt parties, and against an active server t > 2n/3);
* the clients' weights (e.g. sample counts) are handed to the server in the clear to normalise the sum;
* fixed point: the quantisation error is at most half a step, 2^-(FRACTION_BITS + 1), per coordinate per
  client (`TOLERANCE`), and a weighted value or a sum beyond +-2^(63 - FRACTION_BITS) wraps around the ring
  (quantise refuses single values beyond it; an overflowing sum cannot be detected).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch

from fedvlp.seeding import numpy_rng

State = dict[str, torch.Tensor]
Layout = tuple[tuple[str, tuple[int, ...], torch.dtype], ...]  # (key, shape, dtype), keys sorted

FRACTION_BITS = 24
SCALE = 2 ** FRACTION_BITS
TOLERANCE = 2.0 ** -(FRACTION_BITS + 1)  # rounding to nearest: the error of one quantised coordinate
LIMIT = 2.0 ** (63 - FRACTION_BITS)  # |value| below which a quantised value fits the signed ring


# ---------------------------------------------------------------- flat vectors

def flatten(state: State) -> tuple[np.ndarray, Layout]:
    """The state's parameters as one float64 vector, keys in sorted order, and the layout to undo it."""
    keys = sorted(state)
    layout = tuple((key, tuple(state[key].shape), state[key].dtype) for key in keys)
    parts = [state[key].detach().to(torch.float64).reshape(-1).cpu().numpy() for key in keys]
    return (np.concatenate(parts) if parts else np.zeros(0)), layout


def layout_size(layout: Layout) -> int:
    return sum(int(np.prod(shape, dtype=np.int64)) for _, shape, _ in layout)


def unflatten(vector: np.ndarray, layout: Layout, dtype: torch.dtype | None = None) -> State:
    """The state `flatten` made `vector` of: each key back to its shape, in its own dtype (or `dtype`)."""
    if len(vector) != layout_size(layout):
        raise ValueError(f"unflatten: vector has {len(vector)} values, layout needs {layout_size(layout)}")
    out, start = {}, 0
    for key, shape, own_dtype in layout:
        size = int(np.prod(shape, dtype=np.int64))
        part = torch.from_numpy(np.asarray(vector[start:start + size], dtype=np.float64).copy()).reshape(shape)
        out[key] = part.to(dtype or own_dtype)
        start += size
    return out


# ---------------------------------------------------------------- fixed point in Z_{2^64}

def quantise(vector: np.ndarray) -> np.ndarray:
    """round(vector * SCALE) as a ring element (two's complement int64 viewed as uint64)."""
    vector = np.asarray(vector, dtype=np.float64)
    if not np.isfinite(vector).all():
        raise ValueError("quantise: vector has non-finite values")
    if vector.size and np.abs(vector).max() >= LIMIT:
        raise ValueError(f"quantise: vector has values beyond +-2^{63 - FRACTION_BITS}, the fixed-point range")
    return np.rint(vector * SCALE).astype(np.int64).view(np.uint64)


def dequantise(ring: np.ndarray) -> np.ndarray:
    """The ring elements read as signed fixed-point numbers, in float64."""
    return ring.view(np.int64).astype(np.float64) / SCALE


# ---------------------------------------------------------------- pairwise masks

def pair_seed(seed: int, round_index: int, i: int, j: int) -> int:
    """The 128-bit seed s_ij the pair {i, j} shares this round (key agreement in the real protocol)."""
    i, j = min(i, j), max(i, j)
    low, high = numpy_rng(seed, "secagg", round_index, i, j).integers(0, 2 ** 64, size=2, dtype=np.uint64)
    return int(low) | int(high) << 64


def prg(pair: int, size: int) -> np.ndarray:
    """PRG(s): `size` uniform ring elements expanded from seed s (numpy's PCG64)."""
    return np.random.default_rng(pair).integers(0, 2 ** 64, size=size, dtype=np.uint64)


def _mask_of(client: int, other: int, seed: int, round_index: int, size: int) -> np.ndarray:
    """The mask `client` adds for `other`: +PRG(s) if other > client, else -PRG(s) (mod 2^64)."""
    values = prg(pair_seed(seed, round_index, client, other), size)
    return values if other > client else np.negative(values)  # uint64 negation is 2^64 - x: exact in the ring


def _check_cohort(cohort: Iterable[int]) -> list[int]:
    cohort = [int(c) for c in cohort]
    if len(set(cohort)) != len(cohort):
        raise ValueError(f"cohort has repeated clients: {cohort}")
    return cohort


def mask(update: State, weight: float, client: int, cohort: Sequence[int], seed: int, round_index: int) -> np.ndarray:
    """What `client` sends the server: quantise(weight * update) plus its pairwise masks with every other member
    of `cohort` (uint64, one per coordinate of `flatten(update)`)."""
    cohort = _check_cohort(cohort)
    if client not in cohort:
        raise ValueError(f"mask: client {client} is not in the cohort {cohort}")
    vector, _ = flatten(update)
    masked = quantise(float(weight) * vector)
    for other in cohort:
        if other != client:
            masked += _mask_of(client, other, seed, round_index, len(masked))
    return masked


def unmask_sum(masked: Mapping[int, np.ndarray], cohort: Sequence[int], seed: int, round_index: int,
               layout: Layout) -> State:
    """The server's side: the plain weighted sum (float64 State) of the updates of the clients that delivered
    (the keys of `masked`). The survivors' masks among themselves cancel in the ring sum; for every survivor i
    and dropped client d the server recovers s_id (in the real protocol by reconstructing d's secret from the
    Shamir shares the survivors hold) and removes the mask i added for d.

    The real protocol needs at least t survivors, t the threshold of its Shamir secret sharing (chosen above the
    number of corrupt parties); this simulation takes t = 2, the least for which the sum is not one update."""
    cohort = _check_cohort(cohort)
    survivors = sorted(int(c) for c in masked)
    if strangers := sorted(set(survivors) - set(cohort)):
        raise ValueError(f"masked: clients {strangers} are not in the cohort {cohort}")
    if len(survivors) < 2:
        raise ValueError(f"masked: {len(survivors)} client(s) delivered; secure aggregation needs at least 2")
    size = layout_size(layout)
    total = np.zeros(size, dtype=np.uint64)
    for client in survivors:
        if masked[client].dtype != np.uint64 or masked[client].shape != (size,):
            raise ValueError(f"masked[{client}]: expected {size} uint64 values, got {masked[client].shape} "
                             f"{masked[client].dtype}")
        total += masked[client]
    dropped = [c for c in cohort if c not in set(survivors)]
    for client in survivors:
        for other in dropped:
            total -= _mask_of(client, other, seed, round_index, size)
    return unflatten(dequantise(total), layout, torch.float64)


def secure_weighted_average(updates: Mapping[int, State], weights: Mapping[int, float], cohort: Sequence[int],
                            seed: int, round_index: int, delivered: set[int] | None = None) -> State:
    """sum_k w_k update_k / sum_k w_k over the delivered clients (default: all of `updates`), end to end: each
    client masks its weighted update, the server unmasks the sum of those that reached it and divides by their
    total weight. Clients of the cohort missing from `updates` or from `delivered` dropped out; the masks the
    others added for them are removed. (Only delivered vectors are computed: the others never reach the server,
    so masking them changes nothing.) The result is in each parameter's dtype."""
    cohort = _check_cohort(cohort)
    delivered = set(updates) if delivered is None else {int(c) for c in delivered}
    if missing := sorted(delivered - set(updates)):
        raise ValueError(f"delivered: clients {missing} have no update")
    if strangers := sorted(set(updates) - set(cohort)):
        raise ValueError(f"updates: clients {strangers} are not in the cohort {cohort}")
    if len(delivered) < 2:
        raise ValueError(f"delivered: {len(delivered)} client(s) delivered; secure aggregation needs at least 2")
    total_weight = float(sum(weights[c] for c in delivered))
    if not total_weight > 0:
        raise ValueError(f"weights: the delivered clients' weights must sum to > 0, got {total_weight}")
    layout = flatten(updates[min(delivered)])[1]
    masked = {}
    for client in sorted(delivered):
        if flatten(updates[client])[1] != layout:
            raise ValueError(f"updates[{client}]: keys, shapes or dtypes differ from the other clients'")
        masked[client] = mask(updates[client], weights[client], client, cohort, seed, round_index)
    total = unmask_sum(masked, cohort, seed, round_index, layout)
    return {key: (total[key] / total_weight).to(dtype) for key, _, dtype in layout}
