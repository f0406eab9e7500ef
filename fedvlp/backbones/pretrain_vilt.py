"""`fedvlp pretrain tiny-vilt`: pretraining of the tiny ViLT on synthetic-recipes' pretraining split.

Image-text matching (a binary head on the pooler output; a negative pairs an image with another
sample's caption) plus contrastive losses (text alone vs image alone; the pair vs its text alone
and its image alone); AdamW 1e-3, wd 0.01, batch 64, 5 % warm-up then cosine, a fixed number of
steps; then a standardisation of the pooler's pre-activation is folded into it (`standardise_pooler`).
`pretrain_tiny_vilt` says what was measured. Cached by `fedvlp.backbones.pretrain` under a key of
the recipe and its code.
"""
from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from fedvlp.backbones.pretrain import _Recipe, read_metadata, save, train
from fedvlp.backbones.vilt import TINY_VILT, ViltBackbone, create_vilt, tiny_vocabulary
from fedvlp.data.missing import fill_missing_images
from fedvlp.data.recipes import SERVED, generate_recipes
from fedvlp.seeding import numpy_rng, torch_generator, torch_seed


@dataclass(frozen=True)
class TinyViltRecipe(_Recipe):
    backbone: ClassVar[str] = TINY_VILT
    minutes: ClassVar[str] = "about 2½ min"
    code: ClassVar[tuple[str, ...]] = ("fedvlp.backbones.pretrain_vilt", "fedvlp.backbones.vilt",
                                       "fedvlp.data.recipes", "fedvlp.data.missing")
    seed: int = 0
    steps: int = 350
    batch_size: int = 64
    pool_size: int = 20_000
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_fraction: float = 0.05
    standardise_size: int = 2_000      # pretraining pairs whose pooler statistics are folded in; 0: none
    describe_container: float = 1.0    # of pretraining captions that end by naming the true container
    itc_weight: float = 0.5            # text alone <-> image alone, contrastive, on the matching pairs
    pair_weight: float = 1.0           # the pair <-> its text alone and its image alone, contrastive
    mlm_probability: float = 0.0       # of the word tokens of every pair; 0 turns MLM off
    itm_eval_size: int = 2_000         # held-out pretraining-split pairs, half of them negatives
    probe_train: int = 2_000           # linear probe: synthetic-recipes train -> val
    probe_val: int = 1_000

    def fingerprint(self) -> dict:
        return {**super().fingerprint(), "vocabulary": list(tiny_vocabulary())}  # the vocabulary shapes the weights


@contextlib.contextmanager
def _one_thread():
    """Run on one CPU thread: a model this small gains little from intra-op threads, loses a lot
    when the cores are shared (measured: 0.37 s/step on one thread, 7 s on two, beside other jobs),
    and its bits then do not depend on the machine's core count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


PROBE_SETTINGS = ("full", "text_missing", "image_missing")


@torch.no_grad()
def first_tokens(backbone: ViltBackbone, images: np.ndarray, texts, setting: str = "full",
                 chunk: int = 512) -> torch.Tensor:
    """The encoded first token [n, D] (what the pooler reads) of every pair, with every text blanked
    ('text_missing') or every image replaced by the all-ones image ('image_missing')."""
    if setting not in PROBE_SETTINGS:
        raise ValueError(f"setting must be one of {PROBE_SETTINGS}, got {setting!r}")
    texts = [""] * len(texts) if setting == "text_missing" else list(texts)
    image_missing = np.full(len(texts), setting == "image_missing")
    hidden, mask = backbone.embed(images, texts, image_missing)
    out = [backbone.encode(hidden[i:i + chunk].to(backbone.device), mask[i:i + chunk])[:, 0]
           for i in range(0, len(hidden), chunk)]
    return torch.cat(out).float().cpu()


@torch.no_grad()
def pooled_features(backbone: ViltBackbone, images: np.ndarray, texts, setting: str = "full") -> torch.Tensor:
    """The frozen pooler output [n, D] of every pair, in a `PROBE_SETTINGS` setting (`first_tokens`)."""
    return backbone.pooler(first_tokens(backbone, images, texts, setting).to(backbone.device)[:, None]).cpu()


@torch.no_grad()
def standardise_pooler(backbone: ViltBackbone, images: np.ndarray, texts) -> None:
    """Fold a standardisation of the pooler's pre-activation into its dense layer, in place: over
    these pairs, each in the three `PROBE_SETTINGS`, every unit then has mean 0 and std 1 before
    the tanh. Without it the pooled feature sits on a large common offset (mean |f| 0.44 against a
    spread of 0.20 across samples), which the probes' standardisation hides but which slows the
    SGD-trained heads of the prompt methods (a batch norm folded into the pooler, as is done at
    inference; nothing else changes)."""
    dense = backbone.pooler.dense
    pre = torch.cat([dense(first_tokens(backbone, images, texts, s).to(backbone.device)) for s in PROBE_SETTINGS])
    mean, std = pre.mean(0), pre.std(0).clamp_min(1e-6)
    dense.weight.div_(std[:, None])
    dense.bias.sub_(mean).div_(std)


def logistic_probe(train_x: torch.Tensor, train_y: torch.Tensor, eval_x: torch.Tensor, eval_y: torch.Tensor,
                   weight_decay: float = 1e-3, iterations: int = 200) -> float:
    """Accuracy on (eval_x, eval_y) of an L2-regularised multinomial logistic regression on
    standardised features (full-batch L-BFGS from zero, so deterministic)."""
    mean, std = train_x.mean(0), train_x.std(0).clamp_min(1e-6)
    train_x, eval_x = (train_x - mean) / std, (eval_x - mean) / std
    classes = int(max(train_y.max(), eval_y.max())) + 1
    weight = torch.zeros(train_x.shape[1], classes, requires_grad=True)
    bias = torch.zeros(classes, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], lr=1, max_iter=iterations, history_size=20,
                                  tolerance_grad=1e-9, tolerance_change=1e-12, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(train_x @ weight + bias, train_y) + weight_decay * weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        return float(((eval_x @ weight + bias).argmax(1) == eval_y).float().mean())


def probe_accuracies(backbone: ViltBackbone, seed: int = 0, num_train: int = 2_000, num_val: int = 1_000,
                     settings: tuple[str, ...] = PROBE_SETTINGS) -> dict[str, float]:
    """Linear-probe accuracy on the pooler output, synthetic-recipes train -> val (16 classes; val,
    never test, since these figures choose the recipe), with both modalities ('full'), every text
    missing, and every image missing (train and val alike)."""
    train = generate_recipes(num_train, "train", seed)
    val = generate_recipes(num_val, "val", seed)
    out = {}
    for setting in settings:
        with _one_thread():
            out[setting] = logistic_probe(pooled_features(backbone, train.images, train.texts, setting),
                                          torch.from_numpy(train.labels),
                                          pooled_features(backbone, val.images, val.texts, setting),
                                          torch.from_numpy(val.labels))
    return out


class _ViltPretrainingHeads(torch.nn.Module):
    """What pretraining adds on top of the ViltModel and then drops. The batch norms centre the
    pooled features over the batch: at initialisation token 0 barely depends on the input, and
    without them neither the matching head nor the contrastive losses get off the ground."""

    def __init__(self, dim: int, vocab_size: int):
        super().__init__()

        def projection() -> torch.nn.Module:
            return torch.nn.Sequential(torch.nn.Linear(dim, dim), torch.nn.BatchNorm1d(dim))

        self.itm = torch.nn.Sequential(torch.nn.BatchNorm1d(dim), torch.nn.Linear(dim, 2))
        self.text, self.image, self.pair = projection(), projection(), projection()
        self.logit_scale = torch.nn.Parameter(torch.full((2,), math.log(1 / 0.07)))  # itc, pair
        self.mlm = torch.nn.Sequential(torch.nn.Linear(dim, dim), torch.nn.GELU(), torch.nn.LayerNorm(dim),
                                       torch.nn.Linear(dim, vocab_size))


def _contrastive(a: torch.Tensor, b: torch.Tensor, log_scale: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE of row i of `a` against row i of `b` (L2-normalised)."""
    logits = log_scale.exp() * F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T
    target = torch.arange(len(a), device=a.device)
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2


def pretraining_captions(data, describe_container: float, seed: int) -> list[str]:
    """The pretraining split's titles as captions: with probability `describe_container` the
    title's own 'served in a ...' hint (if any) is replaced by one naming the true container,
    as alt-text describes the photo it comes with."""
    describe = numpy_rng(seed, "pretrain", 3).random(len(data)) < describe_container
    out = []
    for text, container, d in zip(data.texts, data.container, describe):
        if d:
            text = next((text[: -len(s)].rstrip() for s in SERVED if text.endswith(s)), text)
            text = f"{text} {SERVED[container]}"
        out.append(text)
    return out


def _draw_pairs(n: int, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(image index, text index, match) of a batch: half the pairs, on average, take the text of
    another sample (a different one, drawn uniformly)."""
    images = torch.randint(n, (batch_size,), generator=generator)
    negative = torch.rand(batch_size, generator=generator) < 0.5
    other = (images + torch.randint(1, n, (batch_size,), generator=generator)) % n
    return images, torch.where(negative, other, images), (~negative).long()


@torch.no_grad()
def itm_accuracy(backbone: ViltBackbone, head: torch.nn.Module, images: np.ndarray, texts, seed: int) -> float:
    """Accuracy of the ITM head on pairs drawn like training pairs from (images, texts)."""
    image_idx, text_idx, match = _draw_pairs(len(texts), len(texts), torch_generator(seed, "pretrain", 2))
    hidden, mask = backbone.embed(images[image_idx.numpy()], [texts[i] for i in text_idx.tolist()],
                                  np.zeros(len(texts), bool))
    logits = head(backbone.pooler(backbone.encode(hidden.to(backbone.device), mask)))
    return float((logits.argmax(1).cpu() == match).float().mean())


def pretrain_tiny_vilt(recipe: TinyViltRecipe = TinyViltRecipe(), progress: bool = True,
                       device: str | torch.device = "cpu") -> dict:
    """Train the tiny ViLT from scratch on synthetic-recipes' pretraining split.

    Each step draws a batch of pairs, half of them negatives (an image with another sample's
    caption), and runs three passes: the pair; its text alone; its image alone (the other
    modality blanked, exactly as a missing one is at run time). Losses, all on pooler outputs:
    image-text matching (binary) on the pair; contrastive text-alone <-> image-alone on the
    matching pairs (`itc_weight`); contrastive pair <-> its text alone and <-> its image alone
    (`pair_weight`), so the pair's pooled feature keeps what identifies both its inputs; and,
    if `mlm_probability`, masked-language modelling on the pair's text tokens.

    Measured (default recipe, seed 0, probes on the target domain train -> val; docs/backbones.md):
    held-out matching 0.78; linear probe on the pooled feature, untrained -> pretrained, both
    modalities 0.52 -> 0.83, every text missing 0.29 -> 0.60, every image missing 0.57 -> 0.62;
    146 CPU seconds in all on one thread. Before the target's palette shift (same weights) the
    probes were, seeds 0 / 1: 0.86 / 0.85, 0.68 / 0.66, 0.62 / 0.64. At 200
    steps the probes were 0.74 / 0.47 / 0.58, at 400 0.87 / 0.67 / 0.60 (165 CPU s). The pooler
    standardisation costs the probes little (at 200 steps 0.77 / 0.49 / 0.59 without it; they
    standardise their inputs anyway) but lifts FedAvg-P, whose SGD-trained head sees the feature as
    it is: at 400 steps its round-10 val accuracy (10 clients, lr 0.1, 3 local epochs) went from
    0.46 without it to 0.69 with it.
    (Measured on the previous synthetic-recipes world, where no modality alone named a class:
    `itc_weight` 0 gave weaker probes and prompt tuning, 1 better matching but weaker probes;
    matching alone lowered the probe; MLM did not raise it; without the container in the captions
    matching stayed at chance.)

    Returns {'path', 'seconds', 'itm_accuracy', 'probe_untrained_<setting>', 'probe_<setting>'}
    (settings: PROBE_SETTINGS); only the ViltModel weights are saved. Every draw is made on the
    CPU, but another `device` computes other bits (`ensure_tiny_vilt`, and so the cache, always
    trains on the CPU).
    """
    with _one_thread():
        return _pretrain_tiny_vilt(recipe, progress, device)


def _pretrain_tiny_vilt(recipe: TinyViltRecipe, progress: bool, device: str | torch.device) -> dict:
    start = time.perf_counter()
    torch.manual_seed(torch_seed(recipe.seed, "pretrain", 0))  # transformers initialises from the global RNG
    vocabulary = tiny_vocabulary()
    backbone = create_vilt(TINY_VILT, vocabulary=vocabulary)
    model = backbone.model
    heads = _ViltPretrainingHeads(backbone.hidden_size, len(vocabulary))
    backbone.to(device), heads.to(device)
    untrained = probe_accuracies(backbone, recipe.seed, recipe.probe_train, recipe.probe_val) \
        if recipe.probe_train else {}

    data = generate_recipes(recipe.pool_size + recipe.itm_eval_size, "pretrain", recipe.seed)
    captions = pretraining_captions(data, recipe.describe_container, recipe.seed)
    n = recipe.pool_size
    ids, text_mask = (t.cpu() for t in backbone.tokenize(captions[:n]))  # drawn from on the CPU
    lengths = text_mask.sum(1)
    images = torch.from_numpy(data.images[:n])
    tokenizer = backbone.tokenizer
    special = torch.tensor([tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id])
    blank_ids, blank_mask = (t[:, :2].to(device) for t in backbone.tokenize([""]))  # [CLS] [SEP]
    generator = torch_generator(recipe.seed, "pretrain", 1)
    model.train().requires_grad_(True)
    heads.train()

    def step_loss(step: int) -> torch.Tensor:
        image_idx, text_idx, match = _draw_pairs(n, recipe.batch_size, generator)
        length = int(lengths[text_idx].max())  # cut the batch to its longest text: faster
        tokens, mask = ids[text_idx, :length].clone(), text_mask[text_idx, :length]
        masked = ~torch.isin(tokens, special) & (torch.rand(tokens.shape, generator=generator) < recipe.mlm_probability)
        labels = torch.where(masked, tokens, torch.full_like(tokens, -100)).to(device)
        tokens[masked] = tokenizer.mask_token_id  # every pair, matching or not, so masks say nothing of matching
        pixels = backbone.preprocess(images[image_idx])
        match, tokens, mask = match.to(device), tokens.to(device), mask.to(device)
        out = backbone.encode(*backbone.embed_tokens(tokens, mask, pixels))
        pair = backbone.pooler(out)
        loss = F.cross_entropy(heads.itm(pair), match)
        if masked.any():
            loss = loss + F.cross_entropy(heads.mlm(out[:, :length][labels >= 0]), labels[labels >= 0])
        if recipe.itc_weight or recipe.pair_weight:
            # each modality alone, the other one blanked as a missing one is
            full_text = ids[text_idx, :length].to(device)
            blank_image = torch.ones(len(match), dtype=torch.bool, device=device)
            text = backbone.pooler(backbone.encode(*backbone.embed_tokens(
                full_text, mask, fill_missing_images(pixels, blank_image))))
            image = backbone.pooler(backbone.encode(*backbone.embed_tokens(
                blank_ids.expand(len(match), -1), blank_mask.expand(len(match), -1), pixels)))
            text, image = heads.text(text), heads.image(image)
            if recipe.itc_weight:
                matching = match.bool()
                loss = loss + recipe.itc_weight * _contrastive(text[matching], image[matching], heads.logit_scale[0])
            if recipe.pair_weight:
                pair = heads.pair(pair)
                loss = loss + recipe.pair_weight / 2 * (_contrastive(pair, text, heads.logit_scale[1])
                                                        + _contrastive(pair, image, heads.logit_scale[1]))
        return loss

    def clamp_scales() -> None:
        with torch.no_grad():
            heads.logit_scale.clamp_(0, math.log(100))

    train([model, heads], recipe, step_loss, progress, after_step=clamp_scales)
    model.eval().requires_grad_(False)
    heads.eval().requires_grad_(False)
    metrics = {"itm_accuracy": itm_accuracy(backbone, heads.itm, data.images[n:], captions[n:], recipe.seed)
               if recipe.itm_eval_size else float("nan")}  # before the pooler changes under the head
    if recipe.standardise_size:  # the titles as they come, not the captions: what the prompt methods will see
        standardise_pooler(backbone, data.images[:recipe.standardise_size], data.texts[:recipe.standardise_size])
    if recipe.probe_train:
        trained = probe_accuracies(backbone, recipe.seed, recipe.probe_train, recipe.probe_val)
        metrics.update({f"probe_untrained_{k}": v for k, v in untrained.items()})
        metrics.update({f"probe_{k}": v for k, v in trained.items()})
    path = save(model.cpu(), recipe, metrics, {"vocabulary": json.dumps(list(vocabulary))})
    return {"path": str(path), "seconds": time.perf_counter() - start, **metrics}


def measure_tiny_vilt(path: Path, recipe: TinyViltRecipe = TinyViltRecipe()) -> dict[str, float]:
    """The figures the manifest documents for a tiny ViLT file: linear-probe val accuracy in each setting."""
    state, vocabulary = load_tiny_vilt_state(path)
    backbone = create_vilt(TINY_VILT, vocabulary=vocabulary)
    backbone.model.load_state_dict(state)  # float16 on disk, float32 in the model
    with _one_thread():
        probes = probe_accuracies(backbone, recipe.seed, recipe.probe_train, recipe.probe_val)
    return {f"probe_{k}": v for k, v in probes.items()}


def load_tiny_vilt_state(path: Path) -> tuple[dict[str, torch.Tensor], tuple[str, ...]]:
    """(ViltModel state dict, tokenizer vocabulary) of a pretrained tiny ViLT."""
    return load_file(str(path)), tuple(json.loads(read_metadata(path)["vocabulary"]))
