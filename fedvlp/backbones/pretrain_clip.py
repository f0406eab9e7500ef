"""`fedvlp pretrain tiny-clip`: pretraining of the tiny CLIP on captioned synthetic-scenes images.

The loss is CLIP's contrastive loss on the pooled token and the captions, plus two multi-label terms that
score the class prompts "a photo of a {class}." against the pooled token (the objects the caption names, as in
UniCL's image-label-text learning) and against each dense patch feature (the class of the patch's quadrant when
the caption names it). The patch term is what makes patches carry evidence: a ViT's patch outputs are never
trained to match text by the contrastive loss alone (zero-shot mAP from patches 0.20 against 0.43 pooled,
measured without it). AdamW 1e-3, wd 0.1, batch 128, 5 % warm-up then cosine, a fixed number of steps over a
pool of captioned images; cached by `fedvlp.backbones.pretrain` under a key of the recipe and its code.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from fedvlp.backbones import TINY_CLIP
from fedvlp.backbones.pretrain import _Recipe, ensure, save, train
from fedvlp.data.scenes import generate_scenes
from fedvlp.platform.metrics import mean_average_precision
from fedvlp.seeding import torch_generator, torch_seed

if TYPE_CHECKING:
    from fedvlp.backbones.clip import ClipBackbone


@dataclass(frozen=True)
class TinyClipRecipe(_Recipe):
    backbone: ClassVar[str] = TINY_CLIP
    minutes: ClassVar[str] = "about 3 min"
    code: ClassVar[tuple[str, ...]] = ("fedvlp.backbones.pretrain_clip", "fedvlp.backbones.clip",
                                       "fedvlp.data.scenes", "backbones/model_configs/tiny-clip.json")
    seed: int = 0
    steps: int = 1200
    batch_size: int = 128
    pool_size: int = 25_000
    lr: float = 1e-3
    weight_decay: float = 0.1
    warmup_fraction: float = 0.05
    eval_size: int = 2_000
    image_weight: float = 2.0     # multi-label BCE: pooled token against the class prompts
    patch_weight: float = 4.0     # the same for every patch, against its quadrant's class


BCE_BIAS_INIT = -10.0  # most (image or patch, class) pairs are negative


def class_prompts(class_names) -> list[str]:
    return [f"a photo of a {name}." for name in class_names]


def zero_shot_maps(backbone: ClipBackbone, images: np.ndarray, labels: np.ndarray, class_names) -> dict[str, float]:
    """mAP of 'a photo of a {class}.' prompts scored by cosine similarity with the pooled token
    ('pooled') and, per class, with the best of the dense patch features ('patches')."""
    text = backbone.encode_texts(class_prompts(class_names))
    similarity = backbone.encode_images(images, kind="tokens") @ text.T        # [n, 1 + M, C]
    return {"pooled": mean_average_precision(similarity[:, 0].numpy(), labels),
            "patches": mean_average_precision(similarity[:, 1:].amax(1).numpy(), labels)}


def multi_hot(classes: np.ndarray, num_classes: int) -> torch.Tensor:
    """float [..., C] from class ids [..., k] (-1: none)."""
    return F.one_hot(torch.from_numpy(classes) + 1, num_classes + 1)[..., 1:].amax(-2).float()


def patch_classes(quadrant_class: np.ndarray, grid: int) -> np.ndarray:
    """The class of each patch's image quadrant (-1: none), [n, grid * grid] in row-major patch order."""
    half = np.arange(grid) // (grid // 2)
    return quadrant_class[:, (2 * half[:, None] + half[None, :]).ravel()]


def pretrain_tiny_clip(recipe: TinyClipRecipe = TinyClipRecipe(), progress: bool = True) -> dict:
    """Train the tiny CLIP from scratch; returns {'path', 'seconds'} and the zero-shot val mAPs
    before and after ('zero_shot_map[_untrained]' pooled, 'patch_zero_shot_map[_untrained]')."""
    import open_clip  # here, not at import: a run that finds the weights cached never loads open_clip in its driver

    from fedvlp.backbones.clip import ClipBackbone, create_clip

    start = time.perf_counter()
    torch.manual_seed(torch_seed(recipe.seed, "pretrain", 0))  # open_clip initialises from the global RNG
    model: Any = create_clip(TINY_CLIP)  # an open_clip CLIP: untyped attributes
    backbone = ClipBackbone(model, TINY_CLIP)
    pool = generate_scenes(recipe.pool_size, "pretrain", recipe.seed)
    val = generate_scenes(recipe.eval_size, "val", recipe.seed)
    untrained = zero_shot_maps(backbone, val.images, val.labels, val.class_names)

    tokens = backbone.tokenize(pool.captions)
    lengths = tokens.argmax(-1) + 1  # the EOT token has the largest id
    images = torch.from_numpy(pool.images)
    class_tokens = backbone.tokenize(class_prompts(pool.class_names))
    class_tokens = class_tokens[:, : int(class_tokens.argmax(-1).max()) + 1]
    # The class terms learn what the captions name, as web supervision does: an object a caption leaves out
    # (faint and occluded ones most often) counts as absent.
    named = np.where(pool.quadrants["named"] == 1, pool.quadrants["class"], -1)
    num_classes = len(pool.class_names)
    image_targets = multi_hot(named[:, None, :], num_classes)[:, 0]                       # [n, C]
    patch_targets = multi_hot(patch_classes(named, model.visual.grid_size[0])[..., None], num_classes)  # [n, M, C]
    model.train().requires_grad_(True)
    # Only the ~70 word ids the captions and prompts use get gradients, and AdamW does not decay
    # embeddings, so every other row would stay at its init anyway: train just these rows (a copy,
    # written back after training). Same result, and the optimiser skips 49k rows a step.
    vocab, compact = torch.unique(torch.cat([tokens.ravel(), class_tokens.ravel()]), return_inverse=True)
    caption_ids, class_ids = compact[: tokens.numel()].view_as(tokens), compact[tokens.numel():].view_as(class_tokens)
    model.token_embedding.requires_grad_(False)
    extra = torch.nn.ParameterDict({"word_embedding": model.token_embedding.weight[vocab].clone(),
                                    "image_bias": torch.tensor(BCE_BIAS_INIT),
                                    "patch_bias": torch.tensor(BCE_BIAS_INIT)})
    loss_fn = open_clip.ClipLoss()
    generator = torch_generator(recipe.seed, "pretrain", 1)

    def encode_text(ids: torch.Tensor, eot: torch.Tensor) -> torch.Tensor:
        return F.normalize(backbone.encode_token_embeddings(F.embedding(ids, extra["word_embedding"]), eot), dim=-1)

    def step_loss(step: int) -> torch.Tensor:
        batch = torch.randint(len(pool.captions), (recipe.batch_size,), generator=generator)
        length = int(lengths[batch].max())  # cut the batch to its longest caption: same result, faster
        pooled, patches = backbone.dense_features(backbone.preprocess(images[batch]))
        pooled, patches = F.normalize(pooled, dim=-1), F.normalize(patches, dim=-1)
        scale = model.logit_scale.exp()
        classes = encode_text(class_ids, class_tokens.argmax(-1))

        def class_loss(features: torch.Tensor, targets: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            """Multi-label BCE of CLIP's scaled cosine (plus a learned bias) against the class prompts."""
            return F.binary_cross_entropy_with_logits(scale * features @ classes.T + bias, targets)

        return (loss_fn(pooled, encode_text(caption_ids[batch, :length], lengths[batch] - 1), scale)
                + recipe.image_weight * class_loss(pooled, image_targets[batch], extra["image_bias"])
                + recipe.patch_weight * class_loss(patches, patch_targets[batch], extra["patch_bias"]))

    def clamp_scale() -> None:
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))

    train([model, extra], recipe, step_loss, progress, after_step=clamp_scale)
    model.eval().requires_grad_(False)
    with torch.no_grad():
        model.token_embedding.weight[vocab] = extra["word_embedding"]
    trained = zero_shot_maps(backbone, val.images, val.labels, val.class_names)
    metrics = {"zero_shot_map_untrained": untrained["pooled"], "zero_shot_map": trained["pooled"],
               "patch_zero_shot_map_untrained": untrained["patches"], "patch_zero_shot_map": trained["patches"]}
    path = save(model, recipe, metrics)
    return {"path": str(path), **metrics, "seconds": time.perf_counter() - start}


def ensure_tiny_clip(recipe: TinyClipRecipe = TinyClipRecipe(), progress: bool = True) -> Path:
    """The cached tiny CLIP checkpoint, pretraining it first if this machine has none."""
    return ensure(recipe, pretrain_tiny_clip, progress)


def load_tiny_clip_state(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))

