"""Datasets by name: each a reader with its options, registered like a plugin's.

A reader is a function `read(request: ReadRequest) -> Dataset`. It receives the root (for datasets on
disk), its own options (a frozen dataclass it declares, built from the config's `data.options` and
validated when the config is built), the run seed and the synthetic sizes. It returns at least the
train and test splits; a val split where the dataset has an official one (MM-IMDB's dev), and for
synthetic data also the held-out pool. `fedvlp.data.load_dataset` splits val and the held-out pool off
the training data, deterministically from the seed, where a reader leaves them out.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedvlp.registry import Registry
from fedvlp.spec import check_params_class


@dataclass(frozen=True)
class ReadRequest:
    root: Path | None
    options: Any        # the reader's options dataclass (or {} when it declares none)
    seed: int
    num_train: int      # synthetic sizes (readers of data on disk ignore them)
    num_val: int
    num_test: int
    num_holdout: int


@dataclass(frozen=True)
class DatasetReader:
    name: str
    read: Callable[[ReadRequest], Any]
    options: type | None = None   # frozen dataclass of the reader's options
    needs_root: bool = True       # data on disk: data.root is required
    doc: str = ""


def _check(name: str, reader: DatasetReader) -> None:
    if not isinstance(reader, DatasetReader) or reader.name != name or not callable(reader.read):
        raise TypeError(f"dataset {name!r}: register a DatasetReader named {name!r} with a read(request) function")
    if reader.options is not None:
        check_params_class(reader.options, f"dataset {name!r} options")


DATASETS: Registry[DatasetReader] = Registry("dataset", "data.name", _check)


def register_dataset(reader: DatasetReader) -> DatasetReader:
    return DATASETS.add(reader.name, reader)
