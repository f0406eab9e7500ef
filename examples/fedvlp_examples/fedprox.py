"""A method plugin: FedProx (Li et al., 2020) on PromptFL.

A method is one class: its `Params` (a frozen dataclass of `spec_field`s, with the ranges `fedvlp tune`
searches), its trainable modules, its server rules and its local update. Here PromptFL's context is
trained with the proximal term (mu / 2) * ||w - w_global||^2 added to the loss, w_global being the state
the client started the round from (the module holds it when `local_update` starts).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fedvlp.methods.promptfl import PromptFL, PromptFLParams
from fedvlp.methods.registry import register
from fedvlp.spec import log_range, spec_field


@dataclass(frozen=True)
class PromptFLProxParams(PromptFLParams):
    prox_mu: float = spec_field(0.1, "FedProx proximal weight mu", ge=0, tune=log_range(1e-3, 10.0))


@register
class PromptFLProx(PromptFL):
    name = "promptfl_prox"
    Params = PromptFLProxParams

    def local_update(self, data, generator: torch.Generator) -> dict[str, float]:
        trainable = self.trainable_parameters()
        start = [p.detach().clone() for p in trainable]  # the round's global state: what the proximal term pulls to

        def batch_loss(features, labels):
            prox = sum(((p - p0) ** 2).sum() for p, p0 in zip(trainable, start))
            return self.loss(self(features), labels) + self.params.prox_mu / 2 * prox

        stats = self.train_epochs(data, generator, torch.optim.Adam(trainable, lr=self.params.lr), batch_loss)
        drift = sum(float((p - p0).norm() ** 2) for p, p0 in zip(trainable, start)) ** 0.5
        return {**stats, "drift": drift}  # an extra statistic: logged every round as train_drift
