"""Server rules: how the coordinator turns the cohort's updates of a parameter group into the next global state.

Every rule is a `ServerRule` registered by name in `RULES` (plugins register theirs the same way). Two kinds:

* **average** rules start from the cohort's weighted average (FedAvg weights: the clients' sample counts;
  or uniform) and then take a server step `step(previous, average, state, options) -> (new, state)`:
  plain FedAvg returns the average; the server optimisers of Reddi et al. (2021) treat
  delta = average - previous as a pseudo-gradient and keep moments in `state`, which the coordinator
  carries between rounds and writes into every checkpoint (so a resumed run stays bitwise identical).
  Because the average is taken by the coordinator, client-level privacy and secure aggregation
  (`fedvlp.platform.privacy`) apply to every average rule alike.
* **custom** rules see the clients' states themselves: `combine(states, num_samples, previous, state,
  generator, options) -> (new, state)` (FED-PRIME's Hungarian clustering).

Updates always come in sorted client-id order and are summed in float64, so the result does not depend
on which worker produced which update or in what order they arrived. Options are a frozen dataclass
per rule (`options`), validated when the config is built (`server.options.<rule>.<key>`).

The registry imports without torch (the config and a run's driver read it); the rules import torch as they run.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fedvlp.registry import Registry
from fedvlp.spec import spec_field

if TYPE_CHECKING:
    import torch

    State = dict[str, torch.Tensor]
LOCAL = "local"  # the rule of parameters that never leave their client (the coordinator keeps them per client)


@dataclass(frozen=True)
class ServerRule:
    """A named server rule (see the module docstring for the two kinds)."""
    name: str
    kind: Literal["average", "custom"]
    run: Callable[..., tuple]  # (new, state) or (new, state, diagnostics); see apply_rule
    weighting: Literal["samples", "uniform"] = "samples"  # average rules: FedAvg weights or the plain mean
    options: type | None = None  # frozen dataclass of the rule's options, or None
    doc: str = ""


def _check_rule(name: str, rule: ServerRule) -> None:
    if not isinstance(rule, ServerRule) or rule.name != name:
        raise TypeError(f"server rule {name!r}: register a ServerRule whose name is {name!r}")
    if rule.kind not in ("average", "custom") or rule.weighting not in ("samples", "uniform"):
        raise ValueError(f"server rule {name!r}: kind must be average or custom, weighting samples or uniform")
    if name == LOCAL:
        raise ValueError(f"server rule {LOCAL!r} is reserved for parameters that stay on their client")


RULES: Registry[ServerRule] = Registry("server rule", "server.rules", _check_rule)


def register_rule(rule: ServerRule) -> ServerRule:
    return RULES.add(rule.name, rule)


def weighted_average(states: Sequence[State], weights: Sequence[float]) -> State:
    """sum_k w_k * state_k / sum_k w_k, key by key, in float64 (FedAvg with w_k = |D_k|)."""
    import torch

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


def rule_weights(rule: ServerRule, num_samples: Sequence[int]) -> list[float]:
    return [float(n) for n in num_samples] if rule.weighting == "samples" else [1.0] * len(num_samples)


# ---------------------------------------------------------------- plain averages

def _keep_average(previous: State, average: State, state: dict, options) -> tuple[State, dict]:
    return average, state


register_rule(ServerRule("fedavg", "average", _keep_average, "samples",
                         doc="FedAvg: the average weighted by client data size"))
register_rule(ServerRule("mean", "average", _keep_average, "uniform",
                         doc="the unweighted mean over the cohort (the FedMPT and FedTPG servers)"))


# ---------------------------------------------------------------- server optimisers (Reddi et al., 2021)

@dataclass(frozen=True)
class FedAvgMOptions:
    lr: float = spec_field(1.0, "server learning rate eta", gt=0)
    momentum: float = spec_field(0.9, "server momentum beta", ge=0, lt=1)


@dataclass(frozen=True)
class FedOptOptions:
    """Options of fedadagrad, fedadam and fedyogi; `variant` picks Reddi et al.'s algorithm or Flower's numbers."""
    lr: float = spec_field(0.01, "server learning rate eta", gt=0)
    beta1: float = spec_field(0.9, "first-moment decay beta_1 (FedAdagrad with variant=flower: 0)", ge=0, lt=1)
    beta2: float = spec_field(0.99, "second-moment decay beta_2 (FedAdam, FedYogi)", ge=0, lt=1)
    tau: float = spec_field(1e-3, "adaptivity tau: added to sqrt(v); v starts at tau^2 (variant=flower: at 0)", gt=0)
    variant: Literal["reddi", "flower"] = spec_field(
        "reddi", "reddi: Algorithm 2 of Reddi et al. (2021); flower: the numbers of Flower's strategy of the same "
        "name (v starts at 0, FedAdam bias-corrects eta, FedAdagrad has beta_1 = 0), for settings ported from Flower")


def _moments(state: dict, previous: State, names: Sequence[str], start: float) -> dict[str, State]:
    """The state's moment tensors, started (float64, shaped like the parameters) on the first round."""
    import torch

    return {name: state.get(name) or {k: torch.full(p.shape, start, dtype=torch.float64) for k, p in previous.items()}
            for name in names}


def _fedavgm(previous: State, average: State, state: dict, options: FedAvgMOptions) -> tuple[State, dict]:
    """FedAvgM (Hsu et al., 2019): v = beta v + delta; x = x + eta v, with delta = average - x."""
    velocity = _moments(state, previous, ["velocity"], 0.0)["velocity"]
    new, new_velocity = {}, {}
    for key, x in previous.items():
        delta = average[key].double() - x.double()
        new_velocity[key] = options.momentum * velocity[key] + delta
        new[key] = (x.double() + options.lr * new_velocity[key]).to(x.dtype)
    return new, {"velocity": new_velocity}


def _fedopt(second_moment: Callable[[torch.Tensor, torch.Tensor, FedOptOptions], torch.Tensor], *,
            flower_bias_correction: bool = False, flower_beta1: float | None = None):
    """FedAdagrad / FedAdam / FedYogi (Reddi et al., 2021, Algorithm 2): with delta = average - x,
    m = beta_1 m + (1 - beta_1) delta; v = second_moment(v, delta); x = x + eta m / (sqrt(v) + tau).
    m starts at 0 and v at tau^2 (the paper's v_{-1} >= tau^2); no bias correction, as in the paper.

    variant=flower follows Flower's strategies (flwr 1.42) instead: v starts at 0; FedAdam scales eta by
    sqrt(1 - beta_2^(t+1)) / (1 - beta_1^(t+1)) with t the step from 1 (Flower's server_round: its exponent is
    one ahead of Kingma & Ba's); FedAdagrad takes beta_1 = 0. The state then also keeps the step count."""
    def step(previous: State, average: State, state: dict, options: FedOptOptions) -> tuple[State, dict]:
        flower = options.variant == "flower"
        beta1 = flower_beta1 if flower and flower_beta1 is not None else options.beta1
        t = state.get("step", 0) + 1
        lr = options.lr
        if flower and flower_bias_correction:
            lr *= math.sqrt(1 - options.beta2 ** (t + 1)) / (1 - beta1 ** (t + 1))
        v0 = 0.0 if flower else options.tau ** 2
        moments = _moments(state, previous, ["m"], 0.0) | _moments(state, previous, ["v"], v0)
        new, m_out, v_out = {}, {}, {}
        for key, x in previous.items():
            delta = average[key].double() - x.double()
            m_out[key] = beta1 * moments["m"][key] + (1 - beta1) * delta
            v_out[key] = second_moment(moments["v"][key], delta, options)
            new[key] = (x.double() + lr * m_out[key] / (v_out[key].sqrt() + options.tau)).to(x.dtype)
        return new, {"m": m_out, "v": v_out} | ({"step": t} if flower else {})  # Flower's server_round
    return step


def _adagrad_v(v: torch.Tensor, delta: torch.Tensor, options: FedOptOptions) -> torch.Tensor:
    return v + delta ** 2


def _adam_v(v: torch.Tensor, delta: torch.Tensor, options: FedOptOptions) -> torch.Tensor:
    return options.beta2 * v + (1 - options.beta2) * delta ** 2


def _yogi_v(v: torch.Tensor, delta: torch.Tensor, options: FedOptOptions) -> torch.Tensor:
    import torch

    return v - (1 - options.beta2) * delta ** 2 * torch.sign(v - delta ** 2)


register_rule(ServerRule("fedavgm", "average", _fedavgm, "samples", FedAvgMOptions,
                         doc="FedAvg with server momentum (Hsu et al., 2019)"))
register_rule(ServerRule("fedadagrad", "average", _fedopt(_adagrad_v, flower_beta1=0.0), "samples", FedOptOptions,
                         doc="FedAdagrad (Reddi et al., 2021)"))
register_rule(ServerRule("fedadam", "average", _fedopt(_adam_v, flower_bias_correction=True), "samples", FedOptOptions,
                         doc="FedAdam (Reddi et al., 2021)"))
register_rule(ServerRule("fedyogi", "average", _fedopt(_yogi_v), "samples", FedOptOptions,
                         doc="FedYogi (Reddi et al., 2021)"))


# ---------------------------------------------------------------- FED-PRIME's clustering

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
    """Every pool key is clustered (`clustering.cluster_pool`); a "<module>.selected" mask beside a pool
    "<module>.prompts" says which of its prompts each client selected (a float 0/1 vector), and comes back
    zeroed at the new pool's size. Returns the diagnostics of every pool, to log each round. The rule's state
    carries each pool's popularity network and its Adam moments from round to round ({key: tensors})."""
    from fedvlp.platform.clustering import cluster_pool  # scipy and the clustering nets load on use

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
                         doc="FED-PRIME's constrained clustering of prompt pools (fedvlp.platform.clustering)"))


# ---------------------------------------------------------------- applying a rule

@dataclass
class RuleInputs:
    """What the coordinator hands a rule for one parameter group in one round."""
    states: list[State]
    num_samples: list[int]
    previous: State
    state: dict = field(default_factory=dict)
    generator: torch.Generator | None = None
    options: Any = None


def apply_rule(rule: ServerRule | str, inputs: RuleInputs,
               average: Callable[[list[State], list[float]], State] | None = None) -> tuple[State, dict, dict]:
    """(new parameters, new rule state, the round's diagnostics) of `rule` (or the rule of that name in this
    process's registry). A rule returns (parameters, state), or (parameters, state, diagnostics): numbers the
    coordinator logs every round. `average` (default `weighted_average`) takes the cohort's weighted average for
    average rules: the coordinator passes its private or secure variant here."""
    if isinstance(rule, str):
        rule = RULES.get(rule)
    if rule.kind == "average":
        mean = (average or weighted_average)(inputs.states, rule_weights(rule, inputs.num_samples))
        result = rule.run(inputs.previous, mean, inputs.state, inputs.options)
    else:
        result = rule.run(inputs.states, inputs.num_samples, inputs.previous, inputs.state, inputs.generator,
                          inputs.options)
    new, state, *diagnostics = result
    return new, state, diagnostics[0] if diagnostics else {}


def is_average(rule: str) -> bool:
    """Whether the rule of that name (in this process's registry) starts from the cohort's average."""
    return RULES.get(rule).kind == "average"


def state_nbytes(state: State) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())
