"""Frozen backbones: one loader per family, the same path for fedvlp's tiny models and real ones."""
from __future__ import annotations

import torch

from fedvlp.backbones.clip import TINY_CLIP, ClipBackbone, create_clip
from fedvlp.seeding import torch_seed


def prepare_backbone(spec, progress: bool = True) -> None:
    """Make sure the weights a run needs are on this machine (pretraining tiny-clip once if needed)."""
    if spec.backbone.name == TINY_CLIP and spec.backbone.pretrained == "fedvlp":
        from fedvlp.backbones.pretrain import ensure_tiny_clip

        ensure_tiny_clip(progress=progress)


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
