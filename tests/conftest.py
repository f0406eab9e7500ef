"""Shared fixtures: offline, the tiny CLIP and tiny ViLT pretrained by fedvlp itself, a small Ray, a sqlite MLflow."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# The pretrained tiny backbones are keyed by their recipe, so a cache shared across sessions is never stale.
os.environ.setdefault("FEDVLP_CACHE_DIR", str(REPO / ".fedvlp-cache"))
os.environ.pop("RAY_ADDRESS", None)
os.environ.pop("MLFLOW_TRACKING_URI", None)


@pytest.fixture(scope="session")
def tiny_clip():
    """The tiny CLIP pretrained by `fedvlp pretrain tiny-clip` (once per machine), with its zero-shot figures."""
    from safetensors import safe_open

    from fedvlp.backbones.pretrain_clip import ensure_tiny_clip

    path = ensure_tiny_clip(progress=False)
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    return {"path": path, "zero_shot_map": float(meta["zero_shot_map"]),
            "zero_shot_map_untrained": float(meta["zero_shot_map_untrained"])}


@pytest.fixture(scope="session")
def tiny_vilt():
    """The tiny ViLT pretrained by `fedvlp pretrain tiny-vilt` (once per machine), with its measured figures."""
    from fedvlp.backbones.pretrain import read_metadata
    from fedvlp.backbones.pretrain_vilt import ensure_tiny_vilt

    path = ensure_tiny_vilt(progress=False)
    meta = read_metadata(path)
    return {"path": path, **{k: float(v) for k, v in meta.items() if k.startswith(("itm_", "probe_"))}}


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray with explicit small resources; 4 logical GPUs so fractional placement is testable on CPU."""
    import ray

    ray.init(address="local", num_cpus=2, num_gpus=4, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture
def tracking_uri(tmp_path):
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def small_run(tracking_uri: str, tmp_path, *overrides: str):
    """A fast run spec on the quickstart config."""
    from fedvlp.config import load_spec

    return load_spec(None, [
        "data.num_train=1000", "data.num_test=512", "federation.clients=4", "federation.rounds=2",
        "method.local_epochs=4", f"tracking.uri={tracking_uri}", f"output_dir={tmp_path / 'runs'}",
        *overrides,
    ])
