"""The loaders of the frozen backbones: one per family, the same path for fedvlp's tiny models and real ones.

Each family's module is imported only where that family is used: open_clip costs a process about 1.5 CPU
seconds to import and transformers' ViLT about 0.7, and every run starts several processes. torch too is
imported by the loaders only: the driver names and fetches weights (`backbone_id`, `prepare_backbone`) without it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from fedvlp.backbones import TINY_CLIP
from fedvlp.seeding import torch_seed

if TYPE_CHECKING:
    import torch

    from fedvlp.backbones.clip import ClipBackbone
    from fedvlp.backbones.vilt import ViltBackbone


def backbone_family(name: str) -> str:
    """'vilt' for tiny-vilt, any name containing 'vilt' (dandelin/vilt-b32-mlm) and a local
    directory holding a ViLT config.json; 'clip' otherwise (open_clip names)."""
    if "vilt" in name.lower():
        return "vilt"
    if Path(name).expanduser().is_dir():
        from fedvlp.backbones.vilt import is_vilt_directory

        if is_vilt_directory(name):
            return "vilt"
    return "clip"


def _fedvlp_pretrained(spec) -> bool:
    """A tiny backbone with fedvlp's own weights (tiny-clip or tiny-vilt)."""
    if spec.backbone.pretrained != "fedvlp":
        return False
    if backbone_family(spec.backbone.name) == "vilt":
        from fedvlp.backbones.vilt import TINY_VILT

        return spec.backbone.name == TINY_VILT
    return spec.backbone.name == TINY_CLIP


def prepare_backbone(spec) -> None:
    """Make sure the weights a run needs are on this machine, before any cluster work: tiny-clip's and tiny-vilt's
    ship in the package and are checked against their checksum; a real backbone's are fetched where its loader
    will look (a local path, else the caches, downloading where the hub can be reached), so weights that cannot
    be had fail here in one line instead of killing every worker."""
    name, pretrained = spec.backbone.name, spec.backbone.pretrained
    random_init = pretrained in ("none", "")
    vilt = backbone_family(name) == "vilt"
    if _fedvlp_pretrained(spec):
        from fedvlp.backbones.shipped import shipped_weights

        shipped_weights(name)  # shipped in the package: checked, never pretrained on the way
    elif os.environ.get("RAY_ADDRESS"):
        return  # the workers run on another machine and look in its caches, not this one's
    elif vilt:
        from fedvlp.backbones.vilt import TINY_VILT, fetch_vilt_files

        if not (random_init and name == TINY_VILT):  # a random real ViLT still needs its config and tokenizer
            fetch_vilt_files(name, _vilt_source(name, pretrained), random_init)
    elif not (random_init and name == TINY_CLIP):
        from fedvlp.backbones.clip import fetch_clip_weights

        fetch_clip_weights(name, None if random_init else pretrained)


def _vilt_source(name: str, pretrained: str) -> str:
    """Where a real ViLT's weights come from: backbone.pretrained when it names them, else backbone.name."""
    return name if pretrained in ("fedvlp", "none", "") else pretrained


def _path_id(path: Path) -> str:
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    stats = [p.stat() for p in files]
    return f"{path.resolve()}:{sum(s.st_size for s in stats)}:{max((s.st_mtime_ns for s in stats), default=0)}"


def backbone_id(spec) -> str:
    """Names the exact frozen weights, for keying cached features."""
    name, pretrained = spec.backbone.name, spec.backbone.pretrained
    if _fedvlp_pretrained(spec):
        from fedvlp.backbones.shipped import read_manifest

        return f"{name}:fedvlp:{read_manifest()[name]['sha256'][:12]}"
    if pretrained in ("none", ""):
        return f"{name}:random:{spec.seed}"
    if backbone_family(name) == "vilt":
        pretrained = _vilt_source(name, pretrained)
    path = Path(pretrained).expanduser()
    if path.exists():
        return f"{name}:{_path_id(path)}"
    return f"{name}:{pretrained}"


def load_clip(spec, device: str | torch.device = "cpu") -> ClipBackbone:
    """The frozen CLIP a run spec names: `backbone.name` + `backbone.pretrained`."""
    import torch

    from fedvlp.backbones.clip import ClipBackbone, create_clip

    name, pretrained = spec.backbone.name, spec.backbone.pretrained
    if name == TINY_CLIP and pretrained == "fedvlp":
        from fedvlp.backbones.shipped import shipped_weights

        model = create_clip(name, str(shipped_weights(name)))  # float16 on disk, float32 in the model
    elif pretrained in ("none", ""):
        torch.manual_seed(torch_seed(spec.seed, "init", 0))  # open_clip initialises from the global RNG
        model = create_clip(name)
    else:
        model = create_clip(name, pretrained)
    return ClipBackbone(model, name).to(device)


def load_vilt(spec, device: str | torch.device = "cpu") -> ViltBackbone:
    """The frozen ViLT a run spec names.

    * `tiny-vilt` + `fedvlp`: fedvlp's tiny ViLT, pretrained once and cached (`fedvlp pretrain tiny-vilt`).
    * `pretrained: none`: a random initialisation of that architecture, seeded by the run's seed
      (for a real model, its config must be on this machine).
    * otherwise a Hugging Face id (`dandelin/vilt-b32-mlm`) or a local directory, in
      `backbone.pretrained` or else `backbone.name`: `ViltModel.from_pretrained` and
      `BertTokenizerFast.from_pretrained`, text cut to 40 tokens, images resized square to the
      model's size (384). Offline without the weights: a one-line `BackboneError` that says how
      to provide them.
    """
    import torch

    from fedvlp.backbones.vilt import TINY_VILT, create_vilt

    name, pretrained = spec.backbone.name, spec.backbone.pretrained
    if name == TINY_VILT and pretrained == "fedvlp":
        from fedvlp.backbones.pretrain_vilt import load_tiny_vilt_state
        from fedvlp.backbones.shipped import shipped_weights

        state, vocabulary = load_tiny_vilt_state(shipped_weights(name))
        backbone = create_vilt(name, vocabulary=vocabulary)
        backbone.model.load_state_dict(state)
    elif pretrained in ("none", "") and name == TINY_VILT:
        torch.manual_seed(torch_seed(spec.seed, "init", 0))  # transformers initialises from the global RNG
        backbone = create_vilt(name)
    elif pretrained in ("none", ""):
        torch.manual_seed(torch_seed(spec.seed, "init", 0))
        backbone = create_vilt(name, random_init=True)
    else:
        backbone = create_vilt(name, _vilt_source(name, pretrained))
    return backbone.to(device)


def load_backbone(spec, device: str | torch.device = "cpu") -> ClipBackbone | ViltBackbone:
    """The frozen backbone of a run spec, of either family (`backbone_family`)."""
    return (load_vilt if backbone_family(spec.backbone.name) == "vilt" else load_clip)(spec, device)
