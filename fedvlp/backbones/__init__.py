"""Frozen backbones: CLIP (`clip`, through open_clip) and ViLT (`vilt`, through transformers), fedvlp's tiny ones and
their pretraining (`pretrain_clip`, `pretrain_vilt`, the shipped weights in `shipped`), and their loaders
(`loaders`: `load_backbone`, `prepare_backbone`, `backbone_id`).

This module holds only what every family shares, and imports none of them.
"""
from __future__ import annotations

import os

TINY_CLIP = "tiny-clip"  # fedvlp's own small CLIP, shipped in the package; `fedvlp pretrain tiny-clip` regenerates it
FEATURE_CHUNK = 256  # images per forward pass; fixed so features are placement-independent


def hf_cache_dir() -> str:
    """Where Hugging Face downloads go, as huggingface_hub resolves it from the environment (for messages)."""
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return os.path.expanduser(os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
                              or os.path.join(home, "hub"))
