"""The rule "hungarian": FED-PRIME's constrained clustering of prompt pools (`prompt_clustering.cluster_pool`) as
a server rule, and as a one-round aggregator of whole states (`hungarian_cluster`).

Imports without torch: the clustering (torch, scipy) is imported as the rule runs.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from fedvlp.platform.aggregation.rules import ServerRule, register_rule
from fedvlp.spec import spec_field

if TYPE_CHECKING:
    import torch

    from fedvlp.platform.aggregation.rules import State


@dataclass(frozen=True)
class HungarianOptions:
    outer_loops: int = spec_field(5, "alternations of Adam steps and Hungarian matching", ge=1)
    lr: float = spec_field(1e-3, "Adam learning rate of the centroids and networks", gt=0)
    hidden: int = spec_field(128, "width of the scale and popularity networks", ge=1)
    prompts: Literal["selected", "all"] = spec_field(
        "selected", "cluster the prompts the clients selected this round (the reference), or every prompt")
    keep: Literal["used", "top"] = spec_field(
        "used", "every used centroid becomes a prompt (the paper; bounded by max_pool), or the pool_size most used")
    pool_size: int | None = spec_field(None, "the method's pool size tau (null: the size the clients sent)", ge=1)
    max_pool: int | None = spec_field(None, "keep=used: the most prompts the pool may grow to (null: 4 tau)", ge=1)
    schedule: Literal["batched", "per_client"] = spec_field(
        "batched", "one Adam step per outer loop on all clients' objective, or one per client (the reference)")


SELECTED = "selected"  # beside a pool "<module>.prompts", "<module>.selected" masks the prompts a client used


def _mask_key(key: str) -> str:
    module, _, _ = key.rpartition(".")
    return f"{module}.{SELECTED}" if module else SELECTED


def _hungarian(states: Sequence[State], num_samples: Sequence[int], previous: State, state: dict,
               generator: torch.Generator, options: HungarianOptions) -> tuple[State, dict, dict]:
    """Every pool key is clustered (`prompt_clustering.cluster_pool`); a "<module>.selected" mask beside a pool
    "<module>.prompts" says which of its prompts each client selected (a float 0/1 vector), and comes back
    zeroed at the new pool's size. Returns the diagnostics of every pool, to log each round. The rule's state
    carries each pool's popularity network and its Adam moments from round to round ({key: tensors})."""
    from fedvlp.platform.aggregation.prompt_clustering import cluster_pool  # scipy and the clustering nets load on use

    out, metrics, popularity = {}, {}, {}
    for key in (k for k in states[0] if k.rpartition(".")[2] != SELECTED):
        mask = _mask_key(key)
        masks = [s[mask] > 0 for s in states] if mask in states[0] else None
        update = cluster_pool([s[key] for s in states], generator, selected=masks, prompts=options.prompts,
                              keep=options.keep, pool_size=options.pool_size, max_pool=options.max_pool,
                              previous=previous.get(key), outer_loops=options.outer_loops, lr=options.lr,
                              hidden=options.hidden, schedule=options.schedule, popularity=state.get(key))
        out[key] = update.prompts
        popularity[key] = update.clustering.popularity_state
        if masks is not None:
            out[mask] = states[0][mask].new_zeros(len(update.prompts))
        metrics.update({f"{key}/{name}": value for name, value in update.diagnostics.items()})
    return out, popularity, metrics


register_rule(ServerRule("hungarian", "custom", _hungarian, options=HungarianOptions,
                         doc="FED-PRIME's constrained clustering of prompt pools "
                             "(fedvlp.platform.aggregation.prompt_clustering)"))


def hungarian_cluster_report(states: Sequence[State], num_samples: Sequence[int], *, generator: torch.Generator,
                             keep: str = "top", previous: State | None = None,
                             **options) -> tuple[State, dict[str, float]]:
    """``hungarian_cluster`` and the diagnostics of every key, as ``{f"{key}/{name}": value}``
    (``pool_diagnostics``), for the coordinator to log each round. ``previous``: the old global state."""
    from fedvlp.platform.aggregation.prompt_clustering import cluster_pool  # scipy and the clustering nets load on use

    if not states:
        raise ValueError("hungarian_cluster: no states to aggregate")
    if len(num_samples) != len(states):
        raise ValueError(f"hungarian_cluster: {len(states)} states but {len(num_samples)} sample counts")
    out, report = {}, {}
    for key, first in states[0].items():
        if first.dim() < 1 or first.shape[0] < 1:
            raise ValueError(f"hungarian_cluster: {key!r} is not a pool [tau, ...], got {tuple(first.shape)}")
        update = cluster_pool([state[key] for state in states], generator, keep=keep,
                              previous=None if previous is None else previous[key], **options)
        out[key] = update.prompts
        report.update({f"{key}/{name}": value for name, value in update.diagnostics.items()})
    return out, report


def hungarian_cluster(states: Sequence[State], num_samples: Sequence[int], *, generator: torch.Generator,
                      keep: str = "top", **options) -> State:
    """FED-PRIME's inter-client prompt aggregation as a platform aggregator (``cluster_pool`` on every key).

    Every key holds one prompt pool per client, [tau, D] (or [tau, ...]). Options are ``cluster_pool``'s
    (``selected``, ``prompts``, ``pool_size``, ``max_pool``, ``outer_loops``, ``lr``, ``hidden``, ``schedule``);
    this is one round with a fresh popularity network (the platform's rule "hungarian" carries it). ``keep``
    defaults to 'top' here, not to the reference's 'used': with it (and no ``selected``) the result has the
    same keys and shapes as the input, which is what the platform's methods can load until they rebuild
    their pool from a state of another size.

    ``num_samples`` is accepted for the common aggregator signature and not used: the reference does
    not weight the clustering by client data size. Keys are processed in the order of ``states[0]``,
    all drawing from ``generator``.
    """
    return hungarian_cluster_report(states, num_samples, generator=generator, keep=keep, **options)[0]
