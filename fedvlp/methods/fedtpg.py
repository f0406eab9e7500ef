"""FedTPG: a prompt generator, conditioned on the class names' text embeddings, learned by all clients.

Qiu et al., "Federated Text-driven Prompt Generation for Vision-Language Models" (ICLR 2024;
boschresearch/FedTPG model/prompt_net.py PromptTranslator and model/FedTPG.py).
Instead of a context vector, the clients learn a network that writes the context from the task's
class names: n_ctx learnable query tokens (N(0, 0.02)) cross-attend (nn.MultiheadAttention,
4 heads, pre-norm on queries and keys, keys/values = the frozen CLIP text embeddings of the bare
class names, computed once and mapped to the token width by the attention's own key/value
projections when the widths differ), then a GEGLU feed-forward with a residual. As in the
reference (depth_ctx 1, model_depth 0), the cross-attention has no residual and the queries
attend to ALL class names at once, so one context [n_ctx, width] is written for the whole class
set and shared by every class prompt (the reference's `text_ctx[0].expand(n_cls, ...)`); the
context changes with the task's class set, not per class. (Per-class contexts, with each class's
queries attending to its own name alone, would make the attention a constant map of one key.)

The context goes through the CoOp prompt "[SOS][ctx][class].[EOS]"; scoring uses the pooled
image embedding like PromptFL: logit_c = s * cos(image, text_c) + b with a learned scale and
bias (the reference trains single-label cross-entropy with CLIP's scale; for multi-label data
the bias starts low since most classes are absent from an image). Loss: the asymmetric loss
(gamma_neg 2, gamma_pos 1, clip 0.05, unknown labels ignored) summed over classes and averaged
over the batch; cross-entropy for single-label tasks. The whole generator (and head) is
averaged uniformly over the cohort by default, as the reference's server does. Local
optimiser: SGD, momentum 0.9, created afresh every round.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fedvlp.methods import declarations
from fedvlp.methods.base import ClientData, Method
from fedvlp.methods.params import FedTPGParams
from fedvlp.methods.prompts import PromptTemplate
from fedvlp.methods.registry import register


class GEGLU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, gates = x.chunk(2, dim=-1)
        return x * F.gelu(gates)


class PromptGenerator(nn.Module):
    """The reference's PromptTranslator at depth 0: learned queries cross-attend to class-name embeddings."""

    def __init__(self, n_ctx: int, width: int, text_dim: int, heads: int, ff_mult: int):
        super().__init__()
        self.queries = nn.Parameter(torch.randn(n_ctx, width) * 0.02)
        self.norm_q = nn.LayerNorm(width)
        self.norm_kv = nn.LayerNorm(text_dim)
        self.attn = nn.MultiheadAttention(width, heads, kdim=text_dim, vdim=text_dim, batch_first=True)
        self.ff = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width * ff_mult * 2), GEGLU(),
                                nn.Linear(width * ff_mult, width))

    def forward(self, class_embeddings: torch.Tensor) -> torch.Tensor:
        """Class-name embeddings [K, D] -> one context [n_ctx, width] for the whole class set."""
        kv = self.norm_kv(class_embeddings).unsqueeze(0)  # [1, K, D]: the queries see every name
        # no residual, as the reference
        x = self.attn(self.norm_q(self.queries).unsqueeze(0), kv, kv, need_weights=False)[0]
        x = x + self.ff(x)
        return x[0]


@register
class FedTPG(declarations.FedTPG, Method):
    class_embeddings: torch.Tensor

    def __init__(self, params: FedTPGParams, backbone, task, generator=None):
        super().__init__(params, backbone, task)
        self.server_rules = {"": params.aggregation}
        self.template = PromptTemplate(backbone, task.class_names, params.n_ctx)
        # Frozen text embeddings of the bare class names (the reference encodes the names alone).
        self.register_buffer("class_embeddings", backbone.encode_texts(list(task.class_names)), persistent=False)
        width = backbone.token_width
        if width % params.heads:
            raise ValueError(f"method.heads: {params.heads} does not divide the token width {width}")
        # PyTorch's default initialisers draw from the global RNG: seed them from `generator`.
        seed = int(torch.randint(2**62, (1,), generator=generator)) if generator is not None else None
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            self.prompt_generator = PromptGenerator(params.n_ctx, width, backbone.embed_dim, params.heads,
                                                    params.ff_mult)
        self.log_scale = nn.Parameter(torch.tensor(math.log(backbone.logit_scale)))
        if task.multilabel:
            self.bias = nn.Parameter(torch.tensor(params.init_bias))

    def text_features(self) -> torch.Tensor:
        return self.template.encode(self.prompt_generator(self.class_embeddings))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        logits = self.log_scale.exp() * features @ self.text_features().T
        return logits + self.bias if self.task.multilabel else logits

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        p = self.params
        return self.asl(logits, labels, p.gamma_neg, p.gamma_pos, p.asl_clip)

    def local_update(self, data: ClientData, generator: torch.Generator) -> dict[str, float]:
        optimizer = torch.optim.SGD(self.trainable_parameters(), lr=self.params.lr, momentum=0.9)
        return self.train_epochs(data, generator, optimizer)
