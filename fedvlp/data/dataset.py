"""The in-memory description of a dataset: its splits of lazily loaded images, labels and texts."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedvlp.data.images import ImageSource


@dataclass(frozen=True, eq=False)  # eq=False: arrays do not compare or hash as dataclass fields
class Split:
    """Images (loaded lazily), labels and, for image+text datasets, one text per image.

    Labels: multi-label int8 [n, C] with 1 present, 0 absent, -1 unknown (ignored by losses and
    metrics); single-label int64 [n] class indices.
    """
    images: ImageSource
    labels: np.ndarray
    texts: tuple[str, ...] | None = None

    def __post_init__(self):
        n = len(self.images)
        if len(self.labels) != n or (self.texts is not None and len(self.texts) != n):
            texts = "-" if self.texts is None else len(self.texts)
            raise ValueError(f"Split: {n} images, {len(self.labels)} labels, {texts} texts")

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, indices: np.ndarray) -> Split:
        """The samples at `indices`, in that order."""
        indices = np.asarray(indices, dtype=np.int64)
        texts = None if self.texts is None else tuple(self.texts[i] for i in indices)
        return Split(self.images.subset(indices), self.labels[indices], texts)


@dataclass(frozen=True, eq=False)
class Dataset:
    """train: what the clients train on; val: what tuning and sweeps select on; test: the final score;
    holdout: the pool the clients' local test sets come from (split over them by the partition rule);
    shift: a second evaluation under a distribution shift (synthetic-scenes: co-occurrence and style decorrelated),
    scored beside test as "shift_<metric>". A reader may leave val and holdout out; `load_dataset` then splits them
    off train. Only a reader that has a shifted split gives one."""
    name: str
    class_names: tuple[str, ...]
    multilabel: bool
    train: Split
    test: Split
    val: Split | None = None
    holdout: Split | None = None
    shift: Split | None = None
