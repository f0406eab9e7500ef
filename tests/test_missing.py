import numpy as np
import pytest
import torch

from fedvlp.data.missing import (
    EVAL_KEYS,
    EVAL_SETTINGS,
    FULL,
    MISSING_IMAGE,
    MISSING_TEXT,
    apply_missing,
    client_missing_tables,
    eval_tables,
    fill_missing_images,
    missing_summary,
    missing_table,
)
from fedvlp.data.partition import partition_iid


def _counts(table):
    return [int((table == c).sum()) for c in (FULL, MISSING_TEXT, MISSING_IMAGE)]


def _parts(n, k, seed=0):
    return partition_iid(n, k, seed)


# ---- missing_table ---------------------------------------------------------------------------

@pytest.mark.parametrize("n, rate", [(1000, 0.7), (999, 0.3), (10, 0.7), (101, 0.5), (100, 0.29)])
def test_exact_count_is_int_n_rate(n, rate):
    for kind in ("text", "image", "both"):
        t = missing_table(n, rate, kind, seed=3)
        assert t.dtype == np.int8 and t.shape == (n,)
        assert int((t != FULL).sum()) == int(n * rate)         # the reference's int(N * eta)
    assert int(100 * 0.29) == 28                                # not 29: float product, floored


def test_kind_semantics():
    assert _counts(missing_table(1000, 0.7, "text", 0)) == [300, 700, 0]
    assert _counts(missing_table(1000, 0.7, "image", 0)) == [300, 0, 700]
    assert _counts(missing_table(1000, 0.7, "both", 0)) == [300, 350, 350]


@pytest.mark.parametrize("n, rate, both_ratio, image", [
    (1000, 0.7, 0.5, 350), (1000, 0.7, 0.2, 140), (1000, 0.7, 0.0, 0), (1000, 0.7, 1.0, 700),
    (10, 0.7, 0.5, 3),          # int(7 * 0.5) = 3 image, 4 text, as the reference
])
def test_both_splits_missing_by_both_ratio(n, rate, both_ratio, image):
    t = missing_table(n, rate, "both", 1, both_ratio=both_ratio)
    m = int(n * rate)
    assert _counts(t) == [n - m, m - image, image]
    assert set(np.unique(t)) <= {FULL, MISSING_TEXT, MISSING_IMAGE}    # nobody loses both


def test_deterministic_and_keyed():
    a = missing_table(500, 0.4, "both", 5)
    assert np.array_equal(a, missing_table(500, 0.4, "both", 5))
    assert not np.array_equal(a, missing_table(500, 0.4, "both", 6))
    assert not np.array_equal(a, missing_table(500, 0.4, "both", 5, key=1))
    # same missing set for text and image kinds (only the code differs)
    assert np.array_equal(missing_table(500, 0.4, "text", 5) != 0,
                          missing_table(500, 0.4, "image", 5) != 0)


def test_missing_samples_spread_uniformly():
    t = missing_table(10000, 0.3, "text", 0)
    halves = t[:5000] != 0, t[5000:] != 0
    assert abs(halves[0].mean() - halves[1].mean()) < 0.03
    assert np.unique(np.where(t != 0)[0]).size == 3000           # distinct samples


def test_rate_edges():
    for kind in ("text", "image", "both"):
        assert _counts(missing_table(50, 0.0, kind, 0)) == [50, 0, 0]
    assert _counts(missing_table(50, 1.0, "text", 0)) == [0, 50, 0]
    assert _counts(missing_table(50, 1.0, "image", 0)) == [0, 0, 50]
    assert _counts(missing_table(50, 1.0, "both", 0)) == [0, 25, 25]
    assert missing_table(0, 0.5, "both", 0).shape == (0,)


# ---- apply_missing / fill / summary --------------------------------------------------------

def test_apply_missing_blanks_texts_and_flags_images():
    texts = ["a", "b", "c", "d"]
    table = np.array([0, 1, 2, 1], np.int8)
    out, image_missing = apply_missing(texts, table)
    assert out == ("a", "", "c", "")
    assert image_missing.dtype == bool and image_missing.tolist() == [False, False, True, False]
    assert texts == ["a", "b", "c", "d"]                     # input untouched
    with pytest.raises(ValueError, match="table"):
        apply_missing(texts, table[:3])
    with pytest.raises(ValueError, match="table"):
        apply_missing(texts, np.array([0, 3, 0, 0]))


def test_fill_missing_images_after_normalisation():
    x = np.random.default_rng(0).normal(size=(3, 2, 2, 3)).astype(np.float32)
    mask = np.array([False, True, False])
    out = fill_missing_images(x, mask)
    assert np.all(out[1] == 1.0) and np.array_equal(out[[0, 2]], x[[0, 2]])
    assert not np.all(x[1] == 1.0)                            # a copy
    xt = torch.from_numpy(x).permute(0, 3, 1, 2)
    out_t = fill_missing_images(xt, mask)
    assert torch.all(out_t[1] == 1.0) and torch.equal(out_t[0], xt[0])
    assert not torch.all(xt[1] == 1.0)


def test_missing_summary():
    s = missing_summary(np.array([0, 1, 2, 2], np.int8))
    assert s == {"full": 0.25, "missing_text": 0.25, "missing_image": 0.5}
    assert missing_summary(missing_table(1000, 0.7, "both", 0)) == \
        {"full": 0.3, "missing_text": 0.35, "missing_image": 0.35}
    assert missing_summary(np.zeros(0, np.int8)) == {"full": 0.0, "missing_text": 0.0,
                                                     "missing_image": 0.0}


# ---- eval tables -----------------------------------------------------------------------------

def test_eval_settings_are_design_section_4():
    assert EVAL_SETTINGS == {"full": (0.0, "both"), "miss_image": (0.7, "image"),
                             "miss_text": (0.7, "text"), "miss_both": (0.7, "both"),
                             "image_only": (1.0, "text"), "text_only": (1.0, "image")}
    assert len(set(EVAL_KEYS.values())) == 7 and 0 not in EVAL_KEYS.values()   # 0: training


def test_eval_tables():
    tables = eval_tables(1000, 0.3, "text", seed=0)
    assert set(tables) == {"train_setting", *EVAL_SETTINGS}
    assert _counts(tables["train_setting"]) == [700, 300, 0]
    assert _counts(tables["full"]) == [1000, 0, 0]
    assert _counts(tables["miss_image"]) == [300, 0, 700]
    assert _counts(tables["miss_text"]) == [300, 700, 0]
    assert _counts(tables["miss_both"]) == [300, 350, 350]
    assert _counts(tables["image_only"]) == [0, 1000, 0]          # every text missing
    assert _counts(tables["text_only"]) == [0, 0, 1000]           # every image missing
    # the six fixed sets do not depend on the run's own setting; each uses its own draw
    other = eval_tables(1000, 0.9, "both", seed=0, both_ratio=0.2)
    for name in EVAL_SETTINGS:
        assert np.array_equal(tables[name], other[name]), name
    assert _counts(other["train_setting"]) == [100, 720, 180]
    assert not np.array_equal(tables["miss_text"] != 0, tables["miss_image"] != 0)
    assert not np.array_equal(tables["miss_both"] != 0, tables["miss_image"] != 0)
    # and not the training table's draw either
    assert not np.array_equal(tables["train_setting"], missing_table(1000, 0.3, "text", 0))


# ---- client skew -----------------------------------------------------------------------------

def _image_shares(table, parts):
    """Per client: share of its missing samples that miss the image."""
    out = []
    for p in parts:
        t = table[p]
        m = (t != FULL).sum()
        out.append((t == MISSING_IMAGE).sum() / m if m else np.nan)
    return np.array(out)


def test_skew_zero_is_the_global_table():
    parts = _parts(2000, 10)
    for kind in ("text", "image", "both"):
        t = client_missing_tables(parts, 2000, 0.6, kind, 0.0, seed=4)
        assert np.array_equal(t, missing_table(2000, 0.6, kind, 4))
    t = client_missing_tables(parts, 2000, 0.6, "both", 0.0, seed=4)
    assert _counts(t) == [800, 600, 600]
    # clients differ only by sampling: all shares near .5, rates near .6
    shares = _image_shares(t, parts)
    assert np.all(np.abs(shares - 0.5) < 0.1)
    assert np.all([abs((t[p] != 0).mean() - 0.6) < 0.1 for p in parts])


def test_skew_both_keeps_missing_set_and_spreads_shares():
    parts = _parts(5000, 50)
    base = missing_table(5000, 0.7, "both", 1)
    spreads = []
    for skew in (0.0, 0.1, 0.4, 1.0):
        t = client_missing_tables(parts, 5000, 0.7, "both", skew, seed=1)
        assert np.array_equal(t != FULL, base != FULL)           # same samples miss something
        shares = _image_shares(t, parts)
        spreads.append(shares.std())
        if skew == 1.0:                                          # each client misses one modality
            assert set(np.round(shares, 6)) <= {0.0, 1.0}
    assert spreads[0] < spreads[1] < spreads[2] < spreads[3]
    # the share variance is skew * .25 (plus the binomial noise of ~70 samples at skew 0)
    assert spreads[0] < 0.1 and abs(spreads[2] - np.sqrt(0.4 * 0.25)) < 0.1
    assert abs(spreads[3] - 0.5) < 0.1


def test_skew_rate_kinds_spread_client_rates_and_keep_kind():
    parts = _parts(5000, 50)
    spreads = []
    for skew in (0.0, 0.2, 0.6, 1.0):
        t = client_missing_tables(parts, 5000, 0.4, "image", skew, seed=2)
        assert set(np.unique(t)) <= {FULL, MISSING_IMAGE}
        rates = np.array([(t[p] != FULL).mean() for p in parts])
        spreads.append(rates.std())
        if skew == 1.0:
            assert set(rates) <= {0.0, 1.0}
    assert spreads[0] < spreads[1] < spreads[2] < spreads[3]
    t = client_missing_tables(parts, 5000, 0.4, "text", 0.5, seed=2)
    assert set(np.unique(t)) == {FULL, MISSING_TEXT}


@pytest.mark.parametrize("kind, skew", [("both", 0.3), ("both", 1.0), ("text", 0.3),
                                        ("image", 1.0)])
def test_skew_preserves_global_rate_and_share_in_expectation(kind, skew):
    parts = _parts(1000, 100)        # small clients: rounding each one's count down would show
    rate, both_ratio = 0.6, 0.3
    summaries = [missing_summary(client_missing_tables(parts, 1000, rate, kind, skew, seed=s,
                                                       both_ratio=both_ratio))
                 for s in range(60)]
    missing = np.mean([1 - s["full"] for s in summaries])
    image = np.mean([s["missing_image"] for s in summaries])
    if kind == "both":
        assert all(abs(1 - s["full"] - rate) < 1e-9 for s in summaries)   # exact, every seed
        assert abs(image / missing - both_ratio) < 0.015
    else:
        assert abs(missing - rate) < 0.015
        # yet single draws do vary (clients' rates are random)
        assert np.std([1 - s["full"] for s in summaries]) > 0.02


@pytest.mark.parametrize("skew", [0.1, 0.25, 0.7])
def test_skew_is_the_fraction_of_the_largest_client_variance(skew):
    """Client missing rates have variance skew * rate * (1 - rate) (the largest possible,
    rate * (1 - rate), is all-or-nothing clients)."""
    parts = _parts(40000, 400)
    t = client_missing_tables(parts, 40000, 0.4, "text", skew, seed=3)
    rates = np.array([(t[p] != FULL).mean() for p in parts])
    assert abs(rates.mean() - 0.4) < 0.03
    assert abs(rates.std() - np.sqrt(skew * 0.24)) < 0.015


def test_skew_deterministic_and_edge_rates():
    parts = _parts(600, 6)
    a = client_missing_tables(parts, 600, 0.5, "both", 0.5, seed=9)
    assert np.array_equal(a, client_missing_tables(parts, 600, 0.5, "both", 0.5, seed=9))
    assert not np.array_equal(a, client_missing_tables(parts, 600, 0.5, "both", 0.5, seed=10))
    assert _counts(client_missing_tables(parts, 600, 0.0, "text", 0.8, seed=9)) == [600, 0, 0]
    assert _counts(client_missing_tables(parts, 600, 1.0, "image", 0.8, seed=9)) == [0, 0, 600]


# ---- validation ------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, word", [
    (dict(rate=1.5), "rate"), (dict(rate=-0.1), "rate"), (dict(rate=float("nan")), "rate"),
    (dict(rate="0.5"), "rate"), (dict(kind="audio"), "kind"), (dict(kind=None), "kind"),
    (dict(both_ratio=2.0), "both_ratio"), (dict(num_samples=-3), "num_samples"),
    (dict(num_samples=2.0), "num_samples"),
])
def test_missing_table_bad_arguments(kwargs, word):
    args = dict(num_samples=10, rate=0.5, kind="both", seed=0) | kwargs
    with pytest.raises(ValueError, match=word):
        missing_table(**args)


@pytest.mark.parametrize("kwargs, word", [
    (dict(skew=1.2), "skew"), (dict(skew=-0.5), "skew"), (dict(rate=2), "rate"),
    (dict(kind="video"), "kind"),
    (dict(parts=[np.arange(5), np.arange(4, 10)]), "parts"),           # overlap
    (dict(parts=[np.arange(5)]), "parts"),                             # not covering
    (dict(parts=[np.arange(5), np.arange(5, 11)]), "parts"),           # out of range
    (dict(parts=[np.linspace(0, 9, 10)]), "parts"),                    # not integer
])
def test_client_tables_bad_arguments(kwargs, word):
    args = dict(parts=[np.arange(5), np.arange(5, 10)], num_samples=10, rate=0.5, kind="both",
                skew=0.5, seed=0) | kwargs
    with pytest.raises(ValueError, match=word):
        client_missing_tables(**args)
