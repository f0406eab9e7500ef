"""Tests for fedvlp.platform.metrics: tiny cases worked out by hand, plus an sklearn cross-check."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from fedvlp.platform.metrics import (
    average_precision,
    mean_average_precision,
    multilabel_metrics,
    single_label_metrics,
)

L = 2.0  # logit 2 -> sigmoid 0.88 (predicted); -L -> 0.12 (not predicted)


# ---------------------------------------------------------------- average precision


def test_ap_by_hand() -> None:
    # ranks: 0.9 pos (P=1/1), 0.8 neg, 0.7 pos (P=2/3), 0.6 neg -> AP = (1 + 2/3) / 2
    ap = average_precision(np.array([0.9, 0.8, 0.7, 0.6]), np.array([1, 0, 1, 0]))
    assert ap == pytest.approx((1 + 2 / 3) / 2)  # 0.8333


def test_ap_groups_tied_scores() -> None:
    # thresholds: 0.9 -> tp1 fp0 P=1   R=1/3
    #             0.8 -> tp2 fp1 P=2/3 R=2/3   (the tie is one threshold)
    #             0.1 -> tp3 fp1 P=3/4 R=1
    # AP = 1/3*1 + 1/3*2/3 + 1/3*3/4 = 0.80556.  Ranking the tied positive first would
    # give 1/3*(1 + 1 + 3/4) = 0.91667 instead.
    ap = average_precision(np.array([0.9, 0.8, 0.8, 0.1]), np.array([1, 1, 0, 1]))
    assert ap == pytest.approx((1 + 2 / 3 + 3 / 4) / 3)


def test_ap_ignores_unknown_targets() -> None:
    # dropping the -1 entries leaves 0.9 pos, 0.7 neg, 0.6 pos -> AP = (1 + 2/3) / 2.
    # Treating -1 as negative would give (1 + 2/4) / 2 = 0.75.
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.5])
    targets = np.array([1, -1, 0, 1, -1])
    assert average_precision(scores, targets) == pytest.approx((1 + 2 / 3) / 2)


def test_ap_without_positive_is_nan() -> None:
    assert math.isnan(average_precision(np.array([0.3, 0.2]), np.array([0, -1])))


def test_map_skips_class_without_positive() -> None:
    # class 0: positive ranked first                      -> AP 1
    # class 1: positive ranked second (after one negative) -> AP 1/2
    # class 2: no positive                                 -> skipped
    # mAP = (1 + 0.5) / 2 = 0.75   (averaging 3 classes with 0 would give 0.5)
    scores = np.array([[0.9, 0.9, 0.3], [0.1, 0.8, 0.2], [0.5, 0.1, 0.1]])
    targets = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 0]])
    assert mean_average_precision(scores, targets) == pytest.approx(0.75)


def test_map_without_any_positive_is_nan() -> None:
    assert math.isnan(mean_average_precision(np.ones((3, 2)), np.zeros((3, 2), dtype=int)))


# ---------------------------------------------------------------- multi-label thresholded


def test_keys_and_plain_floats() -> None:
    out = multilabel_metrics(np.array([[L, -L], [-L, L]]), np.array([[1, 0], [0, 1]]))
    base = ["CP", "CR", "CF1", "OP", "OR", "OF1"]
    assert set(out) == {"mAP", *base, *(k + "_top3" for k in base)}
    assert all(type(v) is float for v in out.values())
    assert all(v == pytest.approx(1.0) for v in out.values())


def test_cf1_is_harmonic_mean_of_averages_not_mean_of_f1() -> None:
    # class A: targets 1,1,1,0  preds 1,0,0,0 -> Nc=1 Np=1 Ng=3: P=1   R=1/3 F1=1/2
    # class B: targets 1,0,0,0  preds 1,1,1,1 -> Nc=1 Np=4 Ng=1: P=1/4 R=1   F1=2/5
    # CP = (1 + 1/4)/2 = 5/8, CR = (1/3 + 1)/2 = 2/3
    # CF1 = 2*(5/8)*(2/3) / (5/8 + 2/3) = 20/31 = 0.6452   vs mean per-class F1 = 0.45
    # OP = 2/5, OR = 2/4, OF1 = 2*0.4*0.5/0.9 = 4/9
    logits = np.array([[L, L], [-L, L], [-L, L], [-L, L]])
    targets = np.array([[1, 1], [1, 0], [1, 0], [0, 0]])
    out = multilabel_metrics(logits, targets)
    assert out["CP"] == pytest.approx(5 / 8)
    assert out["CR"] == pytest.approx(2 / 3)
    assert out["CF1"] == pytest.approx(20 / 31)
    assert out["CF1"] != pytest.approx(0.45)
    assert out["OP"] == pytest.approx(2 / 5)
    assert out["OR"] == pytest.approx(1 / 2)
    assert out["OF1"] == pytest.approx(4 / 9)
    # only 2 classes: top-3 changes nothing
    assert out["CF1_top3"] == pytest.approx(20 / 31)


def test_threshold_is_inclusive_on_probability() -> None:
    # logit 0 -> prob exactly 0.5 -> predicted positive; logit -0.01 -> not predicted
    out = multilabel_metrics(np.array([[0.0], [-0.01]]), np.array([[1], [1]]))
    assert out["OP"] == pytest.approx(1.0)
    assert out["OR"] == pytest.approx(0.5)


def test_class_never_predicted_contributes_zero_precision() -> None:
    # class 0: Nc=2 Np=2 Ng=2 -> P=1 R=1;  class 1: never predicted, Ng=2 -> P=0 (0/0) R=0
    # CP = (1+0)/2, CR = (1+0)/2, CF1 = 1/2;  OP = 2/2, OR = 2/4, OF1 = 2/3
    logits = np.array([[L, -L], [-L, -L], [L, -L]])
    targets = np.array([[1, 1], [0, 1], [1, 0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a 0/0 must not warn
        out = multilabel_metrics(logits, targets)
    assert out["CP"] == pytest.approx(0.5)
    assert out["CR"] == pytest.approx(0.5)
    assert out["CF1"] == pytest.approx(0.5)
    assert out["OP"] == pytest.approx(1.0)
    assert out["OR"] == pytest.approx(0.5)
    assert out["OF1"] == pytest.approx(2 / 3)


def test_nothing_predicted_gives_zeros_not_nan() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = multilabel_metrics(np.full((2, 2), -L), np.array([[1, 0], [0, 1]]))
    for key in ["CP", "CR", "CF1", "OP", "OR", "OF1"]:
        assert out[key] == 0.0


def test_unknown_targets_ignored() -> None:
    # class 0: s0 (t=1, pred) correct; s1 unknown (pred) ignored; s2 (t=0, no pred) -> P=1 R=1
    # class 1: s0 unknown (pred) ignored; s1 (t=1, no pred); s2 (t=0, pred) -> Nc=0 Np=1 -> 0, 0
    # CP = CR = 1/2;  OP = 1/2, OR = 1/2.  (-1 as negative would give CP = (1/2 + 0)/2 = 1/4.)
    # mAP on known entries: class 0 -> 1, class 1 (pos scored -2 below neg 2) -> 1/2; mean 3/4.
    # (-1 as negative: class 0 would tie a negative with its positive at 2 -> AP 1/2.)
    logits = np.array([[L, L], [L, -L], [-L, L]])
    targets = np.array([[1, -1], [-1, 1], [0, 0]])
    out = multilabel_metrics(logits, targets)
    assert out["CP"] == pytest.approx(0.5)
    assert out["CR"] == pytest.approx(0.5)
    assert out["OP"] == pytest.approx(0.5)
    assert out["OR"] == pytest.approx(0.5)
    assert out["mAP"] == pytest.approx(0.75)


def test_top3_excludes_fourth_class_above_threshold() -> None:
    # s0 logits 3,2,1,0.5: all four probs >= 0.5, top-3 keeps classes 0,1,2 only.
    # s1 logits 2,-1,-2,-3: top-3 is classes 0,1,2 but only class 0 passes the threshold.
    # targets s0 = 1,0,1,1   s1 = 1,0,0,0    (class 1 has no positive: not in C-averages)
    # threshold only: c0 Nc2 Np2 Ng2, c1 Nc0 Np1 Ng0, c2 Nc1 Np1 Ng1, c3 Nc1 Np1 Ng1
    #   CP = CR = 1 over {0,2,3};  OP = 4/5 (class-1 false positive counts), OR = 4/4
    # top-3: c3 loses its prediction -> Nc0 Np0 Ng1 -> P=0 R=0
    #   CP = CR = CF1 = (1+1+0)/3 = 2/3;  OP = 3/4, OR = 3/4, OF1 = 3/4
    logits = np.array([[3.0, 2.0, 1.0, 0.5], [2.0, -1.0, -2.0, -3.0]])
    targets = np.array([[1, 0, 1, 1], [1, 0, 0, 0]])
    out = multilabel_metrics(logits, targets)
    assert out["CP"] == pytest.approx(1.0)
    assert out["CR"] == pytest.approx(1.0)
    assert out["OP"] == pytest.approx(4 / 5)
    assert out["OR"] == pytest.approx(1.0)
    assert out["CP_top3"] == pytest.approx(2 / 3)
    assert out["CR_top3"] == pytest.approx(2 / 3)
    assert out["CF1_top3"] == pytest.approx(2 / 3)
    assert out["OP_top3"] == pytest.approx(3 / 4)
    assert out["OR_top3"] == pytest.approx(3 / 4)
    assert out["OF1_top3"] == pytest.approx(3 / 4)


def test_top_k_suffix_follows_argument() -> None:
    # top-1 on s0 of the case above keeps class 0 only.
    out = multilabel_metrics(np.array([[3.0, 2.0]]), np.array([[1, 1]]), top_k=1)
    assert "OR_top1" in out and "OR_top3" not in out
    assert out["OR_top1"] == pytest.approx(1 / 2)


# ---------------------------------------------------------------- single label


def test_single_label_by_hand() -> None:
    # labels 0,0,1,1,2   preds 0,1,1,1,0 -> accuracy 3/5
    # c0: tp1 pred2 true2 -> F1 = 2/4;  c1: tp2 pred3 true2 -> 4/5;  c2: tp0 pred0 true1 -> 0
    # macro-F1 = (0.5 + 0.8 + 0) / 3 = 0.4333
    logits = np.eye(3)[[0, 1, 1, 1, 0]]
    out = single_label_metrics(logits, np.array([0, 0, 1, 1, 2]))
    assert out["accuracy"] == pytest.approx(0.6)
    assert out["macro_f1"] == pytest.approx(1.3 / 3)


def test_macro_f1_over_classes_in_labels_or_predictions() -> None:
    # labels 0,0,1   preds 0,2,1 (class 3 exists in logits but nowhere else)
    # c0: 2*1/(1+2) = 2/3;  c1: 1;  c2 (predicted only): 0 -> macro = 5/9 = 0.5556
    # (labels-only would be 5/6; counting class 3 too would be 5/12)
    logits = np.eye(4)[[0, 2, 1]]
    out = single_label_metrics(logits, np.array([0, 0, 1]))
    assert out["accuracy"] == pytest.approx(2 / 3)
    assert out["macro_f1"] == pytest.approx(5 / 9)


# ---------------------------------------------------------------- cross-check, speed


def test_matches_sklearn_on_random_data() -> None:
    import sklearn.metrics as skm  # a hard test dependency: the only outside check of the metrics
    rng = np.random.default_rng(0)
    n, c = 200, 7
    logits = np.round(rng.normal(size=(n, c)), 1)  # rounding creates many ties
    targets = (rng.random((n, c)) < 0.3).astype(int)
    targets[:, 6] = 0  # a class without positives
    unknown = rng.random((n, c)) < 0.15

    aps = []
    for k in range(c):
        keep = ~unknown[:, k]
        t = targets[keep, k]
        masked = np.where(unknown[:, k], -1, targets[:, k])
        ours = average_precision(logits[:, k], masked)
        if t.sum() == 0:
            assert math.isnan(ours)
            continue
        ref = skm.average_precision_score(t, logits[keep, k])
        assert ours == pytest.approx(ref)
        aps.append(ref)
    masked_all = np.where(unknown, -1, targets)
    assert mean_average_precision(logits, masked_all) == pytest.approx(np.mean(aps))

    # thresholded metrics (no unknowns so sklearn sees the same data)
    out = multilabel_metrics(logits, targets)
    pred = (logits >= 0).astype(int)
    scored = targets.sum(0) > 0
    p = skm.precision_score(targets, pred, average=None, zero_division=0)
    r = skm.recall_score(targets, pred, average=None, zero_division=0)
    assert out["CP"] == pytest.approx(p[scored].mean())
    assert out["CR"] == pytest.approx(r[scored].mean())
    assert out["OP"] == pytest.approx(skm.precision_score(targets, pred, average="micro"))
    assert out["OR"] == pytest.approx(skm.recall_score(targets, pred, average="micro"))

    labels = rng.integers(0, 5, size=n)
    sl_logits = rng.normal(size=(n, 6))
    out = single_label_metrics(sl_logits, labels)
    pred = sl_logits.argmax(1)
    assert out["accuracy"] == pytest.approx(skm.accuracy_score(labels, pred))
    assert out["macro_f1"] == pytest.approx(skm.f1_score(labels, pred, average="macro"))


def test_map_at_coco_scale_matches_sklearn() -> None:
    """At COCO's size (80 classes, thousands of images, ties from rounded scores); its speed is a benchmark's
    business, not a timed test's."""
    import sklearn.metrics as skm

    rng = np.random.default_rng(1)
    scores = np.round(rng.normal(size=(5000, 80)), 2)
    targets = (rng.random((5000, 80)) < 0.05).astype(int)
    expected = np.mean([skm.average_precision_score(targets[:, c], scores[:, c]) for c in range(80)])
    assert multilabel_metrics(scores, targets)["mAP"] == pytest.approx(expected, abs=1e-9)


def test_cooccurring_pairs_are_those_above_independence() -> None:
    from fedvlp.platform.metrics import cooccurring_pairs

    # classes 0 and 1 always together, 2 alone: lift(0, 1) = 2 > 1, lift(0, 2) = 0
    labels = np.array([[1, 1, 0], [1, 1, 0], [0, 0, 1], [0, 0, 1]])
    assert cooccurring_pairs(labels).tolist() == [[False, True, False], [True, False, False], [False, False, False]]


def test_hallucination_gap_by_hand() -> None:
    """Absent classes that co-occur in training with a present one vs the other absent classes."""
    from fedvlp.platform.metrics import hallucination_gap

    pairs = np.array([[False, True, False], [True, False, False], [False, False, False]])
    targets = np.array([[1, 0, 0], [0, 0, 1], [0, 1, -1]])
    # sample 0: class 1 is tempting (co-occurs with 0), class 2 is other; sample 1: 0 and 1 are other;
    # sample 2: class 1 present, class 0 tempting, class 2 unknown (ignored)
    logits = np.array([[0.0, 2.0, -2.0], [1.0, -1.0, 0.0], [3.0, 0.0, 9.0]])
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    tempting = np.mean([sig(2.0), sig(3.0)])
    other = np.mean([sig(-2.0), sig(1.0), sig(-1.0)])
    assert hallucination_gap(logits, targets, pairs) == pytest.approx(tempting - other, abs=1e-12)
    assert np.isnan(hallucination_gap(logits, targets, np.zeros((3, 3), bool)))  # no tempting class at all
    gap = multilabel_metrics(logits, targets, cooccurring=pairs)["hallucination_gap"]
    assert gap == pytest.approx(tempting - other)
