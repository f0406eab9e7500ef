"""The frozen features a run's workers train and evaluate on: encoded once by the workers (or read from the on-disk
cache), then handed out with each worker's clients' data and its share of the evaluation sets."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import ray

from fedvlp.backbones import FEATURE_CHUNK
from fedvlp.backbones.loaders import backbone_id
from fedvlp.data import FederatedData, Split
from fedvlp.data.feature_cache import FeatureCache, array_digest, feature_key
from fedvlp.platform.runtime.pool import wait_all

if TYPE_CHECKING:
    from fedvlp.platform.runtime.pool import WorkerPool


def _feature_sets(data: FederatedData, feature_kind: str) -> list[tuple[str, Split, np.ndarray | None]]:
    """What the workers encode: (name, split, missing table). The training split, the held-out pool of the
    clients' local test sets, val and test; for image+text methods val under the training setting, and the
    test split once per evaluation set ("test" is the training setting, then "test_full", "test_miss_image", ...);
    and a dataset's shifted split where it has one ("shift")."""
    dataset = data.dataset
    if feature_kind != "embeddings":
        named = [("train", dataset.train), ("holdout", data.holdout), ("val", data.val), ("test", dataset.test),
                 ("shift", dataset.shift)]
        return [(name, split, None) for name, split in named if split is not None]
    assert data.eval_missing is not None  # image+text data always has its evaluation tables
    return [("train", dataset.train, data.train_missing), ("holdout", data.holdout, data.holdout_missing),
            ("val", data.val, data.val_missing)] + [
        (_eval_set_name(name), dataset.test, table) for name, table in data.eval_missing.items()]


def _eval_set_name(name: str) -> str:
    """The test set under the training setting is "test"; the six fixed sets are "test_<name>"."""
    return "test" if name == "train_setting" else f"test_{name}"


def _frozen_features(spec, data, workers: list, worker: dict, say) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Frozen features of every set to encode: from the on-disk cache, else encoded by the workers in parallel.

    Samples are encoded in fixed chunks, so a feature never depends on which worker computed it.
    """
    cache = FeatureCache() if spec.data.feature_cache else None
    out, status = {}, {}
    for name, split, table in _feature_sets(data, worker["feature_kind"]):
        if not len(split):  # an empty held-out pool: no local test sets
            out[name] = np.zeros((0,), np.float16)
            continue
        parts = {"backbone": backbone_id(spec), "dataset": data.dataset.name, "split": name.split("_")[0],
                 "images": split.images.cache_key(), "transform": worker["transform"], "kind": worker["feature_kind"]}
        if table is not None:  # image+text inputs: the exact texts and missing pattern too
            parts.update(texts=array_digest(np.array(split.texts)), missing=array_digest(table))
        key = feature_key(**parts)
        features = cache.get(key) if cache is not None else None
        status[f"feature_cache.{name}"] = "off" if cache is None else ("hit" if features is not None else "miss")
        if features is None:
            source = ray.put((split.images, split.texts, table))
            chunks = [(s, min(s + FEATURE_CHUNK, len(split))) for s in range(0, len(split), FEATURE_CHUNK)]
            refs = [w.encode.remote(source, chunks[i :: len(workers)]) for i, w in enumerate(workers)]
            blocks = [b for per_worker in wait_all(refs, f"encoding {name} features", spec.resources.startup_timeout_s,
                                                "resources.startup_timeout_s") for b in per_worker]
            features = np.concatenate([f for _, f in sorted(blocks, key=lambda b: b[0])])
            if cache is not None:
                cache.put(key, features, parts)
                say(f"fedvlp: cached {name} features {features.shape} in {cache.root}")
        out[name] = np.asarray(features)
    return out, status


def attach_data(spec, data, pool: WorkerPool, worker: dict, say) -> dict[str, str]:
    """Give every worker its clients' training data and local test sets, and its share of the evaluation blocks."""
    features, cache_status = _frozen_features(spec, data, pool.actors, worker, say)
    dataset = data.dataset
    train_ref = ray.put((features.pop("train"), data.train_labels, data.train_missing))
    holdout_ref = ray.put((features.pop("holdout"), data.holdout.labels, data.holdout_missing))
    missing = {"val": data.val_missing, **{_eval_set_name(n): t for n, t in (data.eval_missing or {}).items()}}
    eval_ref = ray.put({name: (f, missing.get(name)) for name, f in features.items()})
    pool.attach(train_ref, holdout_ref, data.parts, {"personal": data.local_tests, "personal_val": data.local_vals},
                eval_ref,
                max(len(data.val), len(dataset.test), len(dataset.shift or ())))
    return cache_status
