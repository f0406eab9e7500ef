"""What the synthetic dataset generators share."""
from __future__ import annotations

import numpy as np


def check_generator_args(num_samples, split, image_size, splits: tuple[str, ...]) -> tuple[int, int]:
    """Validate a generator call; returns (num_samples, image_size) as ints."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 0:
        raise ValueError(f"num_samples must be a non-negative integer, got {num_samples!r}")
    if split not in splits:
        raise ValueError(f"split must be one of {splits}, got {split!r}")
    if isinstance(image_size, bool) or not isinstance(image_size, (int, np.integer)) \
            or image_size < 16 or image_size % 2:
        raise ValueError(f"image_size must be an even integer >= 16, got {image_size!r}")
    return int(num_samples), int(image_size)
