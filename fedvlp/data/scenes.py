"""The ``synthetic-scenes`` multi-label dataset.

32x32 RGB images of 1-3 coloured glyphs, 20 classes = 5 shapes x 4 colours. Class ``c`` is
colour ``c // 5`` and shape ``c % 5`` (colour-major: "red circle", "red square", ...,
"yellow cross").

Two domains, as real benchmarks have them. The ``pretrain`` split is the *source*: the captioned corpus the tiny
CLIP learns from, objects in ``OBJECT_RGB``. Every other split is the *target*, the federated task with exact
labels for every object: its objects are drawn in ``TARGET_RGB``, each colour moved ``PALETTE_SHIFT`` of the way to a
neighbouring hue (red towards orange, green towards teal, blue towards purple, yellow towards chartreuse). The class
names still hold, but the frozen encoder meets colours its captions never named: a shift that prompts can correct.

A latent scene context (4 of them) drives what is in a scene and how it looks, in ``pretrain``, ``train``, ``val``,
``test`` and ``holdout``. Context ``k`` prefers 5 classes (one per shape, colours spread; the four sets are disjoint
and cover all 20 classes) and a style: one background, one lighting, one object scale, one pose and a favoured pair
of quadrants (``CONTEXT_*``). Each object comes from the preferred set with probability ``P_PREFERRED_SOURCE`` in
the source corpus and ``P_PREFERRED_TARGET`` in the target splits (else uniformly over the classes not yet in the
image); in the target splits each of background, lighting, scale and pose is the context's with probability
``P_STYLE`` (else uniform), and objects go to the favoured quadrants
``QUADRANT_WEIGHT`` times as readily as to the others. So a client that holds one co-occurrence pattern (label
skew t = 1) also holds one style, and ``val`` and ``test`` are drawn like the union of the clients' data, as VOC's
and COCO's test sets are. The ``shift`` split draws everything independently and uniformly (context = -1): the
co-occurrence and style learned on train do not hold there, which is where the hallucination gap shows.

Objects are not all easy to see, in every split alike: each is clear, faint (blended into the
background at ``FAINT_OPACITY``) or partly occluded (a neutral card covers 40-60 % of it), with
probabilities ``VISIBILITY_P``, and the small scale draws glyphs of radius 4.5-5.4 px (large
5.8-7 px).

Objects sit one per quadrant (jittered within it; glyph and card are drawn in the quadrant's
window, so nothing crosses it) and never overlap. ``SceneSet.quadrants`` holds each quadrant's
``class``, ``visibility`` and whether the caption ``named`` it (-1: empty), and
``SceneSet.region_captions`` the phrase the caption uses for it, for region-level supervision
and tests. Conditions per image, stored as int arrays in ``SceneSet.conditions``:

* ``context``    0..3 (-1 in shift)
* ``background`` ``BACKGROUNDS``  = plain, striped, checked, gradient, noisy (neutral, low
  saturation colours, never an object colour)
* ``lighting``   ``LIGHTINGS``    = normal, dim, bright, warm, cool (whole-image gain and tint)
* ``scale``      ``SCALES``       = small (glyph radius ``SCALE_RADIUS[0]`` of the canvas), large
* ``layout``     ``LAYOUTS`` / ``LAYOUT_NAMES``: which quadrants hold objects (14 values)
* ``pose``       ``POSES``        = upright (|angle| <= 4 deg), turned (15-40 deg either way)

Captions are written the way people write them: the objects that stand out first (clear before faint or
occluded), each named with its class's own words with probability ``CANONICAL_P`` per word, else a synonym
(``COLOUR_WORDS``, ``SHAPE_WORDS``: "a crimson ball", "the navy kite"), an article of ``ARTICLES``, in one of
``CAPTION_FRAMES`` ("there is ...", "... in the picture"), and, half the time, one condition phrase that holds a
word of each of FedMPT's conditions ("spatial layout", "object pose", "background", "lighting", "object scale"):
"i can see a green rhombus, on a striped background", "..., in dim lighting", "..., in a turned object pose", "...,
at a small object scale", "..., with a top row spatial layout" (at most 32 tokens with the open_clip tokenizer,
start/end included). One condition at most: captions full of conditions let contrastive pretraining match on them
and leave shapes unlearned. About 15 % of objects are left out of the captions, faint and occluded ones most often
(``OMIT_P_*``), as people caption what they see; a caption always names at least one object. The evaluation
prompt "a photo of a {class}." is one frame, article and wording among many: about 1 caption in 700 reads like it.

Everything is drawn from ``numpy_rng(seed, "data", SPLITS.index(split))`` in fixed blocks of
``BLOCK`` images, so a set is a prefix of any larger set with the same seed and split.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from fedvlp.data.synthetic import check_generator_args
from fedvlp.seeding import numpy_rng

SPLITS = ("pretrain", "train", "test", "val", "holdout", "shift")
SOURCE_SPLITS = ("pretrain",)                            # the captioned corpus the tiny CLIP learns from
STYLED_SPLITS = ("train", "test", "val", "holdout")      # the target task, drawn like the clients' union
DECORRELATED_SPLITS = ("shift",)
SHAPES = ("circle", "square", "triangle", "diamond", "cross")
COLOURS = ("red", "green", "blue", "yellow")
CLASS_NAMES = [f"{colour} {shape}" for colour in COLOURS for shape in SHAPES]
NUM_CLASSES = len(CLASS_NAMES)
NUM_CONTEXTS = 4

BACKGROUNDS = ("plain", "striped", "checked", "gradient", "noisy")
LIGHTINGS = ("normal", "dim", "bright", "warm", "cool")
SCALES = ("small", "large")
POSES = ("upright", "turned")
VISIBILITIES = ("clear", "faint", "occluded")
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

# Context k prefers (shape s, colour (s + k) % 4) for every shape s, and a style: background and
# lighting k + 1 (plain and normal belong to no context), a scale, a pose and a quadrant pair.
CONTEXT_CLASSES = np.array([[((s + k) % 4) * len(SHAPES) + s for s in range(len(SHAPES))]
                            for k in range(NUM_CONTEXTS)])
CONTEXT_BACKGROUND = np.arange(NUM_CONTEXTS) + 1
CONTEXT_LIGHTING = np.arange(NUM_CONTEXTS) + 1
CONTEXT_SCALE = np.array([0, 1, 0, 1])
CONTEXT_POSE = np.array([0, 1, 1, 0])
CONTEXT_QUADRANTS = np.array([(0, 1), (2, 3), (0, 2), (1, 3)])   # top row, bottom row, columns
# The target's contexts are stronger than the source's, so that label skew costs FedAvg what it costs on VOC and COCO
# (the world's label-skew diagnostic, docs/worlds.md); the source's is the shipped tiny CLIP's corpus, unchanged.
P_PREFERRED_SOURCE = 0.8
P_PREFERRED_TARGET = 0.95
P_STYLE = 0.9
QUADRANT_WEIGHT = 4.0
OBJECT_COUNT_P = (0.3, 0.4, 0.3)            # 1, 2, 3 objects
SCALE_RADIUS = ((0.14, 0.17), (0.18, 0.22))  # glyph radius as a fraction of the canvas
VISIBILITY_P = (0.8, 0.1, 0.1)             # clear, faint, occluded
FAINT_OPACITY = (0.3, 0.5)
CAPTION_OMIT = 0.15                         # fraction of all objects left out of captions
CAPTION_CONDITION_P = 0.5                   # captions that also name one condition
# Per-object chance that a caption leaves the object out (the last named object of an image is never
# dropped): about 9 % of clear and 40 % of faint or occluded objects, 15 % of all.
OMIT_P_CLEAR = 0.1
OMIT_P_HARD = 0.5
BLOCK = 1024

OBJECT_RGB = np.array([(220, 35, 35), (30, 170, 55), (40, 80, 230), (240, 210, 30)], np.float32)
# The target domain's palette: each colour moved PALETTE_SHIFT of the way towards a neighbouring hue (red to
# orange, green to teal, blue to purple, yellow to chartreuse), so the frozen encoder meets colours its captions
# never named, and the class names still hold.
SHIFTED_RGB = np.array([(240, 125, 30), (30, 160, 165), (140, 60, 210), (165, 215, 40)], np.float32)
PALETTE_SHIFT = 0.6
TARGET_RGB = (1 - PALETTE_SHIFT) * OBJECT_RGB + PALETTE_SHIFT * SHIFTED_RGB

# How people name what they see: a caption word is the class's own word with probability CANONICAL_P, else one of
# its synonyms; captions use one of CAPTION_FRAMES and list objects most visible first.
COLOUR_WORDS = (("red", "crimson", "scarlet"), ("green", "lime", "emerald"), ("blue", "navy", "azure"),
                ("yellow", "golden", "lemon"))
SHAPE_WORDS = (("circle", "ball", "disc", "dot"), ("square", "box", "block", "tile"),
               ("triangle", "pyramid", "wedge"), ("diamond", "rhombus", "kite", "lozenge"),
               ("cross", "plus", "plus sign"))
CANONICAL_P = 0.4
ARTICLES = ("a", "one", "the")
CAPTION_FRAMES = ("{}", "a photo of {}", "a picture of {}", "there is {}", "{} in the picture", "i can see {}",
                  "a snapshot with {}", "{} here")
LIGHT_GAIN = np.array([(1.0, 1.0, 1.0), (0.55, 0.58, 0.68), (1.3, 1.25, 1.15), (1.15, 0.95, 0.7),
                       (0.75, 0.92, 1.2)], np.float32)

_CONTEXT_MASK = np.zeros((NUM_CONTEXTS, NUM_CLASSES), bool)
_CONTEXT_MASK[np.arange(NUM_CONTEXTS)[:, None], CONTEXT_CLASSES] = True
_FAVOURED = np.zeros((NUM_CONTEXTS, 4), bool)
_FAVOURED[np.arange(NUM_CONTEXTS)[:, None], CONTEXT_QUADRANTS] = True
_LAYOUT_OF_MASK = np.full(16, -1, np.int64)
for _i, _q in enumerate(LAYOUTS):
    _LAYOUT_OF_MASK[sum(1 << q for q in _q)] = _i


@dataclass(frozen=True)
class SceneSet:
    images: np.ndarray                   # uint8 [n, S, S, 3]; [n, 0, 0, 3] with render=False
    labels: np.ndarray                   # uint8 [n, 20] multi-hot
    captions: list[str]
    conditions: dict[str, np.ndarray]    # int64 [n] each; see module docstring
    class_names: tuple[str, ...]
    quadrants: dict[str, np.ndarray]     # int64 [n, 4] each: "class", "visibility", "named" (-1: empty)
    region_captions: tuple[tuple[str, str, str, str], ...] = ()  # each quadrant's phrase in the caption ("": none)

    def __len__(self) -> int:
        return len(self.captions)


def generate_scenes(num_samples: int, split: str, seed: int, image_size: int = 32, render: bool = True) -> SceneSet:
    """Generate ``num_samples`` scenes of ``split`` deterministically from ``seed``; with ``render=False``
    everything but the pixels (rendering is most of the time), which the same call with ``render=True`` adds."""
    n, size = check_generator_args(num_samples, split, image_size, SPLITS)
    rng = numpy_rng(seed, "data", SPLITS.index(split))
    images = np.empty((n, size, size, 3) if render else (n, 0, 0, 3), np.uint8)
    labels = np.zeros((n, NUM_CLASSES), np.uint8)
    conditions = {k: np.empty(n, np.int64) for k in
                  ("context", "background", "lighting", "scale", "layout", "pose")}
    quadrants = {k: np.empty((n, 4), np.int64) for k in ("class", "visibility", "named")}
    captions: list[str] = []
    region_captions: list[tuple[str, str, str, str]] = []
    for start in range(0, n, BLOCK):
        m = min(BLOCK, n - start)
        params = _draw_block(rng, split, size)   # always a full block: prefix-stable
        params = {k: v[:m] for k, v in params.items()}
        sl = slice(start, start + m)
        if render:
            images[sl] = _render(params, size)
        present = params["quadrant_class"] >= 0
        rows = np.nonzero(present)[0]
        labels[sl][rows, params["quadrant_class"][present]] = 1
        for key in conditions:
            conditions[key][sl] = params[key]
        quadrants["class"][sl] = params["quadrant_class"]
        quadrants["visibility"][sl] = np.where(present, params["visibility"], -1)
        quadrants["named"][sl] = np.where(present, ~params["omit"], -1)
        for caption, regions in _captions(params):
            captions.append(caption)
            region_captions.append(regions)
    return SceneSet(images, labels, captions, conditions, tuple(CLASS_NAMES), quadrants, tuple(region_captions))


def _draw_block(rng: np.random.Generator, split: str, size: int) -> dict[str, np.ndarray]:
    b = BLOCK
    decorrelated = split in DECORRELATED_SPLITS
    styled_split = split in STYLED_SPLITS
    context = rng.integers(0, NUM_CONTEXTS, b)
    count = rng.choice(np.arange(1, 4), size=b, p=OBJECT_COUNT_P)
    # Quadrants in a weighted random order (exponential race), the context's pair favoured.
    weight = np.where(_FAVOURED[context] & styled_split, QUADRANT_WEIGHT, 1.0)
    quadrant_order = np.argsort(rng.exponential(size=(b, 4)) / weight, axis=1)
    # Classes for up to 3 objects, without repetition: preferred with the split's P_PREFERRED_*, else uniform.
    p_preferred = P_PREFERRED_TARGET if styled_split else P_PREFERRED_SOURCE
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
            w = (1 - p_preferred) * uniform
            n_pref = pref.sum(1, keepdims=True)
            w = np.where(n_pref > 0, w + p_preferred * pref / np.maximum(n_pref, 1), uniform)
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

    def styled(num_values: int, preferred_value: np.ndarray) -> np.ndarray:
        """The context's value with probability P_STYLE in a styled split, else uniform."""
        uniform = rng.integers(0, num_values, b)
        keep = (rng.random(b) < P_STYLE) & styled_split
        return np.where(keep, preferred_value[context], uniform)

    background = styled(len(BACKGROUNDS), CONTEXT_BACKGROUND)
    lighting = styled(len(LIGHTINGS), CONTEXT_LIGHTING)
    scale = styled(len(SCALES), CONTEXT_SCALE)
    pose = styled(len(POSES), CONTEXT_POSE)
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

    gain = LIGHT_GAIN[lighting] * rng.uniform(0.95, 1.05, b)[:, None]
    low, high = np.array(SCALE_RADIUS).T
    radius = rng.uniform(low[scale], high[scale])
    angle = np.where(pose[:, None] == 1,
                     rng.uniform(15, 40, (b, 4)) * rng.choice([-1.0, 1.0], (b, 4)),
                     rng.uniform(-4, 4, (b, 4))) * (np.pi / 180)
    jitter = rng.uniform(-1, 1, (b, 4, 2))
    visibility = rng.choice(len(VISIBILITIES), size=(b, 4), p=VISIBILITY_P)
    opacity = np.where(visibility == 1, rng.uniform(*FAINT_OPACITY, (b, 4)), 1.0)
    card_side = rng.integers(0, 4, (b, 4))          # the card covers the left/right/top/bottom part
    card_cut = rng.uniform(-0.2, 0.2, (b, 4))       # where its edge crosses the glyph, in radii
    omit = (rng.random((b, 4)) < np.where(visibility == 0, OMIT_P_CLEAR, OMIT_P_HARD)) & present
    keep_one = np.argmax(np.where(present, rng.random((b, 4)) + 1, 0), axis=1)
    omit[np.arange(b), keep_one] &= omit.sum(1) < present.sum(1)
    # Which condition phrase the caption adds (-1: none). One at most, half the time: captions
    # full of conditions let contrastive pretraining match on them and leave shapes unlearned
    # (zero-shot mAP 0.30 vs 0.46 after 350 steps).
    caption_condition = np.where(rng.random(b) < CAPTION_CONDITION_P,
                                 rng.integers(0, len(_CONDITION_PHRASES), b), -1)
    canonical = rng.random((b, 4, 2)) < CANONICAL_P
    colour_word = np.where(canonical[..., 0], 0, rng.integers(1, 3, (b, 4)))
    shape_synonyms = np.array([len(w) - 1 for w in SHAPE_WORDS])[np.maximum(quadrant_class, 0) % len(SHAPES)]
    shape_word = np.where(canonical[..., 1], 0, 1 + np.floor(rng.random((b, 4)) * shape_synonyms).astype(np.int64))
    article = rng.integers(0, len(ARTICLES), (b, 4))
    frame = rng.integers(0, len(CAPTION_FRAMES), b)
    mention_order = np.argsort(np.where(visibility == 0, 0.0, 1.0) + rng.random((b, 4)), axis=1)
    return dict(context=np.where(decorrelated, -1, context), quadrant_class=quadrant_class,
                layout=layout, background=background, bg_a=bg_a, bg_b=bg_b,
                stripe_dir=stripe_dir, period=period, cell=cell, phase=phase,
                grad_angle=grad_angle, noise=noise, lighting=lighting, gain=gain,
                radius=radius, scale=scale, pose=pose, angle=angle, jitter=jitter,
                visibility=visibility, opacity=opacity, card_side=card_side, card_cut=card_cut,
                omit=omit, caption_condition=caption_condition, colour_word=colour_word, shape_word=shape_word,
                article=article, frame=frame, mention_order=mention_order,
                palette=np.full(b, split not in SOURCE_SPLITS))


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


def _card_distance(side: np.ndarray, cut: np.ndarray, dx: np.ndarray, dy: np.ndarray,
                   r_px: np.ndarray) -> np.ndarray:
    """Signed distance (pixels) of the occluding card: the glyph's box beyond `cut` radii
    from its centre towards `side` (0 left, 1 right, 2 top, 3 bottom)."""
    along = np.where(side < 2, dx, dy) * np.where(side % 2 == 0, -1.0, 1.0)
    across = np.where(side < 2, dy, dx)
    edge = 1.1 * r_px
    return np.maximum(np.maximum(cut * r_px - along, along - edge), np.abs(across) - edge)


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
    alpha *= p["opacity"][rows, quads].astype(np.float32)[:, None, None]
    card = np.clip(0.5 - _card_distance(p["card_side"][rows, quads][:, None, None],
                                        p["card_cut"][rows, quads].astype(np.float32)[:, None, None],
                                        dx, dy, r_px), 0.0, 1.0)
    card *= (p["visibility"][rows, quads] == 2)[:, None, None]
    colour = np.where(p["palette"][rows][:, None], TARGET_RGB[cls // len(SHAPES)],
                      OBJECT_RGB[cls // len(SHAPES)])[:, None, None, :]
    card_colour = p["bg_b"][rows].astype(np.float32)[:, None, None, :]
    a, c = alpha[..., None], card[..., None].astype(np.float32)
    for quad in range(4):
        i = np.nonzero(quads == quad)[0]
        if not len(i):
            continue
        y0, x0 = (quad // 2) * q, (quad % 2) * q
        b = rows[i]
        region = img[b, y0:y0 + q, x0:x0 + q] * (1 - a[i]) + a[i] * colour[i]
        img[b, y0:y0 + q, x0:x0 + q] = region * (1 - c[i]) + c[i] * card_colour[i]
    img *= p["gain"].astype(np.float32)[:, None, None, :]
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def _layout_phrase(p: dict[str, np.ndarray], i: int) -> str:
    return f"with a {LAYOUT_NAMES[p['layout'][i]]} spatial layout"


def _pose_phrase(p: dict[str, np.ndarray], i: int) -> str:
    pose = POSES[p["pose"][i]]
    return f"in {'an' if pose[0] in 'aeiou' else 'a'} {pose} object pose"


# One phrase per FedMPT condition, each holding the condition's words.
_CONDITION_PHRASES = (
    _layout_phrase,
    _pose_phrase,
    lambda p, i: f"on a {BACKGROUNDS[p['background'][i]]} background",
    lambda p, i: f"in {LIGHTINGS[p['lighting'][i]]} lighting",
    lambda p, i: f"at a {SCALES[p['scale'][i]]} object scale",
)


def _object_phrase(p: dict[str, np.ndarray], i: int, quadrant: int) -> str:
    cls = p["quadrant_class"][i, quadrant]
    colour = COLOUR_WORDS[cls // len(SHAPES)][p["colour_word"][i, quadrant]]
    article = ARTICLES[p["article"][i, quadrant]]
    article = "an" if article == "a" and colour[0] in "aeiou" else article
    return f"{article} {colour} {SHAPE_WORDS[cls % len(SHAPES)][p['shape_word'][i, quadrant]]}"


def _captions(p: dict[str, np.ndarray]) -> list[tuple[str, tuple[str, str, str, str]]]:
    """Each image's caption and the phrase it uses for each quadrant's object ("" where it names none)."""
    out = []
    named = (p["quadrant_class"] >= 0) & ~p["omit"]
    for i in range(len(named)):
        phrase = [_object_phrase(p, i, q) if named[i, q] else "" for q in range(4)]
        regions = (phrase[0], phrase[1], phrase[2], phrase[3])
        objs = [regions[q] for q in p["mention_order"][i] if regions[q]]
        listed = objs[0] if len(objs) == 1 else ", ".join(objs[:-1]) + " and " + objs[-1]
        which = p["caption_condition"][i]
        condition = "" if which < 0 else ", " + _CONDITION_PHRASES[which](p, i)
        out.append((CAPTION_FRAMES[p["frame"][i]].format(listed) + condition, regions))
    return out
