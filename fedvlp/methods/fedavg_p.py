"""FedAvg-P and FedProx-P: missing-aware prompts (Lee et al., CVPR'23) on a frozen ViLT, federated.

The FED-PRIME paper's baselines. There is one prompt set per missing
type (complete, text missing, image missing); each sample uses the set of its own type. A set
holds `prompt_length` tokens for each of the first `prompt_layers` transformer layers, prepended
to the sequence before that layer ("input" prompts, so they accumulate). A trainable pooler on
the first token after the prompts (the text [CLS]) and the classifier head score the classes;
cross-entropy. Prompts, pooler and classifier are averaged by FedAvg weighted by data size.

Prompts start at zero with one row of ones that differs per type, as in the reference
(complete: token 0, image missing: token 1, text missing: token 2); they then take about a quarter, then half, of
the real tokens' attention at the two prompted layers of the tiny ViLT (`benchmarks/prompt_attention.py`).
`prompt_attention: as_one` (not the reference's) lowers each score on a prompt by log(prompts in front of the layer),
so that together they start weighing as one token; `prompt_lr` gives the prompts their own SGD learning rate.
FedProx-P adds
(prox_mu / 2) * ||w - w_global||^2 over the trainable parameters to the local loss.
The centralised upper bound (Centralized-P) is this method with `federation.clients: 1` and
`federation.pooled_from: 10`: FedAvg-P's ten clients' data and missing codes, pooled.

Size, on any ViLT: the reference's (FED-PRIME's FedAvg_P baseline: prompt_type input, length 16,
layers 0..5 of ViLT-B's 12) by one rule. The token count stays at 16: a token already has the
backbone's width (128 on the tiny ViLT, 768 on ViLT-B), and FED-PRIME keeps its own counts
(pool 20, top 5) on the tiny ViLT too. The depth is the same fraction, the first half of the
layers: 6 of 12 on ViLT-B, 2 of the tiny ViLT's 4 (`prompt_layers: null`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fedvlp.data.missing import FULL, MISSING_IMAGE, MISSING_TEXT
from fedvlp.methods import declarations
from fedvlp.methods.base import ClientData, Method, TokenInputs
from fedvlp.methods.fedprime import prompt_sgd, token_inputs, trainable_pooler, vilt_classifier
from fedvlp.methods.params import FedAvgPParams
from fedvlp.methods.registry import register

ONES_ROW = {FULL: 0, MISSING_IMAGE: 1, MISSING_TEXT: 2}  # the reference's one-hot-like initial rows


def prompted_layers(requested: int | None, depth: int) -> int:
    """How many layers, from the first, get prompts: as requested (capped at the depth), or half the depth."""
    return min(requested, depth) if requested is not None else max(1, depth // 2)


@register
class FedAvgP(declarations.FedAvgP, Method):
    make_inputs = staticmethod(token_inputs)

    def __init__(self, params: FedAvgPParams, backbone, task, generator=None):
        super().__init__(params, backbone, task)
        layers = prompted_layers(params.prompt_layers, backbone.num_layers)
        prompts = torch.zeros(3, layers, params.prompt_length, backbone.hidden_size)
        for code, row in ONES_ROW.items():
            if row < params.prompt_length:
                prompts[code, :, row] = 1.0
        self.prompts = torch.nn.Parameter(prompts)  # [missing type, layer, token, D]
        self.pooler = trainable_pooler(backbone)
        self.classifier = vilt_classifier(backbone.hidden_size, len(task.class_names), generator)

    def forward(self, inputs: TokenInputs) -> torch.Tensor:
        per_sample = self.prompts[inputs.missing]  # [B, layer, token, D]
        layer_prompts = {i: per_sample[:, i] for i in range(per_sample.shape[1])}
        hidden = self.backbone.encode(inputs.embeddings, inputs.mask, layer_prompts,
                                      prompts_as_one=self.params.prompt_attention == "as_one")
        num_prompts = per_sample.shape[1] * per_sample.shape[2]
        return self.classifier(self.pooler(hidden[:, num_prompts:]))

    def prompt_parameters(self) -> list[torch.nn.Parameter]:
        """What `method.prompt_lr` trains at its own rate: the prompts (not the pooler and head)."""
        return [self.prompts]

    def local_update(self, data: ClientData, generator: torch.Generator) -> dict[str, float]:
        trainable = self.trainable_parameters()
        start = [p.detach().clone() for p in trainable]
        mu = self.params.prox_mu

        def batch_loss(inputs: TokenInputs, labels: torch.Tensor) -> torch.Tensor:
            loss = F.cross_entropy(self(inputs), labels)
            if mu > 0:
                loss = loss + mu / 2 * sum(((p - p0) ** 2).sum() for p, p0 in zip(trainable, start))
            return loss

        optimizer = prompt_sgd(trainable, self.prompt_parameters(), self.params.lr, self.params.prompt_lr)
        return self.train_epochs(data, generator, optimizer, batch_loss)


@register
class FedProxP(declarations.FedProxP, FedAvgP):
    """FedAvg-P with the proximal term (`prox_mu` > 0)."""
