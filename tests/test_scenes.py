import collections
import itertools
import re

import numpy as np
import pytest

from fedvlp.data import scenes
from fedvlp.data.scenes import (
    ARTICLES,
    BACKGROUNDS,
    CANONICAL_P,
    CAPTION_FRAMES,
    CLASS_NAMES,
    COLOUR_WORDS,
    CONTEXT_BACKGROUND,
    CONTEXT_CLASSES,
    CONTEXT_LIGHTING,
    CONTEXT_POSE,
    CONTEXT_QUADRANTS,
    CONTEXT_SCALE,
    DECORRELATED_SPLITS,
    LAYOUT_NAMES,
    LAYOUTS,
    LIGHT_GAIN,
    LIGHTINGS,
    OBJECT_RGB,
    P_STYLE,
    POSES,
    SCALES,
    SHAPE_WORDS,
    SHAPES,
    SOURCE_SPLITS,
    SPLITS,
    STYLED_SPLITS,
    TARGET_RGB,
    VISIBILITIES,
    VISIBILITY_P,
    SceneSet,
    generate_scenes,
)
from fedvlp.methods.fedmpt import PAPER_CONDITIONS

N = 2000
_COLOUR_OF = {word: c for c, words in enumerate(COLOUR_WORDS) for word in words}
_SHAPE_OF = {word: s for s, words in enumerate(SHAPE_WORDS) for word in words}


def _alternatives(words) -> str:
    return "|".join(sorted(words, key=len, reverse=True))  # longest first: "plus sign" before "plus"


# One object phrase: "<article> <colour word> <shape word>", e.g. "an emerald kite", "the red plus sign".
_ARTICLE, _COLOUR, _SHAPE = (_alternatives(w) for w in (("an", *ARTICLES), _COLOUR_OF, _SHAPE_OF))
_OBJECT = re.compile(rf"\b({_ARTICLE}) ({_COLOUR}) ({_SHAPE})\b")
STYLE = {"background": CONTEXT_BACKGROUND, "lighting": CONTEXT_LIGHTING, "scale": CONTEXT_SCALE,
         "pose": CONTEXT_POSE}
SIZES = {"background": len(BACKGROUNDS), "lighting": len(LIGHTINGS), "scale": len(SCALES), "pose": len(POSES)}


@pytest.fixture(scope="module")
def train():
    return generate_scenes(N, "train", 0)


@pytest.fixture(scope="module")
def decorrelated():
    return generate_scenes(N, "shift", 0)


@pytest.fixture(scope="module")
def val():
    return generate_scenes(N, "val", 0)


@pytest.fixture(scope="module")
def testset():
    return generate_scenes(N, "test", 0)


@pytest.fixture(scope="module")
def captioned():
    """3000 pretraining captions: enough mentions (about 5200) to measure word choice to +-0.02."""
    return generate_scenes(3000, "pretrain", 1)


def _same(a: SceneSet, b: SceneSet) -> bool:
    return (np.array_equal(a.images, b.images) and np.array_equal(a.labels, b.labels)
            and a.captions == b.captions
            and all(np.array_equal(a.conditions[k], b.conditions[k]) for k in a.conditions)
            and all(np.array_equal(a.quadrants[k], b.quadrants[k]) for k in a.quadrants)
            and a.region_captions == b.region_captions)


def _named(caption: str) -> list[int]:
    """The classes of the object phrases in a caption, whatever words name them."""
    return [_COLOUR_OF[c] * len(SHAPES) + _SHAPE_OF[s] for _, c, s in _OBJECT.findall(caption)]


def _true_condition_phrases(s: SceneSet, i: int) -> list[str]:
    c = s.conditions
    pose = POSES[c["pose"][i]]
    return [f"with a {LAYOUT_NAMES[c['layout'][i]]} spatial layout",
            f"in {'an' if pose == 'upright' else 'a'} {pose} object pose",
            f"on a {BACKGROUNDS[c['background'][i]]} background",
            f"in {LIGHTINGS[c['lighting'][i]]} lighting",
            f"at a {SCALES[c['scale'][i]]} object scale"]


def _parse_caption(s: SceneSet, i: int) -> tuple[str, str]:
    """(frame, condition phrase or "") of caption i, rebuilt from its region captions in mention order; fails
    unless the caption is exactly frame(listed objects) + optional ", " + a true condition phrase."""
    caption = s.captions[i]
    objs = sorted((r for r in s.region_captions[i] if r), key=caption.index)
    listed = objs[0] if len(objs) == 1 else ", ".join(objs[:-1]) + " and " + objs[-1]
    found = []
    for frame in CAPTION_FRAMES:
        head = frame.format(listed)
        if not caption.startswith(head):
            continue
        rest = caption[len(head):]
        if rest == "":
            found.append((frame, ""))
        elif rest.startswith(", ") and rest[2:] in _true_condition_phrases(s, i):
            found.append((frame, rest[2:]))
    assert len(found) == 1, (caption, found)
    return found[0]


def _cooccurrence_and_style(s: SceneSet) -> dict[str, float]:
    """Context statistics read from the labels alone (so they apply to the decorrelated split too): the share of
    object pairs in one image that lie in one context's preferred set, and for each style condition the share of
    objects whose image has the style of the context that prefers the object."""
    context_of = np.empty(20, np.int64)
    for k, row in enumerate(CONTEXT_CLASSES):
        context_of[row] = k
    pairs = [context_of[a] == context_of[b]
             for row in s.labels for a, b in itertools.combinations(np.nonzero(row)[0], 2)]
    rows, quads = np.nonzero(s.quadrants["class"] >= 0)
    ctx = context_of[s.quadrants["class"][rows, quads]]
    return {"pairs": float(np.mean(pairs)),
            **{key: float((s.conditions[key][rows] == STYLE[key][ctx]).mean()) for key in STYLE}}


def _saturation(s: SceneSet) -> np.ndarray:
    """max - min over RGB after undoing each image's lighting (backgrounds are neutral again)."""
    img = s.images.astype(np.float32) / LIGHT_GAIN[s.conditions["lighting"]][:, None, None, :]
    return img.max(-1) - img.min(-1)


def _quadrant(a: np.ndarray, quad: int) -> np.ndarray:
    """Quadrant `quad` of images [n, 32, 32, ...]."""
    return a[:, (quad // 2) * 16:(quad // 2 + 1) * 16, (quad % 2) * 16:(quad % 2 + 1) * 16]


def test_class_names_colour_major():
    assert len(CLASS_NAMES) == 20 and len(set(CLASS_NAMES)) == 20
    assert CLASS_NAMES[0] == "red circle" and CLASS_NAMES[6] == "green square"
    assert CLASS_NAMES[19] == "yellow cross"
    # context preferred sets: disjoint, cover all classes, one per shape
    assert sorted(CONTEXT_CLASSES.ravel().tolist()) == list(range(20))
    assert all(sorted(c % 5 for c in row) == list(range(5)) for row in CONTEXT_CLASSES)


def test_every_context_has_its_own_style():
    """A client holding one context's images holds one style: backgrounds and lightings differ between
    contexts (and are never the neutral plain/normal), and no two contexts share scale, pose and quadrants."""
    assert len(set(CONTEXT_BACKGROUND)) == len(set(CONTEXT_LIGHTING)) == 4
    assert 0 not in CONTEXT_BACKGROUND and 0 not in CONTEXT_LIGHTING
    combos = {(s, p, tuple(q)) for s, p, q in zip(CONTEXT_SCALE, CONTEXT_POSE, CONTEXT_QUADRANTS)}
    assert len(combos) == 4


def test_label_skew_gives_each_client_a_private_style(train):
    """Clients built by label clustering (t = 1) each see mostly one lighting, their context's; i.i.d. clients
    (t = 0) see every lighting about equally."""
    from fedvlp.data.partition import partition_heterogeneity

    def dominant_share(t: float) -> float:
        parts = partition_heterogeneity(train.labels, 10, t, seed=0)
        return float(np.mean([np.bincount(train.conditions["lighting"][p], minlength=len(LIGHTINGS)).max() / len(p)
                              for p in parts]))

    assert dominant_share(1.0) > 0.55 and dominant_share(0.0) < 0.35  # measured: 0.69 and 0.27


def test_deterministic_and_seed_dependent():
    a, b = generate_scenes(300, "train", 7), generate_scenes(300, "train", 7)
    assert _same(a, b)
    c = generate_scenes(300, "train", 8)
    assert not np.array_equal(a.images, c.images) and a.captions != c.captions
    d = generate_scenes(300, "pretrain", 7)
    assert not np.array_equal(a.images, d.images)


def test_prefix_stable_across_sizes():
    small, big = generate_scenes(700, "test", 3), generate_scenes(1500, "test", 3)
    cut = SceneSet(big.images[:700], big.labels[:700], big.captions[:700],
                   {k: v[:700] for k, v in big.conditions.items()}, big.class_names,
                   {k: v[:700] for k, v in big.quadrants.items()}, big.region_captions[:700])
    assert _same(small, cut)
    assert len(small.region_captions) == 700 and all(len(r) == 4 for r in small.region_captions)


def test_shapes_and_dtypes(train):
    assert train.images.shape == (N, 32, 32, 3) and train.images.dtype == np.uint8
    assert train.labels.shape == (N, 20) and train.labels.dtype == np.uint8
    assert set(np.unique(train.labels)) == {0, 1}
    assert len(train.captions) == N and len(train) == N
    assert train.class_names == tuple(CLASS_NAMES)
    assert set(train.conditions) == {"context", "background", "lighting", "scale", "layout",
                                     "pose"}
    for v in train.conditions.values():
        assert v.shape == (N,) and np.issubdtype(v.dtype, np.integer)
    assert set(train.quadrants) == {"class", "visibility", "named"}
    for v in train.quadrants.values():
        assert v.shape == (N, 4) and np.issubdtype(v.dtype, np.integer)
    big = generate_scenes(5, "pretrain", 0, image_size=48)
    assert big.images.shape == (5, 48, 48, 3)
    assert generate_scenes(0, "test", 0).images.shape == (0, 32, 32, 3)


def test_one_to_three_labels_matching_layout_and_quadrants(train, decorrelated):
    for s in (train, decorrelated):
        count = s.labels.sum(1)
        assert count.min() == 1 and count.max() == 3
        assert set(np.bincount(count)[1:] > 0.2 * N) == {True}
        occupied = s.quadrants["class"] >= 0
        assert np.array_equal(occupied, s.quadrants["visibility"] >= 0)
        assert [tuple(np.nonzero(row)[0]) for row in occupied] == [LAYOUTS[i] for i in s.conditions["layout"]]
        hot = np.zeros_like(s.labels)
        rows, quads = np.nonzero(occupied)
        hot[rows, s.quadrants["class"][rows, quads]] = 1
        assert np.array_equal(hot, s.labels)


def test_conditions_cover_all_values(train, decorrelated):
    expect = {**SIZES, "layout": len(LAYOUTS)}
    for s in (train, decorrelated):
        for key, k in expect.items():
            assert set(np.unique(s.conditions[key])) == set(range(k)), key
        assert set(np.unique(s.quadrants["visibility"])) == {-1, 0, 1, 2}
    assert set(np.unique(train.conditions["context"])) == {0, 1, 2, 3}
    assert set(np.unique(decorrelated.conditions["context"])) == {-1}
    assert len(set(LAYOUT_NAMES)) == 14


def test_train_has_cooccurrence_structure_shift_does_not(train, decorrelated):
    def stats(s):
        corr = np.corrcoef(s.labels.T.astype(float))
        off = ~np.eye(20, dtype=bool)
        same = np.zeros((20, 20), bool)
        for row in CONTEXT_CLASSES:
            same[np.ix_(row, row)] = True
        return np.abs(corr[off]).mean(), corr[same & off].mean()

    train_abs, train_within = stats(train)
    shift_abs, shift_within = stats(decorrelated)
    assert train_abs > 2 * shift_abs
    assert train_within > 0.1 and abs(shift_within) < 0.06
    # marginal class frequencies stay balanced in both
    for s in (train, decorrelated):
        assert s.labels.mean(0).min() > 0.07 and s.labels.mean(0).max() < 0.13


@pytest.mark.parametrize("key", list(STYLE))
def test_style_follows_the_context_in_styled_splits_and_is_uniform_in_shift_and_pretrain(key, train, decorrelated,
                                                                                         val, testset):
    for s in (train, val, testset):
        ctx = s.conditions["context"]
        follows = (s.conditions[key] == STYLE[key][ctx]).mean()   # measured 0.82-0.85 (5 values), 0.90-0.91 (2)
        assert abs(follows - (P_STYLE + (1 - P_STYLE) / SIZES[key])) < 0.03
    for s in (decorrelated, generate_scenes(N, "pretrain", 0)):
        freq = np.bincount(s.conditions[key], minlength=SIZES[key]) / N
        assert np.abs(freq - 1 / SIZES[key]).max() < 0.04
        # ... and independent of the objects: images holding a context's classes look no different
        for k in range(4):
            holds = s.labels[:, CONTEXT_CLASSES[k]].any(1)
            assert abs((s.conditions[key][holds] == STYLE[key][k]).mean() - 1 / SIZES[key]) < 0.05


def test_objects_favour_the_contexts_quadrants_in_styled_splits_only(train, decorrelated, val, testset):
    for s in (train, val, testset):
        occupied = s.quadrants["class"] >= 0
        favoured = np.zeros_like(occupied)
        favoured[np.arange(N)[:, None], CONTEXT_QUADRANTS[s.conditions["context"]]] = True
        # 1 object: weight 4 vs 1 puts it in the favoured pair 80 % of the time; chance is 50 %
        one = occupied.sum(1) == 1
        assert abs((occupied & favoured)[one].sum() / one.sum() - 0.8) < 0.05
    # shift: a lone object's quadrant pair is independent of the (hidden) context of its class
    context_of = np.empty(20, np.int64)
    for k, row in enumerate(CONTEXT_CLASSES):
        context_of[row] = k
    for s, lo, hi in ((train, 0.7, 0.9), (decorrelated, 0.4, 0.6)):
        one = np.nonzero((s.quadrants["class"] >= 0).sum(1) == 1)[0]
        quad = (s.quadrants["class"][one] >= 0).argmax(1)
        ctx = context_of[s.quadrants["class"][one, quad]]
        share = (CONTEXT_QUADRANTS[ctx] == quad[:, None]).any(1).mean()   # measured: train 0.77, shift 0.52
        assert lo < share < hi, share
    per_quadrant = (decorrelated.quadrants["class"] >= 0).mean(0)
    assert np.abs(per_quadrant - per_quadrant.mean()).max() < 0.03


def test_visibility_rates_are_the_same_in_every_split(train, decorrelated, val, testset):
    for s in (train, decorrelated, val, testset):
        vis = s.quadrants["visibility"]
        freq = np.bincount(vis[vis >= 0], minlength=3) / (vis >= 0).sum()
        assert np.abs(freq - VISIBILITY_P).max() < 0.03, freq


def test_faint_and_occluded_objects_show_less_colour(train):
    """Coloured pixels per object (lighting undone): faint objects have far fewer saturated pixels than
    clear ones of the same scale, occluded ones about half; small glyphs are smaller than large ones."""
    sat = _saturation(train)
    coloured = {}
    for quad in range(4):
        px = (_quadrant(sat, quad) > 80).sum((1, 2))
        for i in np.nonzero(train.quadrants["class"][:, quad] >= 0)[0]:
            key = (VISIBILITIES[train.quadrants["visibility"][i, quad]], train.conditions["scale"][i])
            coloured.setdefault(key, []).append(px[i])
    mean = {k: np.mean(v) for k, v in coloured.items()}
    for scale in (0, 1):
        assert mean["faint", scale] < 0.35 * mean["clear", scale]
        assert 0.3 * mean["clear", scale] < mean["occluded", scale] < 0.75 * mean["clear", scale]
    assert mean["clear", 1] > 1.4 * mean["clear", 0]  # radius 0.18-0.22 against 0.14-0.17 of the canvas


def test_captions_miss_faint_and_occluded_objects_more_often(train):
    """`quadrants["named"]` says which objects the caption names; captions leave out about 9 % of clear objects
    and about 40 % of faint or occluded ones (what web captions do with what is hard to see)."""
    q = train.quadrants
    for i, caption in enumerate(train.captions[:500]):
        named = sorted(q["class"][i][q["named"][i] == 1])
        assert named == sorted(_named(caption)), caption
    clear = q["named"][q["visibility"] == 0]
    hard = q["named"][q["visibility"] > 0]
    assert 0.06 < 1 - clear.mean() < 0.12 and 0.33 < 1 - hard.mean() < 0.47


def test_captions_name_only_present_objects_and_omit_about_15_percent(train, decorrelated):
    for s in (train, decorrelated):
        named_total = 0
        for caption, row in zip(s.captions, s.labels):
            named = _named(caption)
            assert 1 <= len(named) == len(set(named))
            assert all(row[c] for c in named)
            named_total += len(named)
        omitted = 1 - named_total / s.labels.sum()
        assert abs(omitted - 0.15) < 0.025


def test_captions_name_at_most_one_true_condition(train):
    """Every caption is exactly a frame around its objects, plus nothing or ", " and one true condition phrase."""
    phrases = sum(_parse_caption(train, i)[1] != "" for i in range(1000))
    assert 0.45 < phrases / 1000 < 0.55


def test_captions_hold_each_fedmpt_condition_phrase():
    """FedMPT's condition words fill its [COND] slot, so the tiny CLIP must see them in pretraining:
    each phrase is in about a tenth of the pretraining captions (half name a condition, 1 in 5 each)."""
    captions = generate_scenes(N, "pretrain", 0).captions
    for phrase in PAPER_CONDITIONS:
        share = np.mean([phrase in caption for caption in captions])
        assert 0.07 < share < 0.13, phrase


def test_objects_confined_to_their_quadrant_with_their_colour(train):
    """Saturated pixels only in quadrants that hold an object (so objects never overlap or
    spill), and the mean colour of a clear object, lighting undone, is the labelled colour
    of the target palette."""
    sat = _saturation(train)
    img = train.images.astype(np.float32)
    wrong = clear = 0
    for quad in range(4):
        mask = _quadrant(sat, quad) > 80
        cls = train.quadrants["class"][:, quad]
        assert not mask[cls < 0].any()
        for i in np.nonzero(train.quadrants["visibility"][:, quad] == 0)[0][:300]:
            rgb = _quadrant(img, quad)[i][mask[i]].mean(0) / LIGHT_GAIN[train.conditions["lighting"][i]]
            wrong += int(np.argmin(((TARGET_RGB - rgb) ** 2).sum(1))) != cls[i] // 5
            clear += 1
    assert clear > 1000 and wrong <= 0.01 * clear


def test_captions_fit_tiny_clip_context(captioned):
    import open_clip

    tokenizer = open_clip.get_tokenizer("ViT-B-16")
    s = captioned
    longest = sorted(s.captions, key=len)[-100:]
    tokens = tokenizer(longest)
    assert int((tokens != 0).sum(1).max()) <= 32


def test_generation_moderate_size_runs():
    s = generate_scenes(N, "pretrain", 0)
    assert len(s) == N and s.images.std() > 20


@pytest.mark.parametrize("kwargs, word", [
    (dict(num_samples=-1, split="train", seed=0), "num_samples"),
    (dict(num_samples=10, split="validation", seed=0), "split"),
    (dict(num_samples=10, split="train", seed=0, image_size=31), "image_size"),
])
def test_bad_arguments(kwargs, word):
    with pytest.raises(ValueError, match=word):
        generate_scenes(**kwargs)


def test_splits_and_block_constants():
    assert SPLITS == ("pretrain", "train", "test", "val", "holdout", "shift")
    assert SOURCE_SPLITS == ("pretrain",) and DECORRELATED_SPLITS == ("shift",)
    assert STYLED_SPLITS == ("train", "test", "val", "holdout")
    assert sorted(SOURCE_SPLITS + STYLED_SPLITS + DECORRELATED_SPLITS) == sorted(SPLITS)
    assert scenes.BLOCK >= 1000


# ---------------------------------------------------------------- styled val/test, the palette, human-like captions

def test_val_and_test_are_drawn_like_train_and_shift_is_not(train, decorrelated, val, testset):
    """val and test hold the clients' co-occurrence and style (they are drawn like the union of the clients' data);
    shift holds neither. Measured on 2000 images (train / val / test / shift): pairs in one context's set
    0.715 / 0.707 / 0.718 / 0.214 (uniform 4/19 = 0.21); objects with their context's background 0.71 / 0.71 / 0.73
    / 0.19, lighting 0.70 / 0.71 / 0.72 / 0.20, scale 0.82 / 0.82 / 0.82 / 0.51, pose 0.82 / 0.83 / 0.82 / 0.50."""
    ref = _cooccurrence_and_style(train)
    chance = {"pairs": 4 / 19, **{key: 1 / SIZES[key] for key in STYLE}}
    assert ref["pairs"] > 0.6 and ref["background"] > 0.6 and ref["lighting"] > 0.6
    assert ref["scale"] > 0.75 and ref["pose"] > 0.75
    for s in (val, testset):
        stats = _cooccurrence_and_style(s)
        for key, value in stats.items():
            assert abs(value - ref[key]) < 0.04, (key, value, ref[key])
    shift = _cooccurrence_and_style(decorrelated)
    for key, value in shift.items():
        assert abs(value - chance[key]) < 0.04, (key, value)
        assert ref[key] - value > 0.25, (key, value, ref[key])


def _centre_pixels(s: SceneSet) -> tuple[np.ndarray, np.ndarray]:
    """RGB at the centre (centroid of the saturated pixels) of every clear, upright object in an image with
    'normal' lighting (gain 0.95-1.05, no tint), and the object's colour index."""
    img = s.images.astype(np.float32)
    sat = img.max(-1) - img.min(-1)
    rgb, colour = [], []
    for quad in range(4):
        keep = ((s.quadrants["visibility"][:, quad] == 0) & (s.conditions["lighting"] == 0)
                & (s.conditions["pose"] == 0))
        for i in np.nonzero(keep)[0]:
            ys, xs = np.nonzero(_quadrant(sat, quad)[i] > 80)
            rgb.append(_quadrant(img, quad)[i, int(ys.mean()), int(xs.mean())])
            colour.append(s.quadrants["class"][i, quad] // len(SHAPES))
    return np.array(rgb), np.array(colour)


def test_pretrain_is_drawn_in_the_source_palette_and_the_target_splits_in_the_shifted_one(train, decorrelated):
    """Nearest of the 8 palette colours (4 source, 4 target) to each clear object's centre pixel: the object's own
    colour in the split's own palette. Measured: 282 pretrain, 40 train and 360 shift objects, all 100 % right;
    median distance to the own palette 6.2 (pretrain) / 6.5 (train), to the other 55-61."""
    assert np.abs(TARGET_RGB - OBJECT_RGB).max(1).min() > 40   # every colour moved visibly
    palettes = np.concatenate([OBJECT_RGB, TARGET_RGB])
    for s, target in ((generate_scenes(N, "pretrain", 0), False), (train, True), (decorrelated, True)):
        rgb, colour = _centre_pixels(s)
        assert len(colour) > 30  # normal lighting is rare in the target splits: no context has it
        nearest = np.argmin(((rgb[:, None] - palettes[None]) ** 2).sum(-1), 1)
        assert (nearest == colour + 4 * target).mean() > 0.95
        own, other = (TARGET_RGB, OBJECT_RGB) if target else (OBJECT_RGB, TARGET_RGB)
        assert np.median(np.sqrt(((rgb - own[colour]) ** 2).sum(-1))) < 15
        assert np.median(np.sqrt(((rgb - other[colour]) ** 2).sum(-1))) > 40


def test_region_captions_are_the_caption_s_object_phrases(captioned):
    """A quadrant's region caption is "" unless the caption names its object; then it is the phrase, verbatim in the
    caption, for the quadrant's class; the caption holds no other object phrase, and reads frame + objects
    (+ one condition)."""
    s, q = captioned, captioned.quadrants
    assert len(s.region_captions) == len(s)
    for i, (caption, regions) in enumerate(zip(s.captions, s.region_captions)):
        assert len(regions) == 4
        assert [bool(r) for r in regions] == [bool(n == 1) for n in q["named"][i]], (caption, regions)
        phrases = [m.group(0) for m in _OBJECT.finditer(caption)]
        assert sorted(phrases) == sorted(r for r in regions if r), (caption, regions)
        for quad, region in enumerate(regions):
            if region:
                assert region in caption
                assert _named(region) == [q["class"][i, quad]], (region, q["class"][i, quad])
        _parse_caption(s, i)
        assert not re.search(r"\ba [aeiou]", caption), caption      # "an emerald", "an azure", "an upright"


def test_captions_use_canonical_words_at_canonical_p_and_synonyms_for_the_rest(captioned):
    """Measured on 3000 captions (5183 mentions): canonical colour word 0.409, shape word 0.404; per class word
    0.39-0.43; each synonym 0.18-0.22 (shape with 3 synonyms) or 0.27-0.31 (2 synonyms); CANONICAL_P = 0.4."""
    colour_words, shape_words, articles = collections.Counter(), collections.Counter(), collections.Counter()
    for caption in captioned.captions:
        for article, colour, shape in _OBJECT.findall(caption):
            articles[article] += 1
            colour_words[colour] += 1
            shape_words[shape] += 1
    mentions = sum(colour_words.values())
    assert mentions > 5000
    for counts, vocabulary in ((colour_words, COLOUR_WORDS), (shape_words, SHAPE_WORDS)):
        canonical = sum(counts[words[0]] for words in vocabulary) / mentions
        assert abs(canonical - CANONICAL_P) < 0.03, (vocabulary, canonical)
        for words in vocabulary:
            total = sum(counts[w] for w in words)
            assert abs(counts[words[0]] / total - CANONICAL_P) < 0.06, (words, counts)
            for synonym in words[1:]:
                assert abs(counts[synonym] / total - (1 - CANONICAL_P) / (len(words) - 1)) < 0.06, (synonym, counts)
    assert set(articles) == {"a", "an", "one", "the"}
    # "an" only before the vowel colours (emerald, azure): a third of their mentions
    assert abs(articles["an"] / (colour_words["emerald"] + colour_words["azure"]) - 1 / 3) < 0.05  # measured 0.31


def test_captions_use_every_frame(captioned):
    """Measured on 3000 captions: each of the 8 frames in 11.8-13.3 % of them."""
    frames = collections.Counter(_parse_caption(captioned, i)[0] for i in range(len(captioned)))
    assert set(frames) == set(CAPTION_FRAMES)
    for frame in CAPTION_FRAMES:
        assert abs(frames[frame] / len(captioned) - 1 / len(CAPTION_FRAMES)) < 0.03, frames


def test_captions_mention_clear_objects_before_faint_or_occluded_ones(captioned):
    """Measured: 406 of 3000 captions name both a clear and a faint/occluded object; all list the clear ones first
    (a random order would put a hard object first in about half of them)."""
    both = 0
    for caption, regions, vis in zip(captioned.captions, captioned.region_captions, captioned.quadrants["visibility"]):
        at = {quad: caption.index(region) for quad, region in enumerate(regions) if region}
        clear = [at[quad] for quad in at if vis[quad] == 0]
        hard = [at[quad] for quad in at if vis[quad] > 0]
        if clear and hard:
            both += 1
            assert max(clear) < min(hard), caption
    assert both > 300
