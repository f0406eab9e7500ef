import re

import numpy as np
import pytest
import torch

from fedvlp.data import recipes
from fedvlp.data.recipes import (
    CLASS_NAMES,
    CONTAINERS,
    CUISINES,
    SHARED,
    SIGNATURE,
    SPLITS,
    VOCABULARY,
    RecipeSet,
    generate_recipes,
)

N_TRAIN, N_VAL = 2000, 1000


@pytest.fixture(scope="module")
def train():
    return generate_recipes(N_TRAIN, "train", 0)


@pytest.fixture(scope="module")
def val():
    """Design checks score on val, never on test."""
    return generate_recipes(N_VAL, "val", 0)


def _same(a: RecipeSet, b: RecipeSet) -> bool:
    return (np.array_equal(a.images, b.images) and np.array_equal(a.labels, b.labels)
            and a.texts == b.texts and a.class_names == b.class_names)


def test_class_names_cuisine_major():
    assert len(CLASS_NAMES) == 16 and len(set(CLASS_NAMES)) == 16
    assert CLASS_NAMES[0] == "ginger bowl" and CLASS_NAMES[6] == "basil cup"
    assert CLASS_NAMES[15] == "lemon tray"
    assert all(CLASS_NAMES[c] == f"{CUISINES[c // 4]} {CONTAINERS[c % 4]}" for c in range(16))
    # the cuisine's own name is one of its signature ingredients; no word in two groups
    assert all(CUISINES[k] in SIGNATURE[k] for k in range(4))
    words = [w for g in SIGNATURE for w in g] + list(SHARED)
    assert len(words) == len(set(words))


def test_deterministic_and_seed_and_split_dependent():
    a, b = generate_recipes(300, "train", 7), generate_recipes(300, "train", 7)
    assert _same(a, b)
    c = generate_recipes(300, "train", 8)
    assert not np.array_equal(a.images, c.images) and a.texts != c.texts
    for split in ("pretrain", "test"):
        d = generate_recipes(300, split, 7)
        assert not np.array_equal(a.images, d.images) and a.texts != d.texts


def test_streams_apart_from_scenes():
    """Recipes use data streams 10-12, scenes 0-2: same seed, unrelated draws."""
    from fedvlp.seeding import numpy_rng

    assert recipes.STREAM_OFFSET == 10
    first = generate_recipes(5, "pretrain", 0).labels
    expect = numpy_rng(0, "data", 10).integers(0, 16, recipes.BLOCK)[:5]
    assert np.array_equal(first, expect)
    assert not np.array_equal(first, numpy_rng(0, "data", 0).integers(0, 16, recipes.BLOCK)[:5])


def test_prefix_stable_across_sizes():
    small, big = generate_recipes(700, "test", 3), generate_recipes(1500, "test", 3)
    cut = RecipeSet(big.images[:700], big.texts[:700], big.labels[:700], big.class_names)
    assert _same(small, cut)


def test_shapes_dtypes_and_every_class(train, val):
    for s, n in ((train, N_TRAIN), (val, N_VAL)):
        assert s.images.shape == (n, 32, 32, 3) and s.images.dtype == np.uint8
        assert s.labels.shape == (n,) and s.labels.dtype == np.int64
        assert isinstance(s.texts, tuple) and len(s.texts) == n == len(s)
        assert s.class_names == CLASS_NAMES
        counts = np.bincount(s.labels, minlength=16)
        assert len(counts) == 16 and counts.min() > n / 16 * 0.6      # all present, balanced
        assert np.array_equal(s.cuisine * 4 + s.container, s.labels)
    assert generate_recipes(4, "pretrain", 0, image_size=48).images.shape == (4, 48, 48, 3)
    empty = generate_recipes(0, "test", 0)
    assert empty.images.shape == (0, 32, 32, 3) and empty.texts == () and empty.labels.shape == (0,)


def test_texts_short_lowercase_words_from_vocabulary(train):
    vocab = set(VOCABULARY)
    assert len(vocab) == len(VOCABULARY) and list(VOCABULARY) == sorted(VOCABULARY)
    used = set()
    for text in train.texts:
        assert re.fullmatch(r"[a-z]+( [a-z]+)*", text), text
        words = text.split()
        assert 4 <= len(words) <= 10
        assert set(words) <= vocab, text
        used |= set(words)
    assert used == vocab                     # the vocabulary is tight: every word occurs


def test_texts_fit_clip_context(train):
    import open_clip

    tokenizer = open_clip.get_tokenizer("ViT-B-16")
    longest = sorted(train.texts, key=len)[-200:]
    assert int((tokenizer(longest) != 0).sum(1).max()) <= 32
    # any text fits: at most 10 words (checked above), each at most 2 BPE tokens, + start/end
    per_word = (tokenizer(list(VOCABULARY)) != 0).sum(1) - 2
    assert int(per_word.max()) <= 2


def test_text_names_cuisine_and_container_usually(train):
    """Each ingredient slot is the true cuisine's with p .8, another cuisine's with .05; most
    titles end by naming a container, usually the true one."""
    true_hit, other_hit, slots = 0, 0, 0
    served_true = served = 0
    for text, cuisine, container in zip(train.texts, train.cuisine, train.container):
        words = text.split()
        true_hit += sum(w in SIGNATURE[cuisine] for w in words)
        other_hit += sum(w in SIGNATURE[k] for k in range(4) if k != cuisine for w in words)
        slots += sum(any(w in g for g in SIGNATURE) or w in SHARED for w in words)
        if "served" in words:
            served += 1
            served_true += words[-1] == CONTAINERS[container]
    assert abs(true_hit / slots - recipes.P_SIGNATURE) < 0.03
    assert abs(other_hit / slots - recipes.P_CROSS) < 0.03
    assert abs(served / len(train) - recipes.P_SERVED) < 0.03
    # true with P_SERVED_TRUE, else uniform over 4 containers: .75 + .25 / 4 = .8125
    assert abs(served_true / served - 0.8125) < 0.03


def test_image_shows_light_container_on_dark_table(train):
    """A bright container on a dark table: the corners are mostly table, the bright area grows
    plate < cup < bowl < tray, and close-ups (zoomed in) show much more of it."""
    n = recipes.BLOCK                        # the first block, whose close-ups we recompute
    lum = train.images[:n].astype(np.float32).mean(-1)
    corners = np.concatenate([lum[:, :3, :3], lum[:, :3, -3:], lum[:, -3:, :3], lum[:, -3:, -3:]],
                             axis=1).mean((1, 2))
    closeup = _closeups(train)
    assert abs(closeup.mean() - recipes.P_CLOSEUP) < 0.04
    assert (corners[~closeup] < 130).mean() > 0.95
    bright = (lum > 150).sum((1, 2))
    area = [bright[(train.container[:n] == k) & ~closeup].mean() for k in range(4)]
    assert area[1] < area[2] < area[0] < area[3]          # plate < cup < bowl < tray
    assert area[3] > 2 * area[1]
    assert bright[closeup].mean() > 2 * bright[~closeup].mean()


def _closeups(s: RecipeSet) -> np.ndarray:
    """Recompute the close-up flag from the same stream (first draws of each block)."""
    from fedvlp.seeding import numpy_rng

    rng = numpy_rng(0, "data", recipes.STREAM_OFFSET + SPLITS.index("train"))
    params = recipes._draw_block(rng, 32, source=False)
    return params["closeup"]


# ---- the key test: the class needs both modalities ------------------------------------------

def _image_features(s: RecipeSet) -> np.ndarray:
    x = s.images.astype(np.float32) / 255                         # 2x2 mean-pooled RGB, 768-d
    return x.reshape(len(s), 16, 2, 16, 2, 3).mean((2, 4)).reshape(len(s), -1)


def _text_features(s: RecipeSet) -> np.ndarray:
    index = {w: i for i, w in enumerate(VOCABULARY)}                 # bag of words
    out = np.zeros((len(s), len(VOCABULARY)), np.float32)
    for row, text in enumerate(s.texts):
        out[row, [index[w] for w in text.split()]] = 1
    return out


def _logistic_accuracy(x_train, y_train, x_test, y_test, classes=16, steps=300) -> float:
    """Full-batch multinomial logistic regression (Adam, fixed init) on standardised features;
    test accuracy. Denormals are flushed while it runs: without that the tiny softmax tails
    make it ~5x slower on CPU."""
    flushed = torch.set_flush_denormal(True)
    try:
        return _fit_logistic(x_train, y_train, x_test, y_test, classes, steps)
    finally:
        if flushed:
            torch.set_flush_denormal(False)


def _fit_logistic(x_train, y_train, x_test, y_test, classes, steps) -> float:
    mean, std = x_train.mean(0), x_train.std(0) + 1e-6
    xt = torch.from_numpy((x_train - mean) / std)
    xe = torch.from_numpy((x_test - mean) / std)
    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(xt.shape[1], classes, generator=gen) * 0.01).requires_grad_()
    bias = torch.zeros(classes, requires_grad=True)
    opt = torch.optim.Adam([weight, bias], lr=0.01, weight_decay=1e-3)
    y = torch.from_numpy(y_train)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(xt @ weight + bias, y).backward()
        opt.step()
    with torch.no_grad():
        return float(((xe @ weight + bias).argmax(1).numpy() == y_test).mean())


def test_each_modality_informs_and_both_together_do_better(train, val):
    """Train -> val, seed 0. Measured: image 0.532, text 0.614, both 0.895; container from pixels
    0.970, cuisine from pixels 0.534; container from words 0.678, cuisine from words 0.928."""
    img_tr, img_va = _image_features(train), _image_features(val)
    txt_tr, txt_va = _text_features(train), _text_features(val)

    def probe(x_tr, x_va, factor="labels", classes=16):
        return _logistic_accuracy(x_tr, getattr(train, factor), x_va, getattr(val, factor), classes)

    acc = {"image": probe(img_tr, img_va), "text": probe(txt_tr, txt_va),
           "both": probe(np.hstack([img_tr, txt_tr]), np.hstack([img_va, txt_va]))}
    factors = {"container_image": probe(img_tr, img_va, "container", 4),
               "cuisine_image": probe(img_tr, img_va, "cuisine", 4),
               "container_text": probe(txt_tr, txt_va, "container", 4),
               "cuisine_text": probe(txt_tr, txt_va, "cuisine", 4)}
    print("recipes logistic accuracy on val:", acc, factors)
    # each modality alone gets most classes right; together they get far more
    assert acc["image"] >= 0.5 and acc["text"] >= 0.55 and acc["both"] >= 0.85
    assert acc["both"] >= max(acc["image"], acc["text"]) + 0.2
    # the complementary part: each modality is strong on its own factor and weak on the other's
    assert factors["container_image"] > 0.93 and factors["cuisine_text"] > 0.9
    assert 0.5 < factors["cuisine_image"] < factors["container_image"] - 0.25
    assert 0.62 < factors["container_text"] < factors["cuisine_text"] - 0.2
    # a class probe from one modality is about its two factors' product (they are independent)
    for modality, (container, cuisine) in (("image", ("container_image", "cuisine_image")),
                                           ("text", ("container_text", "cuisine_text"))):
        assert abs(acc[modality] - factors[container] * factors[cuisine]) < 0.06, modality


def test_the_target_shifts_the_food_palette_so_the_source_misreads_it(train, val):
    """Measured (seed 0, cuisine from pixels, 4 classes): source-trained on 2,000 pretrain images 0.647 on more
    source images but 0.270 on target val, against 0.534 target-trained; text is not shifted."""
    source, more_source = generate_recipes(N_TRAIN, "pretrain", 0), generate_recipes(N_VAL, "pretrain", 1)
    assert recipes.SOURCE_SPLITS == ("pretrain",)
    assert sorted(recipes.SHIFTED_FOOD) == list(range(8))
    cuisine_of = {food: c for c, foods in enumerate(recipes.CUISINE_FOOD) for food in foods}
    assert all(cuisine_of[food] != cuisine_of[to] for food, to in enumerate(recipes.SHIFTED_FOOD))

    def cuisine(x, y):
        return _logistic_accuracy(_image_features(x), x.cuisine, _image_features(y), y.cuisine, 4)

    in_source, across, in_target = cuisine(source, more_source), cuisine(source, val), cuisine(train, val)
    print("cuisine from pixels:", in_source, across, in_target)
    assert in_source > 0.6 and in_target > 0.5 and across < 0.35
    # the same words in both domains
    assert {w for t in source.texts for w in t.split()} <= set(VOCABULARY)


@pytest.mark.parametrize("kwargs, word", [
    (dict(num_samples=-1, split="train", seed=0), "num_samples"),
    (dict(num_samples=2.5, split="train", seed=0), "num_samples"),
    (dict(num_samples=10, split="validation", seed=0), "split"),
    (dict(num_samples=10, split="train", seed=0, image_size=31), "image_size"),
])
def test_bad_arguments(kwargs, word):
    with pytest.raises(ValueError, match=word):
        generate_recipes(**kwargs)
