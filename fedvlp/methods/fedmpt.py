"""FedMPT: federated multi-label prompt tuning with conditions, adapters, optimal transport and a gate.

Implements the paper (CVPR 2026), not its released code, which lacks the OT, the adapters and the
learned gate. For an image with frozen token features f_v(v_m) (the regions: by default the M patch
tokens projected into the joint space, the paper's patch-level features; `regions: pooled+patches`
adds CLIP's pooled token, which anchors the transport where patch tokens align poorly with text):

1. Condition prompts. N conditions (spatial layout, object pose, ...) fill the [COND] slot of
   [cond ctx x Bc][COND][class ctx x Bk][CLASS]; the condition context is separate per
   condition, the class context shared. One text pass gives t[n, c].
2. Adapters. Per condition a low-rank adapter on the frozen patch features,
   f_n(v_m) = f_v(v_m) + W_up,n W_down,n f_v(v_m) (rank D_s; W_up starts at zero, so training
   starts from CLIP's own features). The adapters act on features, not on a layer of the
   backbone, which is why this is a plain module and not a peft wrapper.
3. Optimal transport. S^n_mc = cos(f_n(v_m), t[n, c]); row marginal a_m = softmax_m(max_c S_mc / tau),
   column marginal uniform; P* = entropic Sinkhorn (epsilon = lambda) on cost 1 - S;
   psi_n,c = sum_m P*_mc S_mc, rescaled by C (each column carries mass 1/C). tau, lambda and the
   temperature of the path without OT all divide the cosine S: the paper's tau = 4 is stated on
   CLIP ViT-B/16's logits (100 S), so tau = 0.04 here, on any backbone.
4. Gate. A low-rank router Omega on the pooled image feature gives w = softmax(Omega(f_v(v)));
   the prediction is sum_n w_n * logit_n, with logit_n = s * psi_n + b (learned scale and bias).
   Omega is a LoRA module like the adapters (W_down random, W_up zero), so the gate starts as the
   mean over conditions. It reads the pooled feature at unit scale per coordinate (x sqrt(D), as a
   LoRA module on a network's LayerNorm'd features sees them), not the cached unit vector: the
   router's logits move per SGD step in proportion to |x|^2, and on the unit vector the gate was
   still uniform to within 0.001 after a round of local training (fedmpt_scenes, one client:
   gradient of W_up 0.006 at the start against 0.45 for the condition context; 0.06 rescaled).
   (The adapters need no rescaling: their output is compared by cosine, which undoes the scale.)
5. Loss: asymmetric loss, unknown labels ignored. Server: FedAvg of everything trainable.

Ablation switches (the rows of the paper's Table 4): `cps` (off: plain class prompts shared by
all conditions), `adapters` (off: raw patch features), `ot` (off: DualCoOp region aggregation,
softmax over patches at the plan's temperature lambda), `gate` (off: mean over conditions), and
`regions: pooled+patches` (the pooled token as one more region).
"""
from __future__ import annotations

import math

import torch

from fedvlp.methods import declarations
from fedvlp.methods.base import ClientData, Method
from fedvlp.methods.numerics import ot_region_scores, region_aggregate
from fedvlp.methods.params import PAPER_CONDITIONS, FedMPTParams  # noqa: F401  (PAPER_CONDITIONS: read from here too)
from fedvlp.methods.prompts import ConditionPromptTemplate, PromptTemplate
from fedvlp.methods.registry import register

OT_TOLERANCE = 1e-4  # float32 marginals cannot get closer than ~1e-6 summed; stop well before that floor


class LowRank(torch.nn.Module):
    """x -> W_up W_down x for N independent heads at once: down [N, D, r], up [N, r, out]."""

    def __init__(self, heads: int, dim: int, rank: int, out: int, generator):
        super().__init__()
        self.down = torch.nn.Parameter(torch.randn(heads, dim, rank, generator=generator) / math.sqrt(dim))
        self.up = torch.nn.Parameter(torch.zeros(heads, rank, out))  # zero: training starts from identity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [R, D] (the same rows for every head) -> [N, R, out]."""
        heads, dim, rank = self.down.shape
        # One matrix product for every head's down-projection, then one batched product for the ups.
        hidden = (x @ self.down.transpose(0, 1).reshape(dim, heads * rank)).view(-1, heads, rank)
        return torch.bmm(hidden.transpose(0, 1), self.up)


@register
class FedMPT(declarations.FedMPT, Method):
    def __init__(self, params: FedMPTParams, backbone, task, generator=None):
        super().__init__(params, backbone, task)
        num = len(params.conditions)
        width, dim = backbone.token_width, backbone.embed_dim
        self.template = ConditionPromptTemplate(backbone, params.conditions if params.cps else (),
                                                task.class_names, params.n_cond_ctx, params.n_cls_ctx)
        if params.cps:
            self.cond_ctx = torch.nn.Parameter(torch.randn(num, params.n_cond_ctx, width, generator=generator) * 0.02)
        words = PromptTemplate(backbone, task.class_names[:1], params.n_cls_ctx)
        self.cls_ctx = torch.nn.Parameter(words.init_context(params.cls_ctx_init, generator))
        if params.adapters:
            self.adapter = LowRank(num, dim, params.adapter_rank, dim, generator)
        if params.gate:
            self.router = LowRank(1, dim, params.adapter_rank, num, generator)
        self.log_scale = torch.nn.Parameter(torch.tensor(math.log(backbone.logit_scale)))
        self.bias = torch.nn.Parameter(torch.tensor(params.init_bias))
        self.num_conditions = num

    def condition_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Per-condition logits [B, N, C] from frozen token features [B, 1 + M, D]."""
        p = self.params
        if p.regions == "patches":  # the paper's patch-level features; the gate still reads the pooled token
            features = features[:, 1:]
        # All images' regions are rows of one matrix, conditions lead: every product below is one (batched) GEMM.
        batch, regions, dim = features.shape
        rows = features.reshape(batch * regions, dim)
        text = self.template.encode(self.cond_ctx if p.cps else None, self.cls_ctx)  # [N or 1, C, D]
        views = rows + self.adapter(rows) if p.adapters else rows.unsqueeze(0)  # [N or 1, B(1 + M), D]
        # cos(view, text): the text is unit-norm, so divide the [.., C] dot products by |view|
        # (F.normalize's floor) rather than normalising the [.., D] views first; same value
        norms = views.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        similarity = (views @ text.transpose(-1, -2) / norms).view(-1, batch, regions, text.shape[1])
        if p.ot:  # tau, lambda and the temperature without OT all divide the cosine
            scores = ot_region_scores(similarity, p.tau, epsilon=p.ot_epsilon, max_iter=p.ot_iters,
                                      tol=OT_TOLERANCE) * text.shape[1]
        else:
            scores = region_aggregate(similarity.transpose(-1, -2), p.region_temperature or p.ot_epsilon)
        logits = self.log_scale.exp() * scores + self.bias  # [N or 1, B, C]
        # without condition prompts and adapters every condition sees the same logits: computed once
        return logits.expand(self.num_conditions, -1, -1).transpose(0, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        logits = self.condition_logits(features)
        if not self.params.gate:
            return logits.mean(1)
        return torch.einsum("bn,bnc->bc", self.gate_weights(features), logits)

    def gate_weights(self, features: torch.Tensor) -> torch.Tensor:
        """Each image's mixture over the conditions [B, N], from its pooled feature at unit scale per coordinate."""
        pooled = features[:, 0] * math.sqrt(features.shape[-1])
        return torch.softmax(self.router(pooled)[0], dim=-1)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        p = self.params
        return self.asl(logits, labels, p.gamma_neg, p.gamma_pos, p.clip)

    def local_update(self, data: ClientData, generator: torch.Generator) -> dict[str, float]:
        p = self.params
        optimizer = torch.optim.SGD(self.parameters(), lr=p.lr, momentum=p.momentum, weight_decay=p.weight_decay)
        return self.train_epochs(data, generator, optimizer)
