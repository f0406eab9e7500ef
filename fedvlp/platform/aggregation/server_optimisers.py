"""The server optimisers of Reddi et al. (2021), and FedAvgM (Hsu et al., 2019): average rules that take a server
step from the previous global state, with their moments in the rule's state."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from fedvlp.platform.aggregation.rules import ServerRule, register_rule
from fedvlp.spec import spec_field

if TYPE_CHECKING:
    import torch

    from fedvlp.platform.aggregation.rules import State


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
