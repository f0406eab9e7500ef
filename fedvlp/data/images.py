"""Images of a split, loaded lazily at a requested square size.

Three sources satisfy `ImageSource`:

* `ArrayImages` -- uint8 [n, H, W, 3] already in memory. `load` returns the
  pixels unchanged when H == W == size, else resizes each image straight to size x size (PIL
  bicubic, aspect ratio not kept).
* `GeneratedImages` -- a synthetic generator's images, rendered on their first `load` in the
  process that loads them (a worker encoding features on a cache miss): a driver whose features
  are cached never renders them. Then as `ArrayImages`.
* `FileImages` -- image files on disk, opened only when loaded. Transform: convert to RGB,
  resize so the shorter side is `size` (PIL bicubic), then centre-crop to size x size (the
  usual CLIP / ViLT evaluation transform).

`cache_key()` is a stable hex string naming the exact image set; the feature cache keys on it
(together with the backbone and transform), so it must change whenever any pixel can change.
"""
from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
from PIL import Image

from fedvlp.errors import DataError


@runtime_checkable
class ImageSource(Protocol):
    """What every split's images are: a length, a loader and a cache key."""

    def __len__(self) -> int: ...

    def load(self, indices: Sequence[int], size: int) -> np.ndarray:
        """uint8 [len(indices), size, size, 3]."""
        ...

    def cache_key(self) -> str:
        """A stable string identifying the exact image set."""
        ...

    def subset(self, indices: np.ndarray) -> ImageSource:
        """The images at `indices`, in that order."""
        ...


def _check_size(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"size: expected a positive integer, got {size!r}")
    return int(size)


# eq=False: the generated __eq__/__hash__ would compare/hash the array field, which fails.
@dataclass(frozen=True, eq=False)
class ArrayImages:
    """In-memory uint8 images [n, H, W, 3]."""
    array: np.ndarray
    _key: list = field(default_factory=list, init=False, repr=False)   # memoised cache_key

    def __post_init__(self):
        a = self.array
        if not isinstance(a, np.ndarray) or a.dtype != np.uint8 or a.ndim != 4 or a.shape[3] != 3:
            got = f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
            raise DataError(f"images: expected a uint8 array [n, H, W, 3], got {got}")

    def __len__(self) -> int:
        return len(self.array)

    def load(self, indices: Sequence[int], size: int) -> np.ndarray:
        size = _check_size(size)
        batch = self.array[np.asarray(indices, dtype=np.int64)]
        if batch.shape[1:3] == (size, size):
            return batch                     # fancy indexing already copied
        out = np.empty((len(batch), size, size, 3), np.uint8)
        for i, image in enumerate(batch):
            out[i] = np.asarray(Image.fromarray(image).resize((size, size), Image.Resampling.BICUBIC))
        return out

    def subset(self, indices: np.ndarray) -> ArrayImages:
        return ArrayImages(self.array[np.asarray(indices, dtype=np.int64)])

    def cache_key(self) -> str:
        # All bytes are hashed: a strided sample could miss a changed pixel and serve stale features.
        if not self._key:
            digest = hashlib.sha256(repr(self.array.shape).encode())
            digest.update(np.ascontiguousarray(self.array).data)
            self._key.append(digest.hexdigest())
        return self._key[0]


@dataclass(frozen=True, eq=False)
class GeneratedImages:
    """The images of `generate(num_samples, split, seed)` (a synthetic world's generator: a module-level function,
    so it travels to workers by name, whose result has `.images`), or the rows `indices` of them.

    Its cache key names the generator and its arguments, not pixels it does not have: the source of the
    generator's module and of the seeding it draws from, and numpy's version, so that any change to how the
    pixels are drawn changes the key."""
    generate: Callable
    num_samples: int
    split: str
    seed: int
    indices: np.ndarray | None = None
    _rendered: list = field(default_factory=list, init=False, repr=False)  # memoised ArrayImages

    def __len__(self) -> int:
        return self.num_samples if self.indices is None else len(self.indices)

    def _pixels(self) -> ArrayImages:
        if not self._rendered:
            images = self.generate(self.num_samples, self.split, self.seed).images
            self._rendered.append(ArrayImages(images if self.indices is None else images[self.indices]))
        return self._rendered[0]

    def load(self, indices: Sequence[int], size: int) -> np.ndarray:
        return self._pixels().load(indices, size)

    def subset(self, indices: np.ndarray) -> GeneratedImages:
        rows = np.asarray(indices, dtype=np.int64)
        return GeneratedImages(self.generate, self.num_samples, self.split, self.seed,
                               rows if self.indices is None else self.indices[rows])

    def cache_key(self) -> str:
        from fedvlp import seeding

        digest = hashlib.sha256(f"{self.generate.__module__}.{self.generate.__qualname__} {self.num_samples} "
                                f"{self.split} {self.seed} numpy {np.__version__}".encode())
        for module in (sys.modules[self.generate.__module__], seeding):
            digest.update(Path(module.__file__).read_bytes())  # type: ignore[arg-type]  # modules with files
        if self.indices is not None:
            digest.update(np.ascontiguousarray(self.indices).data)
        return digest.hexdigest()


def _reason(exc: BaseException) -> str:
    """A one-line reason for a failed read, without repeating the path."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text


def _image_error(path: str, exc: BaseException) -> DataError:
    reason = _reason(exc).replace(f" {path!r}", "").replace(f" {path}", "")  # PIL repeats the path
    return DataError(f"{path}: cannot read image ({reason}); expected a JPEG/PNG file")


def resize_shorter_and_crop(image: Image.Image, size: int) -> Image.Image:
    """Resize so the shorter side is `size` (bicubic), then centre-crop to size x size."""
    width, height = image.size
    scale = size / min(width, height)
    new_w, new_h = max(size, round(width * scale)), max(size, round(height * scale))
    if (new_w, new_h) != (width, height):
        image = image.resize((new_w, new_h), Image.Resampling.BICUBIC)
    left, top = (new_w - size) // 2, (new_h - size) // 2
    return image.crop((left, top, left + size, top + size))


def _load_file(path: str, size: int) -> np.ndarray:
    try:
        with Image.open(path) as opened:
            image = opened.convert("RGB")   # forces the full decode, so truncation surfaces here
    # PIL reports broken files as OSError (incl. UnidentifiedImageError), SyntaxError, ValueError ...
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as exc:
        raise _image_error(path, exc) from None
    return np.asarray(resize_shorter_and_crop(image, size), dtype=np.uint8)


@dataclass(frozen=True)
class FileImages:
    """Image files (JPEG/PNG), opened only by `load`; see the module docstring for the transform."""
    paths: tuple[str, ...]

    def __post_init__(self):
        object.__setattr__(self, "paths", tuple(str(p) for p in self.paths))

    def __len__(self) -> int:
        return len(self.paths)

    def load(self, indices: Sequence[int], size: int) -> np.ndarray:
        size = _check_size(size)
        rows = np.asarray(indices, dtype=np.int64)
        out = np.empty((len(rows), size, size, 3), np.uint8)
        for i, index in enumerate(rows):
            out[i] = _load_file(self.paths[index], size)
        return out

    def subset(self, indices: np.ndarray) -> FileImages:
        return FileImages(tuple(self.paths[i] for i in np.asarray(indices, dtype=np.int64)))

    def cache_key(self) -> str:
        # Size + mtime (not content) so that keying 100k files costs one stat each.
        digest = hashlib.sha256(str(len(self.paths)).encode())
        for path in self.paths:
            try:
                st = os.stat(path)
            except OSError as exc:
                raise _image_error(path, exc) from None
            digest.update(f"\0{path}\0{st.st_size}\0{st.st_mtime_ns}".encode())
        return digest.hexdigest()
