"""Can synthetic-recipes ask FED-PRIME's questions? The missing-modality world's diagnostics, on the val split.

Val is drawn under the training setting: 70 % of the samples miss a modality (half their text, half their image).

1. Prompts that know the missing modality pay: Centralized-P (the shipped centralized_p_recipes: one client holding
   FedAvg-P's ten clients' data pooled, their missing codes included) ends at least PROMPT_GAIN above the same model
   without prompts (`method.prompt_length=0`: the trainable pooler and head alone, same settings).
2. Heterogeneity costs FedAvg: FedAvg-P (fedavg_p_recipes: 10 clients, Dirichlet 0.5, each client its own share of
   missing texts and images, missing-client skew 0.5) ends at least FEDERATION_COST below Centralized-P.

Whole fedvlp runs (Ray, a scratch MLflow store each), scoring val, never test, on the configs' evaluation schedule,
so each arm's val curve is recorded too (has it flattened by the last round?). A run's figure is its last
evaluation, as the protocol reads it; the mean of its last three is recorded beside it.
Differences are paired by seed, with 95 % t intervals. `--jobs` runs go side by side, each on one ClientWorker
(a run's metrics do not depend on its number of workers). Writes benchmarks/results/recipes_world.json.
Run: python benchmarks/recipes_world.py
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import time

import numpy as np
from _common import SCRATCH, bench_spec, machine, parse_args, write_results

from fedvlp.platform.studies.report import interval

PROMPT_GAIN = 0.05
FEDERATION_COST = 0.05
METRIC = "val_accuracy"
LAST_EVALUATIONS = 3  # the other readout measured: the mean of a run's last three evaluations

ARMS = {
    "Centralized-P": ("centralized_p_recipes", []),
    "Centralized, no prompts": ("centralized_p_recipes", ["method.prompt_length=0"]),
    "FedAvg-P": ("fedavg_p_recipes", []),
}
DIAGNOSTICS = (("Centralized-P - no prompts", "Centralized, no prompts", PROMPT_GAIN),
               ("Centralized-P - FedAvg-P", "FedAvg-P", FEDERATION_COST))


def readouts(curve: dict[int, float]) -> dict[str, float]:
    """A run's figure two ways: its last evaluation (the protocol's), and the mean of its last LAST_EVALUATIONS
    (round 0, before training, excluded), which `recipes_noise` measured and the protocol did not adopt."""
    trained = [curve[r] for r in sorted(curve, key=int) if int(r) > 0]
    return {"last": trained[-1], "mean_last3": float(np.mean(trained[-LAST_EVALUATIONS:]))}


def _run(config: str, overrides: list[str], tiny: bool) -> dict[int, float]:
    """One whole run in this process (its own local Ray and MLflow store): its val curve, round 0 included."""
    from fedvlp.platform.runtime.engine import run_federated

    store = SCRATCH / f"recipes-world-{os.getpid()}.db"
    spec = bench_spec(config, [*overrides, f"tracking.uri=sqlite:///{store}", "resources.workers=1"], tiny)
    result = run_federated(spec, progress=False)
    return {0: result.initial[METRIC], **{h["round"]: h[METRIC] for h in result.history if METRIC in h}}


def run_arms(arms: dict[str, tuple[str, list[str]]], seeds: list[int], overrides: list[str], jobs: int,
             tiny: bool = False) -> dict[str, list[dict[int, float]]]:
    """Each arm's val curve at each seed (in seed order): `jobs` runs at a time, each in a fresh process, or one
    after the other in this process (and its Ray, if one is up) with `jobs` 1."""
    tasks = {(name, seed): (config, [*overrides, *arm_overrides, f"seed={seed}"], tiny)
             for name, (config, arm_overrides) in arms.items() for seed in seeds}
    curves = {}

    def done(key, curve):
        curves[key] = curve
        print(f"{key[0]} seed {key[1]}: val curve {', '.join(f'{r}: {v:.3f}' for r, v in curve.items())}", flush=True)

    if jobs == 1:
        for key, task in tasks.items():
            done(key, _run(*task))
    else:
        with multiprocessing.get_context("spawn").Pool(jobs, maxtasksperchild=1) as pool:  # a fresh process a run
            pending = {key: pool.apply_async(_run, task) for key, task in tasks.items()}
            for key, result in pending.items():
                done(key, result.get())
    return {name: [curves[name, seed] for seed in seeds] for name in arms}


def judge(figures: dict[str, list[float]]) -> dict:
    out = {}
    for name, other, target in DIAGNOSTICS:
        diff = np.subtract(figures["Centralized-P"], figures[other])
        mean, half, _ = interval(diff)
        out[name] = {"mean": mean, "ci95_half_width": half, "per_seed": [float(d) for d in diff],
                     "target": f">= {target}", "holds": mean >= target}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side, one core each")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="applied to every arm (an arm's own settings win)")
    args = parse_args(parser, argv, __file__, tiny={"seeds": [0, 1], "jobs": 1,
                                                                 "overrides": ["federation.rounds=1"]})
    tic = time.perf_counter()
    curves = run_arms(ARMS, args.seeds, args.overrides, args.jobs, args.tiny)
    by_readout = {kind: {name: [readouts(c)[kind] for c in arm] for name, arm in curves.items()}
                  for kind in ("last", "mean_last3")}
    figures = {"machine": machine(), "seeds": args.seeds, "overrides": args.overrides,
               METRIC: by_readout["last"], f"{METRIC}_mean_last3": by_readout["mean_last3"], "val_curves": curves,
               "diagnostics": judge(by_readout["last"]), "diagnostics_mean_last3": judge(by_readout["mean_last3"]),
               "wall_seconds": time.perf_counter() - tic}
    for name, d in figures["diagnostics"].items():
        print(f"{'holds' if d['holds'] else 'FAILS'}  {name}: {d['mean']:+.4f} ± {d['ci95_half_width']:.4f} "
              f"(target {d['target']})")
    write_results("recipes_world", figures, args)


if __name__ == "__main__":
    main()
