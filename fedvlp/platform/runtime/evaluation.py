"""Evaluation and its output: the global model on every evaluation set and each client's own model on its local
sets, scored centrally, and the lines a run prints."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedvlp.platform.metrics import multilabel_metrics, single_label_metrics

if TYPE_CHECKING:
    from fedvlp.platform.runtime.pool import WorkerPool


def scores(task, logits: np.ndarray, labels: np.ndarray, cooccurring=None) -> dict[str, float]:
    if task.multilabel:
        return multilabel_metrics(logits, labels, cooccurring=cooccurring)
    return single_label_metrics(logits, labels)


def evaluate_models(pool: WorkerPool, coordinator, data, task, cooccurring) -> dict[str, float]:
    """Score the global model on every evaluation set, sharded over the workers, and each client's model on its
    local test set; the metrics are computed centrally.

    Names: "<set>_<metric>" for the sets "val", "test", "shift" where the dataset has one ("shift_mAP",
    "shift_hallucination_gap") and, on image+text data, the six fixed test sets ("test_full_accuracy",
    "test_text_only_macro_f1", ...); "personal_<metric>" for the mean over the clients
    of their own model on their local test set, and "personal_<metric>_std" for its spread over the clients;
    "personal_val_<metric>" likewise on their local val sets (what a personalised method is tuned on).
    """
    state_ref = coordinator.global_state.remote()
    per_worker = pool.evaluate(state_ref)
    metrics = {}
    for name in per_worker[0]:
        blocks = sorted((b for scores in per_worker for b in scores[name]), key=lambda b: b[0])
        logits = np.concatenate([scores for _, scores in blocks])
        metrics.update({f"{name}_{k}": v for k, v in scores(task, logits, data.labels_of(name), cooccurring).items()})
    if pool.local_clients:
        by_set = pool.evaluate_clients(state_ref, coordinator.client_states_of.remote(sorted(pool.local_clients)))
        holdout = data.holdout.labels
        for name, indices in (("personal", data.local_tests), ("personal_val", data.local_vals)):
            metrics.update(personal_metrics([scores(task, logits, holdout[indices[cid]])
                                             for cid, logits in sorted(by_set[name].items())], name))
    return metrics


def personal_metrics(per_client: list[dict[str, float]], prefix: str = "personal") -> dict[str, float]:
    """`<prefix>_<metric>` and `<prefix>_<metric>_std`: the mean and spread over the clients of each metric of their
    own models on one of their local sets (a metric no client could score is left out)."""
    out = {}
    for key in per_client[0] if per_client else []:
        values = np.array([m[key] for m in per_client], dtype=np.float64)
        if not np.isnan(values).all():
            out[f"{prefix}_{key}"] = float(np.nanmean(values))
            out[f"{prefix}_{key}_std"] = float(np.nanstd(values))
    return out


HEADLINE = ("val_mAP", "test_mAP", "personal_mAP", "val_accuracy", "test_accuracy", "personal_accuracy")


def headline(metrics: dict) -> str:
    return "  ".join(f"{k.replace('_', ' ')} {metrics[k]:.4f}" for k in HEADLINE if k in metrics)


def round_line(round_index: int, rounds: int, m: dict) -> str:
    return f"round {round_index}/{rounds}  loss {m['train_loss']:.4f}  {headline(m)}  {m['round_seconds']:.1f} s"
