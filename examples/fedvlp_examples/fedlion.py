"""A server-optimiser plugin: Lion (Chen et al., 2023) applied to the cohort's pseudo-gradient.

An "average" server rule gets the round's previous global parameters, the cohort's weighted average and its
own state (which the coordinator keeps between rounds and writes into every checkpoint), and returns the new
parameters and state. With delta = average - x:
    update = sign(beta1 m + (1 - beta1) delta);  x <- x + lr update;  m <- beta2 m + (1 - beta2) delta.
Select it per parameter group from a config: `server: {rules: {"": fedlion}, options: {fedlion: {lr: 0.01}}}`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fedvlp.platform.aggregation import ServerRule, register_rule
from fedvlp.spec import spec_field


@dataclass(frozen=True)
class FedLionOptions:
    lr: float = spec_field(0.01, "server learning rate: each coordinate moves by exactly this much", gt=0)
    beta1: float = spec_field(0.9, "interpolation of the momentum and the new pseudo-gradient", ge=0, le=1)
    beta2: float = spec_field(0.99, "decay of the momentum", ge=0, lt=1)


def fedlion(previous, average, state, options: FedLionOptions):
    momentum = state.get("m") or {k: torch.zeros_like(x, dtype=torch.float64) for k, x in previous.items()}
    new, new_momentum = {}, {}
    for key, x in previous.items():
        delta = average[key].double() - x.double()
        new[key] = (x.double() + options.lr * torch.sign(options.beta1 * momentum[key] + (1 - options.beta1) * delta)
                    ).to(x.dtype)
        new_momentum[key] = options.beta2 * momentum[key] + (1 - options.beta2) * delta
    return new, {"m": new_momentum}


register_rule(ServerRule("fedlion", "average", fedlion, "samples", FedLionOptions,
                         doc="Lion on the pseudo-gradient (an example plugin)"))
