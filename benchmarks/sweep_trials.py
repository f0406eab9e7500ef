"""What a trial of a sweep costs beyond its rounds: the smoke sweep, timed per trial from the driver.

Runs the shipped `smoke` space (2 methods x 2 heterogeneities x 2 seeds, 3 rounds each, two trials side by side)
through `run_sweep`, in a scratch MLflow store and Tune storage. A Tune callback in the driver notes when each
trial starts and completes; the trial's own MLflow run holds its `round_seconds` for every round and its
`startup_seconds` (with the parts: Ray, actors, backbone, data, features, MLflow). A trial's overhead is its
wall time minus the sum of its rounds: placing its bundles, starting its coordinator and workers, loading the
backbone and features, opening its MLflow run, reporting and checkpointing each round to Tune, and tearing down.

Two arms, the same sweep one after the other: "new", every trial starts its own coordinator and workers (Tune's
reuse_actors off, as before), and "reused", a trial starts in a finished trial's process with its actors reset
(fedvlp's default). Prints per trial and the medians (target: 3 s or less), with where the start-up goes.
Run: python benchmarks/sweep_trials.py [--space smoke]   (~3 min on 2 quiet cores)
Writes benchmarks/results/sweep_trials.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import time
from pathlib import Path

import _common as common

from fedvlp.platform.studies import spaces
from fedvlp.platform.studies import sweep as sweeps

TARGET_S = 3.0


def timed_sweep(space: str, reuse: bool) -> tuple[dict, str, str]:
    """({trial id: (start, end) wall seconds}, tracking uri, experiment) of one run of `space`, with Tune's
    `reuse_actors` as `reuse`."""
    from ray import tune

    scratch = common.SCRATCH / f"sweep_trials_{'reused' if reuse else 'new'}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    uri = f"sqlite:///{scratch / 'mlflow.db'}"
    sweep = dataclasses.replace(spaces.load_sweep(space, [f"tracking.uri={uri}", f"output_dir={scratch / 'runs'}"]),
                                storage=scratch / "tune")
    spans: dict[str, list[float]] = {}
    progress = sweeps.sweep_progress

    class Timing(tune.Callback):
        def on_trial_start(self, iteration, trials, trial, **info):
            spans[trial.trial_id] = [time.perf_counter()]

        def on_trial_complete(self, iteration, trials, trial, **info):
            spans[trial.trial_id].append(time.perf_counter())

    # run_sweep installs one callback, its progress line; this one keeps the line and adds the timing
    class Both(Timing, type(progress(sweep.metric, sweep.mode, sweep.trial_count))):
        pass

    tune_config = sweeps.tune_config
    sweeps.sweep_progress = lambda metric, mode, total: Both()
    sweeps.tune_config = lambda s: dataclasses.replace(tune_config(s), reuse_actors=reuse)
    try:
        sweeps.run_sweep(sweep)
    finally:
        sweeps.sweep_progress, sweeps.tune_config = progress, tune_config
    return {k: tuple(v) for k, v in spans.items() if len(v) == 2}, uri, sweep.experiment


def trial_costs(spans: dict, uri: str, experiment: str) -> list[dict]:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id],
                              filter_string="tags.`fedvlp.role` = 'trial'")
    costs = []
    for run in runs:
        trial = run.data.tags["tune_trial_id"]
        if trial not in spans:
            continue
        rounds = [m.value for m in client.get_metric_history(run.info.run_id, "round_seconds")]
        wall = spans[trial][1] - spans[trial][0]
        startup = {k.removeprefix("startup_").removesuffix("_seconds"): round(v, 2)
                   for k, v in run.data.metrics.items() if k.startswith("startup_") and k != "startup_seconds"}
        costs.append({"trial": run.info.run_name, "wall_s": round(wall, 2), "rounds_s": round(sum(rounds), 2),
                      "overhead_s": round(wall - sum(rounds), 2),
                      "startup_s": round(run.data.metrics.get("startup_seconds", float("nan")), 2),
                      "startup_parts_s": startup})
    return sorted(costs, key=lambda c: c["trial"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--space", default="smoke", help="a shipped space name or a space file")
    args = common.parse_args(parser, argv, __file__, tiny={"space": str(Path(__file__).parent / "tiny_sweep.yaml")})
    figures: dict = {"machine": common.machine(), "space": Path(args.space).stem, "target_s": TARGET_S}
    for arm, reuse in (("new", False), ("reused", True)):
        tic = time.perf_counter()
        spans, uri, experiment = timed_sweep(args.space, reuse)
        total = time.perf_counter() - tic
        costs = trial_costs(spans, uri, experiment)
        print(f"\n{arm}: {'trial':<52}{'wall s':>8}{'rounds s':>10}{'overhead s':>12}{'start-up s':>12}")
        for c in costs:
            print(f"{c['trial']:<58}{c['wall_s']:>8.1f}{c['rounds_s']:>10.1f}{c['overhead_s']:>12.1f}"
                  f"{c['startup_s']:>12.1f}")
        median = statistics.median(c["overhead_s"] for c in costs)
        parts = {k: round(statistics.median(c["startup_parts_s"].get(k, 0.0) for c in costs), 2)
                 for k in sorted({k for c in costs for k in c["startup_parts_s"]})}
        verdict = "met" if median <= TARGET_S else "MISSED"
        print(f"{arm}: median overhead per trial {median:.1f} s (target <= {TARGET_S}: {verdict}); "
              f"median start-up parts (s): {parts}; the sweep took {total:.0f} s for {len(costs)} trials")
        figures[arm] = {"sweep_seconds": round(total, 1), "median_overhead_s": median,
                        "median_startup_parts_s": parts, "trials": costs}
    new, reused = figures["new"], figures["reused"]
    figures["reused_over_new"] = {"overhead": round(reused["median_overhead_s"] / new["median_overhead_s"], 2),
                                  "sweep": round(reused["sweep_seconds"] / new["sweep_seconds"], 2)}
    print(f"reused / new: overhead per trial x{figures['reused_over_new']['overhead']:.2f}, "
          f"sweep x{figures['reused_over_new']['sweep']:.2f}")
    common.write_results("sweep_trials", figures, args)


if __name__ == "__main__":
    main()
