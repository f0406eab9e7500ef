"""CLIP backbones through open_clip: the tiny CLIP fedvlp pretrains itself, and real ones.

`load_clip` is the one loader for every CLIP-like backbone. `ClipBackbone` wraps the frozen
model with what the methods need: image features in fixed chunks (so a sample's feature never
depends on which worker or batch computed it) and a text encoder that takes token embeddings,
so learned prompt vectors can stand in for words (CoOp).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import open_clip
import torch
import torch.nn.functional as F

from fedvlp.backbones import FEATURE_CHUNK, TINY_CLIP, hf_cache_dir
from fedvlp.errors import BackboneError

FEATURE_KINDS = ("global", "tokens")

open_clip.add_model_config(Path(__file__).parent / "model_configs" / f"{TINY_CLIP}.json")


def _checked_pretrained(name: str, pretrained: str | None) -> str | None:
    """`pretrained` as open_clip takes it: None, a checkpoint file's path or one of `name`'s tags; else one line."""
    if name not in open_clip.list_models():
        raise BackboneError(f"backbone.name: unknown open_clip model {name!r} (try ViT-B-16 or {TINY_CLIP})")
    if not pretrained:
        return None
    path = Path(pretrained).expanduser()
    if path.is_dir():
        raise BackboneError(f"backbone.pretrained: {pretrained} is a directory; expected an open_clip checkpoint file "
                            f"or an open_clip tag of {name}")
    if path.exists():
        return str(path)
    if pretrained not in open_clip.list_pretrained_tags_by_model(name):
        raise BackboneError(
            f"backbone.pretrained: {pretrained!r} is neither a checkpoint file nor an open_clip tag of {name} "
            f"({', '.join(open_clip.list_pretrained_tags_by_model(name)) or 'none'})"
        )
    return pretrained


def _download_help(name: str, tag: str | None) -> str:
    return (f"download them where there is internet (python -c \"import open_clip; "
            f"open_clip.create_model('{name}', pretrained='{tag}')\") and copy the Hugging Face cache "
            f"({hf_cache_dir()}) here, or set backbone.pretrained to a local checkpoint file")


def fetch_clip_weights(name: str, pretrained: str | None) -> None:
    """Have the weights `create_clip(name, pretrained)` loads on this machine, fetched as open_clip fetches them
    (a tag's Hugging Face hub entry through the HF cache, else its URL through ~/.cache/clip): found in the cache,
    downloaded where the hub can be reached, or a one-line BackboneError naming the fields and how to provide them.
    The driver calls it before any cluster work, so missing weights never surface as a dead worker."""
    tag = _checked_pretrained(name, pretrained)
    if tag is None or Path(tag).is_file():
        return
    cfg = open_clip.get_pretrained_cfg(name, tag)
    try:
        open_clip.download_pretrained(cfg)  # what open_clip.create_model calls: a cache hit costs no download
    except Exception as exc:
        where = (f"{cfg['hf_hub'].rstrip('/')} in the Hugging Face cache" if cfg.get("hf_hub") else
                 f"{cfg.get('url')} in {Path('~/.cache/clip').expanduser()}")
        raise BackboneError(
            f"backbone.pretrained: the {tag!r} weights of backbone.name {name} are not on this machine and could not "
            f"be downloaded ({type(exc).__name__}; looked for {where}); {_download_help(name, tag)}"
        ) from None


def create_clip(name: str, pretrained: str | None = None) -> torch.nn.Module:
    """Build an open_clip model; `pretrained` is an open_clip tag ('openai'), a checkpoint path, or None."""
    pretrained = _checked_pretrained(name, pretrained)
    logging.getLogger().setLevel(max(logging.getLogger().level, logging.ERROR))  # open_clip warns on random init
    try:
        return open_clip.create_model(name, pretrained=pretrained)
    except Exception as exc:  # offline hub, corrupt file: one line that says how to provide weights
        raise BackboneError(
            f"backbone {name}/{pretrained}: weights could not be loaded ({type(exc).__name__}); "
            f"{_download_help(name, pretrained)}"
        ) from None


class ClipBackbone(torch.nn.Module):
    """A frozen open_clip model plus the encoders the prompt-tuning methods share."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, model: Any, name: str):
        super().__init__()
        # open_clip's CLIP and CustomTextCLIP share no typed interface (visual, transformer, token_embedding, ...)
        self.model: Any = model.eval().requires_grad_(False)
        self.name = name
        self.tokenizer = open_clip.get_tokenizer(name)
        cfg: dict = self.model.visual.preprocess_cfg
        self.image_size = tuple(cfg["size"]) if isinstance(cfg["size"], (tuple, list)) else (cfg["size"],) * 2
        self.register_buffer("mean", torch.tensor(cfg["mean"]).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(cfg["std"]).view(1, 3, 1, 1), persistent=False)

    @property
    def transform_id(self) -> str:
        """Names the image transform, for keying cached features."""
        size = f"{self.image_size[0]}x{self.image_size[1]}"
        return f"{size}-bicubic-mean{self.mean.flatten().tolist()}-std{self.std.flatten().tolist()}"

    @property
    def device(self) -> torch.device:
        return self.mean.device

    @property
    def embed_dim(self) -> int:
        return self.model.text_projection.shape[1]

    @property
    def token_width(self) -> int:
        return self.model.token_embedding.embedding_dim

    @property
    def logit_scale(self) -> float:
        return float(self.model.logit_scale.exp())

    def preprocess(self, images: np.ndarray | torch.Tensor) -> torch.Tensor:
        """uint8 [n, H, W, 3] -> normalised float [n, 3, h, w] at the model's input size."""
        x = torch.as_tensor(images).to(self.device).permute(0, 3, 1, 2).float().div_(255)
        if tuple(x.shape[-2:]) != self.image_size:
            x = F.interpolate(x, size=self.image_size, mode="bicubic", align_corners=False).clamp_(0, 1)
        return (x - self.mean) / self.std

    @torch.no_grad()
    def encode_images(self, images: np.ndarray, kind: str = "global") -> torch.Tensor:
        """Frozen, L2-normalised image features, computed in fixed chunks of FEATURE_CHUNK.

        kind="global": the pooled embedding [n, D]. kind="tokens": [n, 1 + M, D], the pooled
        embedding followed by M dense patch features (`dense_features`), the evidence that
        region-level methods match against class prompts.
        """
        if kind not in FEATURE_KINDS:
            raise ValueError(f"kind must be one of {FEATURE_KINDS}, got {kind!r}")
        chunks = [self._encode_chunk(self.preprocess(images[i : i + FEATURE_CHUNK]), kind)
                  for i in range(0, len(images), FEATURE_CHUNK)]
        return torch.cat(chunks).float().cpu() if chunks else torch.zeros(0, self.embed_dim)

    def _encode_chunk(self, pixels: torch.Tensor, kind: str) -> torch.Tensor:
        if kind == "global":
            return F.normalize(self.model.encode_image(pixels), dim=-1)
        pooled, patches = self.dense_features(pixels)
        return F.normalize(torch.cat([pooled.unsqueeze(1), patches], dim=1), dim=-1)

    def dense_features(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(pooled [n, D], patches [n, M, D]) in the joint space, not normalised; differentiable.

        The patches follow MaskCLIP (Zhou et al., ECCV 2022): each patch's value path through the
        last block (v-projection, out-projection, then ln_post and proj), skipping that block's
        query-key mixing, its residual and its MLP, as ClearCLIP (Lan et al., ECCV 2024) does;
        MaskCLIP keeps the residual and MLP. ViT patch *outputs* are never trained to match text
        (only the class token is) and align poorly with it; the values are what the class token
        pools, so they speak its language. Works for any open_clip VisionTransformer; the pooled
        token is the model's own.
        """
        visual = self.model.visual
        last = visual.transformer.resblocks[-1]
        inputs = []
        hook = last.register_forward_pre_hook(lambda _block, args: inputs.append(args[0]))
        try:
            pooled = visual(pixels)
        finally:
            hook.remove()
        x = inputs[0] if visual.transformer.batch_first else inputs[0].transpose(0, 1)
        rows, cols = visual.grid_size
        x = x[:, -rows * cols :]  # the patch tokens (the class token comes first)
        attn, width = last.attn, x.shape[-1]
        bias = None if attn.in_proj_bias is None else attn.in_proj_bias[2 * width :]
        values = F.linear(last.ln_1(x), attn.in_proj_weight[2 * width :], bias)
        patches = visual.ln_post(last.ls_1(attn.out_proj(values)))
        return pooled, patches @ visual.proj if visual.proj is not None else patches

    def tokenize(self, texts: list[str]) -> torch.Tensor:
        return self.tokenizer(texts).to(self.device)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.token_embedding(tokens)

    def encode_token_embeddings(self, embeddings: torch.Tensor, eot_index: torch.Tensor) -> torch.Tensor:
        """Text features from token embeddings [n, L, width]; L may be shorter than the context.

        This is open_clip's `encode_text` after the embedding lookup, so learned context
        vectors can replace word embeddings. Gradients flow to `embeddings` only.
        """
        length = embeddings.shape[1]
        model = self.model
        x = embeddings + model.positional_embedding[:length]
        *blocks, last = model.transformer.resblocks
        for block in blocks:
            x = block(x, attn_mask=model.attn_mask[:length, :length])
        # Only the end-of-text output is used and the mask is causal: the last block needs every
        # token as a key, but its attention and MLP run for the end-of-text query alone.
        rows = torch.arange(x.shape[0], device=x.device)
        keys = last.ln_1(x)
        after_eot = torch.arange(length, device=x.device) > eot_index.unsqueeze(1)
        attended = last.attn(keys[rows, eot_index].unsqueeze(1), keys, keys, need_weights=False,
                             key_padding_mask=after_eot)[0]
        x = x[rows, eot_index].unsqueeze(1) + last.ls_1(attended)
        x = x + last.ls_2(last.mlp(last.ln_2(x)))
        return model.ln_final(x[:, 0]) @ model.text_projection

    def encode_prompt_groups(self, embeddings: torch.Tensor, eot_index: torch.Tensor, shared: int) -> torch.Tensor:
        """Text features [G, C, D] of G groups of C prompts [G, C, L, width] whose first `shared` tokens are the
        same within a group (FedMPT: a condition's prompts all start [SOS][cond ctx][COND][class ctx]).

        The mask is causal, so a token's hidden states never depend on what follows it: each group's shared
        prefix runs through the encoder once, and only the C continuations run per prompt, attending to the
        prefix's keys and values. Equals `encode_token_embeddings` on the flattened prompts up to float rounding.
        """
        groups, classes, length, width = embeddings.shape
        model = self.model
        *blocks, last = model.transformer.resblocks
        if not 0 < shared <= int(eot_index.min()) or not all(
                isinstance(b.attn, torch.nn.MultiheadAttention) and b.attn.batch_first for b in (*blocks, last)):
            flat = self.encode_token_embeddings(embeddings.reshape(groups * classes, length, width),
                                                eot_index.reshape(-1))
            return flat.reshape(groups, classes, -1)
        x = embeddings + model.positional_embedding[:length]
        prefix = x[:, 0, :shared]  # [G, P, width]
        rest = x[:, :, shared:].reshape(groups * classes, length - shared, width)  # [G * C, S, width]
        positions = torch.arange(length, device=x.device)
        causal = positions[shared:, None] >= positions  # [S, P + S]: a continuation token sees itself and before
        for block in blocks:
            rest = _continuation_block(block, prefix, rest, causal)
            prefix = block(prefix, attn_mask=model.attn_mask[:shared, :shared])
        # As in encode_token_embeddings, the last block runs for the end-of-text query alone.
        eot = eot_index.reshape(-1, 1) - shared
        rest = _continuation_block(last, prefix, rest, causal[eot], queries=eot)
        return (model.ln_final(rest[:, 0]) @ model.text_projection).reshape(groups, classes, -1)

    def encode_texts(self, texts: list[str]) -> torch.Tensor:
        """L2-normalised text embeddings [n, D] for plain strings."""
        tokens = self.tokenize(texts)
        with torch.no_grad():
            return F.normalize(self.encode_token_embeddings(self.embed_tokens(tokens), tokens.argmax(-1)), dim=-1)


def _continuation_block(block, prefix: torch.Tensor, rest: torch.Tensor, allowed: torch.Tensor,
                        queries: torch.Tensor | None = None) -> torch.Tensor:
    """One open_clip residual block for continuations `rest` [G * C, S, width] of their group's `prefix`
    [G, P, width], both the block's inputs: keys and values are the prefix's (projected once per group)
    followed by the continuation's own. `allowed` [S or n, Q, P + S] marks the keys each query sees; with
    `queries` [n, Q] (positions in the continuation) only those rows are computed."""
    attn = block.attn
    heads, width = attn.num_heads, prefix.shape[-1]
    per_group = rest.shape[0] // prefix.shape[0]
    weight, bias = attn.in_proj_weight, attn.in_proj_bias
    rows = torch.arange(rest.shape[0], device=rest.device).unsqueeze(1)
    inputs = rest if queries is None else rest[rows, queries]
    query = F.linear(block.ln_1(inputs), weight[:width], bias[:width])
    keys, values = F.linear(block.ln_1(rest), weight[width:], bias[width:]).chunk(2, dim=-1)
    prefix_keys, prefix_values = F.linear(block.ln_1(prefix), weight[width:], bias[width:]).chunk(2, dim=-1)
    keys = torch.cat([prefix_keys.repeat_interleave(per_group, 0), keys], dim=1)
    values = torch.cat([prefix_values.repeat_interleave(per_group, 0), values], dim=1)
    split = lambda t: t.unflatten(-1, (heads, -1)).transpose(1, 2)  # noqa: E731  [n, heads, L, head width]
    attended = F.scaled_dot_product_attention(split(query), split(keys), split(values),
                                              attn_mask=allowed.unsqueeze(-3) if allowed.dim() == 3 else allowed)
    x = inputs + block.ls_1(attn.out_proj(attended.transpose(1, 2).flatten(2)))
    return x + block.ls_2(block.mlp(block.ln_2(x)))
