"""Server-side aggregation rules: small, pure functions over state dicts (Flower's aggregate.py style).

Updates are always given in sorted client-id order and summed in float64, so the result does
not depend on which worker produced which update or in what order they arrived. Every rule
takes `(states, num_samples, *, generator, **options)`: `generator` is the round's own seeded
stream (for rules that draw, like the Hungarian clustering), `options` come from the method.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

State = dict[str, torch.Tensor]


def weighted_average(states: Sequence[State], weights: Sequence[float]) -> State:
    """sum_k w_k * state_k / sum_k w_k, key by key (FedAvg with w_k = |D_k|)."""
    if not states:
        raise ValueError("weighted_average: no states to aggregate")
    total = float(sum(weights))
    if total <= 0:
        raise ValueError(f"weighted_average: weights must sum to > 0, got {list(weights)}")
    out = {}
    for key, first in states[0].items():
        acc = torch.zeros(first.shape, dtype=torch.float64)
        for state, weight in zip(states, weights):
            acc += state[key].double() * (weight / total)
        out[key] = acc.to(first.dtype)
    return out


def fedavg(states: Sequence[State], num_samples: Sequence[int], **_) -> State:
    """FedAvg: the average weighted by client data size."""
    return weighted_average(states, num_samples)


def uniform_average(states: Sequence[State], num_samples: Sequence[int], **_) -> State:
    """The unweighted mean, as in the FedMPT/FedTPG servers."""
    return weighted_average(states, [1.0] * len(states))


def _hungarian(states: Sequence[State], num_samples: Sequence[int], **options) -> State:
    from fedvlp.platform.clustering import hungarian_cluster  # scipy and the clustering nets load on use

    return hungarian_cluster(states, num_samples, **options)


AGGREGATORS: dict[str, Callable[..., State]] = {
    "fedavg": fedavg,
    "mean": uniform_average,
    "hungarian": _hungarian,   # FED-PRIME's constrained clustering of prompt pools (clustering.py)
}


def state_nbytes(state: State) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())
