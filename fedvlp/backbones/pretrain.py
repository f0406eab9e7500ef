"""`fedvlp pretrain tiny-clip | tiny-vilt`: what the pretraining of fedvlp's tiny backbones shares.

The recipes themselves live one module per backbone (`pretrain_clip`, `pretrain_vilt`). Both use
a fixed number of steps (not a time budget) and named random streams, so the same recipe gives
bit-identical weights.

The weights a run uses ship inside the package (`fedvlp.backbones.shipped`); `fedvlp pretrain`
regenerates them. It trains in float32 into the user cache dir, keyed by a hash of the recipe *and of
the code that produces it* (the syntax trees of the pretraining module, the data generator and the
model code, and the model config: `_Recipe.code`), so a changed recipe or generator is never served
from a stale cache, while comments and docstrings leave the key alone. Entries are written
atomically, so a killed run never leaves a bad file.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

import torch
from filelock import FileLock
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from fedvlp.paths import cache_dir


def _code(path: Path) -> bytes:
    """What a source file *does*: Python as its syntax tree without docstrings (comments, formatting and
    documentation do not change the key), JSON as its canonical dump."""
    text = path.read_text()
    if path.suffix == ".json":
        return json.dumps(json.loads(text), sort_keys=True).encode()
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body \
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) \
                and isinstance(node.body[0].value.value, str):
            node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False).encode()


def _source_digest(names: tuple[str, ...]) -> str:
    """sha256 over the code of modules (dotted names) or package files (paths relative to fedvlp/)."""
    digest = hashlib.sha256()
    for name in names:
        if name.endswith((".json", ".py")):
            path = Path(__file__).resolve().parent.parent / name
        else:
            spec = importlib.util.find_spec(name)
            if spec is None or spec.origin is None:
                raise ModuleNotFoundError(f"pretraining cache key: no module {name}")
            path = Path(spec.origin)
        digest.update(name.encode() + b"\0" + _code(path))
    return digest.hexdigest()


@dataclass(frozen=True)
class _Recipe:
    """What every pretraining recipe shares: the optimiser's fields (each subclass gives their
    values) and a cache key."""

    backbone: ClassVar[str]
    minutes: ClassVar[str]      # how long it takes on 2 cores, for the first-use message
    code: ClassVar[tuple[str, ...]]  # the modules and files whose source shapes the weights
    seed: int
    steps: int
    batch_size: int
    lr: float
    weight_decay: float
    warmup_fraction: float

    def fingerprint(self) -> dict:
        return {**asdict(self), "code": _source_digest(("fedvlp.backbones.pretrain", *self.code))}

    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.fingerprint(), sort_keys=True).encode()).hexdigest()[:12]


def checkpoint_path(recipe: _Recipe) -> Path:
    return cache_dir() / "backbones" / f"{recipe.backbone}-{recipe.key()}.safetensors"


def lr_at(step: int, recipe: _Recipe) -> float:
    warmup = max(1, int(recipe.warmup_fraction * recipe.steps))
    if step < warmup:
        return recipe.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, recipe.steps - warmup)
    return recipe.lr * 0.5 * (1 + math.cos(math.pi * progress))


def train(modules: list[torch.nn.Module], recipe: _Recipe, step_loss: Callable[[int], torch.Tensor],
           progress: bool, after_step: Callable[[], None] | None = None) -> None:
    """AdamW (weight decay on matrices that are not embeddings) with warm-up then cosine, for
    `recipe.steps` steps of `step_loss(step)`."""
    named = [(n, p) for module in modules for n, p in module.named_parameters()]
    decay = [p for n, p in named if p.ndim >= 2 and "embedding" not in n]
    no_decay = [p for n, p in named if not (p.ndim >= 2 and "embedding" not in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=recipe.lr,
    )
    bar = tqdm(range(recipe.steps), desc=f"pretraining {recipe.backbone}", disable=not progress, unit="step")
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, recipe)
        loss = step_loss(step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if after_step is not None:
            after_step()
        if step % 20 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")


def save(model: torch.nn.Module, recipe: _Recipe, metrics: dict[str, float],
         extra: dict[str, str] | None = None) -> Path:
    """Write the model's weights under the recipe's key, atomically, with the recipe and metrics as metadata."""
    path = checkpoint_path(recipe)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    metadata = {"recipe": json.dumps(asdict(recipe)), **{k: f"{v:.4f}" for k, v in metrics.items()}, **(extra or {})}
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp), metadata=metadata)
    os.replace(tmp, path)  # atomic: a partly written file is never seen under the final name
    return path


def ensure(recipe: _Recipe, pretrain: Callable[..., dict], progress: bool) -> Path:
    """The cached checkpoint, pretraining it first if this machine has none (one process at a time)."""
    path = checkpoint_path(recipe)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if not path.exists():
            if progress:
                print(f"fedvlp: no pretrained {recipe.backbone} in {path.parent}; "
                      f"pretraining it once ({recipe.minutes} on 2 cores)")
            pretrain(recipe, progress=progress)
    return path


def read_metadata(path: Path) -> dict[str, str]:
    """The recipe and measured figures stored with a pretrained checkpoint."""
    with safe_open(str(path), "pt") as f:
        return dict(f.metadata() or {})



