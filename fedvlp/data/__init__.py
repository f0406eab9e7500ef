"""Everything between the files on disk and a client's batches.

`prepare_data(spec)` reads the dataset the spec names (a registered reader, `fedvlp.data.registry`),
splits val and the held-out pool off the training data where the reader has none, hides training
annotations (label mask), splits the training set and the held-out pool over the virtual clients with
one partition rule (so each client's local val and local test sets come from its own distribution), and draws the
missing-modality tables. It runs in the driver before any cluster work, so bad data fails early, and
it is what `fedvlp data stats` inspects.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedvlp.data.dataset import Dataset, Split
from fedvlp.errors import ConfigError
from fedvlp.seeding import numpy_rng

__all__ = ["Dataset", "Split", "FederatedData", "load_dataset", "prepare_data"]

VAL_KEY, HOLDOUT_KEY, LOCAL_VAL_KEY = 0, 1, 2  # keys of the "split" seed stream


@dataclass(frozen=True, eq=False)
class FederatedData:
    dataset: Dataset
    train_labels: np.ndarray              # after the label mask; val, test and held-out labels are never masked
    parts: list[np.ndarray]               # training-sample indices of each virtual client
    local_tests: list[np.ndarray]         # held-out-pool indices of each client's local test set (personal_*)
    local_vals: list[np.ndarray]          # held-out-pool indices of each client's local val set (personal_val_*)
    train_missing: np.ndarray | None      # image+text only: per-sample missing code (data.missing)
    holdout_missing: np.ndarray | None    # image+text only: the held-out pool's, drawn with each client's pattern
    val_missing: np.ndarray | None        # image+text only: val under the training setting
    eval_missing: dict[str, np.ndarray] | None  # image+text only: the test split's tables (training setting + six)

    @property
    def test_labels(self) -> np.ndarray:
        return self.dataset.test.labels

    def labels_of(self, evaluation_set: str) -> np.ndarray:
        """The labels an evaluation set is scored against: "val", "shift", else the test split's ("test_full", ...)."""
        if evaluation_set == "val":
            return self.val.labels
        if evaluation_set == "shift":
            assert self.dataset.shift is not None
            return self.dataset.shift.labels
        return self.test_labels

    @property
    def val(self) -> Split:
        assert self.dataset.val is not None  # load_dataset always provides it
        return self.dataset.val

    @property
    def holdout(self) -> Split:
        assert self.dataset.holdout is not None  # load_dataset always provides it
        return self.dataset.holdout


def split_off(split: Split, fraction: float, seed: int, key: int, at_least: int = 0) -> tuple[Split, Split]:
    """(rest, part): a `fraction` of `split` (at least `at_least` samples) drawn by the seed, both in index order."""
    n = len(split)
    count = min(n - 1, max(at_least, round(fraction * n))) if n > 1 else 0
    order = numpy_rng(seed, "split", key).permutation(n)
    return split.subset(np.sort(order[count:])), split.subset(np.sort(order[:count]))


def load_dataset(spec) -> Dataset:
    """The dataset named by `data.name`, with its val split and held-out pool."""
    from fedvlp.data.catalogue import datasets
    from fedvlp.data.registry import ReadRequest

    data = spec.data
    reader = datasets().get(data.name)
    root = Path(data.root).expanduser() if data.root else None
    dataset = reader.read(ReadRequest(root, data.options, spec.seed, data.num_train, data.num_val, data.num_test,
                                      data.num_holdout))
    train, val, holdout = dataset.train, dataset.val, dataset.holdout
    if val is None:
        train, val = split_off(train, data.val_fraction, spec.seed, VAL_KEY, at_least=1)
    if holdout is None:
        train, holdout = split_off(train, data.holdout_fraction, spec.seed, HOLDOUT_KEY)
    return dataclasses.replace(dataset, train=train, val=val, holdout=holdout)


def partition_clients(labels: np.ndarray, multilabel: bool, spec) -> list[np.ndarray]:
    """Sample indices of each virtual client, by the partition rule the spec names (`fedvlp list partitioners`).
    A centralised arm (`federation.pooled_from`) is partitioned as its federated counterpart; `prepare_data`
    pools the parts once the missing patterns are drawn."""
    from fedvlp.data.partition import PARTITIONERS

    fed = spec.federation
    name = fed.partition if fed.partition != "auto" else ("heterogeneity" if multilabel else "dirichlet")
    partitioner = PARTITIONERS.get(name)
    clients = fed.pooled_from or fed.clients
    key = "federation.pooled_from" if fed.pooled_from else "federation.clients"
    if clients > len(labels):
        raise ConfigError(f"{key}: {clients} clients but only {len(labels)} training samples")
    if partitioner.labels == "single" and multilabel:
        raise ConfigError(f"federation.partition: {name} needs single-label data; {spec.data.name} is multi-label")
    if partitioner.labels == "multilabel" and not multilabel:
        raise ConfigError(f"federation.partition: {name} needs multi-label data; {spec.data.name} is single-label")
    return partitioner.split(labels, clients, spec.seed, dataclasses.replace(fed, clients=clients, pooled_from=None))


def prepare_data(spec) -> FederatedData:
    from fedvlp.data.label_masking import mask_labels
    from fedvlp.data.missing import VAL_KEY as MISSING_VAL_KEY
    from fedvlp.data.missing import client_missing_tables, eval_tables, missing_table

    dataset = load_dataset(spec)
    assert dataset.val is not None and dataset.holdout is not None
    val, holdout = dataset.val, dataset.holdout
    data = spec.data
    labels = dataset.train.labels
    if data.label_mask > 0:
        if not dataset.multilabel:
            raise ConfigError(f"data.label_mask: partial labels need multi-label data; {dataset.name} is single-label")
        labels = mask_labels(labels, data.label_mask, spec.seed, data.mask_as)
    # One partition of train + held-out pool: a client's local test set follows its own distribution.
    n = len(dataset.train)
    union = np.concatenate([dataset.train.labels, holdout.labels])
    parts_union = partition_clients(union, dataset.multilabel, spec)
    train_missing = holdout_missing = val_missing = eval_missing = None
    if dataset.train.texts is not None:
        table = client_missing_tables(parts_union, len(union), data.missing_rate, data.missing_type,
                                      data.missing_client_skew, spec.seed)
        train_missing, holdout_missing = table[:n], table[n:]
        val_missing = missing_table(len(val), data.missing_rate, data.missing_type, spec.seed, MISSING_VAL_KEY)
        eval_missing = eval_tables(len(dataset.test), data.missing_rate, data.missing_type, spec.seed)
    elif data.missing_rate > 0:
        raise ConfigError(f"data.missing_rate: {dataset.name} has no text modality to miss")
    parts = [p[p < n] for p in parts_union]
    local_vals, local_tests = local_splits([p[p >= n] - n for p in parts_union], data.local_val_fraction, spec.seed)
    if spec.federation.pooled_from:  # the centralised arm: the federated clients' data, codes and all, in one place
        parts, local_vals, local_tests = ([np.sort(np.concatenate(x))] for x in (parts, local_vals, local_tests))
    return FederatedData(dataset, labels, parts, local_tests, local_vals, train_missing, holdout_missing, val_missing,
                         eval_missing)


def local_splits(held_out: list[np.ndarray], fraction: float, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(local vals, local tests) of the clients, from their parts of the held-out pool: the seed marks a `fraction`
    of the pool as local val (what a personalised method is tuned on), whichever client a sample falls to, so a
    centralised arm's local sets are its federated counterpart's pooled; the rest is local test."""
    size = sum(map(len, held_out))
    is_val = np.zeros(size, dtype=bool)
    is_val[numpy_rng(seed, "split", LOCAL_VAL_KEY).permutation(size)[:round(fraction * size)]] = True
    return [p[is_val[p]] for p in held_out], [p[~is_val[p]] for p in held_out]
