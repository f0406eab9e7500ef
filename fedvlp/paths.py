"""Where fedvlp keeps things on disk."""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def cache_dir() -> Path:
    """The user cache dir (pretrained tiny backbones, feature caches); FEDVLP_CACHE_DIR overrides it."""
    path = Path(os.environ.get("FEDVLP_CACHE_DIR") or platformdirs.user_cache_dir("fedvlp"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def feature_cache_dir() -> Path:
    """Cached frozen features; FEDVLP_FEATURE_CACHE overrides (e.g. a larger disk)."""
    return Path(os.environ.get("FEDVLP_FEATURE_CACHE") or cache_dir() / "features")


def default_tracking_uri() -> str:
    """MLFLOW_TRACKING_URI if set, else a sqlite store in the working directory."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"
