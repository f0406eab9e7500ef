"""FedOTP: a global and a local prompt per client, matched to the image patches by optimal transport.

Li et al., "Global and Local Prompts Cooperation via Optimal Transport for Federated Learning"
(HongxiaLee/FedOTP trainers/GLP_OT.py). Every client holds N = 2 prompts:
prompt 0 (`global_ctx`) is averaged by the server (FedAvg weighted by data size); prompt 1
(`local_ctx`) never leaves its client (server rule LOCAL; the coordinator keeps it per client).

Per image and class, the M patch tokens and the 2 prompts' text features are matched by
entropic OT on cost 1 - cos(patch, text), with patch marginal a = 1/M: by default the
reference's unbalanced "COT" variant (`transport: partial`): each prompt receives
`top_percent` / 2 of the mass and a patch may ship less than its own, so only the patches
that match carry the prompts (`numerics.partial_transport`); or balanced Sinkhorn with
b = 1/2 (`transport: balanced`). The plan is computed without gradient, as in the reference,
and the class score is logit_c = logit_scale * sum_{m,n} T_mn cos_mn (the FedOTP formula; the
frozen backbone's logit scale). The reference trains single-label cross-entropy; for
multi-label data a learned bias, shared and averaged like the global prompt, shifts the logits
(sum T cos is a weighted mean cosine, so every raw logit is of the same sign), and the loss is
the asymmetric loss (gamma_neg 2, gamma_pos 1, clip 0.05, unknown labels ignored) averaged over
the known labels. Single-label tasks use cross-entropy on the raw logits, as the reference.

Both prompts start from N(0, 0.02) as in the reference (`ctx_init` words are optional; the two
prompts then start equal and only drift apart through aggregation, which trained worse on
synthetic-scenes). Local optimiser: SGD, momentum 0.9, created afresh every round.

Evaluation. A client's own model (`personal_*`) is the global prompt with its local prompt: the
only model the reference evaluates (federated_main.py scores every client's [global; local] prompts
on its own test data and reports their mean as "Global test acc"), so `personal_*` is the figure
to compare with it; the reference has no global model of its own. Here the global model (`val_*`,
`test_*`) is the global prompt alone, the same forward with N = 1 (it receives all top_percent of
the mass): no local prompt enters it, neither a client's nor the untrained initial one, which took
half the transported mass. The global prompt is trained beside a local one, not to stand alone: on
fedotp_scenes (4 clients, 800 samples, 2 rounds) its val mAP falls from 0.360 to 0.274 while personal mAP
rises from 0.477 to 0.650.
"""
from __future__ import annotations

import torch

from fedvlp.methods import declarations
from fedvlp.methods.base import LOCAL, ClientData, Method
from fedvlp.methods.numerics import partial_transport, sinkhorn
from fedvlp.methods.params import FedOTPParams
from fedvlp.methods.prompts import PromptTemplate
from fedvlp.methods.registry import register

NUM_PROMPTS = 2  # prompt 0 global, prompt 1 local (the reference's --num_prompt 2, --avg_prompt 1)


@register
class FedOTP(declarations.FedOTP, Method):
    global_evaluation = "global"

    def __init__(self, params: FedOTPParams, backbone, task, generator=None):
        super().__init__(params, backbone, task)
        self.server_rules = {"": params.aggregation, "local_ctx": LOCAL}
        self.template = PromptTemplate(backbone, task.class_names, params.n_ctx)
        self.global_ctx = torch.nn.Parameter(self.template.init_context(params.ctx_init, generator).cpu())
        self.local_ctx = torch.nn.Parameter(self.template.init_context(params.ctx_init, generator).cpu())
        if task.multilabel:
            self.bias = torch.nn.Parameter(torch.tensor(params.init_bias))

    def transport_scores(self, features: torch.Tensor) -> torch.Tensor:
        """sum_{m,n} T_mn cos_mn [B, C]: the OT-weighted similarity of the patches and the prompts (the global
        and the local one; the global one alone while the global model is scored)."""
        patches = features[:, 1:]  # drop the pooled embedding: [B, M, D]
        prompts = [self.global_ctx] if self.global_only else [self.global_ctx, self.local_ctx]
        text = torch.stack([self.template.encode(ctx) for ctx in prompts])  # [N, C, D]
        sim = torch.einsum("bmd,ncd->bcmn", patches, text)  # [B, C, M, N]
        m, n = sim.shape[-2:]
        a = torch.full((m,), 1.0 / m, dtype=sim.dtype, device=sim.device)
        b = torch.full((n,), 1.0 / n, dtype=sim.dtype, device=sim.device)
        with torch.no_grad():  # the reference treats the plan as a constant
            p = self.params
            if p.transport == "partial":
                plan = partial_transport(1 - sim, a, b * p.top_percent, p.epsilon, p.ot_max_iter, p.ot_tol)
            else:
                plan = sinkhorn(1 - sim, a, b, p.epsilon, p.ot_max_iter, p.ot_tol)
        return (plan * sim).sum(dim=(-2, -1))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        logits = self.backbone.logit_scale * self.transport_scores(features)
        return logits + self.bias if self.task.multilabel else logits

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        p = self.params
        return self.asl(logits, labels, p.gamma_neg, p.gamma_pos, p.asl_clip)

    def local_update(self, data: ClientData, generator: torch.Generator) -> dict[str, float]:
        optimizer = torch.optim.SGD(self.trainable_parameters(), lr=self.params.lr, momentum=0.9)
        return self.train_epochs(data, generator, optimizer)
