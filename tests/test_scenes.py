import re

import numpy as np
import pytest

from fedvlp.data import scenes
from fedvlp.data.scenes import (
    BACKGROUNDS,
    CLASS_NAMES,
    COLOURS,
    CONTEXT_BACKGROUND,
    CONTEXT_CLASSES,
    CONTEXT_LIGHTING,
    CONTEXT_POSE,
    CONTEXT_QUADRANTS,
    CONTEXT_SCALE,
    LAYOUT_NAMES,
    LAYOUTS,
    LIGHT_GAIN,
    LIGHTINGS,
    OBJECT_RGB,
    P_STYLE,
    POSES,
    SCALES,
    SHAPES,
    SPLITS,
    VISIBILITIES,
    VISIBILITY_P,
    SceneSet,
    generate_scenes,
)
from fedvlp.methods.fedmpt import PAPER_CONDITIONS

N = 2000
_OBJECT = re.compile(r"a ({}) ({})".format("|".join(COLOURS), "|".join(SHAPES)))
STYLE = {"background": CONTEXT_BACKGROUND, "lighting": CONTEXT_LIGHTING, "scale": CONTEXT_SCALE,
         "pose": CONTEXT_POSE}
SIZES = {"background": len(BACKGROUNDS), "lighting": len(LIGHTINGS), "scale": len(SCALES), "pose": len(POSES)}


@pytest.fixture(scope="module")
def train():
    return generate_scenes(N, "train", 0)


@pytest.fixture(scope="module")
def decorrelated():
    return generate_scenes(N, "test", 0)


@pytest.fixture(scope="module")
def val():
    return generate_scenes(N, "val", 0)


def _same(a: SceneSet, b: SceneSet) -> bool:
    return (np.array_equal(a.images, b.images) and np.array_equal(a.labels, b.labels)
            and a.captions == b.captions
            and all(np.array_equal(a.conditions[k], b.conditions[k]) for k in a.conditions)
            and all(np.array_equal(a.quadrants[k], b.quadrants[k]) for k in a.quadrants))


def _named(caption: str) -> list[int]:
    return [CLASS_NAMES.index(f"{c} {s}") for c, s in _OBJECT.findall(caption)]


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
                   {k: v[:700] for k, v in big.quadrants.items()})
    assert _same(small, cut)


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


def test_train_has_cooccurrence_structure_test_does_not(train, decorrelated):
    def stats(s):
        corr = np.corrcoef(s.labels.T.astype(float))
        off = ~np.eye(20, dtype=bool)
        same = np.zeros((20, 20), bool)
        for row in CONTEXT_CLASSES:
            same[np.ix_(row, row)] = True
        return np.abs(corr[off]).mean(), corr[same & off].mean()

    train_abs, train_within = stats(train)
    test_abs, test_within = stats(decorrelated)
    assert train_abs > 2 * test_abs
    assert train_within > 0.1 and abs(test_within) < 0.06
    # marginal class frequencies stay balanced in both
    for s in (train, decorrelated):
        assert s.labels.mean(0).min() > 0.07 and s.labels.mean(0).max() < 0.13


@pytest.mark.parametrize("key", list(STYLE))
def test_style_follows_the_context_in_train_and_is_uniform_in_test_and_val(key, train, decorrelated, val):
    ctx = train.conditions["context"]
    follows = (train.conditions[key] == STYLE[key][ctx]).mean()
    assert abs(follows - (P_STYLE + (1 - P_STYLE) / SIZES[key])) < 0.03
    for s in (decorrelated, val):
        freq = np.bincount(s.conditions[key], minlength=SIZES[key]) / N
        assert np.abs(freq - 1 / SIZES[key]).max() < 0.04
        # ... and independent of the objects: images holding a context's classes look no different
        for k in range(4):
            holds = s.labels[:, CONTEXT_CLASSES[k]].any(1)
            assert abs((s.conditions[key][holds] == STYLE[key][k]).mean() - 1 / SIZES[key]) < 0.05


def test_objects_favour_the_contexts_quadrants_in_train_only(train, decorrelated):
    occupied = train.quadrants["class"] >= 0
    favoured = np.zeros_like(occupied)
    favoured[np.arange(N)[:, None], CONTEXT_QUADRANTS[train.conditions["context"]]] = True
    # 1 object: weight 4 vs 1 puts it in the favoured pair 80 % of the time; chance is 50 %
    one = occupied.sum(1) == 1
    assert abs((occupied & favoured)[one].sum() / one.sum() - 0.8) < 0.05
    per_quadrant = (decorrelated.quadrants["class"] >= 0).mean(0)
    assert np.abs(per_quadrant - per_quadrant.mean()).max() < 0.03


def test_visibility_rates_are_the_same_in_every_split(train, decorrelated, val):
    for s in (train, decorrelated, val):
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
    c = train.conditions
    phrases = 0
    for i, caption in enumerate(train.captions[:1000]):
        assert caption.startswith("a photo of a ")
        pose = POSES[c["pose"][i]]
        true_phrases = [f"with a {LAYOUT_NAMES[c['layout'][i]]} spatial layout",
                        f"in {'an' if pose == 'upright' else 'a'} {pose} object pose",
                        f"on a {BACKGROUNDS[c['background'][i]]} background",
                        f"in {LIGHTINGS[c['lighting'][i]]} lighting",
                        f"at a {SCALES[c['scale'][i]]} object scale"]
        named = [p for p in true_phrases if caption.endswith(", " + p)]
        if named:
            phrases += 1
        else:  # no condition: the caption ends with an object
            assert any(caption.endswith(name) for name in train.class_names), caption
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
    spill), and the mean colour of a clear object, lighting undone, is the labelled colour."""
    sat = _saturation(train)
    img = train.images.astype(np.float32)
    wrong = clear = 0
    for quad in range(4):
        mask = _quadrant(sat, quad) > 80
        cls = train.quadrants["class"][:, quad]
        assert not mask[cls < 0].any()
        for i in np.nonzero(train.quadrants["visibility"][:, quad] == 0)[0][:300]:
            rgb = _quadrant(img, quad)[i][mask[i]].mean(0) / LIGHT_GAIN[train.conditions["lighting"][i]]
            wrong += int(np.argmin(((OBJECT_RGB - rgb) ** 2).sum(1))) != cls[i] // 5
            clear += 1
    assert clear > 1000 and wrong <= 0.01 * clear


def test_captions_fit_tiny_clip_context():
    import open_clip

    tokenizer = open_clip.get_tokenizer("ViT-B-16")
    s = generate_scenes(3000, "pretrain", 1)
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
    assert SPLITS == ("pretrain", "train", "test", "val", "holdout")
    assert scenes.BLOCK >= 1000
