"""`fedvlp sweep SPACE`: a Ray Tune search over whole federated runs.

Each trial is one `run_federated` call, reserving its own placement group (one bundle for the
trial itself, one for its coordinator, one per worker), reporting and checkpointing every
round. The sweep is one MLflow experiment with a parent run and one nested run per trial.
`--resume` continues an interrupted sweep: finished trials are kept, unfinished ones continue
from their last round checkpoint in their own MLflow run.

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
import json
import math
import os
import pickle
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedvlp.config import build_spec, read_config, read_yaml, resolve_base, set_dotted
from fedvlp.errors import ConfigError, FedvlpError

if TYPE_CHECKING:
    from ray.tune import Callback

SPACE_KEYS = {"base", "name", "set", "space", "variants", "method_settings", "seeds", "metric", "mode", "scheduler",
              "num_samples", "max_concurrent_trials", "trial_cpus", "storage", "reference", "minutes_per_trial"}
VARIANT_KEY = "variant"
DISTRIBUTIONS = ("grid", "choice", "uniform", "loguniform")
PARENT_FILE = "fedvlp_sweep.json"


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
    base.setdefault("tracking", {})["uri"] = _absolute_uri(base.get("tracking", {}).get("uri"))
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


def _absolute_uri(uri: str | None) -> str:
    """Trials run in other working directories: a relative sqlite path must not move with them."""
    from fedvlp.paths import default_tracking_uri

    uri = uri or default_tracking_uri()
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    return uri


# ---------------------------------------------------------------- running

def _param_space(sweep: SweepSpec) -> dict:
    from ray import tune

    build = {"grid": tune.grid_search, "choice": tune.choice, "uniform": lambda v: tune.uniform(*v),
             "loguniform": lambda v: tune.loguniform(*v)}
    space = {key: build[kind](values) for key, (kind, values) in sweep.space.items()}
    space["seed"] = tune.grid_search(list(sweep.seeds))
    return space


def _trial(config: dict, sweep: SweepSpec, parent_run_id: str) -> None:
    """One Tune trial = one whole federated run, reporting and checkpointing every round."""
    from ray import tune

    from fedvlp.platform.checkpoint import read_checkpoint
    from fedvlp.platform.engine import run_federated

    spec = trial_spec(sweep, config, parent_run_id)
    trial_id = tune.get_context().get_trial_id()
    tags = {"mlflow.parentRunId": parent_run_id, "fedvlp.role": "trial", "sweep": sweep.name, "tune_trial_id": trial_id,
            "seed": str(config["seed"]), **{f"swept.{k}": str(config[k]) for k in sweep.swept_keys}}
    checkpoint = tune.get_checkpoint()
    resume = None
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            resume = read_checkpoint(Path(directory) / "checkpoint.pt")
    _delete_stale_attempts(spec.tracking.uri, parent_run_id, trial_id, keep=resume["run_id"] if resume else None)

    def report(round_index: int, metrics: dict, checkpoint_path: Path) -> None:
        with tempfile.TemporaryDirectory() as directory:
            shutil.copy(checkpoint_path, Path(directory) / "checkpoint.pt")
            tune.report({**metrics, "round": round_index, "mlflow_run_id": _run_id_of(checkpoint_path)},
                        checkpoint=tune.Checkpoint.from_directory(directory))

    run_federated(spec, progress=False, on_round=report, tags=tags, resume=resume)


def _delete_stale_attempts(uri: str, parent_run_id: str, trial_id: str, keep: str | None) -> None:
    """Runs of this trial from an interrupted attempt that Tune will not continue: one nested run per trial."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(parent_run_id)
    stale = client.search_runs([parent.info.experiment_id],
                               filter_string=f"tags.tune_trial_id = '{trial_id}' and "
                                             f"tags.mlflow.parentRunId = '{parent_run_id}'")
    for run in stale:
        if run.info.run_id != keep:
            client.delete_run(run.info.run_id)


def _run_id_of(checkpoint_path: Path) -> str:
    return Path(checkpoint_path).parent.name  # checkpoints live in <output_dir>/<run id>/


def _trial_resources(sweep: SweepSpec):
    from ray import tune

    from fedvlp.platform.engine import run_bundles

    def resources(config: dict):
        spec = trial_spec(sweep, config, parent_run_id="resources")
        # The trial itself stays on the head node, where the MLflow server and Tune's storage are.
        trial_bundle = {"CPU": sweep.trial_cpus, "node:__internal_head__": 0.001}
        return tune.PlacementGroupFactory([trial_bundle] + run_bundles(spec))

    return resources


def run_sweep(sweep: SweepSpec, resume: bool = False, progress: bool = True):
    """Run (or resume) the sweep; returns Tune's ResultGrid."""
    import ray
    from ray import tune

    from fedvlp.platform.engine import ensure_ray
    from fedvlp.platform.tracking import open_experiment

    storage = sweep.storage.resolve()
    experiment_dir = storage / sweep.name
    state_file = experiment_dir / PARENT_FILE
    uri = sweep.base["tracking"]["uri"]
    if resume and not (state_file.exists() and tune.Tuner.can_restore(str(experiment_dir))):
        raise FedvlpError(f"--resume: no interrupted sweep '{sweep.name}' in {experiment_dir}")
    for name in recover_cut_state(experiment_dir) if resume else []:
        print(f"fedvlp: --resume: {name} was cut off when the driver died; using Tune's whole staged copy",
              file=sys.stderr)
    if not resume and experiment_dir.exists():
        raise FedvlpError(f"{experiment_dir}: a sweep named '{sweep.name}' exists already; "
                          f"pass --resume to continue it, or remove the folder to start over")

    client, experiment_id = open_experiment(uri, sweep.experiment)
    if resume:
        parent_run_id = json.loads(state_file.read_text())["parent_run_id"]
        client.update_run(parent_run_id, status="RUNNING")
    else:
        parent = client.create_run(experiment_id, run_name=sweep.name, tags={
            "fedvlp.role": "sweep", "sweep": sweep.name, "swept_keys": ",".join(sweep.swept_keys),
            "metric": sweep.metric, "mode": sweep.mode, **({"reference": sweep.reference} if sweep.reference else {})})
        parent_run_id = parent.info.run_id
        client.log_text(parent_run_id, sweep.path.read_text(), "space.yaml")
        experiment_dir.mkdir(parents=True, exist_ok=True)
        state_file.write_text(json.dumps({"parent_run_id": parent_run_id, "tracking_uri": uri}))

    started_ray = ensure_ray(plugins=sweep.base["plugins"])
    try:
        trainable = tune.with_resources(
            tune.with_parameters(_trial, sweep=sweep, parent_run_id=parent_run_id), _trial_resources(sweep))
        if resume:
            tuner = tune.Tuner.restore(str(experiment_dir), trainable, resume_unfinished=True, resume_errored=True)
        else:
            tuner = tune.Tuner(trainable, param_space=_param_space(sweep), tune_config=_tune_config(sweep),
                               run_config=tune.RunConfig(
                                   name=sweep.name, storage_path=str(storage), verbose=0,
                                   callbacks=[sweep_progress(sweep.metric, sweep.mode, sweep.trial_count)]
                                   if progress else [],
                                   checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                                   failure_config=tune.FailureConfig(max_failures=0)))
        results = tuner.fit()
        _close_runs(client, experiment_id, parent_run_id, experiment_dir, trials="FINISHED",
                    parent="FINISHED" if not results.errors else "FAILED")
        _summarise(uri, sweep.experiment)
        return results
    except BaseException:
        _close_runs(client, experiment_id, parent_run_id, experiment_dir, trials="KILLED", parent="KILLED")
        raise
    finally:
        if started_ray:
            ray.shutdown()


# what Tune rewrites in the experiment folder while a sweep runs: its own state, and its searcher's
TUNE_STATE_FILES = ("experiment_state-*.json", "basic-variant-state-*.json", "searcher-state-*.pkl")


def recover_cut_state(experiment_dir: Path, ray_temp_dir: Path | None = None) -> list[str]:
    """Put back Tune state files that a killed driver left cut off; returns the names put back.

    Tune writes its experiment and searcher state to a staging folder under Ray's temp folder, then copies them to
    the experiment folder, neither step atomically: a kill -9 in the copy leaves the experiment folder's file empty
    or cut short while the staging copy is whole (a kill in the write leaves the previous copy whole). Restoring
    from a cut file, Tune silently starts a new experiment with an empty search space."""
    temp = ray_temp_dir or default_ray_temp_dir()
    recovered = []
    for cut in sorted(path for pattern in TUNE_STATE_FILES for path in experiment_dir.glob(pattern)):
        if whole_state(cut):
            continue
        whole = [copy for copy in staged_copies(experiment_dir, cut.name, temp) if whole_state(copy)]
        if not whole:
            raise FedvlpError(f"--resume: {cut} was cut off when the sweep's driver died and no whole copy is left "
                              f"under {temp}; remove {experiment_dir} to start the sweep over")
        staged = cut.with_name(cut.name + ".recovered")
        shutil.copyfile(whole[-1], staged)
        staged.replace(cut)
        recovered.append(cut.name)
    return recovered


def default_ray_temp_dir() -> Path:
    """Where a Ray started on this machine keeps its sessions, as Ray chooses it on Linux and macOS."""
    return Path(os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp") / "ray"


def staged_copies(experiment_dir: Path, name: str, ray_temp_dir: Path) -> list[Path]:
    """Tune's staged copies of the experiment folder's file `name`, oldest first (one per driver session)."""
    pattern = f"session_*/artifacts/*/{experiment_dir.name}/driver_artifacts/{name}"
    return sorted(ray_temp_dir.glob(pattern), key=lambda copy: copy.stat().st_mtime)


def whole_state(path: Path) -> bool:
    """Whether a Tune state file reads back: the experiment's state is JSON, a searcher's is a pickle (whatever
    its name ends with)."""
    import ray.cloudpickle

    try:
        if path.name.startswith("experiment_state-"):
            json.loads(path.read_bytes())
        else:
            ray.cloudpickle.loads(path.read_bytes())
        return True
    except (ValueError, EOFError, pickle.UnpicklingError):
        return False


def _tune_config(sweep: SweepSpec):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    check_selection_metric(sweep.metric, f"{sweep.path}: metric")  # what ASHA and the best trial read
    scheduler = None
    if sweep.scheduler["type"] == "asha":
        rounds = build_spec(copy.deepcopy(sweep.base)).federation.rounds
        scheduler = ASHAScheduler(time_attr="training_iteration", max_t=rounds,
                                  grace_period=sweep.scheduler.get("grace_period", 1),
                                  reduction_factor=sweep.scheduler.get("reduction_factor", 2))
    return tune.TuneConfig(metric=sweep.metric, mode=sweep.mode, scheduler=scheduler, num_samples=sweep.num_samples,
                           max_concurrent_trials=sweep.max_concurrent_trials,
                           reuse_actors=True)  # a trial starts in a finished one's process, with its actors (engine)


def _close_runs(client, experiment_id: str, parent_run_id: str, experiment_dir: Path, trials: str, parent: str) -> None:
    """End the parent run (and trial runs Tune left open); an MLflow store gone by now costs a warning, not the
    sweep's results, which Tune keeps in `experiment_dir`."""
    try:
        _close_trial_runs(client, experiment_id, parent_run_id, status=trials)
        client.set_terminated(parent_run_id, parent)
    except Exception as exc:
        print(f"fedvlp: warning: could not end the sweep's MLflow runs ({type(exc).__name__}); "
              f"the trial results are in {experiment_dir}", file=sys.stderr, flush=True)


def _summarise(uri: str, experiment: str) -> None:
    """The parent run carries the sweep's summary (fedvlp.platform.report.log_sweep_summary); a sweep whose
    trials all failed has none, and a store gone by now costs a warning, not the sweep's results."""
    from fedvlp.platform.report import log_sweep_summary

    try:
        log_sweep_summary(uri, experiment)
    except Exception as exc:
        print(f"fedvlp: warning: no summary on the sweep's parent run ({type(exc).__name__}: {exc})"[:300],
              file=sys.stderr, flush=True)


def _close_trial_runs(client, experiment_id: str, parent_run_id: str, status: str = "FINISHED") -> None:
    """Trials that Tune stopped (ASHA) or that died with their process end their MLflow runs here."""
    running = client.search_runs([experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}' "
                                                                "and attributes.status = 'RUNNING'")
    for run in running:
        client.set_tag(run.info.run_id, "stopped_early", "true")
        client.set_terminated(run.info.run_id, status)


def sweep_progress(metric: str, mode: str, total: int) -> Callback:
    """A Tune callback printing one line per finished trial: trials done of `total`, running and failed, the time
    elapsed and an estimate of the time left, and the best trial so far by its last round's `metric` (what reports
    read)."""
    from ray import tune

    started = time.monotonic()

    class _Progress(tune.Callback):
        def __init__(self):
            self.best = None

        def _line(self, trials, finished, status: str, event: str) -> None:
            # Tune calls back before it updates the finished trial's status
            states = [status if t is finished else t.status for t in trials]
            done, running, failed = (states.count(s) for s in ("TERMINATED", "RUNNING", "ERROR"))
            elapsed = time.monotonic() - started
            left = elapsed / (done + failed) * (total - done - failed) if done + failed else None
            best = "" if self.best is None else f"; best last-round {metric} {self.best[0]:.4f} ({self.best[1]})"
            print(f"sweep: {done}/{total} trials done, {running} running" + (f", {failed} failed" if failed else "")
                  + f"; {_minutes(elapsed)} elapsed" + ("" if left is None else f", about {_minutes(left)} left")
                  + f"{best}  [{event}]", flush=True)

        def on_trial_complete(self, iteration, trials, trial, **info):
            value = (trial.last_result or {}).get(metric)  # the last round's, as reports read it
            if value is not None and not math.isnan(value):
                if self.best is None or (value > self.best[0] if mode == "max" else value < self.best[0]):
                    self.best = (value, _describe(trial.config))
            self._line(trials, trial, "TERMINATED", f"{_describe(trial.config)} finished")

        def on_trial_error(self, iteration, trials, trial, **info):
            self._line(trials, trial, "ERROR", f"{_describe(trial.config)} FAILED")

    return _Progress()


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def _describe(config: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.items())
