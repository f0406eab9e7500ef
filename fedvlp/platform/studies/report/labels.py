"""How a report names what it shows: swept keys, metrics (with the range a score cannot leave) and swept values,
and the order values sort in (numbers before text)."""
from __future__ import annotations

from fedvlp.platform.metrics import split_metric

KEY_LABELS = {"federation.heterogeneity": "heterogeneity t", "federation.participation": "participation rate ρ",
              "data.label_mask": "label mask m", "data.missing_rate": "missing rate η",
              "data.missing_type": "missing modality", "federation.clients": "clients N",
              "federation.rounds": "rounds R"}


def key_label(key: str) -> str:
    return KEY_LABELS.get(key, key)


def metric_label(metric: str, unit: bool = False) -> str:
    # Every fedvlp score is a fraction (in [0, 1], or [-1, 1] for a gap between two), not a percentage.
    split, name = split_metric(metric)
    text = f"{split.replace('_', ' ')} {name.replace('_', ' ')}" if split else metric.replace("_", " ")
    bounds = score_bounds(metric) if unit else None
    return text + (f" ({bounds[0]:g}–{bounds[1]:g})" if bounds else "")


def test_metric_of(metric: str) -> str:
    """The test counterpart of a selection metric: val_mAP -> test_mAP, a client's local val set's
    personal_val_mAP -> personal_mAP (its local test set)."""
    split, name = split_metric(metric)
    return {"val": f"test_{name}", "personal_val": f"personal_{name}"}.get(split, metric)


def value_order(value) -> tuple:
    """Numbers before text, numbers numerically: a sort key that never compares float with str."""
    return (0, value, "") if isinstance(value, float) else (1, 0.0, str(value))


def sorted_values(values) -> list:
    return sorted(set(values), key=value_order)


def show_value(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


SIGNED_SCORES = {"hallucination_gap"}  # a difference of two mean scores, so in [-1, 1]


def score_bounds(metric: str, difference: bool = False) -> tuple[float, float] | None:
    """The range a metric's value cannot leave: a score lies in [0, 1], a signed score (a gap between two scores)
    in [-1, 1], and a difference of two values in the range's width either side of 0; a loss has no upper bound
    (None: its intervals are drawn as computed)."""
    name = split_metric(metric)[1]
    if "loss" in name:
        return None
    low, high = (-1.0, 1.0) if name in SIGNED_SCORES else (0.0, 1.0)
    return (low - high, high - low) if difference else (low, high)
