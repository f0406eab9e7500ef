"""Space files: what `fedvlp sweep SPACE` reads, validated before Ray starts, and the run spec of each of its
trials. (`sweep` runs them; `report` groups the trials by these keys.)

A space file (a path, or the name of one shipped in fedvlp/tune_spaces):

    base: quickstart                        # run config: a shipped name, or a path relative to the space file
    name: heterogeneity                     # Tune experiment and MLflow experiment "sweep-<name>"
    set: {federation.rounds: 5}             # fixed overrides (dotted keys)
    space:                                  # dotted key -> one of grid / choice / uniform / loguniform
      federation.heterogeneity: {grid: [0.1, 0.4, 0.7, 1.0]}
      method.name: {grid: [promptfl, zeroshot]}
    variants:                               # optional: named sets of overrides, swept as a grid ("variant")
      full: {}
      no_gate: {method.gate: false}
    method_settings:                        # optional: whenever a trial runs that method, its settings come
      fedmpt: fedmpt_scenes                 #   from the `method:` section of a run config (its tuned one),
      dualcoop: {method.region_scale: 5.0}  #   or from a mapping of dotted keys; swept values still win
    seeds: [0, 1, 2]
    metric: val_mAP                         # what ASHA and "best" read: a val_* metric, never a test one
    mode: max
    reference: promptfl                     # optional: the report's paired differences are against this method
    scheduler: {type: none}                 # or {type: asha, grace_period: 2, reduction_factor: 2}
    num_samples: 1                          # samples of the random (choice/uniform) part per grid point
    max_concurrent_trials: 2
"""
from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedvlp.config import build_spec, read_config, read_yaml, resolve_base, set_dotted
from fedvlp.errors import ConfigError

SPACE_KEYS = {"base", "name", "set", "space", "variants", "method_settings", "seeds", "metric", "mode", "scheduler",
              "num_samples", "max_concurrent_trials", "trial_cpus", "storage", "reference", "minutes_per_trial"}
VARIANT_KEY = "variant"
DISTRIBUTIONS = ("grid", "choice", "uniform", "loguniform")


@dataclass(frozen=True)
class SweepSpec:
    path: Path
    name: str
    base: dict                      # the base run config with the fixed overrides applied
    space: dict[str, tuple[str, Any]]
    seeds: tuple[int, ...]
    metric: str
    mode: str
    scheduler: dict = field(default_factory=lambda: {"type": "none"})
    num_samples: int = 1
    max_concurrent_trials: int = 1
    trial_cpus: float = 0.25
    storage: Path = Path("ray_results")
    variants: dict[str, dict] = field(default_factory=dict)
    method_settings: dict[str, dict] = field(default_factory=dict)
    reference: str | None = None
    minutes_per_trial: float | None = None  # measured on 2 cores at the space's concurrency: the estimate's basis

    @property
    def experiment(self) -> str:
        return f"sweep-{self.name}"

    @property
    def swept_keys(self) -> list[str]:
        return list(self.space)

    @property
    def trial_count(self) -> int:
        """Trials the sweep runs: every grid point (and num_samples draws of the rest) for every seed."""
        grid = math.prod(len(values) for kind, values in self.space.values() if kind == "grid")
        return grid * self.num_samples * len(self.seeds)


def _fail(path, key: str, expected: str, got=None) -> ConfigError:
    tail = "" if got is None else f", got {got!r}"
    return ConfigError(f"{path}: {key}: expected {expected}{tail}")


def check_selection_metric(metric, where: str) -> str:
    """What selects (a sweep's best trial, ASHA, `fedvlp tune`) reads a val_* metric, or personal_val_* (each
    client's own model on its local val set); never a test, shift or local test (personal_*) one."""
    from fedvlp.platform.metrics import split_metric

    if not isinstance(metric, str) or split_metric(metric)[0] not in ("val", "personal_val"):
        raise ConfigError(f"{where}: expected a val_* metric such as val_mAP or val_accuracy, or personal_val_* (the "
                          f"clients' local val sets); selection never reads test, shift or personal (local test) "
                          f"metrics, got {metric!r}")
    return metric


def load_sweep(path: str | Path, overrides: list[str] | None = None, seeds: list[int] | None = None,
               methods: list[str] | None = None, grids: list[str] | None = None) -> SweepSpec:
    """Read and validate a space file; every grid point is checked as a run config before Ray starts.

    A study cut down from the command line: `seeds` replaces the space's seeds, `methods` keeps these of its
    methods (the `method.name` grid, or the named variants), and each of `grids` ("KEY=V1,V2", `--values`) replaces
    the grid of a swept KEY."""
    from fedvlp.config import SPACES_DIR, apply_overrides, resolve_file

    path = resolve_file(path, SPACES_DIR, "space")
    raw = cut_down(read_yaml(path), seeds, methods, grids)
    for key in raw:
        if key not in SPACE_KEYS:
            raise ConfigError(f"{path}: {key}: unknown key (expected one of: {', '.join(sorted(SPACE_KEYS))})")
    for key in ("base", "space", "metric"):
        if key not in raw:
            raise _fail(path, key, "a value (required)")
    base = read_config(resolve_base(raw["base"], path))
    fixed = raw.get("set") or {}
    if not isinstance(fixed, dict):
        raise _fail(path, "set", "a mapping of dotted keys to values", fixed)
    for key, value in fixed.items():
        set_dotted(base, key, value)
    apply_overrides(base, list(overrides or []))
    # Trials run in their own working directories: pin every relative location to this one.
    base.setdefault("tracking", {})["uri"] = absolute_uri(base.get("tracking", {}).get("uri"))
    base["output_dir"] = str(Path(base.get("output_dir", "fedvlp-runs")).resolve())
    if base.get("data", {}).get("root"):
        base["data"]["root"] = str(Path(base["data"]["root"]).expanduser().resolve())

    space = {}
    method_settings = raw.get("method_settings") or {}
    if not isinstance(method_settings, dict) or \
            not all(isinstance(v, (dict, str)) for v in method_settings.values()):
        raise _fail(path, "method_settings", "a mapping of method names to run config names or to mappings of "
                    "dotted keys to values", method_settings)
    method_settings = {name: _settings_of(value, name, path) for name, value in method_settings.items()}
    variants = raw.get("variants")
    if variants is not None:
        if not isinstance(variants, dict) or not variants or \
                not all(isinstance(v, dict) or v is None for v in variants.values()):
            raise _fail(path, "variants", "a mapping of names to mappings of dotted keys to values", variants)
        space[VARIANT_KEY] = ("grid", list(variants))
    if not isinstance(raw["space"], dict) or (not raw["space"] and variants is None):
        raise _fail(path, "space", "a non-empty mapping of dotted keys to distributions", raw["space"])
    for key, dist in (raw["space"] or {}).items():
        if not isinstance(dist, dict) or len(dist) != 1 or next(iter(dist)) not in DISTRIBUTIONS:
            raise _fail(path, f"space.{key}", f"one of {{{', '.join(d + ': ...' for d in DISTRIBUTIONS)}}}", dist)
        kind, values = next(iter(dist.items()))
        if kind in ("grid", "choice") and (not isinstance(values, list) or not values):
            raise _fail(path, f"space.{key}.{kind}", "a non-empty list", values)
        if kind in ("uniform", "loguniform"):
            if not (isinstance(values, list) and len(values) == 2 and all(isinstance(v, (int, float)) for v in values)
                    and values[0] < values[1] and (kind == "uniform" or values[0] > 0)):
                raise _fail(path, f"space.{key}.{kind}", "[low, high] with low < high (and low > 0 for loguniform)",
                            values)
        space[key] = (kind, values)
    seeds = raw.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise _fail(path, "seeds", "a non-empty list of non-negative integers", seeds)
    check_selection_metric(raw["metric"], f"{path}: metric")
    mode = raw.get("mode", "max")
    if mode not in ("max", "min"):
        raise _fail(path, "mode", "max or min", mode)
    reference = raw.get("reference")
    if reference is not None and not isinstance(reference, str):
        raise _fail(path, "reference", "a method name", reference)
    scheduler = raw.get("scheduler") or {"type": "none"}
    if not isinstance(scheduler, dict) or scheduler.get("type") not in ("none", "asha") or \
            set(scheduler) - {"type", "grace_period", "reduction_factor"}:
        raise _fail(path, "scheduler", "{type: none} or {type: asha, grace_period: N, reduction_factor: F}", scheduler)
    for key, low in (("num_samples", 1), ("max_concurrent_trials", 1)):
        if not isinstance(raw.get(key, 1), int) or raw.get(key, 1) < low:
            raise _fail(path, key, f"an integer >= {low}", raw.get(key))
    trial_cpus = raw.get("trial_cpus", 0.25)
    if not isinstance(trial_cpus, (int, float)) or trial_cpus <= 0:
        raise _fail(path, "trial_cpus", "a number > 0", trial_cpus)
    minutes = raw.get("minutes_per_trial")
    if minutes is not None and (not isinstance(minutes, (int, float)) or minutes <= 0):
        raise _fail(path, "minutes_per_trial", "a number > 0 (minutes a trial took on 2 cores)", minutes)

    sweep = SweepSpec(path=path, name=str(raw.get("name") or path.stem), base=base, space=space,
                      variants={name: dict(v or {}) for name, v in (variants or {}).items()},
                      method_settings=method_settings,
                      seeds=tuple(seeds), metric=str(raw["metric"]), mode=mode, scheduler=scheduler,
                      num_samples=raw.get("num_samples", 1), max_concurrent_trials=raw.get("max_concurrent_trials", 1),
                      trial_cpus=float(trial_cpus), storage=Path(raw.get("storage", "ray_results")),
                      reference=reference, minutes_per_trial=minutes)
    for point in _validation_points(sweep):
        try:
            trial_spec(sweep, point, parent_run_id="validation")
        except ConfigError as exc:
            raise ConfigError(f"{path}: trial {point}: {exc}") from None
    # A trial on another node does not see this process's $FEDVLP_PLUGINS: its config names them.
    base["plugins"] = list(trial_spec(sweep, {"seed": sweep.seeds[0]}, "plugins").plugins)
    return sweep


def cut_down(raw: dict, seeds: list[int] | None, methods: list[str] | None, grids: list[str] | None) -> dict:
    """The space file's fields with the command line's cuts (`load_sweep`), each checked in one line."""
    import yaml

    raw = copy.deepcopy(raw)
    if seeds is not None:
        raw["seeds"] = list(seeds)
    if methods is not None:
        variants, grid = raw.get("variants"), (raw.get("space") or {}).get("method.name", {}).get("grid")
        offered = list(variants) if variants else grid
        if not offered:
            raise ConfigError("--methods: this space sweeps no method (no variants and no method.name grid)")
        unknown = [m for m in methods if m not in offered]
        if unknown:
            raise ConfigError(f"--methods: {', '.join(unknown)} not in this space; expected some of "
                              f"{', '.join(map(str, offered))}")
        if variants:
            raw["variants"] = {name: v for name, v in variants.items() if name in methods}
        else:
            raw["space"]["method.name"] = {"grid": [m for m in grid if m in methods]}
    for text in grids or []:
        key, sep, listed = text.partition("=")
        swept = (raw.get("space") or {}).get(key)
        if not sep or not listed:
            raise ConfigError(f"--values: expected KEY=V1,V2,..., got {text!r}")
        if not isinstance(swept, dict) or "grid" not in swept:
            raise ConfigError(f"--values {key}: not a grid key of this space; expected one of "
                              f"{', '.join(k for k, d in (raw.get('space') or {}).items() if 'grid' in d) or 'none'}")
        raw["space"][key] = {"grid": [yaml.safe_load(v) for v in listed.split(",")]}
    return raw


def _settings_of(value: dict | str, method: str, space_path: Path) -> dict:
    """A method's settings as dotted keys: the mapping given, or the `method:` section of the run config named."""
    if isinstance(value, dict):
        return value
    section = read_config(resolve_base(value, space_path)).get("method") or {}
    if section.get("name") != method:
        raise _fail(space_path, f"method_settings.{method}", f"a run config of method {method}", value)
    return {f"method.{key}": v for key, v in section.items() if key != "name"}


def _validation_points(sweep: SweepSpec):
    """Every grid/choice combination (range ends for uniform/loguniform), with the first seed."""
    options = {k: (values if kind in ("grid", "choice") else list(values)) for k, (kind, values) in sweep.space.items()}
    for combo in itertools.product(*options.values()):
        yield {"seed": sweep.seeds[0], **dict(zip(options, combo))}


def trial_spec(sweep: SweepSpec, config: dict, parent_run_id: str):
    """The run spec of one trial: base config + the trial's sampled values (+ sweep tracking)."""
    raw = copy.deepcopy(sweep.base)
    values = dict(config)
    values.update(sweep.variants.get(values.pop(VARIANT_KEY, None), {}))
    if "method.name" in values:  # a method switch first: it drops the base method's settings
        set_dotted(raw, "method.name", values.pop("method.name"))
    for key, value in {**sweep.method_settings.get(raw["method"]["name"], {}), **values}.items():
        set_dotted(raw, key, value)
    raw["tracking"]["experiment"] = sweep.experiment
    raw["tracking"]["run_name"] = trial_name(sweep, config, raw["method"]["name"])
    return build_spec(raw)


def trial_name(sweep: SweepSpec, config: dict, method: str) -> str:
    """`<method> <swept values> seed <s>`: what the MLflow runs table shows for a trial."""
    swept = [f"{key.rsplit('.', 1)[-1]}={config[key]}" for key in sweep.swept_keys
             if key != "method.name" and key in config]
    return " ".join([method, *swept, f"seed {config.get('seed', '?')}"])


def absolute_uri(uri: str | None) -> str:
    """Trials run in other working directories: a relative sqlite path must not move with them."""
    from fedvlp.paths import default_tracking_uri

    uri = uri or default_tracking_uri()
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    return uri
