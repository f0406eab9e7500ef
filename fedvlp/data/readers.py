"""Readers for the real datasets in their published layouts, with the standard splits.

`read_<name>(root, **options) -> Dataset`; `READERS` maps the dataset names to them, and each is
registered in `fedvlp.data.registry.DATASETS` with its options (`data.options`). Only
annotation files are parsed at read time; images stay on disk as `FileImages` and are opened
when loaded (a missing or corrupt image is reported then, or by `cache_key()`).

Labels: multi-label sets give int8 [n, C] with 1 present, 0 absent, -1 unknown (ignored by
losses and metrics); single-label sets give int64 [n] class indices. Every missing or
malformed file or field raises `DataError` with one line naming the path (and field) and what
was expected.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from fedvlp.data.dataset import Dataset, Split
from fedvlp.data.images import FileImages
from fedvlp.data.registry import DatasetReader, register_dataset
from fedvlp.errors import ConfigError, DataError
from fedvlp.spec import spec_field

VOC_CLASSES = (
    "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa",
    "train", "tvmonitor",
)
MMIMDB_GENRES = (
    "Drama", "Comedy", "Romance", "Thriller", "Crime", "Action", "Adventure", "Horror",
    "Documentary", "Mystery", "Sci-Fi", "Fantasy", "Family", "Biography", "War", "History",
    "Animation", "Musical", "Music", "Western", "Sport", "Short", "Film-Noir",
)
FEDPRIME_IMDB_CLASSES = 8


# --------------------------------------------------------------------------- file helpers

def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return " ".join(str(exc).split()) or type(exc).__name__


def _require_dir(root: str | Path, expected: str) -> Path:
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(f"{root}: no such directory; expected {expected}")
    return root


def _read_text(path: Path, expected: str, errors: str = "strict") -> str:
    try:
        return path.read_text(encoding="utf-8-sig", errors=errors)
    except FileNotFoundError:
        raise DataError(f"{path}: missing; expected {expected}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read ({_reason(exc)}); expected {expected}") from None


def _read_json(path: Path, expected: str):
    text = _read_text(path, expected)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: invalid JSON (line {exc.lineno}: {exc.msg}); expected {expected}") from None


def _read_lines(path: Path, expected: str) -> list[str]:
    """Stripped non-empty lines; an empty file is an error (every list here has entries)."""
    lines = [line.strip() for line in _read_text(path, expected).splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        raise DataError(f"{path}: empty; expected {expected}")
    return lines


def _key(obj, key: str, path: Path, expected: str):
    """obj[key], or a DataError naming the file and field."""
    if not isinstance(obj, dict) or key not in obj:
        raise DataError(f"{path}: missing key {key!r}; expected {expected}")
    return obj[key]


def _under(directory: Path, names, suffix: str = "") -> FileImages:
    """Files `directory/<name><suffix>`; plain string joins, as pathlib costs seconds for 100k+ names."""
    prefix = os.path.join(str(directory), "")
    return FileImages(tuple(f"{prefix}{name}{suffix}" for name in names))


def _multi_hot(n: int, num_classes: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    labels = np.zeros((n, num_classes), np.int8)
    labels[rows, cols] = 1
    return labels


def _top_k_relabel(train: np.ndarray, names: tuple[str, ...], k: int) -> tuple[np.ndarray, tuple[str, ...]]:
    """The k classes most frequent in `train` (ties by name) and an old->new index map (-1 = dropped)."""
    counts = np.bincount(train, minlength=len(names))
    keep = sorted(range(len(names)), key=lambda c: (-counts[c], names[c]))[:k]
    mapping = np.full(len(names), -1, np.int64)
    mapping[keep] = np.arange(len(keep))
    return mapping, tuple(names[c] for c in keep)


def _filter_split(split: Split, mapping: np.ndarray) -> Split:
    """Keep the samples whose single label survives `mapping`, relabelled."""
    new = mapping[split.labels]
    keep = np.flatnonzero(new >= 0)
    return dataclasses.replace(split.subset(keep), labels=new[keep])


# --------------------------------------------------------------------------- VOC2007

_VOC_EXPECTED = "a VOC annotation"


def _voc_dir(root: str | Path) -> Path:
    root = _require_dir(root, "a VOC2007 tree (VOCdevkit/VOC2007/...)")
    for candidate in (root / "VOCdevkit" / "VOC2007", root):
        if (candidate / "ImageSets" / "Main" / "trainval.txt").is_file():
            return candidate
    raise DataError(f"{root}: not a VOC2007 tree (expected VOCdevkit/VOC2007/ImageSets/Main/trainval.txt)")


def _voc_row(xml_path: Path) -> np.ndarray:
    """1 for a class with a non-difficult object, -1 if it has only difficult ones, else 0."""
    try:
        tree = ET.parse(xml_path)
    except FileNotFoundError:
        raise DataError(f"{xml_path}: missing; expected {_VOC_EXPECTED}") from None
    except OSError as exc:
        raise DataError(f"{xml_path}: cannot read ({_reason(exc)}); expected {_VOC_EXPECTED}") from None
    except ET.ParseError as exc:
        raise DataError(f"{xml_path}: malformed XML ({_reason(exc)}); expected {_VOC_EXPECTED}") from None
    row = np.zeros(len(VOC_CLASSES), np.int8)
    difficult_only = []
    for obj in tree.getroot().iter("object"):
        name = (obj.findtext("name") or "").strip()
        if not name:
            raise DataError(f"{xml_path}: missing <object><name>; expected {_VOC_EXPECTED}")
        if name not in VOC_CLASSES:
            raise DataError(f"{xml_path}: unknown class {name!r} in <object><name>; expected one of the 20 VOC classes")
        difficult = (obj.findtext("difficult") or "0").strip()   # absent means not difficult
        if difficult not in ("0", "1"):
            raise DataError(f"{xml_path}: <object><difficult> is {difficult!r}; expected 0 or 1")
        c = VOC_CLASSES.index(name)
        if difficult == "1":
            difficult_only.append(c)
        else:
            row[c] = 1
    for c in difficult_only:
        if row[c] == 0:
            row[c] = -1
    return row


def _voc_split(voc: Path, split: str) -> Split:
    # Class-specific lists ("<id> <flag>") also work: only the first token is the id.
    ids = [line.split()[0] for line in
           _read_lines(voc / "ImageSets" / "Main" / f"{split}.txt", "one VOC image id per line")]
    labels = np.stack([_voc_row(voc / "Annotations" / f"{i}.xml") for i in ids])
    return Split(_under(voc / "JPEGImages", ids, ".jpg"), labels)


def read_voc2007(root: str | Path) -> Dataset:
    """PASCAL VOC 2007, 20 classes (standard order aeroplane .. tvmonitor), multi-label.

    Layout: ``root/VOCdevkit/VOC2007/`` (or ``root`` itself being the VOC2007 folder) with
    ``JPEGImages/<id>.jpg``, ``Annotations/<id>.xml`` and ``ImageSets/Main/{trainval,test}.txt``.
    train = trainval (5,011), test = test (4,952). A class is 1 if the image has a
    non-difficult object of it, -1 (unknown) if only difficult ones, else 0.
    """
    voc = _voc_dir(root)
    return Dataset("voc2007", VOC_CLASSES, True, _voc_split(voc, "trainval"), _voc_split(voc, "test"))


# --------------------------------------------------------------------------- COCO2014

_COCO_EXPECTED = "a COCO instances file"


def _coco_categories(data, path: Path) -> tuple[np.ndarray, tuple[str, ...]]:
    categories = _key(data, "categories", path, _COCO_EXPECTED)
    try:
        pairs = sorted((int(c["id"]), str(c["name"])) for c in categories)
    except (KeyError, TypeError, ValueError):
        raise DataError(f"{path}: categories entries need 'id' and 'name'; expected {_COCO_EXPECTED}") from None
    if not pairs:
        raise DataError(f"{path}: 'categories' is empty; expected {_COCO_EXPECTED}")
    return np.array([i for i, _ in pairs], np.int64), tuple(n for _, n in pairs)


def _column(records, key: str, path: Path, list_name: str, dtype=None):
    """One field of every record of a list, as a list (or an array when `dtype` is given)."""
    try:
        values = [r[key] for r in records]
        return values if dtype is None else np.asarray(values, dtype)
    except (KeyError, TypeError, ValueError):
        # Slow path only on error: find the first bad record to name it.
        for i, r in enumerate(records):
            if not isinstance(r, dict) or key not in r or (dtype is not None and not isinstance(r[key], int)):
                raise DataError(f"{path}: {list_name}[{i}] missing or bad key {key!r}; "
                                f"expected {_COCO_EXPECTED}") from None
        raise DataError(f"{path}: bad {list_name} key {key!r}; expected {_COCO_EXPECTED}") from None


def _coco_split(root: Path, split: str, cat_ids: np.ndarray | None):
    path = root / "annotations" / f"instances_{split}.json"
    data = _read_json(path, _COCO_EXPECTED)
    if not isinstance(data, dict):
        raise DataError(f"{path}: top level is not an object; expected {_COCO_EXPECTED}")
    # Check all three keys before the (long) vectorising so a wrong file fails fast.
    images = _key(data, "images", path, _COCO_EXPECTED)
    annotations = _key(data, "annotations", path, _COCO_EXPECTED)
    ids, names = _coco_categories(data, path)
    if cat_ids is not None and not np.array_equal(ids, cat_ids):
        raise DataError(f"{path}: categories differ from instances_train2014.json; expected the same 80 categories")
    image_ids = _column(images, "id", path, "images", np.int64)
    if len(image_ids) == 0:
        raise DataError(f"{path}: 'images' is empty; expected {_COCO_EXPECTED}")
    files = _column(images, "file_name", path, "images")
    ann_images = _column(annotations, "image_id", path, "annotations", np.int64)
    ann_cats = _column(annotations, "category_id", path, "annotations", np.int64)

    order = np.argsort(image_ids, kind="stable")
    sorted_ids = image_ids[order]
    if len(sorted_ids) > 1 and np.any(sorted_ids[1:] == sorted_ids[:-1]):
        raise DataError(f"{path}: duplicate image ids in 'images'; expected {_COCO_EXPECTED}")
    rows = order[_lookup(sorted_ids, ann_images, path, "image_id", "an id listed in 'images'")]
    cols = _lookup(ids, ann_cats, path, "category_id", "an id listed in 'categories'")
    labels = _multi_hot(len(image_ids), len(ids), rows, cols)   # images without annotations stay all-zero
    split_data = Split(_under(root / split, files), labels)
    return split_data, ids, names


def _lookup(sorted_keys: np.ndarray, values: np.ndarray, path: Path, field: str, expected: str) -> np.ndarray:
    """Positions of `values` in `sorted_keys`; an absent value is a DataError."""
    pos = np.searchsorted(sorted_keys, values)
    pos = np.minimum(pos, len(sorted_keys) - 1)
    bad = np.flatnonzero(sorted_keys[pos] != values)
    if len(bad):
        raise DataError(f"{path}: annotations[{bad[0]}] has {field} {values[bad[0]]}; expected {expected}")
    return pos


def read_coco2014(root: str | Path) -> Dataset:
    """MS-COCO 2014, 80 classes (categories sorted by id, names from the JSON), multi-label.

    Layout: ``root/{train2014,val2014}/<file_name>`` and
    ``root/annotations/instances_{train2014,val2014}.json``. train = train2014, test = val2014;
    image order as in the JSON. A class is 1 if the image has any annotation of it (crowd
    included); images without annotations keep an all-zero row.
    """
    root = _require_dir(root, "a COCO2014 tree (train2014/, val2014/, annotations/)")
    train, ids, names = _coco_split(root, "train2014", None)
    test, _, _ = _coco_split(root, "val2014", ids)
    return Dataset("coco2014", names, True, train, test)


# --------------------------------------------------------------------------- NUS-WIDE

def _read_01_column(path: Path, n: int, list_path: Path) -> np.ndarray:
    """One 0/1 per line, exactly n lines, as int8; vectorised (81 files x 160k lines)."""
    expected = f"{n} lines of 0/1, one per image of {list_path.name}"
    try:
        raw = np.frombuffer(path.read_bytes(), np.uint8)
    except FileNotFoundError:
        raise DataError(f"{path}: missing; expected {expected}") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({_reason(exc)}); expected {expected}") from None
    chars = raw[~np.isin(raw, np.frombuffer(b" \t\r", np.uint8))]
    end = len(chars)
    while end and chars[end - 1] == ord("\n"):
        end -= 1
    chars = chars[:end]
    # Well-formed means exactly "v\nv\n...v" with v in {0, 1}.
    values, newlines = chars[0::2], chars[1::2]
    if len(chars) == 2 * n - 1 and np.all((values == ord("0")) | (values == ord("1"))) \
            and np.all(newlines == ord("\n")):
        return (values - ord("0")).astype(np.int8)
    lines = [line.strip() for line in raw.tobytes().decode("latin-1").rstrip().splitlines()]
    if len(lines) != n:
        raise DataError(f"{path}: {len(lines)} lines; expected {expected}")
    bad = next((i for i, v in enumerate(lines) if v not in ("0", "1")), None)
    if bad is None:
        raise DataError(f"{path}: unexpected whitespace or separators; expected {expected}")
    raise DataError(f"{path}: line {bad + 1} is {lines[bad][:20]!r}; expected {expected}")


def _nuswide_split(root: Path, concepts: tuple[str, ...], split: str) -> Split:
    list_path = root / "ImageList" / f"{split}Imagelist.txt"
    # The lists use Windows separators ("actor\0001_2124494179.jpg").
    rel = [line.replace("\\", "/") for line in _read_lines(list_path, "one relative image path per line")]
    label_dir = root / "Groundtruth" / "TrainTestLabels"
    columns = [_read_01_column(label_dir / f"Labels_{c}_{split}.txt", len(rel), list_path) for c in concepts]
    return Split(_under(root / "Flickr", rel), np.stack(columns, axis=1))


def read_nuswide(root: str | Path) -> Dataset:
    """NUS-WIDE, 81 concepts, multi-label, official layout.

    ``root/Concepts81.txt`` (one concept per line), ``root/ImageList/{Train,Test}Imagelist.txt``
    (paths relative to ``root/Flickr/`` with Windows backslashes) and
    ``root/Groundtruth/TrainTestLabels/Labels_<concept>_{Train,Test}.txt`` (one 0/1 per line,
    aligned with the image list). train = Train, test = Test.
    """
    root = _require_dir(root, "a NUS-WIDE tree (Concepts81.txt, ImageList/, Groundtruth/, Flickr/)")
    concepts = tuple(_read_lines(root / "Concepts81.txt", "one NUS-WIDE concept per line"))
    return Dataset("nuswide", concepts, True, _nuswide_split(root, concepts, "Train"),
                       _nuswide_split(root, concepts, "Test"))


# --------------------------------------------------------------------------- UPMC Food-101

def _food_split(root: Path, split: str, class_index: dict[str, int]) -> Split:
    path = root / "texts" / f"{split}_titles.csv"
    expected = "CSV rows file_name,text,class"
    # Titles are scraped web text: undecodable bytes become U+FFFD rather than failing the read.
    text = _read_text(path, expected, errors="replace")
    image_dir = os.path.join(str(root / "images" / split), "")
    paths, labels, texts = [], [], []
    reader = csv.reader(io.StringIO(text, newline=""))   # newline="": quoted titles may span lines
    for row in reader:
        line_no = reader.line_num
        if not row:
            continue
        if len(row) < 3:
            raise DataError(f"{path}: line {line_no} has {len(row)} fields; expected {expected}")
        # Unquoted commas inside the title split it: the first and last fields are unambiguous.
        file_name, title, label = row[0].strip(), ",".join(row[1:-1]), row[-1].strip()
        if label not in class_index:
            raise DataError(f"{path}: line {line_no} has class {label!r}; expected a class directory of images/train")
        paths.append(f"{image_dir}{label}{os.sep}{file_name}")
        labels.append(class_index[label])
        texts.append(title)
    if not paths:
        raise DataError(f"{path}: no rows; expected {expected}")
    return Split(FileImages(tuple(paths)), np.array(labels, np.int64), tuple(texts))


def read_food101(root: str | Path, top_k: int | None = None) -> Dataset:
    """UPMC Food-101, 101 classes, image + text, single-label.

    Layout: ``root/images/{train,test}/<class>/<file>.jpg`` and
    ``root/texts/{train,test}_titles.csv`` (rows ``file_name,text,class``, no header). The CSV
    rows are the samples; the image is ``images/<split>/<class>/<file_name>``. Classes = sorted
    directory names of ``images/train``. ``top_k``: keep only the k classes most frequent in
    train (ties by name), relabelled 0..k-1 in that order, both splits filtered.
    """
    root = _require_dir(root, "a UPMC Food-101 tree (images/, texts/)")
    train_dir = root / "images" / "train"
    if not train_dir.is_dir():
        raise DataError(f"{train_dir}: no such directory; expected one directory per class")
    names = tuple(sorted(p.name for p in train_dir.iterdir() if p.is_dir()))
    if not names:
        raise DataError(f"{train_dir}: no class directories; expected one directory per class")
    class_index = {name: i for i, name in enumerate(names)}
    train, test = _food_split(root, "train", class_index), _food_split(root, "test", class_index)
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= len(names):
            raise ConfigError(f"top_k: expected an integer in 1..{len(names)} or None, got {top_k!r}")
        mapping, names = _top_k_relabel(train.labels, names, top_k)
        train, test = _filter_split(train, mapping), _filter_split(test, mapping)
    return Dataset("food101", names, False, train, test)


# --------------------------------------------------------------------------- MM-IMDB

_IMDB_EXPECTED = "an MM-IMDB movie file"


def _imdb_movie(path: Path) -> tuple[list[str], str]:
    """(genres, first plot) of one movie JSON."""
    data = _read_json(path, _IMDB_EXPECTED)
    genres = _key(data, "genres", path, _IMDB_EXPECTED)
    plots = _key(data, "plot", path, _IMDB_EXPECTED)
    if not isinstance(genres, list) or not all(isinstance(g, str) for g in genres):
        raise DataError(f"{path}: key 'genres' is not a list of strings; expected {_IMDB_EXPECTED}")
    if not isinstance(plots, list) or not plots or not isinstance(plots[0], str):
        raise DataError(f"{path}: key 'plot' is not a non-empty list of strings; expected {_IMDB_EXPECTED}")
    return genres, plots[0]


def _imdb_split(root: Path, ids: list[str]) -> Split:
    genre_index = {g: i for i, g in enumerate(MMIMDB_GENRES)}
    rows, cols, texts = [], [], []
    for row, movie in enumerate(ids):
        genres, plot = _imdb_movie(root / "dataset" / f"{movie}.json")
        # Genres outside the standard 23 (e.g. News, Talk-Show) are dropped, as in the usual preprocessing.
        for c in {genre_index[g] for g in genres if g in genre_index}:
            rows.append(row)
            cols.append(c)
        texts.append(plot)
    labels = _multi_hot(len(ids), len(MMIMDB_GENRES), np.array(rows, np.int64), np.array(cols, np.int64))
    return Split(_under(root / "dataset", ids, ".jpeg"), labels, tuple(texts))


def _imdb_ids(split_json, path: Path, split: str) -> list[str]:
    ids = _key(split_json, split, path, '{"train": [ids], "dev": [ids], "test": [ids]}')
    if not isinstance(ids, list) or not ids or not all(isinstance(i, (str, int)) for i in ids):
        raise DataError(f"{path}: key {split!r} is not a non-empty list of ids; expected MM-IMDB movie ids")
    return [str(i) for i in ids]


def _fedprime_imdb(train: Split, dev: Split, test: Split) -> tuple[tuple[str, ...], Split, Split, Split]:
    """FED-PRIME's protocol: single-genre movies only, then the 8 genres most frequent among them in train."""
    def single(split: Split) -> Split:
        keep = np.flatnonzero((split.labels == 1).sum(axis=1) == 1)
        return dataclasses.replace(split.subset(keep), labels=split.labels[keep].argmax(axis=1).astype(np.int64))

    train, dev, test = single(train), single(dev), single(test)
    mapping, names = _top_k_relabel(train.labels, MMIMDB_GENRES, FEDPRIME_IMDB_CLASSES)
    return names, _filter_split(train, mapping), _filter_split(dev, mapping), _filter_split(test, mapping)


def read_mmimdb(root: str | Path, protocol: str = "multilabel") -> Dataset:
    """MM-IMDB, 23 genres, image (poster) + text (first plot).

    Layout: ``root/split.json`` ({"train": [ids], "dev": [ids], "test": [ids]}),
    ``root/dataset/<id>.jpeg`` and ``root/dataset/<id>.json`` ("genres": list[str], "plot":
    list[str]). train = train, val = dev, test = test. ``protocol``:
    ``"multilabel"`` (default) -- int8 [n, 23] over the standard genres;
    ``"fedprime"`` -- FED-PRIME's single-label protocol: movies with exactly one (standard)
    genre, then the 8 genres most frequent among those in train (ties by name), int64 labels
    0..7 in frequency order; every split filtered.
    """
    if protocol not in ("multilabel", "fedprime"):
        raise ConfigError(f"protocol: expected 'multilabel' or 'fedprime', got {protocol!r}")
    root = _require_dir(root, "an MM-IMDB tree (split.json, dataset/)")
    split_path = root / "split.json"
    split_json = _read_json(split_path, '{"train": [ids], "dev": [ids], "test": [ids]}')
    train = _imdb_split(root, _imdb_ids(split_json, split_path, "train"))
    dev = _imdb_split(root, _imdb_ids(split_json, split_path, "dev"))
    test = _imdb_split(root, _imdb_ids(split_json, split_path, "test"))
    if protocol == "fedprime":
        names, train, dev, test = _fedprime_imdb(train, dev, test)
        return Dataset("mmimdb", names, False, train, test, val=dev)
    return Dataset("mmimdb", MMIMDB_GENRES, True, train, test, val=dev)


# --------------------------------------------------------------------------- registration

@dataclass(frozen=True)
class Food101Options:
    top_k: int | None = spec_field(None, "keep the k classes most frequent in train (FED-PRIME uses 8)", ge=1)


@dataclass(frozen=True)
class MMIMDBOptions:
    protocol: Literal["multilabel", "fedprime"] = spec_field(
        "multilabel", "23-genre multi-label, or FED-PRIME's single-genre top-8 protocol")


READERS = {
    "voc2007": read_voc2007,
    "coco2014": read_coco2014,
    "nuswide": read_nuswide,
    "food101": read_food101,
    "mmimdb": read_mmimdb,
}
_ON_DISK = {
    "voc2007": (lambda r: read_voc2007(r.root), None, "multi-label, 20 classes; val split off trainval"),
    "coco2014": (lambda r: read_coco2014(r.root), None, "multi-label, 80 classes; val split off train2014"),
    "nuswide": (lambda r: read_nuswide(r.root), None, "multi-label, 81 concepts; val split off train"),
    "food101": (lambda r: read_food101(r.root, top_k=r.options.top_k), Food101Options,
                "image + text, 101 classes (options.top_k); val split off train"),
    "mmimdb": (lambda r: read_mmimdb(r.root, protocol=r.options.protocol), MMIMDBOptions,
               "image + text, 23 genres (options.protocol); val is the official dev split"),
}
for _name, (_read, _options, _doc) in _ON_DISK.items():
    register_dataset(DatasetReader(_name, _read, _options, needs_root=True, doc=_doc))
