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


# ---------------------------------------------------------------- the synthetic datasets as registered readers

SYNTHETIC_SPLITS = ("train", "val", "test", "holdout")


def _read_synthetic(name: str, generate, multilabel: bool, request, shift: bool = False):
    """Every split generated from its own seed stream, so val and the held-out pool never overlap train; with
    `shift`, also the generator's `shift` split, as large as test. The pixels are rendered only where they are
    loaded (`GeneratedImages`)."""
    from fedvlp.data.dataset import Dataset, Split
    from fedvlp.data.images import GeneratedImages

    sizes = {"train": request.num_train, "val": request.num_val, "test": request.num_test,
             "holdout": request.num_holdout, **({"shift": request.num_test} if shift else {})}
    splits = {}
    for split, size in sizes.items():
        made = generate(size, split, request.seed, render=False)
        labels = made.labels.astype(np.int8) if multilabel else made.labels
        splits[split] = Split(GeneratedImages(generate, size, split, request.seed), labels,
                              getattr(made, "texts", None))
    class_names = tuple(made.class_names)
    return Dataset(name, class_names, multilabel, **splits)


def _scenes(request):
    from fedvlp.data.scenes import generate_scenes

    return _read_synthetic("synthetic-scenes", generate_scenes, True, request, shift=True)


def _recipes(request):
    from fedvlp.data.recipes import generate_recipes

    return _read_synthetic("synthetic-recipes", generate_recipes, False, request)


def _register() -> None:
    from fedvlp.data.registry import DatasetReader, register_dataset

    register_dataset(DatasetReader("synthetic-scenes", _scenes, needs_root=False,
                                   doc="multi-label, 20 classes (5 shapes x 4 colours), generated from the seed"))
    register_dataset(DatasetReader("synthetic-recipes", _recipes, needs_root=False,
                                   doc="image + text, single-label, 16 classes, generated from the seed"))


_register()
