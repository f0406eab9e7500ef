"""PromptFL: a CoOp context learned by every client and averaged by the server (FedAvg).

Guo et al., "PromptFL: Let Federated Participants Cooperatively Learn Prompts Instead of
Models". Multi-label scoring: logit_c = s * cos(image, text_c) + b with a learned scale s and
bias b (the bias starts low, since most classes are absent from any one image), trained with
binary cross-entropy that ignores unknown labels.
"""
from __future__ import annotations

import math

import torch

from fedvlp.methods import declarations
from fedvlp.methods.base import ClientData, Method
from fedvlp.methods.params import PromptFLParams
from fedvlp.methods.prompts import PromptTemplate
from fedvlp.methods.registry import register


@register
class PromptFL(declarations.PromptFL, Method):
    def __init__(self, params: PromptFLParams, backbone, task, generator=None):
        super().__init__(params, backbone, task)
        self.template = PromptTemplate(backbone, task.class_names, params.n_ctx)
        self.ctx = torch.nn.Parameter(self.template.init_context(params.ctx_init, generator))
        self.log_scale = torch.nn.Parameter(torch.tensor(math.log(backbone.logit_scale)))
        self.bias = torch.nn.Parameter(torch.tensor(params.init_bias))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        text = self.template.encode(self.ctx)
        return self.log_scale.exp() * features @ text.T + self.bias

    def local_update(self, data: ClientData, generator: torch.Generator) -> dict[str, float]:
        return self.train_epochs(data, generator, torch.optim.Adam(self.parameters(), lr=self.params.lr))
