"""Methods by name."""
from __future__ import annotations

METHODS: dict[str, type] = {}


def register(cls):
    if cls.name in METHODS:
        raise ValueError(f"method {cls.name!r} is registered twice")
    METHODS[cls.name] = cls
    return cls
