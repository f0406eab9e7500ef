"""Typed, validated config dataclasses: the leaf every config section and every method's `Params` build on.

A field is declared once with `spec_field(default, help, ge=, gt=, le=, lt=, tune=)`: its type (the
annotation), its default, its range and its help text, and for a method's hyper-parameters the range
`fedvlp tune` searches. `build_dataclass` turns a mapping (YAML, `--set` overrides) into the dataclass
and raises a `ConfigError` whose one-line message names the dotted key of the first problem. This module
imports nothing of fedvlp but its errors, so the run config and the methods both build on it without
importing each other.
"""
from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fedvlp.errors import ConfigError

_EXPONENT_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
BOUNDS = {"ge": (lambda v, b: v >= b, ">="), "gt": (lambda v, b: v > b, ">"),
          "le": (lambda v, b: v <= b, "<="), "lt": (lambda v, b: v < b, "<")}


@dataclass(frozen=True)
class TuneRange:
    """The range `fedvlp tune` searches for one hyper-parameter.

    kind: "loguniform" / "uniform" (floats in [low, high]), "int" (integers in [low, high]), or
    "choice" (one of `values`)."""
    kind: Literal["loguniform", "uniform", "int", "choice"]
    low: float = 0.0
    high: float = 0.0
    values: tuple = ()

    def __post_init__(self):
        if self.kind == "choice":
            if not self.values:
                raise ValueError("TuneRange: a choice needs at least one value")
        elif not self.low < self.high or (self.kind == "loguniform" and self.low <= 0):
            raise ValueError(f"TuneRange: expected low < high (and low > 0 for loguniform), "
                             f"got {self.low}, {self.high}")

    def describe(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(map(str, self.values))
        return f"{self.kind} [{self.low:g}, {self.high:g}]"


def log_range(low: float, high: float) -> TuneRange:
    return TuneRange("loguniform", low, high)


def linear_range(low: float, high: float) -> TuneRange:
    return TuneRange("uniform", low, high)


def int_range(low: int, high: int) -> TuneRange:
    return TuneRange("int", low, high)


# The ranges every method of a backbone family declares for the keys they share, so `fedvlp tune` searches the same
# space for each (equal budgets mean little over unequal ranges). The CLIP family mixes Adam and SGD, so its
# learning rates span four decades.
CLIP_LR_RANGE = TuneRange("loguniform", 3e-4, 3.0)
CLIP_EPOCHS_RANGE = TuneRange("int", 1, 16)
VILT_LR_RANGE = TuneRange("loguniform", 3e-3, 0.5)
VILT_EPOCHS_RANGE = TuneRange("int", 1, 5)
# The ViLT prompt methods' own prompt learning rate (method.prompt_lr): the head's range and a decade above it.
VILT_PROMPT_LR_RANGE = TuneRange("loguniform", 3e-3, 5.0)


def choices(*values) -> TuneRange:
    return TuneRange("choice", values=tuple(values))


def spec_field(default, help: str, *, ge=None, gt=None, le=None, lt=None, tune: TuneRange | None = None):
    """A config field with its help text, an optional numeric range and an optional tuning range."""
    bounds = {"ge": ge, "gt": gt, "le": le, "lt": lt}
    metadata = {"help": help, **{k: v for k, v in bounds.items() if v is not None}}
    if tune is not None:
        metadata["tune"] = tune
    if isinstance(default, (dict, list)):  # mutable defaults need a factory
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def tuning_ranges(params_cls) -> dict[str, TuneRange]:
    """{field name: range} of the fields of a Params dataclass that declare one."""
    return {f.name: f.metadata["tune"] for f in dataclasses.fields(params_cls) if "tune" in f.metadata}


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def type_name(tp) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(tp)))
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is dict or tp is dict:
        return "a mapping"
    if typing.get_origin(tp) in (tuple, list):
        return "a list"
    return {int: "an integer", float: "a number", bool: "true/false", str: "a string", type(None): "null"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def coerce(value, tp, key: str):
    """`value` as type `tp`, or a ConfigError naming `key`."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if isinstance(tp, types.UnionType) or origin is typing.Union:
        for option in typing.get_args(tp):
            try:
                return coerce(value, option, key)
            except ConfigError:
                continue
    elif origin is Literal:
        if value in typing.get_args(tp):
            return value
    elif tp is type(None):
        if value is None:
            return None
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, str) and _EXPONENT_FLOAT.fullmatch(value.strip()):
            value = float(value)  # YAML 1.1 reads 1e-5 (no dot) as a string; it is meant as a number
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif origin in (tuple, list):
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        if isinstance(value, (list, tuple)):
            return tuple(coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value))
    elif origin is dict or tp is dict:
        key_tp, value_tp = typing.get_args(tp) or (Any, Any)
        if isinstance(value, dict):
            return {coerce(k, key_tp, key): coerce(v, value_tp, f"{key}.{k}") for k, v in value.items()}
    raise ConfigError(f"{key}: expected {type_name(tp)}, got {value!r}")


def check_range(value, meta: Mapping, key: str) -> None:
    if value is None or isinstance(value, (tuple, dict, str, bool)):
        return
    for name, (ok, symbol) in BOUNDS.items():
        if name in meta and not ok(value, meta[name]):
            raise ConfigError(f"{key}: expected a value {symbol} {meta[name]}, got {value!r}")


def build_dataclass(cls, raw: Any, prefix: str, given: dict | None = None):
    """Build dataclass `cls` from a mapping, naming the dotted key of the first problem.

    `given` holds fields already built by the caller (the method section, whose schema depends on
    the method's name). Nested dataclass fields are built from nested mappings.
    """
    given = given or {}
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in fields or key in given:
            raise ConfigError(f"{prefix}{key}: unknown key (expected one of: {', '.join(fields)})")
    values = dict(given)
    for name, f in fields.items():
        key = f"{prefix}{name}"
        if name not in raw or name in given:
            continue
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            values[name] = build_dataclass(tp, raw[name], f"{key}.")
        else:
            values[name] = coerce(raw[name], tp, key)
            check_range(values[name], f.metadata, key)
    try:
        return cls(**values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:  # a __post_init__ check of the dataclass itself
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: {exc}") from None


def check_params_class(cls, owner: str) -> None:
    """What a method's (or any plugin's) `Params` must be: a frozen dataclass whose every field has help
    text and, where it declares one, a valid tuning range; raises TypeError naming what to fix."""
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        raise TypeError(f"{owner}: Params must be a dataclass (@dataclass(frozen=True)), got {cls!r}")
    if not getattr(cls, "__dataclass_params__").frozen:  # noqa: B009  (mypy does not know the attribute)
        raise TypeError(f"{owner}: Params {cls.__name__} must be frozen (@dataclass(frozen=True))")
    for f in dataclasses.fields(cls):
        if not f.metadata.get("help"):
            raise TypeError(f"{owner}: Params field {f.name!r} has no help text; declare it with "
                            f"spec_field(default, 'what it means')")
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise TypeError(f"{owner}: Params field {f.name!r} has no default")
        if "tune" in f.metadata and not isinstance(f.metadata["tune"], TuneRange):
            raise TypeError(f"{owner}: Params field {f.name!r}: tune= must be a TuneRange (log_range, ...)")
