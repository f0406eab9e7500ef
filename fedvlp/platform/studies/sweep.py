"""`fedvlp sweep SPACE`: a Ray Tune search over whole federated runs.

Each trial is one `run_federated` call, reserving its own placement group (one bundle for the
trial itself, one for its coordinator, one per worker), reporting and checkpointing every
round. The sweep is one MLflow experiment with a parent run and one nested run per trial.
`--resume` continues an interrupted sweep: finished trials are kept, unfinished ones continue
from their last round checkpoint in their own MLflow run.

The space file, its validation and each trial's run spec: `fedvlp.platform.studies.spaces`.
"""
from __future__ import annotations

import copy
import json
import math
import os
import pickle
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fedvlp.config import build_spec
from fedvlp.errors import FedvlpError
from fedvlp.platform.studies.spaces import SweepSpec, check_selection_metric, trial_spec

if TYPE_CHECKING:
    from ray.tune import Callback

PARENT_FILE = "fedvlp_sweep.json"


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

    from fedvlp.platform.records.checkpoint import read_checkpoint
    from fedvlp.platform.runtime.engine import run_federated

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

    from fedvlp.platform.runtime.placement import run_bundles

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

    from fedvlp.platform.records.tracking import open_experiment
    from fedvlp.platform.runtime.placement import ensure_ray

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
            tuner = tune.Tuner(trainable, param_space=_param_space(sweep), tune_config=tune_config(sweep),
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


def tune_config(sweep: SweepSpec):
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
    """The parent run carries the sweep's summary (fedvlp.platform.studies.report.log_sweep_summary); a sweep whose
    trials all failed has none, and a store gone by now costs a warning, not the sweep's results."""
    from fedvlp.platform.studies.report import log_sweep_summary

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
