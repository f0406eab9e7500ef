"""A custom server-rule plugin: the coordinate-wise trimmed mean (Yin et al., 2018), robust to outlying clients.

A "custom" rule sees the cohort's states themselves, not only their average: it gets them in client-id order
with their sample counts, the round's previous global parameters, its own state and the round's "aggregate"
generator, and returns the new parameters and its state (and, optionally, numbers to log every round). Here,
per coordinate, the floor(proportion * K) largest and smallest of the K client values are cut and the rest
averaged, unweighted (as `scipy.stats.trim_mean`): a few clients sending extreme values move nothing.
Aim it at one parameter group with a prefix (`fedvlp list state` shows the keys):
`server: {rules: {"ctx": trimmed_mean}, options: {trimmed_mean: {proportion: 0.25}}}`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fedvlp.platform.aggregation import ServerRule, register_rule
from fedvlp.spec import spec_field


@dataclass(frozen=True)
class TrimmedMeanOptions:
    proportion: float = spec_field(0.1, "fraction of the cohort cut from each end, per coordinate", ge=0, lt=0.5)


def trimmed_mean(states, num_samples, previous, state, generator, options: TrimmedMeanOptions):
    cut = int(options.proportion * len(states))  # per side; proportion < 0.5 always leaves at least one
    new = {}
    for key, x in previous.items():
        ranked = torch.stack([s[key].double() for s in states]).sort(dim=0).values
        new[key] = ranked[cut:len(states) - cut].mean(dim=0).to(x.dtype)
    return new, state, {"trimmed": float(cut)}  # logged every round as server/trimmed_mean/trimmed


register_rule(ServerRule("trimmed_mean", "custom", trimmed_mean, options=TrimmedMeanOptions,
                         doc="coordinate-wise trimmed mean (Yin et al., 2018; an example plugin)"))
