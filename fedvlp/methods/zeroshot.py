"""Zero-shot CLIP: hand-written prompts, nothing trained; the reference line every method must beat.

Scores use the same multi-label head as the prompt learners start from
(logit_c = s_CLIP * cos(image, text_c) + b), so its thresholded metrics are comparable.
"""
from __future__ import annotations

import torch

from fedvlp.methods import declarations
from fedvlp.methods.base import ClientData, Method
from fedvlp.methods.params import ZeroShotParams
from fedvlp.methods.registry import register


@register
class ZeroShot(declarations.ZeroShot, Method):
    text: torch.Tensor

    def __init__(self, params: ZeroShotParams, backbone, task, generator=None):
        super().__init__(params, backbone, task)
        prompts = [params.template.format(name) for name in task.class_names]
        self.register_buffer("text", backbone.encode_texts(prompts).cpu(), persistent=False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.backbone.logit_scale * features @ self.text.T + self.params.bias

    @torch.no_grad()
    def local_update(self, data: ClientData, generator: torch.Generator) -> dict[str, float]:
        """Nothing to train: report the loss of the fixed prompts on the client's data."""
        return {"loss": self.loss(self.score(data.features), data.labels).item() if len(data) else 0.0, "steps": 0}
