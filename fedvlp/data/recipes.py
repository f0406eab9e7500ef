"""The ``synthetic-recipes`` image + text, single-label dataset, like UPMC Food-101.

16 classes = 4 cuisines x 4 containers. Class ``c`` is cuisine ``c // 4`` and container
``c % 4`` (cuisine-major: "ginger bowl", "ginger plate", ..., "lemon tray"). Each modality
carries one factor well and the other one weakly, so either alone names most classes and the
two together name far more (robustness to a missing modality can show, and so can its cost):

* the **container** (bowl, plate, cup, tray) is drawn in the image, reliably: a light ceramic
  glyph on a dark table. The text names it only as a hint: ``P_SERVED`` of the titles end
  "served in a cup" / "served on a plate", naming the true container with probability
  ``P_SERVED_TRUE``, else a uniformly random one;
* the **cuisine** (ginger, basil, chili, lemon) is named in the text, reliably, through its
  signature ingredients (``SIGNATURE``). The image shows it only as a hint: the colour of the 2-3
  food blobs on the container, each of its cuisine's palette (``CUISINE_FOOD``: orange/brown,
  green/lime, red/purple, yellow/cream, disjoint) with probability ``P_FOOD_MATCH``, else any of
  the 8 food colours.

Neither modality is clean:

* Image: the container's position (jitter ``CENTRE_JITTER``), size (``SCALE_RANGE``) and
  colour vary; ``P_CLOSEUP`` of the images are close-ups (``CLOSEUP_SCALE``) that cut the
  container off; the table is a random dark colour, half the time with wood grain; half the
  images hold a metal utensil (``P_UTENSIL``) as a light distractor; lighting gain and pixel
  noise; the food blobs (radius ``BLOB_RADIUS``) sit at random along the container.
* Text: a short lowercase recipe title of 2-3 ingredients from one of ``TEMPLATES``, padded with
  neutral adjectives and dish words. Each ingredient slot is a signature ingredient of the
  true cuisine with probability ``P_SIGNATURE``, of another cuisine with ``P_CROSS``, else a
  shared pantry ingredient (``SHARED``), so some titles name no cuisine at all and some name
  two.

Every text is words only (no punctuation), uses only ``VOCABULARY`` and has 4-10 words (every
word is at most 2 open_clip BPE tokens, so at most 22 tokens with start/end, under 32).

Measured (tests/test_recipes.py, seed 0, 2,000 train -> 1,000 val, logistic regression on
2x2-pooled pixels and/or bag of words): image alone 0.53, text alone 0.61, both 0.90. Per
factor: container from pixels 0.97, cuisine from pixels 0.53 (0.65 within the source domain,
0.27 trained on the source and scored on the target); cuisine from words 0.93, container from
words 0.68. (The previous world, with the container only in the image and the
cuisine only in the text, gave 0.26 / 0.23 / 0.57.)

A **source** and a **target** domain, as in synthetic-scenes: the tiny ViLT learns from the
``pretrain`` split (the source); the federated task's splits (``train``, ``val``, ``test``,
``holdout``, all drawn alike) are the target, whose food is drawn in ``TARGET_FOOD_RGB``: each colour
moved ``PALETTE_SHIFT`` of the way towards a colour of another cuisine (``SHIFTED_FOOD``). The
target's palettes stay disjoint, so the image still hints at the cuisine, but a frozen backbone reads
the shifted colours as the source's other cuisine. Only the image side is shifted: what a model needs
to re-learn is how to read the image when the text is missing, which prompts that know the missing
modality are meant to do (measured with the tiny ViLT, they do not: docs/results/missing-modalities.md).

Everything is drawn from ``numpy_rng(seed, "data", 10 + SPLITS.index(split))`` (streams 10-14,
apart from synthetic-scenes' 0-4) in fixed blocks of ``BLOCK`` samples, so a set is a prefix of
any larger set with the same seed and split.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedvlp.data.synthetic import check_generator_args
from fedvlp.seeding import numpy_rng

SPLITS = ("pretrain", "train", "test", "val", "holdout")
STREAM_OFFSET = 10
CUISINES = ("ginger", "basil", "chili", "lemon")
CONTAINERS = ("bowl", "plate", "cup", "tray")
CLASS_NAMES = tuple(f"{cuisine} {container}" for cuisine in CUISINES for container in CONTAINERS)
NUM_CLASSES = len(CLASS_NAMES)

# --- text -------------------------------------------------------------------------------
SIGNATURE = (
    ("ginger", "soy", "rice", "sesame"),
    ("basil", "tomato", "pasta", "cheese"),
    ("chili", "beans", "corn", "cumin"),
    ("lemon", "dill", "fish", "yogurt"),
)
SHARED = ("salt", "pepper", "garlic", "onion", "oil", "butter", "egg", "herbs", "flour", "honey")
ADJECTIVES = ("easy", "quick", "homemade", "simple", "fresh", "classic", "healthy", "rustic")
DISHES = ("dish", "meal", "recipe", "lunch", "dinner", "supper", "snack", "special")
# {a} adjective, {d} dish word, {i0} {i1} {i2} ingredients; number of ingredient slots each.
TEMPLATES = (
    ("{a} {d} with {i0} and {i1}", 2),
    ("{i0} and {i1} {d}", 2),
    ("{d} with {i0} {i1} and {i2}", 3),
    ("{a} {i0} {d} with {i1}", 2),
)
SERVED = ("served in a bowl", "served on a plate", "served in a cup", "served on a tray")
P_SIGNATURE = 0.8
P_CROSS = 0.05
P_SERVED = 0.8
P_SERVED_TRUE = 0.75

VOCABULARY: tuple[str, ...] = tuple(sorted(
    {w for group in SIGNATURE for w in group} | set(SHARED) | set(ADJECTIVES) | set(DISHES)
    | {w for t, _ in TEMPLATES for w in t.split() if not w.startswith("{")}
    | {w for s in SERVED for w in s.split()}))

# --- image ------------------------------------------------------------------------------
FOOD_RGB = np.array([(235, 140, 40), (130, 80, 40), (60, 170, 60), (200, 40, 40),
                     (240, 215, 50), (170, 210, 90), (150, 60, 150), (245, 235, 200)], np.float32)
FOOD_NAMES = ("orange", "brown", "green", "red", "yellow", "lime", "purple", "cream")
CUISINE_FOOD = ((0, 1), (2, 5), (3, 6), (4, 7))        # palette of each cuisine, disjoint
SOURCE_SPLITS = ("pretrain",)                          # the corpus the tiny ViLT learns from
# The target domain's food colours: each moved PALETTE_SHIFT of the way towards a colour of the next
# cuisine (ginger's towards chili's, chili's towards lemon's, lemon's towards basil's, basil's towards ginger's).
SHIFTED_FOOD = (3, 6, 0, 4, 2, 1, 7, 5)
PALETTE_SHIFT = 0.6
TARGET_FOOD_RGB = (1 - PALETTE_SHIFT) * FOOD_RGB + PALETTE_SHIFT * FOOD_RGB[list(SHIFTED_FOOD)]
P_FOOD_MATCH = 0.8
P_UTENSIL = 0.5
CENTRE_JITTER = 0.08                                   # fraction of the canvas, each axis
SCALE_RANGE = (0.85, 1.1)
P_CLOSEUP = 0.15                                       # zoomed in: the container is cut off
CLOSEUP_SCALE = (1.6, 2.2)
CLOSEUP_JITTER = 0.2
BLOB_RADIUS = (0.07, 0.1)
NOISE_STD = 5.0
# Where the food sits on each container, in container units: (centre v, half spread in u).
FOOD_LINE = ((-0.07, 0.2), (0.05, 0.22), (-0.16, 0.07), (0.02, 0.26))
BLOCK = 1024


@dataclass(frozen=True)
class RecipeSet:
    images: np.ndarray          # uint8 [n, S, S, 3]; [n, 0, 0, 3] with render=False
    texts: tuple[str, ...]
    labels: np.ndarray          # int64 [n]
    class_names: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def cuisine(self) -> np.ndarray:
        """The text factor of each label (index into ``CUISINES``)."""
        return self.labels // len(CONTAINERS)

    @property
    def container(self) -> np.ndarray:
        """The image factor of each label (index into ``CONTAINERS``)."""
        return self.labels % len(CONTAINERS)


def generate_recipes(num_samples: int, split: str, seed: int, image_size: int = 32,
                     render: bool = True) -> RecipeSet:
    """Generate ``num_samples`` recipes of ``split`` deterministically from ``seed``; with ``render=False``
    everything but the pixels, which the same call with ``render=True`` adds."""
    n, size = check_generator_args(num_samples, split, image_size, SPLITS)
    rng = numpy_rng(seed, "data", STREAM_OFFSET + SPLITS.index(split))
    images = np.empty((n, size, size, 3) if render else (n, 0, 0, 3), np.uint8)
    labels = np.empty(n, np.int64)
    texts: list[str] = []
    for start in range(0, n, BLOCK):
        m = min(BLOCK, n - start)
        params = _draw_block(rng, size, split in SOURCE_SPLITS)  # always a full block: prefix-stable
        params = {k: v[:m] for k, v in params.items()}
        if render:
            images[start:start + m] = _render(params, size)
        labels[start:start + m] = params["label"]
        texts.extend(_texts(params))
    return RecipeSet(images, tuple(texts), labels, CLASS_NAMES)


def _draw_block(rng: np.random.Generator, size: int, source: bool) -> dict[str, np.ndarray]:
    b = BLOCK
    label = rng.integers(0, NUM_CLASSES, b)
    cuisine, container = label // len(CONTAINERS), label % len(CONTAINERS)
    # image
    closeup = rng.random(b) < P_CLOSEUP
    centre = 0.5 + np.where(closeup[:, None], rng.uniform(-CLOSEUP_JITTER, CLOSEUP_JITTER, (b, 2)),
                            rng.uniform(-CENTRE_JITTER, CENTRE_JITTER, (b, 2)))
    scale = np.where(closeup, rng.uniform(*CLOSEUP_SCALE, b), rng.uniform(*SCALE_RANGE, b))
    dish_rgb = rng.uniform(175, 240, b)[:, None] + rng.uniform(-15, 15, (b, 3))
    table_rgb = rng.uniform(35, 110, b)[:, None] + rng.uniform(-12, 12, (b, 3))
    grain_amp = np.where(rng.random(b) < 0.5, rng.uniform(6, 18, b), 0.0)
    grain_freq = rng.uniform(3, 8, b)
    grain_phase = rng.uniform(0, 1, b)
    utensil = rng.random(b) < P_UTENSIL
    utensil_mid = rng.uniform(0.1, 0.9, (b, 2))
    utensil_angle = rng.uniform(0, np.pi, b)
    utensil_len = rng.uniform(0.3, 0.45, b)
    utensil_rgb = rng.uniform(140, 200, b)[:, None] + rng.uniform(-8, 8, (b, 3))
    blob_count = rng.integers(2, 4, b)
    blob_t = rng.uniform(-1, 1, (b, 3))
    blob_dv = rng.uniform(-0.03, 0.03, (b, 3))
    blob_radius = rng.uniform(*BLOB_RADIUS, (b, 3))
    match = rng.random((b, 3)) < P_FOOD_MATCH
    palette = np.array(CUISINE_FOOD)[cuisine[:, None], rng.integers(0, 2, (b, 3))]
    blob_food = np.where(match, palette, rng.integers(0, len(FOOD_RGB), (b, 3)))
    blob_rgb = (FOOD_RGB if source else TARGET_FOOD_RGB)[blob_food] + rng.uniform(-15, 15, (b, 3, 3))
    gain = rng.uniform(0.85, 1.15, b)
    noise = rng.normal(0, NOISE_STD, (b, size, size, 3)).astype(np.float32)
    # text
    template = rng.integers(0, len(TEMPLATES), b)
    adjective = rng.integers(0, len(ADJECTIVES), b)
    dish = rng.integers(0, len(DISHES), b)
    u = rng.random((b, 3))
    slot_kind = np.where(u < P_SIGNATURE, 0, np.where(u < P_SIGNATURE + P_CROSS, 1, 2))
    other = (cuisine[:, None] + rng.integers(1, len(CUISINES), (b, 3))) % len(CUISINES)
    slot_cuisine = np.where(slot_kind == 0, cuisine[:, None], other)
    slot_word = rng.integers(0, len(SHARED), (b, 3))   # taken mod 4 for signature slots
    served = rng.random(b) < P_SERVED
    served_container = np.where(rng.random(b) < P_SERVED_TRUE, container,
                                rng.integers(0, len(CONTAINERS), b))
    return dict(label=label, cuisine=cuisine, container=container, closeup=closeup, centre=centre, scale=scale,
                dish_rgb=dish_rgb, table_rgb=table_rgb, grain_amp=grain_amp,
                grain_freq=grain_freq, grain_phase=grain_phase, utensil=utensil,
                utensil_mid=utensil_mid, utensil_angle=utensil_angle, utensil_len=utensil_len,
                utensil_rgb=utensil_rgb, blob_count=blob_count, blob_t=blob_t, blob_dv=blob_dv,
                blob_radius=blob_radius, blob_food=blob_food, blob_rgb=blob_rgb, gain=gain,
                noise=noise, template=template, adjective=adjective, dish=dish,
                slot_kind=slot_kind, slot_cuisine=slot_cuisine, slot_word=slot_word,
                served=served, served_container=served_container)


def _box(u: np.ndarray, v: np.ndarray, cu: float, cv: float, hu: float, hv: float) -> np.ndarray:
    du, dv = np.abs(u - cu) - hu, np.abs(v - cv) - hv
    return np.hypot(np.maximum(du, 0), np.maximum(dv, 0)) + np.minimum(np.maximum(du, dv), 0)


def _ellipse(u: np.ndarray, v: np.ndarray, cu: float, cv: float, a: float, b: float) -> np.ndarray:
    return (np.hypot((u - cu) / a, (v - cv) / b) - 1.0) * min(a, b)


def _container_distance(kind: int, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Approximate signed distance of each container glyph, in container units (one unit is
    the canvas side at scale 1); the glyph is centred near (0, 0)."""
    if kind == 0:        # bowl: lower half of a wide ellipse, cut at the rim, on a small foot
        body = np.maximum(_ellipse(u, v, 0.0, -0.04, 0.34, 0.30), -(v + 0.04))
        return np.minimum(body, _box(u, v, 0.0, 0.28, 0.1, 0.035))
    if kind == 1:        # plate: a thin wide ellipse
        return _ellipse(u, v, 0.0, 0.12, 0.42, 0.09)
    if kind == 2:        # cup: a tall box with a ring handle on the right
        handle = np.abs(np.hypot(u - 0.12, v - 0.04) - 0.09) - 0.03
        return np.minimum(_box(u, v, -0.04, 0.06, 0.14, 0.2), handle)
    # tray: a wide box with a tab handle at each end
    return np.minimum(_box(u, v, 0.0, 0.06, 0.38, 0.19), _box(np.abs(u), v, 0.42, 0.0, 0.05, 0.04))


def _paint(img: np.ndarray, alpha: np.ndarray, rgb: np.ndarray) -> None:
    a = alpha[..., None]
    img *= 1 - a
    img += a * rgb[:, None, None, :]


def _render(p: dict[str, np.ndarray], size: int) -> np.ndarray:
    m = len(p["label"])
    c = (np.arange(size, dtype=np.float32) + 0.5) / size
    y, x = c[None, :, None], c[None, None, :]
    # table with optional wood grain
    grain = p["grain_amp"][:, None, None] * np.sin(
        2 * np.pi * (p["grain_freq"][:, None, None] * y + p["grain_phase"][:, None, None]
                     + 0.15 * np.sin(2 * np.pi * 1.5 * x)))
    img = (p["table_rgb"][:, None, None, :] + grain[..., None]).astype(np.float32)
    img = np.broadcast_to(img, (m, size, size, 3)).copy()
    # utensil behind the dish: a capsule
    i = np.nonzero(p["utensil"])[0]
    if len(i):
        ang = p["utensil_angle"][i]
        half = 0.5 * p["utensil_len"][i]
        mid = p["utensil_mid"][i]
        ax, ay = np.cos(ang)[:, None, None], np.sin(ang)[:, None, None]
        dx, dy = x - mid[:, 0, None, None], y - mid[:, 1, None, None]
        along = np.clip(dx * ax + dy * ay, -half[:, None, None], half[:, None, None])
        dist = np.hypot(dx - along * ax, dy - along * ay) - 0.025
        sub = img[i]
        _paint(sub, np.clip(0.5 - dist * size, 0, 1).astype(np.float32), p["utensil_rgb"][i])
        img[i] = sub
    # the container
    s = p["scale"][:, None, None]
    u = (x - p["centre"][:, 0, None, None]) / s
    v = (y - p["centre"][:, 1, None, None]) / s
    for kind in range(len(CONTAINERS)):
        i = np.nonzero(p["container"] == kind)[0]
        if not len(i):
            continue
        sd = _container_distance(kind, u[i], v[i]) * s[i] * size            # in pixels
        sub = img[i]
        _paint(sub, np.clip(0.5 - sd, 0, 1).astype(np.float32), p["dish_rgb"][i])
        # food blobs along the container's food line
        line_v = np.array([FOOD_LINE[kind][0]])
        spread = FOOD_LINE[kind][1]
        bu = p["centre"][i, 0, None] + s[i, 0] * spread * p["blob_t"][i]
        bv = p["centre"][i, 1, None] + s[i, 0] * (line_v + p["blob_dv"][i])
        for j in range(3):
            k = np.nonzero(p["blob_count"][i] > j)[0]
            if not len(k):
                continue
            dist = np.hypot(x - bu[k, j, None, None], y - bv[k, j, None, None]) \
                - (p["blob_radius"][i[k], j] * p["scale"][i[k]])[:, None, None]
            blob = sub[k]
            _paint(blob, np.clip(0.5 - dist * size, 0, 1).astype(np.float32),
                   p["blob_rgb"][i[k], j])
            sub[k] = blob
        img[i] = sub
    img *= p["gain"].astype(np.float32)[:, None, None, None]
    img += p["noise"]
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def _texts(p: dict[str, np.ndarray]) -> list[str]:
    out = []
    for i in range(len(p["label"])):
        template, slots = TEMPLATES[p["template"][i]]
        words: list[str] = []
        group: tuple[str, ...]
        for j in range(slots):
            if p["slot_kind"][i, j] == 2:
                group, w = SHARED, int(p["slot_word"][i, j])
            else:
                group, w = SIGNATURE[p["slot_cuisine"][i, j]], int(p["slot_word"][i, j]) % 4
            while group[w % len(group)] in words:         # no ingredient twice
                w += 1
            words.append(group[w % len(group)])
        text = template.format(a=ADJECTIVES[p["adjective"][i]], d=DISHES[p["dish"][i]],
                               **{f"i{j}": word for j, word in enumerate(words)})
        if p["served"][i]:
            text += " " + SERVED[p["served_container"][i]]
        out.append(text)
    return out
