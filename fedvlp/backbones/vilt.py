"""ViLT backbones through transformers: the tiny ViLT fedvlp pretrains itself, and real ones.

`ViltBackbone` wraps a frozen `transformers.ViltModel` with the two halves the missing-aware
prompt methods (Lee et al. CVPR'23, FED-PRIME) need:

* `embed`: the frozen embedding-layer outputs (text tokens, then the image [CLS] and patches,
  with ViLT's modality-type embeddings added). They do not depend on any prompt, so they can
  be computed once and cached. Unlike `ViltEmbeddings.visual_embed`, which samples patches at
  random (`torch.multinomial`, at test time too), every patch is kept in grid order, so the same
  input always gives bit-identical output.
* `encode`: the frozen transformer layers and final layernorm on those embeddings, with learned
  prompts prepended before any layer; gradients reach the embeddings and prompts, never the weights.

The tiny ViLT (`TINY_VILT`) is ViLT's architecture at 32 px (hidden 128, 4 layers, patch 8) with
a word-level BERT tokenizer over the synthetic recipes' vocabulary, so nothing is downloaded.
"""
from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import BertTokenizerFast, ViltConfig, ViltModel  # type: ignore[attr-defined]  # lazy export
from transformers.models.vilt.modeling_vilt import ViltPooler
from transformers.utils import cached_file

from fedvlp.backbones import hf_cache_dir
from fedvlp.data.missing import fill_missing_images
from fedvlp.data.recipes import VOCABULARY
from fedvlp.errors import BackboneError

TINY_VILT = "tiny-vilt"
MAX_TEXT_LEN = 16            # tiny ViLT: recipe titles are 4-10 words, one token each, plus [CLS] [SEP]
REAL_MAX_TEXT_LEN = 40       # dandelin/vilt-b32-mlm's text positions (the reference's Food-101 setting)
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PIXEL_MEAN = PIXEL_STD = (0.5, 0.5, 0.5)   # ViLT's (inception) normalisation
# 1/sqrt(width) rather than BERT's 0.02: at 0.02 the text [CLS] barely depends on the input at
# initialisation and pretraining (a few hundred steps) never gets going.
INIT_STD = 128 ** -0.5
EMBED_CHUNK = 256            # samples per forward pass; fixed so outputs are placement-independent


def tiny_vocabulary(words: Sequence[str] = VOCABULARY) -> tuple[str, ...]:
    """The tiny ViLT's WordPiece vocabulary: the special tokens, then the words sorted."""
    return SPECIAL_TOKENS + tuple(sorted(set(words) - set(SPECIAL_TOKENS)))


def make_tokenizer(vocabulary: Sequence[str]) -> BertTokenizerFast:
    """A lowercasing BERT (WordPiece) tokenizer over `vocabulary` (id = position): no download."""
    if int(transformers.__version__.split(".")[0]) >= 5:  # v5 takes the vocabulary itself and ignores vocab_file
        return BertTokenizerFast(vocab={word: i for i, word in enumerate(vocabulary)}, do_lower_case=True)
    with tempfile.TemporaryDirectory() as folder:  # v4 reads a vocab.txt
        path = Path(folder) / "vocab.txt"
        path.write_text("".join(f"{word}\n" for word in vocabulary), encoding="utf-8")
        return BertTokenizerFast(vocab_file=str(path), do_lower_case=True)


def tiny_vilt_config(vocab_size: int) -> ViltConfig:
    """ViLT at 32 px: hidden 128, 4 layers of 4 heads, MLP 512, patch 8 (16 patches + image [CLS])."""
    return ViltConfig(vocab_size=vocab_size, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                      intermediate_size=512, image_size=32, patch_size=8, max_position_embeddings=MAX_TEXT_LEN,
                      modality_type_vocab_size=2, type_vocab_size=2, pad_token_id=0, max_image_length=-1,
                      initializer_range=INIT_STD)


def _weights_help(name: str) -> str:
    return (f"download it where there is internet (python -c \"from transformers import BertTokenizerFast, ViltModel; "
            f"ViltModel.from_pretrained('{name}').save_pretrained('DIR'); "
            f"BertTokenizerFast.from_pretrained('{name}').save_pretrained('DIR')\"), copy DIR here "
            f"and set backbone.pretrained (or backbone.name) to DIR")


# The files create_vilt reads: what to call each, and its alternatives in transformers' order of preference.
CONFIG_FILES = ("config.json", ("config.json",))
TOKENIZER_FILES = ("tokenizer.json or vocab.txt", ("tokenizer.json", "vocab.txt"))
WEIGHT_FILES = ("model.safetensors or pytorch_model.bin", ("model.safetensors", "model.safetensors.index.json",
                                                           "pytorch_model.bin", "pytorch_model.bin.index.json"))


def fetch_vilt_files(name: str, source: str, random_init: bool = False) -> None:
    """Have the files `create_vilt(name, source, random_init=...)` reads on this machine, fetched as transformers
    fetches them (from a local directory, else the Hugging Face cache, downloading where the hub can be reached):
    config, tokenizer and, unless `random_init`, weights. Otherwise a one-line BackboneError that says how to
    provide them. The driver calls it before any cluster work, so missing weights never kill a worker."""
    field = "backbone.name" if source == name else "backbone.pretrained"
    path = Path(source).expanduser()
    local = str(path) if path.is_dir() else None
    needed = (CONFIG_FILES, TOKENIZER_FILES) if random_init else (CONFIG_FILES, TOKENIZER_FILES, WEIGHT_FILES)
    try:
        missing = [label for label, files in needed
                   if not any(cached_file(local or source, file, _raise_exceptions_for_missing_entries=False,
                                          _raise_exceptions_for_connection_errors=False) for file in files)]
    except Exception as exc:  # no such repository on the hub, a gated one, an unreadable cache
        missing = [f"the model ({type(exc).__name__})"]
    if not missing:
        return
    looked = local or f"the Hugging Face cache {hf_cache_dir()}"
    needs = " (backbone.pretrained none still needs the config and tokenizer)" if random_init else ""
    raise BackboneError(f"{field} {source}: ViLT files not on this machine{needs}: {'; '.join(missing)} "
                        f"(looked in {looked}); {_weights_help(local or source)}")


def create_vilt(name: str = TINY_VILT, pretrained: str | None = None, vocabulary: Sequence[str] | None = None,
                random_init: bool = False) -> ViltBackbone:
    """A frozen ViLT.

    `name` tiny-vilt: a fresh tiny ViLT initialised from the global torch RNG (seed it first), over
    `vocabulary` (default `tiny_vocabulary()`). Any other name is a Hugging Face model id or a
    local directory (`pretrained`, when given, is the id or directory to load instead):
    `ViltModel.from_pretrained` and `BertTokenizerFast.from_pretrained` (or, with `random_init`,
    only the config, initialised from the global RNG). Text is cut to the model's text positions,
    at most 40, and images are resized square to the model's image size (384 for
    dandelin/vilt-b32-mlm, where the original resizes the shorter side to 384 and keeps the aspect).
    Weights that cannot be had raise a one-line `BackboneError` that says how to provide them.
    """
    if name == TINY_VILT and pretrained is None:
        vocabulary = tuple(vocabulary or tiny_vocabulary())
        model = ViltModel(tiny_vilt_config(len(vocabulary)))
        with torch.no_grad():  # real ViLT takes these from a pretrained ViT; transformers leaves them at zero
            model.embeddings.cls_token.normal_(0, INIT_STD)
            model.embeddings.position_embeddings.normal_(0, INIT_STD)
        return ViltBackbone(model, make_tokenizer(vocabulary), name)
    source = pretrained or name
    if Path(source).expanduser().exists():
        source = str(Path(source).expanduser())
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        if random_init:
            model = ViltModel(ViltConfig.from_pretrained(source))
        else:
            model = ViltModel.from_pretrained(source)
        tokenizer = BertTokenizerFast.from_pretrained(source)
    except Exception as exc:  # offline hub, missing or corrupt directory: one line that says how to provide weights
        where = name if source == name else f"{name} ({source})"
        raise BackboneError(
            f"backbone {where}: ViLT weights could not be loaded ({type(exc).__name__}); {_weights_help(source)}"
        ) from None
    finally:
        hf_logging.set_verbosity(verbosity)
    if not isinstance(model.config, ViltConfig):
        raise BackboneError(f"backbone {source}: not a ViLT model (model_type {model.config.model_type!r})")
    max_text_len = min(REAL_MAX_TEXT_LEN, model.config.max_position_embeddings)
    return ViltBackbone(model, tokenizer, name, max_text_len=max_text_len)


class ViltBackbone(torch.nn.Module):
    """A frozen ViltModel plus its tokenizer and preprocessing: `embed` once, then `encode` with prompts."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, model: ViltModel, tokenizer, name: str, max_text_len: int | None = None,
                 image_size: int | tuple[int, int] | None = None):
        super().__init__()
        if model.pooler is None:
            raise BackboneError(f"backbone {name}: the ViltModel has no pooler")
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.name = name
        config = model.config
        self.max_text_len = int(min(max_text_len or config.max_position_embeddings, config.max_position_embeddings))
        size = image_size or config.image_size
        self.image_size = tuple(size) if isinstance(size, (tuple, list)) else (int(size), int(size))
        if not isinstance(config.patch_size, int):
            raise BackboneError(f"backbone {name}: expected an integer patch_size, got {config.patch_size!r}")
        self.patch_size = config.patch_size
        self.num_patches = (self.image_size[0] // self.patch_size) * (self.image_size[1] // self.patch_size)
        self.register_buffer("mean", torch.tensor(PIXEL_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(PIXEL_STD).view(1, 3, 1, 1), persistent=False)

    # ---- what callers key and size things by --------------------------------------------------
    @property
    def transform_id(self) -> str:
        """Names the preprocessing (image transform and text length), for keying cached embeddings."""
        return (f"vilt-{self.image_size[0]}x{self.image_size[1]}-bicubic-mean{self.mean.flatten().tolist()}"
                f"-std{self.std.flatten().tolist()}-text{self.max_text_len}")

    @property
    def device(self) -> torch.device:
        return self.mean.device

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def num_layers(self) -> int:
        return len(self.model.encoder.layer)

    @property
    def seq_len(self) -> int:
        """L of `embed`: max_text_len text tokens, the image [CLS], then the patches."""
        return self.max_text_len + 1 + self.num_patches

    @property
    def pooler(self) -> ViltPooler:
        """The pretrained pooler (Linear + tanh on token 0); copy it to train one of your own."""
        return self.model.pooler

    # ---- embedding layers --------------------------------------------------------------------
    def preprocess(self, images: np.ndarray | torch.Tensor) -> torch.Tensor:
        """uint8 [n, H, W, 3] -> normalised float [n, 3, h, w] at the model's input size."""
        x = torch.as_tensor(images).to(self.device).permute(0, 3, 1, 2).float().div_(255)
        if tuple(x.shape[-2:]) != self.image_size:
            x = F.interpolate(x, size=self.image_size, mode="bicubic", align_corners=False).clamp_(0, 1)
        return (x - self.mean) / self.std

    def tokenize(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask) [n, max_text_len]: [CLS] words [SEP], padded; "" gives [CLS] [SEP]."""
        out = self.tokenizer(list(texts), padding="max_length", truncation=True, max_length=self.max_text_len,
                             return_tensors="pt")
        return out["input_ids"].to(self.device), out["attention_mask"].to(self.device).bool()

    def text_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        """BERT embeddings of the tokens plus the text modality type (0): [n, T, D]."""
        embeddings = self.model.embeddings
        text = embeddings.text_embeddings(input_ids=input_ids, token_type_ids=torch.zeros_like(input_ids))
        return text + embeddings.token_type_embeddings(torch.zeros_like(input_ids))

    def image_embeddings(self, pixels: torch.Tensor) -> torch.Tensor:
        """Image [CLS] then every patch in grid order, with position embeddings (bilinearly
        interpolated, as ViLT does, when the grid differs from the model's) and the image modality
        type (1): [n, 1 + patches, D]. Deterministic: no patch sampling."""
        embeddings = self.model.embeddings
        patches = embeddings.patch_embeddings.projection(pixels)            # [n, D, gh, gw]
        n, dim, gh, gw = patches.shape
        grid = self.model.config.image_size // self.model.config.patch_size
        spatial = embeddings.position_embeddings[:, 1:, :].transpose(1, 2).reshape(1, dim, grid, grid)
        if (gh, gw) != (grid, grid):
            spatial = F.interpolate(spatial, size=(gh, gw), mode="bilinear", align_corners=True)
        patches = patches.flatten(2).transpose(1, 2) + spatial.flatten(2).transpose(1, 2)
        cls = (embeddings.cls_token + embeddings.position_embeddings[:, :1, :]).expand(n, -1, -1)
        x = torch.cat([cls, patches], dim=1)
        return x + embeddings.token_type_embeddings(torch.ones(x.shape[:2], dtype=torch.long, device=x.device))

    def embed_tokens(self, input_ids: torch.Tensor, text_mask: torch.Tensor,
                     pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`embed` on tokenised text and normalised pixels, with gradients (pretraining uses it)."""
        hidden = torch.cat([self.text_embeddings(input_ids), self.image_embeddings(pixels)], dim=1)
        image_mask = torch.ones(pixels.shape[0], 1 + self.num_patches, dtype=torch.bool, device=pixels.device)
        return hidden, torch.cat([text_mask.bool(), image_mask], dim=1)

    @torch.no_grad()
    def embed(self, images: np.ndarray, texts: Sequence[str],
              image_missing: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Frozen embedding-layer outputs of image-text pairs, in fixed chunks of EMBED_CHUNK.

        images uint8 [n, H, W, 3] (resized to `image_size` if needed); texts, "" for a missing
        one; image_missing bool [n]: those images become all-ones after normalisation (the
        reference's dummy image). Returns float32 [n, L, D] on the CPU, L = max_text_len + 1 +
        num_patches (text tokens padded to max_text_len, then the image [CLS] and patches), and
        the bool [n, L] mask of real (non-pad) tokens.
        """
        image_missing = np.asarray(image_missing, bool)
        if not len(images) == len(texts) == len(image_missing):
            raise ValueError(f"images, texts and image_missing must have the same length, got "
                             f"{len(images)}, {len(texts)}, {len(image_missing)}")
        hidden, masks = [], []
        for i in range(0, len(texts), EMBED_CHUNK):
            pixels = fill_missing_images(self.preprocess(images[i:i + EMBED_CHUNK]), image_missing[i:i + EMBED_CHUNK])
            x, mask = self.embed_tokens(*self.tokenize(texts[i:i + EMBED_CHUNK]), pixels)
            hidden.append(x.float().cpu())
            masks.append(mask.cpu())
        if not hidden:
            return torch.zeros(0, self.seq_len, self.hidden_size), torch.zeros(0, self.seq_len, dtype=torch.bool)
        return torch.cat(hidden), torch.cat(masks)

    # ---- transformer -------------------------------------------------------------------------
    def encode(self, hidden: torch.Tensor, mask: torch.Tensor,
               layer_prompts: dict[int, torch.Tensor] | None = None, prompts_as_one: bool = False) -> torch.Tensor:
        """The frozen transformer layers and final layernorm: last hidden states [B, L', D].

        hidden [B, L, D] (from `embed`), mask bool [B, L] of real tokens. `layer_prompts[i]`
        ([B, P_i, D], or [P_i, D] for the whole batch) is prepended just before layer i, so the
        prompts accumulate (Lee et al.'s 'input' prompts): L' = L + sum(P_i), latest prompts first,
        the text [CLS] at index sum(P_i). Gradients flow to `hidden` and the prompts only.
        `prompts_as_one`: every attention score on one of the P prompts in front of a layer is lowered by
        log P, so at equal scores the prompts together weigh as one token (the reference: as P tokens).
        """
        layers = self.model.encoder.layer
        prompts = dict(layer_prompts or {})
        if any(not 0 <= int(i) < len(layers) for i in prompts):
            raise ValueError(f"layer_prompts keys must be layer indices in [0, {len(layers)}), got {sorted(prompts)}")
        x, mask = hidden, mask.to(device=hidden.device, dtype=torch.bool)
        batch, in_front = x.shape[0], 0
        for i, layer in enumerate(layers):
            if i in prompts:
                p = prompts[i].to(device=x.device, dtype=x.dtype)
                p = p.unsqueeze(0).expand(batch, -1, -1) if p.dim() == 2 else p
                x = torch.cat([p, x], dim=1)
                mask = torch.cat([torch.ones(batch, p.shape[1], dtype=torch.bool, device=x.device), mask], dim=1)
                in_front += p.shape[1]
            scores = additive_attention_mask(mask, x.dtype)
            if prompts_as_one and in_front > 1:
                scores[..., :in_front] -= math.log(in_front)
            x = layer(x, scores)[0]
        return self.model.layernorm(x)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor,
                layer_prompts: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        return self.encode(hidden, mask, layer_prompts)


def additive_attention_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool [B, L] of real tokens -> the additive [B, 1, 1, L] mask ViltSelfAttention adds to its
    scores (0 where attended, the dtype's minimum where masked), as transformers builds it for
    eager attention."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, torch.finfo(dtype).min)[:, None, None, :]


def is_vilt_directory(path: str | Path) -> bool:
    """A local directory whose config.json is a ViLT's."""
    config = Path(path).expanduser() / "config.json"
    try:
        return config.is_file() and json.loads(config.read_text()).get("model_type") == "vilt"
    except (OSError, ValueError):
        return False
