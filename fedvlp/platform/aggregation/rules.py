"""The server-rule registry and what every rule shares: `ServerRule`, `RULES`, the cohort's weighted average, the
plain averages (`fedavg`, `mean`) and `apply_rule`, which the coordinator calls for every parameter group.

Imports without torch (the config and a run's driver read the registry); the rules import torch as they run.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fedvlp.registry import Registry

if TYPE_CHECKING:
    import torch

    State = dict[str, torch.Tensor]
LOCAL = "local"  # the rule of parameters that never leave their client (the coordinator keeps them per client)


@dataclass(frozen=True)
class ServerRule:
    """A named server rule (see the package docstring, `fedvlp.platform.aggregation`, for the two kinds)."""
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
