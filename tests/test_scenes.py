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
    LAYOUT_NAMES,
    LAYOUTS,
    LIGHT_GAIN,
    LIGHTINGS,
    OBJECT_RGB,
    POSES,
    SCALES,
    SHAPES,
    SPLITS,
    SceneSet,
    generate_scenes,
)

N = 2000
_OBJECT = re.compile(r"a ({}) ({})".format("|".join(COLOURS), "|".join(SHAPES)))


@pytest.fixture(scope="module")
def train():
    return generate_scenes(N, "train", 0)


@pytest.fixture(scope="module")
def decorrelated():
    return generate_scenes(N, "test", 0)


def _same(a: SceneSet, b: SceneSet) -> bool:
    return (np.array_equal(a.images, b.images) and np.array_equal(a.labels, b.labels)
            and a.captions == b.captions
            and all(np.array_equal(a.conditions[k], b.conditions[k]) for k in a.conditions))


def _named(caption: str) -> list[int]:
    objects = caption.split(", small and")[0].split(", large and")[0]
    return [CLASS_NAMES.index(f"{c} {s}") for c, s in _OBJECT.findall(objects)]


def test_class_names_colour_major():
    assert len(CLASS_NAMES) == 20 and len(set(CLASS_NAMES)) == 20
    assert CLASS_NAMES[0] == "red circle" and CLASS_NAMES[6] == "green square"
    assert CLASS_NAMES[19] == "yellow cross"
    # context preferred sets: disjoint, cover all classes, one per shape
    assert sorted(CONTEXT_CLASSES.ravel().tolist()) == list(range(20))
    assert all(sorted(c % 5 for c in row) == list(range(5)) for row in CONTEXT_CLASSES)


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
                   {k: v[:700] for k, v in big.conditions.items()}, big.class_names)
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
    big = generate_scenes(5, "pretrain", 0, image_size=48)
    assert big.images.shape == (5, 48, 48, 3)
    assert generate_scenes(0, "test", 0).images.shape == (0, 32, 32, 3)


def test_one_to_three_labels_matching_layout(train, decorrelated):
    for s in (train, decorrelated):
        count = s.labels.sum(1)
        assert count.min() == 1 and count.max() == 3
        assert set(np.bincount(count)[1:] > 0.2 * N) == {True}
        layout_size = np.array([len(LAYOUTS[i]) for i in s.conditions["layout"]])
        assert np.array_equal(count, layout_size)


def test_conditions_cover_all_values(train, decorrelated):
    expect = {"background": len(BACKGROUNDS), "lighting": len(LIGHTINGS),
              "scale": len(SCALES), "layout": len(LAYOUTS), "pose": len(POSES)}
    for s in (train, decorrelated):
        for key, k in expect.items():
            assert set(np.unique(s.conditions[key])) == set(range(k)), key
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
    # background follows the context in train (0.7 + 0.3/5), is uniform in test
    ctx = train.conditions["context"]
    assert abs((train.conditions["background"] == CONTEXT_BACKGROUND[ctx]).mean() - 0.76) < 0.04
    assert np.bincount(decorrelated.conditions["background"]).min() > N / 5 * 0.8
    # marginal class frequencies stay balanced in both
    for s in (train, decorrelated):
        assert s.labels.mean(0).min() > 0.07 and s.labels.mean(0).max() < 0.13


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
        true_phrases = [f"{SCALES[c['scale'][i]]} and {POSES[c['pose'][i]]}", LAYOUT_NAMES[c["layout"][i]],
                        f"on a {BACKGROUNDS[c['background'][i]]} background", f"in {LIGHTINGS[c['lighting'][i]]} light"]
        tail = caption.rsplit(", ", 1)[-1]
        named = [p for p in true_phrases if caption.endswith(", " + p)]
        if named:
            phrases += 1
        else:  # no condition: the caption ends with an object
            assert any(tail.endswith(name) for name in train.class_names), caption
    assert 0.45 < phrases / 1000 < 0.55


def test_objects_confined_to_their_quadrant_with_their_colour(train):
    """Saturated pixels only in quadrants that hold an object (so objects never overlap or
    spill), and their mean colour, undoing the lighting gain, is the labelled colour."""
    img = train.images.astype(np.float32)
    sat = img.max(-1) - img.min(-1)
    wrong = 0
    areas = {0: [], 1: []}
    for i in range(400):
        layout = LAYOUTS[train.conditions["layout"][i]]
        colours = sorted(c // 5 for c in np.nonzero(train.labels[i])[0])
        seen = []
        for quad in range(4):
            ys, xs = slice((quad // 2) * 16, (quad // 2 + 1) * 16), slice((quad % 2) * 16,
                                                                       (quad % 2 + 1) * 16)
            mask = sat[i, ys, xs] > 80
            if quad not in layout:
                assert not mask.any()
                continue
            assert mask.sum() >= 10
            areas[int(train.conditions["scale"][i])].append(int(mask.sum()))
            rgb = img[i, ys, xs][mask].mean(0) / LIGHT_GAIN[train.conditions["lighting"][i]]
            seen.append(int(np.argmin(((OBJECT_RGB - rgb) ** 2).sum(1))))
        wrong += sorted(seen) != colours
    assert wrong <= 4
    assert np.mean(areas[1]) > 1.3 * np.mean(areas[0])


def test_captions_fit_tiny_clip_context():
    open_clip = pytest.importorskip("open_clip")
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
