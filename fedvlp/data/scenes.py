"""The ``synthetic-scenes`` multi-label dataset.

32x32 RGB images of 1-3 coloured glyphs, 20 classes = 5 shapes x 4 colours. Class ``c`` is
colour ``c // 5`` and shape ``c % 5`` (colour-major: "red circle", "red square", ...,
"yellow cross").

A latent scene context (4 of them) drives co-occurrence in the ``pretrain`` and ``train``
splits: each context prefers 5 classes (one per shape, colours spread, the four sets are
disjoint and cover all 20 classes) and one background. Each object comes from the preferred
set with probability ``P_PREFERRED`` (else uniformly over all classes not yet in the image),
and the background is the preferred one with probability ``P_BACKGROUND`` (else uniform).
The ``test`` and ``val`` splits draw objects and background independently and uniformly
(context = -1), so co-occurrence learned on train does not hold there; ``holdout`` (the pool the
clients' local test sets come from) is drawn like ``train``.

Objects sit one per quadrant (the quadrant is jittered within its cell, never crossing it),
so they never overlap. Conditions per image, stored as int arrays in ``SceneSet.conditions``
and named in the captions:

* ``context``    0..3 (-1 in test and val)
* ``background`` ``BACKGROUNDS``  = plain, striped, checked, gradient, noisy (neutral, low
  saturation colours, never an object colour)
* ``lighting``   ``LIGHTINGS``    = dim, normal, bright (whole-image gain with a slight tint)
* ``scale``      ``SCALES``       = small (radius < 0.18 of the canvas), large
* ``layout``     ``LAYOUTS`` / ``LAYOUT_NAMES``: which quadrants hold objects (14 values)
* ``pose``       ``POSES``        = upright (|angle| <= 4 deg), turned (15-40 deg either way)

Captions name the objects and, half the time, one condition: "a photo of a red circle, a blue
square and a yellow cross", "a photo of a green diamond, on a striped background", "... in dim
light", "... small and turned", "... gap bottom right" (at most 32 tokens with the open_clip
tokenizer, start/end included). About 15 % of objects are left out of the
captions; a caption always names at least one object. Objects are listed in reading order
(top left, top right, bottom left, bottom right).

Everything is drawn from ``numpy_rng(seed, "data", SPLITS.index(split))`` in fixed blocks of
``BLOCK`` images, so a set is a prefix of any larger set with the same seed and split.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from fedvlp.data.synthetic import check_generator_args
from fedvlp.seeding import numpy_rng

SPLITS = ("pretrain", "train", "test", "val", "holdout")
DECORRELATED_SPLITS = ("test", "val")
SHAPES = ("circle", "square", "triangle", "diamond", "cross")
COLOURS = ("red", "green", "blue", "yellow")
CLASS_NAMES = [f"{colour} {shape}" for colour in COLOURS for shape in SHAPES]
NUM_CLASSES = len(CLASS_NAMES)
NUM_CONTEXTS = 4

BACKGROUNDS = ("plain", "striped", "checked", "gradient", "noisy")
LIGHTINGS = ("dim", "normal", "bright")
SCALES = ("small", "large")
POSES = ("upright", "turned")
# Quadrants: 0 top left, 1 top right, 2 bottom left, 3 bottom right.
LAYOUTS = tuple(q for k in (1, 2, 3) for q in itertools.combinations(range(4), k))
_QUADRANT_NAMES = ("top left", "top right", "bottom left", "bottom right")
_PAIR_NAMES = {(0, 1): "top row", (2, 3): "bottom row", (0, 2): "left column",
               (1, 3): "right column", (0, 3): "diagonal down", (1, 2): "diagonal up"}


def _layout_name(quadrants: tuple[int, ...]) -> str:
    if len(quadrants) == 1:
        return _QUADRANT_NAMES[quadrants[0]]
    if len(quadrants) == 2:
        return _PAIR_NAMES[quadrants]
    (gap,) = set(range(4)) - set(quadrants)
    return f"gap {_QUADRANT_NAMES[gap]}"


LAYOUT_NAMES = tuple(_layout_name(q) for q in LAYOUTS)
CONDITION_VALUES = {"background": BACKGROUNDS, "lighting": LIGHTINGS, "scale": SCALES,
                    "layout": LAYOUT_NAMES, "pose": POSES}

# Context k prefers (shape s, colour (s + k) % 4) for every shape s, and background k + 1.
CONTEXT_CLASSES = np.array([[((s + k) % 4) * len(SHAPES) + s for s in range(len(SHAPES))]
                            for k in range(NUM_CONTEXTS)])
CONTEXT_BACKGROUND = np.arange(NUM_CONTEXTS) + 1
P_PREFERRED = 0.8
P_BACKGROUND = 0.7
OBJECT_COUNT_P = (0.3, 0.4, 0.3)            # 1, 2, 3 objects
RADIUS_RANGE = (0.14, 0.22)                 # fraction of the canvas
SMALL_BELOW = 0.18
CAPTION_OMIT = 0.15                         # target fraction of objects left out of captions
CAPTION_CONDITION_P = 0.5                   # captions that also name one condition
# Per-object drop probability that yields CAPTION_OMIT overall, since the last named object of
# an image is never dropped: E[dropped] = .4 (2p - p^2) + .3 (3p - p^3) = .15 * E[count].
_OMIT_P = 0.1853
BLOCK = 1024

OBJECT_RGB = np.array([(220, 35, 35), (30, 170, 55), (40, 80, 230), (240, 210, 30)], np.float32)
LIGHT_GAIN = np.array([(0.60, 0.62, 0.70), (1.0, 1.0, 1.0), (1.22, 1.18, 1.08)], np.float32)

_PHRASES = [f"a {name}" for name in CLASS_NAMES]
_CONTEXT_MASK = np.zeros((NUM_CONTEXTS, NUM_CLASSES), bool)
_CONTEXT_MASK[np.arange(NUM_CONTEXTS)[:, None], CONTEXT_CLASSES] = True
_LAYOUT_OF_MASK = np.full(16, -1, np.int64)
for _i, _q in enumerate(LAYOUTS):
    _LAYOUT_OF_MASK[sum(1 << q for q in _q)] = _i


@dataclass(frozen=True)
class SceneSet:
    images: np.ndarray                   # uint8 [n, S, S, 3]
    labels: np.ndarray                   # uint8 [n, 20] multi-hot
    captions: list[str]
    conditions: dict[str, np.ndarray]    # int64 [n] each; see module docstring
    class_names: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.captions)


def generate_scenes(num_samples: int, split: str, seed: int, image_size: int = 32) -> SceneSet:
    """Generate ``num_samples`` scenes of ``split`` deterministically from ``seed``."""
    n, size = check_generator_args(num_samples, split, image_size, SPLITS)
    rng = numpy_rng(seed, "data", SPLITS.index(split))
    images = np.empty((n, size, size, 3), np.uint8)
    labels = np.zeros((n, NUM_CLASSES), np.uint8)
    conditions = {k: np.empty(n, np.int64) for k in
                  ("context", "background", "lighting", "scale", "layout", "pose")}
    captions: list[str] = []
    for start in range(0, n, BLOCK):
        m = min(BLOCK, n - start)
        params = _draw_block(rng, split, size)   # always a full block: prefix-stable
        params = {k: v[:m] for k, v in params.items()}
        sl = slice(start, start + m)
        images[sl] = _render(params, size)
        present = params["quadrant_class"] >= 0
        rows = np.nonzero(present)[0]
        labels[sl][rows, params["quadrant_class"][present]] = 1
        for key in conditions:
            conditions[key][sl] = params[key]
        captions.extend(_captions(params))
    return SceneSet(images, labels, captions, conditions, tuple(CLASS_NAMES))


def _draw_block(rng: np.random.Generator, split: str, size: int) -> dict[str, np.ndarray]:
    b = BLOCK
    decorrelated = split in DECORRELATED_SPLITS
    context = rng.integers(0, NUM_CONTEXTS, b)
    count = rng.choice(np.arange(1, 4), size=b, p=OBJECT_COUNT_P)
    quadrant_order = np.argsort(rng.random((b, 4)), axis=1)
    # Classes for up to 3 objects, without repetition: preferred with P_PREFERRED, else uniform.
    chosen = np.zeros((b, NUM_CLASSES), bool)
    classes = np.empty((b, 3), np.int64)
    preferred = _CONTEXT_MASK[context]
    for j in range(3):
        free = ~chosen
        uniform = free / free.sum(1, keepdims=True)
        if decorrelated:
            w = uniform
        else:
            pref = preferred & free
            w = (1 - P_PREFERRED) * uniform
            n_pref = pref.sum(1, keepdims=True)
            w = np.where(n_pref > 0, w + P_PREFERRED * pref / np.maximum(n_pref, 1), uniform)
        cdf = np.cumsum(w, axis=1)
        u = rng.random(b)[:, None] * cdf[:, -1:]
        classes[:, j] = np.minimum((cdf <= u).sum(1), NUM_CLASSES - 1)
        chosen[np.arange(b), classes[:, j]] = True
    quadrant_class = np.full((b, 4), -1, np.int64)
    for j in range(3):
        rows = np.nonzero(count > j)[0]
        quadrant_class[rows, quadrant_order[rows, j]] = classes[rows, j]
    present = quadrant_class >= 0
    layout = _LAYOUT_OF_MASK[(present * (1 << np.arange(4))).sum(1)]

    uniform_bg = rng.integers(0, len(BACKGROUNDS), b)
    keep_bg = rng.random(b) < P_BACKGROUND
    background = uniform_bg if decorrelated else np.where(keep_bg, CONTEXT_BACKGROUND[context],
                                                          uniform_bg)
    # Neutral background colours: grey level plus a small tint shared by both pattern colours.
    level = rng.uniform(70, 180, b)
    delta = rng.uniform(35, 60, b) * np.where(level < 125, 1.0, -1.0)
    tint = rng.uniform(-10, 10, (b, 3))
    bg_a = level[:, None] + tint
    bg_b = bg_a + delta[:, None]
    stripe_dir = rng.integers(0, 4, b)
    period = rng.integers(4, 9, b).astype(np.float64)
    cell = rng.integers(3, 7, b).astype(np.float64)
    phase = rng.uniform(0, 8, (b, 2))
    grad_angle = rng.uniform(0, 2 * np.pi, b)
    noise = rng.random((b, size // 2, size // 2))

    lighting = rng.integers(0, len(LIGHTINGS), b)
    gain = LIGHT_GAIN[lighting] * rng.uniform(0.95, 1.05, b)[:, None]
    radius = rng.uniform(*RADIUS_RANGE, b)
    pose = rng.integers(0, len(POSES), b)
    angle = np.where(pose[:, None] == 1,
                     rng.uniform(15, 40, (b, 4)) * rng.choice([-1.0, 1.0], (b, 4)),
                     rng.uniform(-4, 4, (b, 4))) * (np.pi / 180)
    jitter = rng.uniform(-1, 1, (b, 4, 2))
    omit = (rng.random((b, 4)) < _OMIT_P) & present
    keep_one = np.argmax(np.where(present, rng.random((b, 4)) + 1, 0), axis=1)
    omit[np.arange(b), keep_one] &= omit.sum(1) < present.sum(1)
    # Which condition phrase the caption adds (-1: none). One at most, half the time: captions
    # full of conditions let contrastive pretraining match on them and leave shapes unlearned
    # (zero-shot mAP 0.30 vs 0.46 after 350 steps).
    caption_condition = np.where(rng.random(b) < CAPTION_CONDITION_P,
                                 rng.integers(0, len(_CONDITION_PHRASES), b), -1)
    return dict(context=np.where(decorrelated, -1, context), quadrant_class=quadrant_class,
                layout=layout, background=background, bg_a=bg_a, bg_b=bg_b,
                stripe_dir=stripe_dir, period=period, cell=cell, phase=phase,
                grad_angle=grad_angle, noise=noise, lighting=lighting, gain=gain,
                radius=radius, scale=(radius >= SMALL_BELOW).astype(np.int64), pose=pose,
                angle=angle, jitter=jitter, omit=omit, caption_condition=caption_condition)


def _background(p: dict[str, np.ndarray], size: int) -> np.ndarray:
    m = len(p["background"])
    c = np.arange(size, dtype=np.float32) + 0.5
    y, x = c[None, :, None], c[None, None, :]
    t = np.zeros((m, size, size), np.float32)
    kind = p["background"]
    i = np.nonzero(kind == 1)[0]                          # stripes
    if len(i):
        d = p["stripe_dir"][i][:, None, None]
        s = np.where(d == 0, y, np.where(d == 1, x, np.where(d == 2, x + y, x - y)))
        t[i] = np.floor((s + p["phase"][i, :1, None]) / (p["period"][i, None, None] / 2)) % 2
    i = np.nonzero(kind == 2)[0]                          # checks
    if len(i):
        cell = p["cell"][i, None, None]
        t[i] = (np.floor((y + p["phase"][i, :1, None]) / cell)
                + np.floor((x + p["phase"][i, 1:, None]) / cell)) % 2
    i = np.nonzero(kind == 3)[0]                          # gradient
    if len(i):
        a = p["grad_angle"][i][:, None, None]
        ca, sa = np.cos(a), np.sin(a)
        proj = (x - size / 2) * ca + (y - size / 2) * sa
        t[i] = proj / (size * (np.abs(ca) + np.abs(sa))) + 0.5
    i = np.nonzero(kind == 4)[0]                          # noise, 2x2 blocks
    if len(i):
        t[i] = np.repeat(np.repeat(p["noise"][i], 2, axis=1), 2, axis=2)
    a, b = p["bg_a"].astype(np.float32), p["bg_b"].astype(np.float32)
    return a[:, None, None, :] + t[..., None] * (b - a)[:, None, None, :]


def _shape_distance(shape: int, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Signed distance (unit radius, approximate outside corners) of each glyph; every glyph
    fits in the unit circle so no rotation leaves its quadrant."""
    au, av = np.abs(u), np.abs(v)
    if shape == 0:                                        # circle
        return np.sqrt(u * u + v * v) - 1.0
    if shape == 1:                                        # square, half side 0.72
        return np.maximum(au, av) - 0.72
    if shape == 2:                                        # equilateral triangle, apex up
        h = np.sqrt(3.0) / 2
        return np.maximum(np.maximum(v, h * u - 0.5 * v), -h * u - 0.5 * v) - 0.5
    if shape == 3:                                        # tall rhombus, half axes .6 / 1
        a, b = 0.6, 1.0
        return (au * b + av * a - a * b) / np.hypot(a, b)
    arm, half = 0.95, 0.3                                 # plus-shaped cross
    return np.minimum(np.maximum(au - arm, av - half), np.maximum(au - half, av - arm))


def _render(p: dict[str, np.ndarray], size: int) -> np.ndarray:
    img = _background(p, size)
    q = size // 2
    rows, quads = np.nonzero(p["quadrant_class"] >= 0)
    cls = p["quadrant_class"][rows, quads]
    r_px = (p["radius"][rows] * size).astype(np.float32)[:, None, None]
    room = np.maximum(q / 2 - r_px - 0.6, 0)
    centre = q / 2 + p["jitter"][rows, quads].astype(np.float32)[:, :, None, None] * room[:, None]
    grid = np.arange(q, dtype=np.float32) + 0.5
    dx, dy = grid[None, None, :] - centre[:, 0], grid[None, :, None] - centre[:, 1]
    ang = p["angle"][rows, quads].astype(np.float32)[:, None, None]
    ca, sa = np.cos(ang), np.sin(ang)
    u, v = (ca * dx + sa * dy) / r_px, (-sa * dx + ca * dy) / r_px
    alpha = np.empty((len(rows), q, q), np.float32)
    shape = cls % len(SHAPES)
    for s in range(len(SHAPES)):
        i = np.nonzero(shape == s)[0]
        if len(i):
            sd = _shape_distance(s, u[i], v[i]) * r_px[i]      # in pixels
            alpha[i] = np.clip(0.5 - sd, 0.0, 1.0)
    colour = OBJECT_RGB[cls // len(SHAPES)][:, None, None, :]
    a = alpha[..., None]
    for quad in range(4):
        i = np.nonzero(quads == quad)[0]
        if not len(i):
            continue
        y0, x0 = (quad // 2) * q, (quad % 2) * q
        b = rows[i]
        region = img[b, y0:y0 + q, x0:x0 + q]
        img[b, y0:y0 + q, x0:x0 + q] = region * (1 - a[i]) + a[i] * colour[i]
    img *= p["gain"].astype(np.float32)[:, None, None, :]
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


_CONDITION_PHRASES = (
    lambda p, i: f"{SCALES[p['scale'][i]]} and {POSES[p['pose'][i]]}",
    lambda p, i: LAYOUT_NAMES[p["layout"][i]],
    lambda p, i: f"on a {BACKGROUNDS[p['background'][i]]} background",
    lambda p, i: f"in {LIGHTINGS[p['lighting'][i]]} light",
)


def _captions(p: dict[str, np.ndarray]) -> list[str]:
    out = []
    named = np.where(p["omit"], -1, p["quadrant_class"])
    for i in range(len(named)):
        objs = [_PHRASES[c] for c in named[i] if c >= 0]
        listed = objs[0] if len(objs) == 1 else ", ".join(objs[:-1]) + " and " + objs[-1]
        which = p["caption_condition"][i]
        condition = "" if which < 0 else ", " + _CONDITION_PHRASES[which](p, i)
        out.append(f"a photo of {listed}{condition}")
    return out
