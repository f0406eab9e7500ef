"""Methods by name, and what a method class must be to register.

`@register` checks a method when its module is imported, not in round 1: its name, its `Params` (a
frozen dataclass whose every field has help text), its `backbone_kind` and `feature_kind`, and that
every value of its `server_rules` is a known server rule (`fedvlp.platform.aggregation.RULES`) or
`"local"`. Register a plugin's server rules before the methods that use them.

The built-ins' modules (torch) are imported on the first use of METHODS; `declaration` answers what the config
and a run's driver ask of a method without importing them.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from fedvlp.registry import Registry
from fedvlp.spec import check_params_class

if TYPE_CHECKING:
    from fedvlp.methods.base import Method
    from fedvlp.methods.declarations import MethodDeclaration

BUILT_IN_MODULES = ("dualcoop", "fedavg_p", "fedlora", "fedmpt", "fedotp", "fedprime", "fedtpg", "promptfl", "zeroshot")

FEATURE_KINDS = {"clip": ("global", "tokens"), "vilt": ("embeddings",)}


def _check_method(name: str, cls) -> None:
    from fedvlp.platform.aggregation import LOCAL, RULES

    owner = f"method {name!r} ({getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', cls)})"
    if getattr(cls, "name", None) != name:
        raise TypeError(f"{owner}: its class attribute name must be {name!r}")
    check_params_class(getattr(cls, "Params", None), owner)
    kinds = FEATURE_KINDS.get(getattr(cls, "backbone_kind", ""))
    if kinds is None:
        raise ValueError(f"{owner}: backbone_kind must be one of {', '.join(FEATURE_KINDS)}, got {cls.backbone_kind!r}")
    if cls.feature_kind not in kinds:
        raise ValueError(f"{owner}: feature_kind must be one of {', '.join(kinds)} for a {cls.backbone_kind} "
                         f"backbone, got {cls.feature_kind!r}")
    rules = getattr(cls, "server_rules", None)
    if not isinstance(rules, dict) or "" not in rules:
        raise ValueError(f"{owner}: server_rules must map parameter-name prefixes to rules, with a default for ''")
    for prefix, rule in rules.items():
        if rule != LOCAL and rule not in RULES:
            raise ValueError(f"{owner}: server_rules[{prefix!r}] = {rule!r} is not a server rule "
                             f"(expected one of: {', '.join(RULES.names())}, or {LOCAL!r})")
    from fedvlp.methods.base import Method

    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise TypeError(f"{owner}: a method is a subclass of fedvlp.methods.base.Method")
    for hook in ("local_update", "forward"):
        if getattr(cls, hook) is getattr(Method, hook):
            raise TypeError(f"{owner}: implement {hook}() (see the contract in fedvlp.methods.base.Method)")


def _import_built_ins() -> None:
    for module in BUILT_IN_MODULES:
        importlib.import_module(f"fedvlp.methods.{module}")


METHODS: Registry[type[Method]] = Registry("method", "method.name", _check_method, load=_import_built_ins)


def declaration(name: str) -> type[MethodDeclaration]:
    """A method's name, Params, backbone_kind, feature_kind and server_rules: a built-in's from
    `fedvlp.methods.declarations`, without importing its module; any other's from its registered class."""
    from fedvlp.methods.declarations import BUILT_IN

    return BUILT_IN[name] if name in BUILT_IN else METHODS.get(name)


def register(cls):
    """Class decorator: register a `Method` subclass under its `name`."""
    METHODS.add(getattr(cls, "name", ""), cls)
    return cls
