"""`fedvlp tune CONFIG --budget N`: the same tuning protocol for every method, on the val split.

Each method declares its tunable hyper-parameters and their ranges beside their definition, in its
`Params` (`spec_field(..., tune=log_range(...))`), so a new method brings its own search space. A tune
run is N Ray Tune trials drawn by a search algorithm (Optuna's TPE through Ray Tune's integration,
seeded from the run seed), optionally cut by ASHA. A trial runs the config with its sampled values once
per seed, one after another, and reports every round's val metric; its last report is the mean over the
seeds of the final val metric, which is what the search algorithm learns from and what picks the best
trial. ASHA compares trials at the same report, i.e. at the same seed and round. Nothing here reads a
test metric: the metric must be a val_* one.

MLflow: one experiment `tune-<config>` with a parent run (budget, seeds, ranges, the best values) and a
nested run per trial and seed. The best values are written into a copy of the config (`--out`) that
`fedvlp run` and space files accept as a base; its header says how it was tuned.
"""
from __future__ import annotations

import copy
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from fedvlp.config import CONFIGS_DIR, apply_overrides, build_spec, read_config, resolve_file, set_dotted
from fedvlp.errors import ConfigError, FedvlpError
from fedvlp.spec import TuneRange, tuning_ranges

OBJECTIVE = "objective"


@dataclass(frozen=True)
class TuneSpec:
    config: Path
    raw: dict                     # the config with the overrides applied, as written back with the tuned values
    base: dict                    # the same, with the tracking store and output dir made absolute for the trials
    method: str
    ranges: dict[str, TuneRange]  # dotted key -> range
    budget: int
    seeds: tuple[int, ...]
    metric: str
    mode: str
    asha: bool
    max_concurrent: int
    storage: Path
    trial_cpus: float = 0.25

    @property
    def name(self) -> str:
        return self.config.stem

    @property
    def experiment(self) -> str:
        return f"tune-{self.name}"


def load_tune(config, budget: int, seeds=(0, 1), metric: str | None = None, mode: str = "max", asha: bool = False,
              max_concurrent: int = 1, overrides=(), storage: str | Path = "ray_results") -> TuneSpec:
    """Validate everything before Ray starts: the config, the method's ranges, the metric (val_* only), the budget."""
    from fedvlp.platform.studies.spaces import check_selection_metric

    path = resolve_file(config, CONFIGS_DIR, "config")
    raw = apply_overrides(read_config(path), list(overrides))
    base = copy.deepcopy(raw)
    spec = build_spec(copy.deepcopy(base))
    ranges = {f"method.{k}": r for k, r in tuning_ranges(type(spec.method.params)).items()}
    if not ranges:
        raise ConfigError(f"method.name: {spec.method.name} declares no tunable hyper-parameters (nothing to tune)")
    if not isinstance(budget, int) or budget < 1:
        raise ConfigError(f"--budget: expected an integer >= 1, got {budget!r}")
    if not seeds or any(not isinstance(s, int) or s < 0 for s in seeds):
        raise ConfigError(f"--seeds: expected non-negative integers, got {list(seeds)!r}")
    if metric is None:  # the method's own selection set (fedvlp.methods.declarations.MethodDeclaration)
        from fedvlp.methods.registry import declaration

        single_label = spec.data.name in ("synthetic-recipes", "food101") or (
            spec.data.name == "mmimdb" and getattr(spec.data.options, "protocol", "") == "fedprime")
        metric = f"{declaration(spec.method.name).selection_set}_{'accuracy' if single_label else 'mAP'}"
    check_selection_metric(metric, "--metric")
    if mode not in ("max", "min"):
        raise ConfigError(f"--mode: expected max or min, got {mode!r}")
    base.setdefault("tracking", {})
    from fedvlp.platform.studies.spaces import absolute_uri

    base["tracking"]["uri"] = absolute_uri(base["tracking"].get("uri"))
    base["output_dir"] = str(Path(base.get("output_dir", "fedvlp-runs")).resolve())
    base["plugins"] = list(spec.plugins)  # a trial on another node does not see this process's $FEDVLP_PLUGINS
    return TuneSpec(path, raw, base, spec.method.name, ranges, budget, tuple(seeds), metric, mode, asha, max_concurrent,
                    Path(storage))


def trial_raw(tune_spec: TuneSpec, values: dict, seed: int) -> dict:
    raw = copy.deepcopy(tune_spec.base)
    for key, value in values.items():
        set_dotted(raw, key, value)
    raw["seed"] = seed
    raw["tracking"]["experiment"] = tune_spec.experiment
    shown = " ".join(f"{k.rsplit('.', 1)[-1]}={_short(v)}" for k, v in values.items())
    raw["tracking"]["run_name"] = f"{tune_spec.method} {shown} seed {seed}"
    return raw


def _short(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _search_space(ranges: dict[str, TuneRange]) -> dict:
    from ray import tune

    build = {"loguniform": lambda r: tune.loguniform(r.low, r.high), "uniform": lambda r: tune.uniform(r.low, r.high),
             "int": lambda r: tune.randint(int(r.low), int(r.high) + 1),
             "choice": lambda r: tune.choice(list(r.values))}
    return {key: build[r.kind](r) for key, r in ranges.items()}


def _trial(config: dict, tune_spec: TuneSpec, parent_run_id: str) -> None:
    """One trial: the config with these values, once per seed in turn; every round reports the seed's val
    metric as the objective, the last report the mean over seeds of the final val metric."""
    from ray import tune

    from fedvlp.platform.runtime.engine import run_federated

    values = {k: (int(v) if tune_spec.ranges[k].kind == "int" else v) for k, v in config.items()}
    trial_id = tune.get_context().get_trial_id()
    finals = []
    rounds = build_spec(trial_raw(tune_spec, values, tune_spec.seeds[0])).federation.rounds
    for index, seed in enumerate(tune_spec.seeds):
        spec = build_spec(trial_raw(tune_spec, values, seed))
        last = index == len(tune_spec.seeds) - 1

        def report(round_index: int, metrics: dict, checkpoint, seed_index=index, is_last=last) -> None:
            value = metrics.get(tune_spec.metric, math.nan)
            if round_index == rounds:
                finals.append(value)
            objective = float(sum(finals) / len(finals)) if is_last and round_index == rounds else value
            tune.report({OBJECTIVE: objective, tune_spec.metric: value, "seed_index": seed_index, "round": round_index})

        tags = {"mlflow.parentRunId": parent_run_id, "fedvlp.role": "trial", "tune_trial_id": trial_id,
                "seed": str(seed), **{f"tuned.{k}": str(v) for k, v in values.items()}}
        run_federated(spec, progress=False, on_round=report, tags=tags)


def run_tune(tune_spec: TuneSpec, out: str | Path | None = None, progress: bool = True) -> dict:
    """Run the search; write the tuned config; return {"values", "objective", "config", "parent_run_id", ...}."""
    import optuna
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    from fedvlp.platform.records.tracking import open_experiment
    from fedvlp.platform.runtime.placement import ensure_ray, run_bundles
    from fedvlp.platform.studies.spaces import check_selection_metric
    from fedvlp.seeding import numpy_rng

    check_selection_metric(tune_spec.metric, "--metric")  # what the search algorithm, ASHA and the best trial read
    rounds = build_spec(copy.deepcopy(tune_spec.base)).federation.rounds
    out_path = Path(out) if out else Path(f"{tune_spec.name}-tuned.yaml")
    experiment_dir = tune_spec.storage.resolve() / tune_spec.experiment
    if experiment_dir.exists():
        raise FedvlpError(f"{experiment_dir}: a tune run named '{tune_spec.experiment}' exists already; remove the "
                          f"folder to start over")
    uri = tune_spec.base["tracking"]["uri"]
    client, experiment_id = open_experiment(uri, tune_spec.experiment)
    seed = int(tune_spec.base.get("seed", 0))
    parent = client.create_run(experiment_id, run_name=f"tune {tune_spec.method} budget {tune_spec.budget}", tags={
        "fedvlp.role": "tune", "method": tune_spec.method, "metric": tune_spec.metric, "mode": tune_spec.mode})
    parent_id = parent.info.run_id
    for key, value in {"budget": tune_spec.budget, "seeds": list(tune_spec.seeds), "metric": tune_spec.metric,
                       "asha": tune_spec.asha, "config": str(tune_spec.config),
                       **{f"range.{k}": r.describe() for k, r in tune_spec.ranges.items()}}.items():
        client.log_param(parent_id, key, str(value))
    started_ray = ensure_ray(plugins=tune_spec.base["plugins"])
    status = "FAILED"
    try:
        sampler = optuna.samplers.TPESampler(n_startup_trials=random_trials(tune_spec.budget),
                                             seed=int(numpy_rng(seed, "tune").integers(2**31)))
        searcher = ConcurrencyLimiter(OptunaSearch(metric=OBJECTIVE, mode=tune_spec.mode, sampler=sampler),
                                      max_concurrent=tune_spec.max_concurrent)
        scheduler = ASHAScheduler(time_attr="training_iteration", max_t=rounds * len(tune_spec.seeds),
                                  grace_period=max(1, rounds // 2), reduction_factor=2) if tune_spec.asha else None

        def resources(config: dict):
            spec = build_spec(trial_raw(tune_spec, config, tune_spec.seeds[0]))
            return tune.PlacementGroupFactory([{"CPU": tune_spec.trial_cpus, "node:__internal_head__": 0.001}]
                                              + run_bundles(spec))

        tuner = tune.Tuner(
            tune.with_resources(tune.with_parameters(_trial, tune_spec=tune_spec, parent_run_id=parent_id), resources),
            param_space=_search_space(tune_spec.ranges),
            tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler, num_samples=tune_spec.budget,
                                        metric=OBJECTIVE, mode=tune_spec.mode,
                                        reuse_actors=True),  # a trial starts with a finished one's actors (engine)
            run_config=tune.RunConfig(name=tune_spec.experiment, storage_path=str(tune_spec.storage.resolve()),
                                      verbose=0, failure_config=tune.FailureConfig(max_failures=0)))
        results = tuner.fit()
        trials = [results[i] for i in range(len(results))]
        # (values tried, mean objective over the seeds) of every trial that ran all its seeds to the last round
        complete = [(r.config or {}, r.metrics[OBJECTIVE]) for r in trials
                    if r.error is None and r.metrics and r.metrics.get("seed_index") == len(tune_spec.seeds) - 1
                    and r.metrics.get("round") == rounds]
        if not complete:
            raise FedvlpError(f"tune {tune_spec.name}: no trial finished all its seeds "
                              f"({len(results.errors)} failed); see {experiment_dir}")
        best_config, objective = (max if tune_spec.mode == "max" else min)(complete, key=lambda trial: trial[1])
        values = {k: (int(v) if tune_spec.ranges[k].kind == "int" else v) for k, v in best_config.items()}
        edges = range_edges(values, tune_spec.ranges)
        config_path = write_tuned_config(tune_spec, values, objective, out_path, edges)
        client.log_metric(parent_id, f"best_{tune_spec.metric}", objective)
        client.set_tag(parent_id, "guided_trials", str(tune_spec.budget - random_trials(tune_spec.budget)))
        for key, value in values.items():
            client.set_tag(parent_id, f"best.{key}", str(value))
            client.set_tag(parent_id, f"edge.{key}", edges.get(key, "no"))
        client.log_artifact(parent_id, str(config_path))
        status = "FINISHED"
        if progress:
            print(f"tune {tune_spec.name}: {len(results)} trials, {len(complete)} finished all seeds; best "
                  f"{tune_spec.metric} (mean over seeds {list(tune_spec.seeds)}) {objective:.4f} with "
                  + ", ".join(f"{k}={_short(v)}" for k, v in values.items()))
            print(f"tune {tune_spec.name}: {random_trials(tune_spec.budget)} random trials, "
                  f"{tune_spec.budget - random_trials(tune_spec.budget)} guided by TPE; at a range edge: "
                  + (", ".join(f"{k} ({side})" for k, side in edges.items()) or "none"))
        return {"values": values, "objective": objective, "config": config_path,
                "parent_run_id": parent_id, "trials": len(results), "complete": len(complete)}
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        _end_runs(client, experiment_id, parent_id, status)
        if started_ray:
            ray.shutdown()


def random_trials(budget: int) -> int:
    """TPE's random start-up: half the budget at most (Optuna's default of 10 would leave a budget of 12 two guided
    trials), and at least one."""
    return max(1, budget // 2)


EDGE_SHARE = 0.05  # a value within 5 % of its range's span (on the range's own scale) of an end sits at that edge


def range_edges(values: dict, ranges: dict[str, TuneRange]) -> dict[str, str]:
    """{key: "low" | "high"} for each tuned value at an edge of its range: there the range, not the search, may
    have stopped it, and the tuning protocol widens that range and tunes again (docs/results/tuning/)."""
    edges = {}
    for key, value in values.items():
        r = ranges[key]
        if r.kind == "choice":
            continue
        scale = math.log if r.kind == "loguniform" else float
        position = (scale(value) - scale(r.low)) / (scale(r.high) - scale(r.low))
        share = 0.0 if r.kind == "int" else EDGE_SHARE
        if position <= share:
            edges[key] = "low"
        elif position >= 1 - share:
            edges[key] = "high"
    return edges


def write_tuned_config(tune_spec: TuneSpec, values: dict, objective: float, path: Path,
                       edges: dict[str, str] | None = None) -> Path:
    """The config (with the overrides it was tuned under) with the tuned values, and a header that says how."""
    raw = copy.deepcopy(tune_spec.raw)
    for key, value in values.items():
        set_dotted(raw, key, float(f"{value:.4g}") if isinstance(value, float) else value)
    seeds = " ".join(map(str, tune_spec.seeds))
    header = (f"# Tuned with `fedvlp tune {tune_spec.name} --budget {tune_spec.budget} --seeds {seeds}"
              f"{' --asha' if tune_spec.asha else ''}`: {tune_spec.budget} trials (Optuna TPE through Ray Tune, "
              f"{random_trials(tune_spec.budget)} random, then guided), each over seeds {seeds};\n# selected on "
              f"{tune_spec.metric} (mean over the seeds {objective:.4f}); tuned: {', '.join(values)}; at a range "
              f"edge: {', '.join(f'{k} ({side})' for k, side in (edges or {}).items()) or 'none'}. Nothing was "
              f"selected on test data.\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(raw, sort_keys=False))
    return path


def _end_runs(client, experiment_id: str, parent_id: str, status: str) -> None:
    try:
        for run in client.search_runs([experiment_id], f"tags.mlflow.parentRunId = '{parent_id}' "
                                                       "and attributes.status = 'RUNNING'"):
            client.set_tag(run.info.run_id, "stopped_early", "true")
            client.set_terminated(run.info.run_id, "FINISHED" if status == "FINISHED" else status)
        client.set_terminated(parent_id, status)
    except Exception as exc:
        print(f"fedvlp: warning: could not end the tune run's MLflow runs ({type(exc).__name__})", file=sys.stderr)
