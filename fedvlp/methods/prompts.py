"""CoOp-style prompt encoding, shared by every prompt-learning method.

A prompt is [SOS][ctx_1 .. ctx_M][class-name tokens][.][EOS]. The M context vectors are
learned; everything else is the frozen token embedding. The batch of prompts is cut to its
longest tokenised prompt, which gives the same features as the full context and is faster.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class PromptTemplate(torch.nn.Module):
    """Frozen token embeddings of 'X X .. X {class}.' for every class, with slots for learned context."""

    def __init__(self, backbone, class_names, n_ctx: int):
        super().__init__()
        object.__setattr__(self, "backbone", backbone)
        tokens = backbone.tokenize([" ".join(["X"] * n_ctx + [f"{name}."]) for name in class_names])
        eot = tokens.argmax(-1)
        tokens = tokens[:, : int(eot.max()) + 1]
        with torch.no_grad():
            embeddings = backbone.embed_tokens(tokens)
        self.n_ctx = n_ctx
        self.register_buffer("prefix", embeddings[:, :1].clone(), persistent=False)  # SOS
        self.register_buffer("suffix", embeddings[:, 1 + n_ctx :].clone(), persistent=False)  # class . EOS pad
        self.register_buffer("eot", eot, persistent=False)

    def init_context(self, text: str, generator: torch.Generator | None = None) -> torch.Tensor:
        """Context vectors from the word embeddings of `text` (CoOp init), or N(0, 0.02) if empty."""
        if not text:
            return torch.randn(self.n_ctx, self.backbone.token_width, generator=generator) * 0.02
        tokens = self.backbone.tokenize([text])[0]
        words = tokens[1 : int(tokens.argmax()) ]
        if len(words) != self.n_ctx:
            raise ValueError(f"ctx_init {text!r} has {len(words)} tokens but n_ctx is {self.n_ctx}")
        with torch.no_grad():
            return self.backbone.embed_tokens(words).clone()

    def encode(self, context: torch.Tensor) -> torch.Tensor:
        """L2-normalised text features [C, D] for context [M, width] (shared) or [C, M, width] (per class)."""
        classes = self.prefix.shape[0]
        if context.dim() == 2:
            context = context.unsqueeze(0).expand(classes, -1, -1)
        embeddings = torch.cat([self.prefix, context, self.suffix], dim=1)
        return F.normalize(self.backbone.encode_token_embeddings(embeddings, self.eot), dim=-1)
