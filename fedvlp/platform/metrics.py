"""Evaluation metrics: the definitions of docs/architecture.md ("Shared definitions").

Multi-label: mAP is the mean, over classes with at least one positive, of the per-class
average precision (sklearn semantics, tied scores grouped); CP/CR/CF1 and OP/OR/OF1 follow
ML-GCN and are taken at a fixed threshold of 0.5 on sigmoid scores, never tuned on the test
set, plus a top-3 variant where only each sample's three highest scores may be positive.
Target entries equal to -1 (unknown) are ignored everywhere. Single-label: accuracy and
macro-F1. All functions are pure numpy and return plain Python floats.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

UNKNOWN = -1
# The sets a run's metrics are named after ("<set>_<metric>"), in the order tables show them: the global model on
# val, test and a dataset's shifted split, and the clients' own models on their local test and local val sets.
LOCAL_SETS = ("personal", "personal_val")
EVALUATION_SETS = ("val", "test", "shift", *LOCAL_SETS)


def split_metric(metric: str) -> tuple[str, str]:
    """(evaluation set, metric within it): "personal_val_mAP" -> ("personal_val", "mAP"); ("", metric) for a name
    that starts with no evaluation set ("train_loss")."""
    for name in sorted(EVALUATION_SETS, key=len, reverse=True):
        if metric.startswith(name + "_"):
            return name, metric[len(name) + 1:]
    return "", metric


def _safe_div(num: ArrayLike, den: ArrayLike) -> np.ndarray:
    """Elementwise num / den with 0/0 (and x/0) mapped to 0, without warnings."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    out = np.zeros(np.broadcast(num, den).shape, dtype=np.float64)
    np.divide(num, den, out=out, where=den != 0)
    return out


def _per_class_ap(scores: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """AP of every column of [n, C] arrays; nan for a column without a positive."""
    scores = np.asarray(scores, dtype=np.float64)
    targets = np.asarray(targets)
    n, _ = scores.shape
    # Descending sort per column; stable so the result does not depend on sort internals.
    order = np.argsort(-scores, axis=0, kind="stable")
    s = np.take_along_axis(scores, order, axis=0)
    t = np.take_along_axis(targets, order, axis=0)
    # Unknown entries get weight 0 in both counts: the same as deleting them.
    tp = np.cumsum(t == 1, axis=0)
    fp = np.cumsum(t == 0, axis=0)
    precision = _safe_div(tp, tp + fp)
    # Tied scores form one threshold: every positive of a tie group sees the precision at
    # the group's last row (that is what sklearn's distinct-threshold curve does).
    is_end = np.ones_like(s, dtype=bool)
    is_end[:-1] = s[:-1] != s[1:]
    end_idx = np.where(is_end, np.arange(n)[:, None], n)
    end_idx = np.minimum.accumulate(end_idx[::-1], axis=0)[::-1]
    precision_at_end = np.take_along_axis(precision, end_idx, axis=0)
    # sum_k (R_k - R_{k-1}) P_k == sum over positives of P(at its threshold) / #positives.
    n_pos = tp[-1] if n else np.zeros(scores.shape[1], dtype=np.int64)
    ap_sum = np.sum((t == 1) * precision_at_end, axis=0)
    return np.where(n_pos > 0, _safe_div(ap_sum, n_pos), np.nan)


def average_precision(scores: np.ndarray, targets: np.ndarray) -> float:
    """AP of one class (sklearn's average_precision_score); nan without a positive."""
    scores = np.asarray(scores, dtype=np.float64).reshape(-1, 1)
    targets = np.asarray(targets).reshape(-1, 1)
    return float(_per_class_ap(scores, targets)[0])


def mean_average_precision(scores: np.ndarray, targets: np.ndarray) -> float:
    """Mean AP over classes with >= 1 positive; nan when no class has one."""
    ap = _per_class_ap(scores, targets)
    ap = ap[~np.isnan(ap)]
    # An empty mean would warn; "no class to score" is reported as nan, not 0.
    return float(ap.mean()) if ap.size else float("nan")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """Overflow-free logistic function."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _precision_recall(pred: np.ndarray, targets: np.ndarray, suffix: str) -> dict[str, float]:
    """ML-GCN CP/CR/CF1 and OP/OR/OF1 for boolean predictions [n, C]."""
    known = targets != UNKNOWN
    positive = targets == 1
    pred = pred & known  # a prediction on an unknown entry is neither right nor wrong
    n_correct = np.sum(pred & positive, axis=0)
    n_pred = np.sum(pred, axis=0)
    n_gt = np.sum(positive, axis=0)
    # Overall sums run over all classes: a positive prediction for a class that has no
    # positive is still a false positive. Per-class averages use the mAP class set.
    op = float(_safe_div(n_correct.sum(), n_pred.sum()))
    orc = float(_safe_div(n_correct.sum(), n_gt.sum()))
    scored = n_gt > 0
    cp = float(_safe_div(n_correct, n_pred)[scored].sum() / scored.sum()) if scored.any() else 0.0
    cr = float(_safe_div(n_correct, n_gt)[scored].sum() / scored.sum()) if scored.any() else 0.0
    return {
        f"CP{suffix}": cp,
        f"CR{suffix}": cr,
        # Harmonic mean of the averages (ML-GCN), not the mean of per-class F1.
        f"CF1{suffix}": float(_safe_div(2 * cp * cr, cp + cr)),
        f"OP{suffix}": op,
        f"OR{suffix}": orc,
        f"OF1{suffix}": float(_safe_div(2 * op * orc, op + orc)),
    }


def multilabel_metrics(
    logits: np.ndarray, targets: np.ndarray, threshold: float = 0.5, top_k: int = 3,
    cooccurring: np.ndarray | None = None,
) -> dict[str, float]:
    """mAP plus thresholded and top-k ML-GCN metrics for raw scores [n, C]; with the training co-occurrence
    pairs `cooccurring` [C, C], also the hallucination gap (`hallucination_gap`)."""
    logits = np.asarray(logits, dtype=np.float64)
    targets = np.asarray(targets)
    pred = _sigmoid(logits) >= threshold
    # Rank on logits, not probabilities: sigmoid saturates and would create false ties.
    top = np.argsort(-logits, axis=1, kind="stable")[:, :top_k]
    in_top = np.zeros_like(pred)
    np.put_along_axis(in_top, top, True, axis=1)
    metrics = {"mAP": mean_average_precision(logits, targets)}
    metrics.update(_precision_recall(pred, targets, ""))
    metrics.update(_precision_recall(pred & in_top, targets, f"_top{top_k}"))
    if cooccurring is not None:
        metrics["hallucination_gap"] = hallucination_gap(logits, targets, cooccurring)
    return metrics


def single_label_metrics(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Accuracy and macro-F1 (over classes present in labels or predictions)."""
    labels = np.asarray(labels).astype(np.int64).reshape(-1)
    pred = np.asarray(logits).argmax(axis=1)
    classes = np.union1d(labels, pred)
    tp = np.array([np.sum((pred == c) & (labels == c)) for c in classes])
    n_pred = np.array([np.sum(pred == c) for c in classes])
    n_true = np.array([np.sum(labels == c) for c in classes])
    # F1 = 2TP / (2TP + FP + FN) = 2TP / (#predicted + #true), with 0/0 -> 0.
    f1 = _safe_div(2 * tp, n_pred + n_true)
    return {
        "accuracy": float(np.mean(pred == labels)) if labels.size else 0.0,
        "macro_f1": float(f1.mean()) if f1.size else 0.0,
    }


def cooccurring_pairs(labels: np.ndarray) -> np.ndarray:
    """bool [C, C]: the class pairs (c, d), c != d, that co-occur in `labels` (multi-hot [n, C], entries > 0
    positive) more often than independence of the two classes predicts (lift n_cd * n / (n_c * n_d) > 1)."""
    positive = (np.asarray(labels) > 0).astype(np.float64)
    n = max(len(positive), 1)
    together = positive.T @ positive
    counts = np.diag(together)
    expected = np.outer(counts, counts) / n
    pairs = together > expected
    np.fill_diagonal(pairs, False)
    return pairs


def hallucination_gap(logits: np.ndarray, targets: np.ndarray, cooccurring: np.ndarray) -> float:
    """The co-occurrence hallucination gap: over all samples, the mean sigmoid score of the absent classes that
    co-occur in training with at least one present class (`cooccurring_pairs`), minus the mean score of the
    other absent classes. Positive: the model leans on co-occurrence to predict what is not there. Unknown
    (-1) entries are neither present nor absent; nan when either group is empty."""
    targets = np.asarray(targets)
    scores = _sigmoid(np.asarray(logits, dtype=np.float64))
    present = (targets == 1).astype(np.float64)
    absent = targets == 0
    suggested = (present @ np.asarray(cooccurring, dtype=np.float64)) > 0
    tempting, other = absent & suggested, absent & ~suggested
    if not tempting.any() or not other.any():
        return float("nan")
    return float(scores[tempting].mean() - scores[other].mean())
