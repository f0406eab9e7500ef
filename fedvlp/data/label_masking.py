"""Partial labels: each training annotation is hidden with probability m."""
from __future__ import annotations

import numpy as np

from fedvlp.seeding import numpy_rng

UNKNOWN = -1


def mask_labels(labels: np.ndarray, rate: float, seed: int, mask_as: str = "unknown") -> np.ndarray:
    """Hide each (sample, class) annotation with probability `rate`.

    mask_as="unknown": a hidden annotation becomes -1 and the loss ignores it.
    mask_as="negative": a hidden positive becomes 0 (the "drop to negative" variant of the
    FedMPT code); hidden negatives stay 0. Test labels are never passed here.
    """
    if not 0 <= rate < 1:
        raise ValueError(f"label_mask must be in [0, 1), got {rate!r}")
    if mask_as not in ("unknown", "negative"):
        raise ValueError(f"mask_as must be 'unknown' or 'negative', got {mask_as!r}")
    out = labels.astype(np.int8, copy=True)
    if rate == 0:
        return out
    hidden = numpy_rng(seed, "label_mask").random(labels.shape) < rate
    out[hidden] = UNKNOWN if mask_as == "unknown" else np.minimum(out[hidden], 0)
    return out
