"""Everything between the files on disk and a client's batches.

`prepare_data(spec)` reads the dataset the spec names, hides training annotations (label
mask), splits the training set over the virtual clients, and draws the missing-modality
tables. It runs in the driver before any cluster work, so bad data fails early, and it is
what `fedvlp data stats` inspects.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedvlp.data.dataset import Dataset, Split
from fedvlp.data.images import ArrayImages
from fedvlp.errors import ConfigError

__all__ = ["Dataset", "Split", "FederatedData", "load_dataset", "prepare_data"]


@dataclass(frozen=True, eq=False)
class FederatedData:
    dataset: Dataset
    train_labels: np.ndarray              # after the label mask; test labels are never masked
    parts: list[np.ndarray]               # training-sample indices of each virtual client
    train_missing: np.ndarray | None      # image+text only: per-sample missing code (data.missing)
    eval_missing: dict[str, np.ndarray] | None  # image+text only: the test split's missing tables

    @property
    def test_labels(self) -> np.ndarray:
        return self.dataset.test.labels


def load_dataset(spec) -> Dataset:
    """The dataset named by `data.name` (synthetic, or a reader of a published layout at `data.root`)."""
    data = spec.data
    if data.name == "synthetic-scenes":
        from fedvlp.data.scenes import generate_scenes

        train, test = (generate_scenes(n, split, spec.seed) for n, split in
                       ((data.num_train, "train"), (data.num_test, "test")))
        return Dataset(data.name, tuple(train.class_names), True,
                       Split(ArrayImages(train.images), train.labels.astype(np.int8)),
                       Split(ArrayImages(test.images), test.labels.astype(np.int8)))
    if data.name == "synthetic-recipes":
        from fedvlp.data.recipes import generate_recipes

        train, test = (generate_recipes(n, split, spec.seed) for n, split in
                       ((data.num_train, "train"), (data.num_test, "test")))
        return Dataset(data.name, tuple(train.class_names), False,
                       Split(ArrayImages(train.images), train.labels, tuple(train.texts)),
                       Split(ArrayImages(test.images), test.labels, tuple(test.texts)))
    from fedvlp.data.readers import READERS, read_food101, read_mmimdb

    if data.name == "food101":
        return read_food101(data.root, top_k=data.top_k)
    if data.name == "mmimdb":
        return read_mmimdb(data.root, protocol=data.protocol)
    return READERS[data.name](data.root)


def partition_clients(labels: np.ndarray, multilabel: bool, spec) -> list[np.ndarray]:
    """Training-sample indices of each virtual client (DESIGN §4)."""
    from fedvlp.data.partition import partition_dirichlet, partition_heterogeneity, partition_iid

    fed = spec.federation
    kind = fed.partition if fed.partition != "auto" else ("heterogeneity" if multilabel else "dirichlet")
    if fed.clients > len(labels):
        raise ConfigError(f"federation.clients: {fed.clients} clients but only {len(labels)} training samples")
    if kind == "iid":
        return partition_iid(len(labels), fed.clients, spec.seed)
    if kind == "dirichlet":
        if multilabel:
            raise ConfigError(f"federation.partition: dirichlet needs single-label data; {spec.data.name} is multi-label")
        return partition_dirichlet(labels, fed.clients, fed.dirichlet_alpha, spec.seed)
    hot = labels if multilabel else np.eye(labels.max() + 1, dtype=np.int8)[labels]
    return partition_heterogeneity(hot, fed.clients, fed.heterogeneity, spec.seed)


def prepare_data(spec) -> FederatedData:
    from fedvlp.data.masking import mask_labels
    from fedvlp.data.missing import client_missing_tables, eval_tables

    dataset = load_dataset(spec)
    data = spec.data
    labels = dataset.train.labels
    if data.label_mask > 0:
        if not dataset.multilabel:
            raise ConfigError(f"data.label_mask: partial labels need multi-label data; {dataset.name} is single-label")
        labels = mask_labels(labels, data.label_mask, spec.seed, data.mask_as)
    parts = partition_clients(dataset.train.labels, dataset.multilabel, spec)
    train_missing = eval_missing = None
    if dataset.train.texts is not None:
        train_missing = client_missing_tables(parts, len(labels), data.missing_rate, data.missing_type,
                                              data.missing_client_skew, spec.seed)
        eval_missing = eval_tables(len(dataset.test), data.missing_rate, data.missing_type, spec.seed)
    elif data.missing_rate > 0:
        raise ConfigError(f"data.missing_rate: {dataset.name} has no text modality to miss")
    return FederatedData(dataset, labels, parts, train_missing, eval_missing)
