"""`fedvlp pretrain tiny-clip`: contrastive pretraining of the tiny CLIP on synthetic-scenes captions.

AdamW 1e-3, wd 0.1, batch 128, 5 % warm-up then cosine, a fixed number of steps over a pool of
captioned images; cached by `fedvlp.backbones.pretrain` under a key of the recipe and its code.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import open_clip
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from fedvlp.backbones.clip import TINY_CLIP, ClipBackbone, create_clip
from fedvlp.backbones.pretrain import _Recipe, ensure, save, train
from fedvlp.data.scenes import generate_scenes
from fedvlp.platform.metrics import mean_average_precision
from fedvlp.seeding import torch_generator, torch_seed


@dataclass(frozen=True)
class TinyClipRecipe(_Recipe):
    backbone: ClassVar[str] = TINY_CLIP
    minutes: ClassVar[str] = "about 2 min"
    code: ClassVar[tuple[str, ...]] = ("fedvlp.backbones.pretrain_clip", "fedvlp.backbones.clip",
                                       "fedvlp.data.scenes", "backbones/model_configs/tiny-clip.json")
    seed: int = 0
    steps: int = 700
    batch_size: int = 128
    pool_size: int = 25_000
    lr: float = 1e-3
    weight_decay: float = 0.1
    warmup_fraction: float = 0.05
    eval_size: int = 2_000


def zero_shot_map(backbone: ClipBackbone, images: np.ndarray, labels: np.ndarray, class_names) -> float:
    """Test mAP of 'a photo of a {class}.' prompts scored by cosine similarity."""
    text = backbone.encode_texts([f"a photo of a {name}." for name in class_names])
    scores = backbone.encode_images(images) @ text.T
    return mean_average_precision(scores.numpy(), labels)


def pretrain_tiny_clip(recipe: TinyClipRecipe = TinyClipRecipe(), progress: bool = True) -> dict:
    """Train the tiny CLIP from scratch; returns {'path', 'zero_shot_map_untrained', 'zero_shot_map', 'seconds'}."""
    start = time.perf_counter()
    torch.manual_seed(torch_seed(recipe.seed, "pretrain", 0))  # open_clip initialises from the global RNG
    model: Any = create_clip(TINY_CLIP)  # an open_clip CLIP: untyped attributes
    backbone = ClipBackbone(model, TINY_CLIP)
    pool = generate_scenes(recipe.pool_size, "pretrain", recipe.seed)
    test = generate_scenes(recipe.eval_size, "test", recipe.seed)
    untrained = zero_shot_map(backbone, test.images, test.labels, test.class_names)

    tokens = backbone.tokenize(pool.captions)
    lengths = tokens.argmax(-1) + 1  # the EOT token has the largest id
    images = torch.from_numpy(pool.images)
    model.train().requires_grad_(True)
    loss_fn = open_clip.ClipLoss()
    generator = torch_generator(recipe.seed, "pretrain", 1)

    def step_loss(step: int) -> torch.Tensor:
        batch = torch.randint(len(pool.captions), (recipe.batch_size,), generator=generator)
        length = int(lengths[batch].max())  # cut the batch to its longest caption: same result, faster
        text = tokens[batch, :length]
        image_features = F.normalize(model.encode_image(backbone.preprocess(images[batch])), dim=-1)
        text_features = F.normalize(
            backbone.encode_token_embeddings(backbone.embed_tokens(text), text.argmax(-1)), dim=-1
        )
        return loss_fn(image_features, text_features, model.logit_scale.exp())

    def clamp_scale() -> None:
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))

    train([model], recipe, step_loss, progress, after_step=clamp_scale)
    model.eval().requires_grad_(False)
    trained = zero_shot_map(backbone, test.images, test.labels, test.class_names)
    path = save(model, recipe, {"zero_shot_map_untrained": untrained, "zero_shot_map": trained})
    return {"path": str(path), "zero_shot_map_untrained": untrained, "zero_shot_map": trained,
            "seconds": time.perf_counter() - start}


def ensure_tiny_clip(recipe: TinyClipRecipe = TinyClipRecipe(), progress: bool = True) -> Path:
    """The cached tiny CLIP checkpoint, pretraining it first if this machine has none."""
    return ensure(recipe, pretrain_tiny_clip, progress)


def load_tiny_clip_state(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))

