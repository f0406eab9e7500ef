"""`fedvlp pretrain tiny-clip`: contrastive pretraining of the tiny CLIP on synthetic-scenes captions.

The recipe is fixed (DESIGN §5): AdamW 1e-3, wd 0.1, batch 128, 5 % warm-up then cosine, a fixed
number of steps over a pool of captioned images. The result is cached under the user cache dir,
keyed by a hash of the recipe, and written atomically so a killed run never leaves a bad file.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import open_clip
import torch
import torch.nn.functional as F
from filelock import FileLock
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from fedvlp.backbones.clip import TINY_CLIP, ClipBackbone, create_clip
from fedvlp.data.scenes import generate_scenes
from fedvlp.paths import cache_dir
from fedvlp.platform.metrics import mean_average_precision
from fedvlp.seeding import torch_generator, torch_seed


@dataclass(frozen=True)
class TinyClipRecipe:
    version: int = 2  # bump when the model code or data generator changes what training produces
    seed: int = 0
    steps: int = 700
    batch_size: int = 128
    pool_size: int = 25_000
    lr: float = 1e-3
    weight_decay: float = 0.1
    warmup_fraction: float = 0.05
    eval_size: int = 2_000

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def checkpoint_path(recipe: TinyClipRecipe = TinyClipRecipe()) -> Path:
    return cache_dir() / "backbones" / f"{TINY_CLIP}-{recipe.key()}.safetensors"


def zero_shot_map(backbone: ClipBackbone, images: np.ndarray, labels: np.ndarray, class_names) -> float:
    """Test mAP of 'a photo of a {class}.' prompts scored by cosine similarity."""
    text = backbone.encode_texts([f"a photo of a {name}." for name in class_names])
    scores = backbone.encode_images(images) @ text.T
    return mean_average_precision(scores.numpy(), labels)


def _lr_at(step: int, recipe: TinyClipRecipe) -> float:
    warmup = max(1, int(recipe.warmup_fraction * recipe.steps))
    if step < warmup:
        return recipe.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, recipe.steps - warmup)
    return recipe.lr * 0.5 * (1 + math.cos(math.pi * progress))


def pretrain_tiny_clip(recipe: TinyClipRecipe = TinyClipRecipe(), progress: bool = True) -> dict:
    """Train the tiny CLIP from scratch; returns {'path', 'zero_shot_map_untrained', 'zero_shot_map'}."""
    torch.manual_seed(torch_seed(recipe.seed, "pretrain", 0))  # open_clip initialises from the global RNG
    model = create_clip(TINY_CLIP)
    backbone = ClipBackbone(model, TINY_CLIP)
    pool = generate_scenes(recipe.pool_size, "pretrain", recipe.seed)
    test = generate_scenes(recipe.eval_size, "test", recipe.seed)
    untrained = zero_shot_map(backbone, test.images, test.labels, test.class_names)

    tokens = backbone.tokenize(pool.captions)
    lengths = tokens.argmax(-1) + 1  # the EOT token has the largest id
    images = torch.from_numpy(pool.images)
    model.train().requires_grad_(True)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embedding" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embedding" not in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=recipe.lr,
    )
    loss_fn = open_clip.ClipLoss()
    generator = torch_generator(recipe.seed, "pretrain", 1)
    bar = tqdm(range(recipe.steps), desc="pretraining tiny-clip", disable=not progress, unit="step")
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, recipe)
        batch = torch.randint(len(pool.captions), (recipe.batch_size,), generator=generator)
        length = int(lengths[batch].max())  # cut the batch to its longest caption: same result, faster
        text = tokens[batch, :length]
        image_features = F.normalize(model.encode_image(backbone.preprocess(images[batch])), dim=-1)
        text_features = F.normalize(
            backbone.encode_token_embeddings(backbone.embed_tokens(text), text.argmax(-1)), dim=-1
        )
        loss = loss_fn(image_features, text_features, model.logit_scale.exp())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))
        if step % 20 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval().requires_grad_(False)
    trained = zero_shot_map(backbone, test.images, test.labels, test.class_names)

    path = checkpoint_path(recipe)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    metadata = {"recipe": json.dumps(asdict(recipe)), "zero_shot_map_untrained": f"{untrained:.4f}",
                "zero_shot_map": f"{trained:.4f}"}
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp), metadata=metadata)
    os.replace(tmp, path)  # atomic: a partly written file is never seen under the final name
    return {"path": str(path), "zero_shot_map_untrained": untrained, "zero_shot_map": trained}


def ensure_tiny_clip(recipe: TinyClipRecipe = TinyClipRecipe(), progress: bool = True) -> Path:
    """The cached checkpoint, pretraining it first if this machine has none (one process at a time)."""
    path = checkpoint_path(recipe)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if not path.exists():
            if progress:
                print(f"fedvlp: no pretrained {TINY_CLIP} in {path.parent}; pretraining it once (about 2 min on 2 cores)")
            pretrain_tiny_clip(recipe, progress=progress)
    return path


def load_tiny_clip_state(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))
