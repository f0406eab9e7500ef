"""Datasets and client partitions: everything between the data and a client's batches."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedvlp.errors import ConfigError


@dataclass(frozen=True)
class Dataset:
    """A split dataset in memory: uint8 images [n, H, W, 3] and multi-hot labels [n, C] (-1 = unknown)."""
    name: str
    class_names: tuple[str, ...]
    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    multilabel: bool = True


def load_dataset(spec) -> Dataset:
    """The dataset a run spec names (`data.name`)."""
    data = spec.data
    if data.name == "synthetic-scenes":
        from fedvlp.data.scenes import generate_scenes

        train = generate_scenes(data.num_train, "train", spec.seed)
        test = generate_scenes(data.num_test, "test", spec.seed)
        return Dataset(data.name, tuple(train.class_names), train.images, train.labels.astype(np.int8),
                       test.images, test.labels.astype(np.int8))
    raise ConfigError(f"data.name: unknown dataset {data.name!r}")


def partition_clients(dataset: Dataset, spec) -> list[np.ndarray]:
    """Training-sample indices of each virtual client, from the run's partition settings."""
    from fedvlp.data.partition import partition_heterogeneity

    fed = spec.federation
    return partition_heterogeneity(dataset.train_labels, fed.clients, fed.heterogeneity, spec.seed)
