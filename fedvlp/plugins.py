"""Plugins: user modules that register methods, server rules, datasets and partitioners.

A plugin is an importable module (or package) whose import registers what it brings, with the same
decorators and `register_*` calls the built-ins use. fedvlp imports, in this order:

1. every entry point of the group `fedvlp.plugins` of the installed distributions
   (`[project.entry-points."fedvlp.plugins"] my_plugin = "my_package.plugin"`);
2. the modules named in `$FEDVLP_PLUGINS` (comma-separated);
3. the modules named in the config's `plugins: [module, ...]`.

They are imported in every process that builds or runs a spec: the driver (before the config is
validated, so a plugin's method names and keys are known), every ClientWorker, the Coordinator and
every Tune trial. A plugin that is not installed where Ray runs those processes (a module on the
driver's path, not a distribution) is shipped to them with Ray's runtime environment (`py_modules`):
its package directory, or its file.
A module that cannot be imported is a one-line `ConfigError`, before any cluster work: one that is not
found says so; one that is found but raises while importing names the exception and the line of the
plugin's code it came from; a broken entry point also names the distribution that installed it.
`FEDVLP_NO_ENTRY_POINTS=1` skips the entry points (in every process of a run it starts), so a broken
installed plugin cannot block fedvlp.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import sys
import sysconfig
import tempfile
import traceback
from pathlib import Path
from types import ModuleType

from fedvlp.errors import ConfigError

ENTRY_POINT_GROUP = "fedvlp.plugins"
ENV_VAR = "FEDVLP_PLUGINS"
NO_ENTRY_POINTS = "FEDVLP_NO_ENTRY_POINTS"  # set to 1: skip the installed distributions' entry points
_entry_points_loaded = False


def env_plugins() -> tuple[str, ...]:
    return tuple(name.strip() for name in os.environ.get(ENV_VAR, "").split(",") if name.strip())


def entry_points_skipped() -> bool:
    return os.environ.get(NO_ENTRY_POINTS, "").strip() not in ("", "0")


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded or entry_points_skipped():
        return
    _entry_points_loaded = True
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = entry_point.load()
            if callable(loaded) and not isinstance(loaded, ModuleType):
                loaded()  # an entry point may name a register() function instead of a module
        except Exception as exc:
            dist = entry_point.dist
            name, version = (dist.name, f" {dist.version}") if dist else (entry_point.module, "")
            raise ConfigError(f"plugins: the entry point {entry_point.name} = {entry_point.value} (group "
                              f"{ENTRY_POINT_GROUP}, from the installed distribution {name}{version}) "
                              f"{_failure(exc, entry_point.module)}; pip uninstall {name}, or set "
                              f"{NO_ENTRY_POINTS}=1 to skip installed plugins") from None


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _not_found(exc: BaseException, name: str) -> bool:
    """Whether `exc` says that module `name` itself (or a package above it) is not on the path."""
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    return missing is not None and (name == missing or name.startswith(f"{missing}."))


def _failure(exc: BaseException, name: str) -> str:
    """What went wrong importing module `name`: it is not on the path, or it is and raised `exc`, at the
    innermost line of the plugin's own code (its package, or its file) on the way to the error."""
    if _not_found(exc, name):
        return f"cannot be imported ({_reason(exc)})"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
    modules = [Path(f.filename) for f in frames if f.name == "<module>"]  # the first is the plugin's own
    own = []
    if modules:
        root = modules[0].parent if modules[0].name == "__init__.py" else modules[0]
        own = [f for f in frames if Path(f.filename) == root or root in Path(f.filename).parents]
    where = f" at {own[-1].filename}:{own[-1].lineno}" if own else ""
    return f"was found, but importing it failed{where} with {_reason(exc)}"


def load_plugins(names=()) -> list[ModuleType]:
    """Import the entry-point plugins, then each module in `names` (idempotent: a module imports once)."""
    _load_entry_points()
    modules = []
    for name in names:
        if not isinstance(name, str) or not name or not all(part.isidentifier() for part in name.split(".")):
            raise ConfigError(f"plugins: {name!r} is not a module name; expected a dotted Python module name "
                              f"such as my_package.fedvlp_plugin")
        try:
            modules.append(importlib.import_module(name))
        except Exception as exc:
            if _not_found(exc, name):
                raise ConfigError(f"plugins: cannot import {name!r} ({_reason(exc)}); expected a module on the Python "
                                  f"path (pip install it, or run from its parent directory)") from None
            raise ConfigError(f"plugins: {name!r} {_failure(exc, name)}") from None
    return modules


def _installed(path: Path) -> bool:
    """True if `path` lies in an installation directory (site-packages), where every node has it too."""
    roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    return any(Path(root) in path.parents for root in roots)


def py_modules(names) -> list[str]:
    """Paths for Ray's `runtime_env={"py_modules": ...}` that make the plugins `names` importable in processes on
    any node: the top-level package directory (or single-file module) of each plugin not installed in site-packages."""
    out: list[str] = []
    for name in names:
        top = name.split(".")[0]
        module = sys.modules.get(top) or importlib.import_module(top)
        location = list(module.__path__)[0] if getattr(module, "__path__", None) else module.__file__
        if location is None:
            raise ConfigError(f"plugin {name}: module {top} has no file to ship to the cluster")
        path = Path(location)
        if not _installed(path) and str(path) not in out:
            out.append(str(path))
    return out


def runtime_env(names) -> dict | None:
    """The job-level runtime environment (for `ray.init`) that ships the plugins `names`; None if nothing to ship."""
    modules = py_modules(names)
    return {**({"py_modules": modules} if modules else {}), **_skip_entry_points_env()} or None


def _skip_entry_points_env() -> dict:
    """$FEDVLP_NO_ENTRY_POINTS for the processes a run starts, which on other nodes do not inherit the driver's."""
    return {"env_vars": {NO_ENTRY_POINTS: "1"}} if entry_points_skipped() else {}


_uploaded: dict[tuple[str, ...], dict] = {}


def actor_runtime_env(names) -> dict | None:
    """The runtime environment for actors started in a Ray the caller initialised: Ray uploads local modules only
    at the job level, so the plugins are uploaded here (as ray.init would) and named by their package URIs."""
    modules = tuple(py_modules(names))
    if not modules:
        return _skip_entry_points_env() or None
    if modules not in _uploaded:
        from ray._private.runtime_env.py_modules import upload_py_modules_if_needed

        scratch = tempfile.mkdtemp(prefix="fedvlp-plugins-")
        try:
            _uploaded[modules] = upload_py_modules_if_needed({"py_modules": list(modules)}, include_gitignore=False,
                                                             scratch_dir=scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return {**_uploaded[modules], **_skip_entry_points_env()}
