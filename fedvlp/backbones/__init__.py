"""Frozen backbones: one loader per family, the same path for fedvlp's tiny models and real ones."""
from __future__ import annotations

from pathlib import Path

import torch

from fedvlp.backbones.clip import TINY_CLIP, ClipBackbone, create_clip
from fedvlp.backbones.vilt import TINY_VILT, ViltBackbone, create_vilt, is_vilt_directory
from fedvlp.seeding import torch_seed


def backbone_family(name: str) -> str:
    """"vilt" for tiny-vilt, ViLT hub ids and directories holding a ViLT; "clip" otherwise."""
    if name == TINY_VILT or "vilt" in name.lower() or is_vilt_directory(name):
        return "vilt"
    return "clip"


def load_backbone(spec, device: str | torch.device = "cpu") -> "ClipBackbone | ViltBackbone":
    """The frozen backbone a run spec names, CLIP or ViLT."""
    return load_vilt(spec, device) if backbone_family(spec.backbone.name) == "vilt" else load_clip(spec, device)


def load_vilt(spec, device: str | torch.device = "cpu") -> ViltBackbone:
    """The frozen ViLT a run spec names: tiny-vilt (fedvlp-pretrained or random), a hub id or a directory."""
    name, pretrained = spec.backbone.name, spec.backbone.pretrained
    if name == TINY_VILT and pretrained == "fedvlp":
        from fedvlp.backbones.pretrain import ensure_tiny_vilt, load_tiny_vilt_state

        state, vocabulary = load_tiny_vilt_state(ensure_tiny_vilt(progress=False))
        torch.manual_seed(torch_seed(spec.seed, "init", 0))  # overwritten by the state; keeps construction quiet
        backbone = create_vilt(name, vocabulary=vocabulary)
        backbone.model.load_state_dict(state)
    elif name == TINY_VILT and pretrained in ("none", ""):
        torch.manual_seed(torch_seed(spec.seed, "init", 0))  # transformers initialises from the global RNG
        backbone = create_vilt(name)
    else:
        backbone = create_vilt(name, None if pretrained in ("fedvlp", "none", "") else pretrained)
    return backbone.to(device)


def prepare_backbone(spec, progress: bool = True) -> None:
    """Make sure the weights a run needs are on this machine (pretraining tiny-clip once if needed)."""
    if spec.backbone.name == TINY_CLIP and spec.backbone.pretrained == "fedvlp":
        from fedvlp.backbones.pretrain import ensure_tiny_clip

        ensure_tiny_clip(progress=progress)
    if spec.backbone.name == TINY_VILT and spec.backbone.pretrained == "fedvlp":
        from fedvlp.backbones.pretrain import ensure_tiny_vilt

        ensure_tiny_vilt(progress=progress)


def backbone_id(spec) -> str:
    """Names the exact frozen weights, for keying cached features."""
    name, pretrained = spec.backbone.name, spec.backbone.pretrained
    if name == TINY_CLIP and pretrained == "fedvlp":
        from fedvlp.backbones.pretrain import TinyClipRecipe

        return f"{name}:fedvlp:{TinyClipRecipe().key()}"
    if name == TINY_VILT and pretrained == "fedvlp":
        from fedvlp.backbones.pretrain import TinyViltRecipe

        return f"{name}:fedvlp:{TinyViltRecipe().key()}"
    if pretrained in ("none", ""):
        return f"{name}:random:{spec.seed}"
    path = Path(pretrained).expanduser()
    if path.is_file():
        stat = path.stat()
        return f"{name}:{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    return f"{name}:{pretrained}"


def load_clip(spec, device: str | torch.device = "cpu") -> ClipBackbone:
    """The frozen CLIP a run spec names: `backbone.name` + `backbone.pretrained`."""
    name, pretrained = spec.backbone.name, spec.backbone.pretrained
    if name == TINY_CLIP and pretrained == "fedvlp":
        from fedvlp.backbones.pretrain import ensure_tiny_clip, load_tiny_clip_state

        model = create_clip(name)
        model.load_state_dict(load_tiny_clip_state(ensure_tiny_clip(progress=False)))
    elif pretrained in ("none", ""):
        torch.manual_seed(torch_seed(spec.seed, "init", 0))  # open_clip initialises from the global RNG
        model = create_clip(name)
    else:
        model = create_clip(name, pretrained)
    return ClipBackbone(model, name).to(device)
