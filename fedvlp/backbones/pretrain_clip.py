"""`fedvlp pretrain tiny-clip`: pretraining of the tiny CLIP on synthetic-scenes' captioned source domain.

The loss is CLIP's contrastive loss between the pooled token and the captions, written the way people write them
(the objects that stand out, synonyms, no fixed template: `fedvlp.data.scenes`), plus a region-level term in the
manner of RegionCLIP: each patch of a quadrant whose object the caption names is contrasted, over the distinct
phrases of the batch, with the phrase the caption uses for that object ("the crimson ball"). That term is what makes
patches carry evidence for the region methods (DualCoOp, FedMPT's OT): a ViT's patch outputs are never trained to
match text by the contrastive loss alone (measured on an earlier world: patch zero-shot 0.34 against 0.54 pooled).
No term scores the evaluation prompts "a photo of a {class}." against the labels, so zero-shot is a real but
imperfect classifier of the target task, as CLIP's is of VOC.

AdamW 1e-3, wd 0.1, batch 128, 5 % warm-up then cosine, a fixed number of steps over a pool of captioned images,
trained in float32 and shipped in float16 (`fedvlp.backbones.shipped`). Measured on 2 cores (seed 0, 2,000 steps,
345 s): zero-shot val mAP on the target task 0.11 untrained -> 0.70 pooled, 0.12 -> 0.83 from the best patch.
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

from fedvlp.backbones import TINY_CLIP
from fedvlp.backbones.pretrain import _Recipe, save, train
from fedvlp.data.scenes import generate_scenes
from fedvlp.platform.metrics import mean_average_precision
from fedvlp.seeding import torch_generator, torch_seed

if TYPE_CHECKING:
    from fedvlp.backbones.clip import ClipBackbone


@dataclass(frozen=True)
class TinyClipRecipe(_Recipe):
    backbone: ClassVar[str] = TINY_CLIP
    minutes: ClassVar[str] = "about 6 min"
    code: ClassVar[tuple[str, ...]] = ("fedvlp.backbones.pretrain_clip", "fedvlp.backbones.clip",
                                       "fedvlp.data.scenes", "backbones/model_configs/tiny-clip.json")
    seed: int = 0
    steps: int = 2000
    batch_size: int = 128
    pool_size: int = 25_000
    lr: float = 1e-3
    weight_decay: float = 0.1
    warmup_fraction: float = 0.05
    eval_size: int = 2_000
    region_weight: float = 1.0    # region-text contrast: each patch against its quadrant's phrase in the caption


def class_prompts(class_names) -> list[str]:
    return [f"a photo of a {name}." for name in class_names]


def zero_shot_maps(backbone: ClipBackbone, images: np.ndarray, labels: np.ndarray, class_names) -> dict[str, float]:
    """mAP of 'a photo of a {class}.' prompts scored by cosine similarity with the pooled token
    ('pooled') and, per class, with the best of the dense patch features ('patches')."""
    text = backbone.encode_texts(class_prompts(class_names))
    similarity = backbone.encode_images(images, kind="tokens") @ text.T        # [n, 1 + M, C]
    return {"pooled": mean_average_precision(similarity[:, 0].numpy(), labels),
            "patches": mean_average_precision(similarity[:, 1:].amax(1).numpy(), labels)}


def patch_quadrants(grid: int) -> np.ndarray:
    """The image quadrant of each patch, [grid * grid] in row-major patch order."""
    half = np.arange(grid) // (grid // 2)
    return (2 * half[:, None] + half[None, :]).ravel()


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
    # Region captions (RegionCLIP-style): the phrase the caption uses for each quadrant's object, contrasted with
    # that quadrant's patches. An object the caption leaves out has no phrase and trains nothing.
    phrases, phrase_of = np.unique(np.array(pool.region_captions).ravel(), return_inverse=True)
    phrase_of = phrase_of.reshape(-1, 4) - int(phrases[0] == "")                          # [n, 4], -1: none
    phrases = phrases[1:] if phrases[0] == "" else phrases
    phrase_tokens = backbone.tokenize(list(phrases))
    phrase_tokens = phrase_tokens[:, : int(phrase_tokens.argmax(-1).max()) + 1]
    patch_phrase = torch.from_numpy(phrase_of[:, patch_quadrants(model.visual.grid_size[0])])  # [n, M]
    model.train().requires_grad_(True)
    # Only the ~100 word ids the captions use get gradients, and AdamW does not decay embeddings, so every
    # other row would stay at its init anyway: train just these rows (a copy, written back after training).
    # Same result, and the optimiser skips 49k rows a step.
    vocab, compact = torch.unique(torch.cat([tokens.ravel(), phrase_tokens.ravel()]), return_inverse=True)
    caption_ids, phrase_ids = compact[: tokens.numel()].view_as(tokens), compact[tokens.numel():].view_as(phrase_tokens)
    model.token_embedding.requires_grad_(False)
    extra = torch.nn.ParameterDict({"word_embedding": model.token_embedding.weight[vocab].clone()})
    loss_fn = open_clip.ClipLoss()
    generator = torch_generator(recipe.seed, "pretrain", 1)

    def encode_text(ids: torch.Tensor, eot: torch.Tensor) -> torch.Tensor:
        return F.normalize(backbone.encode_token_embeddings(F.embedding(ids, extra["word_embedding"]), eot), dim=-1)

    def region_loss(patches: torch.Tensor, batch: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of each named object's patches over the distinct phrases of the batch."""
        target = patch_phrase[batch]                                                       # [B, M]
        used, target = torch.unique(target, return_inverse=True)
        named = used >= 0
        used, target = used[named], target - int((~named).sum())
        text = encode_text(phrase_ids[used], phrase_tokens[used].argmax(-1))
        keep = target >= 0
        return F.cross_entropy(scale * patches[keep] @ text.T, target[keep])

    def step_loss(step: int) -> torch.Tensor:
        batch = torch.randint(len(pool.captions), (recipe.batch_size,), generator=generator)
        length = int(lengths[batch].max())  # cut the batch to its longest caption: same result, faster
        pooled, patches = backbone.dense_features(backbone.preprocess(images[batch]))
        pooled, patches = F.normalize(pooled, dim=-1), F.normalize(patches, dim=-1)
        scale = model.logit_scale.exp()
        return (loss_fn(pooled, encode_text(caption_ids[batch, :length], lengths[batch] - 1), scale)
                + recipe.region_weight * region_loss(patches, batch, scale))

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


def measure_tiny_clip(path: Path, recipe: TinyClipRecipe = TinyClipRecipe()) -> dict[str, float]:
    """The figures the manifest documents for a tiny CLIP file: zero-shot val mAP, pooled and best patch."""
    from fedvlp.backbones.clip import ClipBackbone, create_clip

    val = generate_scenes(recipe.eval_size, "val", recipe.seed)
    maps = zero_shot_maps(ClipBackbone(create_clip(TINY_CLIP, str(path)), TINY_CLIP), val.images, val.labels,
                          val.class_names)
    return {"zero_shot_map": maps["pooled"], "patch_zero_shot_map": maps["patches"]}

