"""A dataset plugin: images in a folder, labels in CSV files.

Layout under `data.root`:

    images/...              the image files (any sub-folders)
    train.csv, test.csv     rows `file,labels` with a header: the image path relative to images/, and its class
                            names, separated by ';' for multi-label data
    val.csv                 optional: without it, val is split off train by the seed (data.val_fraction)

Options (`data.options`): `multilabel` (several labels per image, default true). Classes are the sorted names
seen in train.csv. A missing file or an unknown class is a one-line DataError naming the path and line.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass

import numpy as np

from fedvlp.data.dataset import Dataset, Split
from fedvlp.data.images import FileImages
from fedvlp.data.registry import DatasetReader, ReadRequest, register_dataset
from fedvlp.errors import DataError
from fedvlp.spec import spec_field


@dataclass(frozen=True)
class FolderCSVOptions:
    multilabel: bool = spec_field(True, "several ';'-separated labels per image (false: exactly one)")


def _rows(path) -> list[tuple[str, list[str]]]:
    if not path.is_file():
        raise DataError(f"{path}: missing; expected a CSV file with the header file,labels")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or not {"file", "labels"} <= set(reader.fieldnames):
            raise DataError(f"{path}: expected the header file,labels")
        return [(row["file"], [n for n in row["labels"].split(";") if n]) for row in reader]


def _split(root, rows, classes: dict[str, int], multilabel: bool, path) -> Split:
    labels = np.zeros((len(rows), len(classes)), np.int8) if multilabel else np.zeros(len(rows), np.int64)
    for i, (_, names) in enumerate(rows):
        for name in names:
            if name not in classes:
                raise DataError(f"{path}: line {i + 2}: unknown class {name!r}; expected a class of train.csv")
        if multilabel:
            labels[i, [classes[n] for n in names]] = 1
        elif len(names) != 1:
            raise DataError(f"{path}: line {i + 2}: expected exactly one label (data.options.multilabel is false)")
        else:
            labels[i] = classes[names[0]]
    return Split(FileImages(tuple(str(root / "images" / file) for file, _ in rows)), labels)


def read_folder_csv(request: ReadRequest) -> Dataset:
    root, multilabel = request.root, request.options.multilabel
    train = _rows(root / "train.csv")
    classes = {name: i for i, name in enumerate(sorted({n for _, names in train for n in names}))}
    splits = {name: _split(root, _rows(root / f"{name}.csv"), classes, multilabel, root / f"{name}.csv")
              for name in ("train", "test") + (("val",) if (root / "val.csv").is_file() else ())}
    return Dataset("folder-csv", tuple(classes), multilabel, **splits)


register_dataset(DatasetReader("folder-csv", read_folder_csv, FolderCSVOptions, needs_root=True,
                               doc="images in a folder, labels in train/test CSV files (an example plugin)"))
