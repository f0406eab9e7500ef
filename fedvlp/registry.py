"""Named registries: methods, server rules, datasets and partitioners are all found by name here.

Built-ins register exactly as plugins do (`fedvlp.plugins`). Registration validates what it is given
(the name's form, duplicates, and whatever the registry's `check` demands) and raises a TypeError or
ValueError that says what to fix, at import time of the module that registers, not in round 1. A
lookup of an unknown name is a one-line `ConfigError` naming the config key and the known names.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from fedvlp.errors import ConfigError

T = TypeVar("T")
NAME_FORM = re.compile(r"^[a-z][a-z0-9_-]*$")


class Registry(Generic[T]):
    """name -> entry for one kind of extension (`kind`), looked up from the config key `key`."""

    def __init__(self, kind: str, key: str, check: Callable[[str, T], None] | None = None,
                 load: Callable[[], None] | None = None):
        self.kind, self.key, self.check = kind, key, check
        self._entries: dict[str, T] = {}
        self._load = load  # registers the built-ins, on first use: importing them may be costly (torch)

    def _loaded(self) -> dict[str, T]:
        if self._load is not None:
            load, self._load = self._load, None
            load()
        return self._entries

    def add(self, name: str, entry: T) -> T:
        if not isinstance(name, str) or not NAME_FORM.match(name):
            raise ValueError(f"{self.kind} name {name!r}: expected lowercase letters, digits, '_' or '-', "
                             f"starting with a letter")
        if name in self._loaded():
            raise ValueError(f"{self.kind} {name!r} is registered twice; pick another name")
        if self.check is not None:
            self.check(name, entry)
        self._entries[name] = entry
        return entry

    def get(self, name: str) -> T:
        if name not in self._loaded():
            raise ConfigError(f"{self.key}: unknown {self.kind} {name!r} (expected one of: {', '.join(self.names())}; "
                              f"plugins register more, see docs/extending.md)")
        return self._entries[name]

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._loaded()

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._loaded()))

    def __len__(self) -> int:
        return len(self._loaded())

    def names(self) -> list[str]:
        return sorted(self._loaded())

    def items(self):
        return sorted(self._loaded().items())

    def remove(self, name: str) -> None:
        """Forget `name` (tests that register throwaway entries clean up with this)."""
        self._loaded().pop(name, None)
