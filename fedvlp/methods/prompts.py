"""CoOp-style prompt encoding, shared by every prompt-learning method.

A prompt is [SOS][ctx_1 .. ctx_M][class-name tokens][.][EOS]. The M context vectors are
learned; everything else is the frozen token embedding. The batch of prompts is cut to its
longest tokenised prompt, which gives the same features as the full context and is faster.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


class PromptTemplate(torch.nn.Module):
    """Frozen token embeddings of 'X X .. X {class}.' for every class, with slots for learned context."""

    backbone: Any
    prefix: torch.Tensor
    suffix: torch.Tensor
    eot: torch.Tensor

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


class ConditionPromptTemplate(torch.nn.Module):
    """FedMPT's condition prompts: [SOS][cond ctx x Bc][COND words][class ctx x Bk][CLASS words][.][EOS].

    One prompt per (condition n, class c). The condition-level context is separate for each
    condition; the class-level context is shared by all prompts. The frozen word embeddings
    and the slot positions are laid out once, so `encode` is one gather-and-add and a single
    text-encoder pass over all N x C prompts, in which each condition's shared prefix (everything
    before the class words) is encoded once, not once per class. `conditions=()` gives plain class prompts
    [SOS][class ctx][CLASS][.][EOS] (N = 1), the "no condition prompts" ablation.
    """

    backbone: Any
    frozen: torch.Tensor
    cond_slot: torch.Tensor
    cls_slot: torch.Tensor
    eot: torch.Tensor

    def __init__(self, backbone, conditions, class_names, n_cond_ctx: int, n_cls_ctx: int):
        super().__init__()
        object.__setattr__(self, "backbone", backbone)
        words = lambda text: _word_tokens(backbone, text)  # noqa: E731
        sos, eos = backbone.tokenize([""])[0, :2]
        groups = [words(c) for c in conditions] or [torch.zeros(0, dtype=torch.long)]
        n_cond = n_cond_ctx if conditions else 0
        classes = [words(f"{name}.") for name in class_names]
        length = 1 + n_cond + max(len(g) for g in groups) + n_cls_ctx + max(len(c) for c in classes) + 1
        tokens = torch.zeros(len(groups), len(classes), length, dtype=torch.long)
        cond_slot = torch.full((len(groups), length), n_cond)  # index n_cond = "no slot here"
        cls_slot = torch.full((len(groups), length), n_cls_ctx)
        eot = torch.zeros(len(groups), len(classes), dtype=torch.long)
        for n, group in enumerate(groups):
            cls_start = 1 + n_cond + len(group)
            cond_slot[n, 1 : 1 + n_cond] = torch.arange(n_cond)
            cls_slot[n, cls_start : cls_start + n_cls_ctx] = torch.arange(n_cls_ctx)
            for c, name in enumerate(classes):
                end = cls_start + n_cls_ctx + len(name)
                tokens[n, c, 0], tokens[n, c, end] = sos, eos
                tokens[n, c, 1 + n_cond : cls_start] = group
                tokens[n, c, cls_start + n_cls_ctx : end] = name
                eot[n, c] = end
        with torch.no_grad():
            embeddings = backbone.embed_tokens(tokens.to(backbone.device)).cpu()
        slots = (cond_slot < n_cond).unsqueeze(1) | (cls_slot < n_cls_ctx).unsqueeze(1)
        self.register_buffer("frozen", embeddings * ~slots.unsqueeze(-1), persistent=False)
        self.register_buffer("cond_slot", cond_slot, persistent=False)
        self.register_buffer("cls_slot", cls_slot, persistent=False)
        self.register_buffer("eot", eot, persistent=False)
        self.n_cond_ctx, self.n_cls_ctx = n_cond, n_cls_ctx
        # a condition's prompts are the same up to their class words: the text encoder runs that prefix once
        self.shared = 1 + n_cond + min(len(g) for g in groups) + n_cls_ctx

    @property
    def num_conditions(self) -> int:
        return self.frozen.shape[0]

    def encode(self, cond_ctx: torch.Tensor | None, cls_ctx: torch.Tensor) -> torch.Tensor:
        """L2-normalised text features [N, C, D] for cond_ctx [N, Bc, width] and cls_ctx [Bk, width]."""
        groups, classes, length, width = self.frozen.shape
        pad = cls_ctx.new_zeros(1, width)
        x = self.frozen + torch.cat([cls_ctx, pad])[self.cls_slot].unsqueeze(1)
        if cond_ctx is not None and self.n_cond_ctx:
            padded = torch.cat([cond_ctx, pad.expand(groups, 1, width)], dim=1)  # [N, Bc + 1, width]
            x = x + torch.gather(padded, 1, self.cond_slot.unsqueeze(-1).expand(-1, -1, width)).unsqueeze(1)
        return F.normalize(self.backbone.encode_prompt_groups(x, self.eot, self.shared), dim=-1)


def _word_tokens(backbone, text: str) -> torch.Tensor:
    """BPE token ids of `text` without the start and end tokens."""
    tokens = backbone.tokenize([text])[0].cpu()
    return tokens[1 : int(tokens.argmax())]


class PromptPool(torch.nn.Module):
    """A pool of prompts retrieved by key-query matching (L2P; FED-PRIME's intra and inter pools).

    Each prompt is one token and also its own key. The query of a sample is the max over its
    frozen input embeddings, mapped by `query` (a projection that never leaves its client) and
    L2-normalised; the top-k prompts by cosine similarity are selected, per sample, or
    `batchwise` as the reference code does: the k prompts most often in the samples' top-k,
    used for the whole batch.

    With `track_selection`, the buffer `selected` marks every prompt retrieved in training since
    `reset_selection()` (the reference's checklist): it travels with the pool, so the server can
    cluster only the prompts the clients used. `resize(n)` rebuilds the pool for a global state of
    another size (FED-PRIME's server keeps every used centroid, so the pool size varies by round).
    """

    selected: torch.Tensor

    def __init__(self, size: int, dim: int, top_k: int, batchwise: bool, generator: torch.Generator,
                 patch_size: int = 32, track_selection: bool = False):
        super().__init__()
        bound = (6.0 / (3 * patch_size * patch_size + dim)) ** 0.5  # the reference's uniform init
        self.prompts = torch.nn.Parameter(torch.empty(size, dim).uniform_(-bound, bound, generator=generator))
        self.query = torch.nn.Linear(dim, dim, bias=False)
        with torch.no_grad():
            self.query.weight.uniform_(-1.0, 1.0, generator=generator)
        self.top_k, self.batchwise = top_k, batchwise
        if track_selection:
            self.register_buffer("selected", torch.zeros(size))

    def reset_selection(self) -> None:
        if hasattr(self, "selected"):
            self.selected.zero_()

    def resize(self, size: int) -> None:
        if size != len(self.prompts):
            self.prompts = torch.nn.Parameter(self.prompts.new_empty(size, self.prompts.shape[1]))
            if hasattr(self, "selected"):
                self.selected = self.selected.new_zeros(size)

    def forward(self, query_features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(selected prompts [B, k, D], mean over the batch of the summed cosine of query and selected keys)."""
        query = F.normalize(self.query(query_features), dim=-1)
        keys = F.normalize(self.prompts, dim=-1)
        top = (query @ keys.T).topk(self.top_k, dim=-1).indices           # [B, k]
        if self.batchwise:
            counts = torch.bincount(top.flatten(), minlength=len(keys))
            top = counts.topk(self.top_k).indices.expand(len(query), -1)  # ties: lowest index first
        similarity = (keys[top] * query.unsqueeze(1)).sum(-1)              # [B, k]
        if self.training and hasattr(self, "selected"):
            self.selected[top.unique()] = 1.0
        return self.prompts[top], similarity.sum(-1).mean()
