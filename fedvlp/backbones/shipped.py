"""The tiny backbones' weights that ship inside the package: `fedvlp/backbones/weights/`.

Each is stored in float16 (under 20 MB) with its entry in `manifest.json`: checksum, size, the recipe and the code key
it was trained from, the command that regenerates it and the figures measured on the float16 file itself (what every
run loads). `shipped_weights` checks the checksum before handing a file out, so a run, a test or CI never pretrains;
`fedvlp pretrain` writes new ones with `ship`.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from fedvlp.errors import BackboneError

SHIPPED_DIR = Path(__file__).resolve().parent / "weights"
MANIFEST = "manifest.json"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(directory: Path = SHIPPED_DIR) -> dict[str, dict]:
    path = directory / MANIFEST
    return json.loads(path.read_text()) if path.exists() else {}


_VERIFIED: dict[Path, tuple] = {}  # path -> (checksum, mtime, size) already verified in this process


def shipped_weights(backbone: str, directory: Path = SHIPPED_DIR) -> Path:
    """The float16 weights of `backbone` shipped in the package, after checking them against the manifest's
    checksum; a one-line BackboneError where they are missing or differ."""
    path, entry = directory / f"{backbone}.safetensors", read_manifest(directory).get(backbone)
    regenerate = f"reinstall fedvlp, or regenerate them with `fedvlp pretrain {backbone}`"
    if entry is None or not path.exists():
        raise BackboneError(f"backbone.name: the {backbone} weights are not in this installation ({path}); "
                            f"{regenerate}")
    stat = path.stat()
    seen = (entry["sha256"], stat.st_mtime_ns, stat.st_size)
    if _VERIFIED.get(path) != seen:
        if file_sha256(path) != entry["sha256"]:
            raise BackboneError(f"{path}: checksum does not match {directory / MANIFEST}; {regenerate}")
        _VERIFIED[path] = seen
    return path


def regenerate(recipe, pretrain: Callable[..., dict], measure: Callable[..., dict[str, float]], force: bool = False,
               directory: Path = SHIPPED_DIR, progress: bool = True) -> dict:
    """`fedvlp pretrain`: pretrain `recipe` (or take its float32 result cached for this recipe and code), then `ship`
    it into `directory` (the package's by default) with the figures `measure(path, recipe)` takes."""
    from fedvlp.backbones.pretrain import ensure

    if force:
        pretrain(recipe, progress)
    return ship(recipe, ensure(recipe, pretrain, progress), lambda path: measure(path, recipe), directory)


def ship(recipe, checkpoint: Path, measure: Callable[[Path], dict[str, float]],
         directory: Path = SHIPPED_DIR) -> dict:
    """Write the float32 `checkpoint` as float16 into `directory` and record its manifest entry, with the figures
    `measure` takes from the float16 file itself (what every run will load)."""
    from safetensors import safe_open
    from safetensors.torch import save_file  # imports torch: not at the top, where the driver checks the weights

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{recipe.backbone}.safetensors"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with safe_open(str(checkpoint), "pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}
        metadata = dict(f.metadata() or {})
    save_file({k: v.half() if v.is_floating_point() else v for k, v in state.items()}, str(tmp), metadata=metadata)
    tmp.chmod(0o644)  # package data: readable by whoever installs it
    os.replace(tmp, path)
    entry = {"file": path.name, "sha256": file_sha256(path), "bytes": path.stat().st_size, "dtype": "float16",
             "recipe": asdict(recipe), "code_key": recipe.key(), "command": f"fedvlp pretrain {recipe.backbone}",
             "figures": {k: round(v, 4) for k, v in measure(path).items()}}
    manifest = {**read_manifest(directory), recipe.backbone: entry}
    tmp = directory / f"{MANIFEST}.tmp{os.getpid()}"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, directory / MANIFEST)
    return entry
