"""On-disk cache of frozen image features, shared by every run and sweep on a machine.

An entry is keyed by everything its numbers depend on: the backbone (name and exact weights),
the dataset and split, the exact image set, and the transform. It is stored as a float16
`.npy` file read back memory-mapped. The data file is renamed into place atomically and the
metadata file, written after it, is the completion marker: an entry without valid metadata,
or whose metadata disagrees with the data file, is never read as valid.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from fedvlp.paths import feature_cache_dir


def feature_key(**parts: str) -> str:
    """A short stable key over named parts (backbone, dataset, split, images, transform)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def array_digest(array: np.ndarray) -> str:
    """A short digest of an array's exact contents (texts, missing tables), for feature keys."""
    digest = hashlib.sha256(f"{array.dtype}{array.shape}".encode())
    digest.update(np.ascontiguousarray(array).tobytes() if array.dtype != object else repr(array.tolist()).encode())
    return digest.hexdigest()[:20]


class FeatureCache:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else feature_cache_dir()

    def _paths(self, key: str) -> tuple[Path, Path]:
        return self.root / f"{key}.npy", self.root / f"{key}.json"

    def get(self, key: str) -> np.ndarray | None:
        """The cached features [n, D] (float16, memory-mapped), or None if absent or incomplete."""
        data, meta = self._paths(key)
        try:
            info = json.loads(meta.read_text())
            features = np.load(data, mmap_mode="r")
        except (OSError, ValueError):
            return None
        if list(features.shape) != info.get("shape") or features.dtype != np.float16:
            return None
        return features

    def put(self, key: str, features: np.ndarray, parts: dict | None = None) -> Path:
        """Store features as float16; atomic, so a killed writer leaves nothing that reads as valid."""
        self.root.mkdir(parents=True, exist_ok=True)
        data, meta = self._paths(key)
        tmp = data.with_name(f"{data.stem}.{os.getpid()}.tmp.npy")
        np.save(tmp, np.ascontiguousarray(features, dtype=np.float16))
        os.replace(tmp, data)
        tmp_meta = meta.with_name(f"{meta.stem}.{os.getpid()}.tmp")
        tmp_meta.write_text(json.dumps({"shape": list(features.shape), "parts": parts or {}}, indent=1))
        os.replace(tmp_meta, meta)
        return data
