"""Fed-DualCoOp: DualCoOp's positive and negative prompts, learned by every client and averaged.

Sun et al., "DualCoOp: Fast Adaptation to Multi-Label Recognition with Limited Annotations"
(sunxm2357/DualCoOp models/dualcoop.py); the federated version is the FedMPT baseline, whose
server averages the prompt learner.

Two learned contexts, positive and negative (n_ctx tokens each, shared by all classes or, with
`csc`, one per class), give two text features per class. The positive context starts from the
words of `ctx_init` when they are n_ctx tokens, the negative one (and a positive one whose words
do not fit) from N(0, 0.02). Class-specific region aggregation over the M patch tokens:
S = region_scale * cos(patch, text) [B, C, M]; the weights are the softmax over patches of the
POSITIVE map, shared by the negative map; each side scores output_scale * sum_m w_m S_m. The
reference fixes region_scale 20 and output_scale 5, whose product 100 is the logit scale of
OpenAI's CLIP; here output_scale defaults to the backbone's logit scale / region_scale, which is
exactly 5 for OpenAI's CLIP and keeps the tiny CLIP's own scale (16) for it. The reference takes
the softmax over [neg, pos] as the probability of the class; that softmax is sigmoid(pos - neg),
so `forward` returns the multi-label logit pos - neg [B, C] and the loss is the asymmetric loss
on it (gamma_neg 2, gamma_pos 1, clip 0.05, unknown labels ignored) summed over classes and
averaged over the batch: the reference's sum-reduced loss up to its constant loss weight, and
stable at lr 0.01 whatever the batch size. Single-label tasks use cross-entropy on pos - neg.
Local optimiser: SGD with momentum 0.9, created afresh every round, so a client carries nothing
between rounds.
"""
from __future__ import annotations

import torch

from fedvlp.methods import declarations
from fedvlp.methods.base import ClientData, Method
from fedvlp.methods.numerics import region_aggregate
from fedvlp.methods.params import DualCoOpParams
from fedvlp.methods.prompts import PromptTemplate
from fedvlp.methods.registry import register


@register
class DualCoOp(declarations.DualCoOp, Method):
    def __init__(self, params: DualCoOpParams, backbone, task, generator=None):
        super().__init__(params, backbone, task)
        self.server_rules = {"": params.aggregation}
        self.template = PromptTemplate(backbone, task.class_names, params.n_ctx)
        self.output_scale = params.output_scale or backbone.logit_scale / params.region_scale
        classes = len(task.class_names) if params.csc else 0
        self.ctx_pos = torch.nn.Parameter(self._init_context(params.ctx_init, classes, generator))
        self.ctx_neg = torch.nn.Parameter(self._init_context("", classes, generator))

    def _init_context(self, text: str, classes: int, generator) -> torch.Tensor:
        """The word embeddings of `text` if it is exactly n_ctx tokens, else N(0, 0.02) (the reference's two
        cases); [n_ctx, width], or [classes, n_ctx, width] for class-specific contexts (words copied per class)."""
        n_ctx, width = self.params.n_ctx, self.backbone.token_width
        if text and int(self.backbone.tokenize([text])[0].argmax()) - 1 == n_ctx:
            words = self.template.init_context(text).cpu()
            return words.repeat(classes, 1, 1) if classes else words
        shape = (classes, n_ctx, width) if classes else (n_ctx, width)
        return torch.randn(*shape, generator=generator) * 0.02

    def dual_logits(self, features: torch.Tensor) -> torch.Tensor:
        """[B, 2, C]: the negative and the positive logit of every class (the reference's output)."""
        patches = features[:, 1:]  # drop the pooled embedding: [B, M, D]
        text_pos = self.template.encode(self.ctx_pos)
        text_neg = self.template.encode(self.ctx_neg)
        s_pos = self.params.region_scale * torch.einsum("bmd,cd->bcm", patches, text_pos)
        s_neg = self.params.region_scale * torch.einsum("bmd,cd->bcm", patches, text_neg)
        # Class-specific region aggregation; the negative map is weighted by the positive map's softmax.
        pos = self.output_scale * region_aggregate(s_pos, 1.0)
        neg = self.output_scale * region_aggregate(s_neg, 1.0, guide=s_pos)
        return torch.stack([neg, pos], dim=1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Multi-label logits pos - neg [B, C]: sigmoid(pos - neg) is the softmax over [neg, pos]."""
        neg, pos = self.dual_logits(features).unbind(1)
        return pos - neg

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        p = self.params
        return self.asl(logits, labels, p.gamma_neg, p.gamma_pos, p.asl_clip)

    def local_update(self, data: ClientData, generator: torch.Generator) -> dict[str, float]:
        optimizer = torch.optim.SGD(self.trainable_parameters(), lr=self.params.lr, momentum=0.9)
        return self.train_epochs(data, generator, optimizer)
