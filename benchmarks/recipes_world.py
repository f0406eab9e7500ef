"""Can synthetic-recipes ask FED-PRIME's questions? The missing-modality world's diagnostics, on the val split.

Val is drawn under the training setting: 70 % of the samples miss a modality (half their text, half their image).

1. Prompts that know the missing modality pay: Centralized-P (the shipped centralized_p_recipes: one client, all
   the data) ends at least PROMPT_GAIN above the same model without prompts (`method.prompt_length=0`: the
   trainable pooler and head alone, same settings).
2. Heterogeneity costs FedAvg: FedAvg-P (fedavg_p_recipes: 10 clients, Dirichlet 0.5, each client its own share of
   missing texts and images, missing-client skew 0.5) ends at least FEDERATION_COST below Centralized-P.

Whole fedvlp runs (Ray, a scratch MLflow store), scoring val, never test, on the configs' evaluation schedule, so
each arm's val curve is recorded too (has it flattened by the last round?). Differences are paired by seed, with
95 % t intervals. Writes benchmarks/results/recipes_world.json. Run: python benchmarks/recipes_world.py
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from _common import bench_spec, machine, parse_args, write_results

from fedvlp.platform.engine import run_federated
from fedvlp.platform.report import interval

PROMPT_GAIN = 0.05
FEDERATION_COST = 0.05

ARMS = {
    "Centralized-P": ("centralized_p_recipes", []),
    "Centralized, no prompts": ("centralized_p_recipes", ["method.prompt_length=0"]),
    "FedAvg-P": ("fedavg_p_recipes", []),
}


def judge(arms: dict[str, list[float]]) -> dict:
    out = {}
    for name, other, target in (("Centralized-P - no prompts", "Centralized, no prompts", PROMPT_GAIN),
                                 ("Centralized-P - FedAvg-P", "FedAvg-P", FEDERATION_COST)):
        diff = np.subtract(arms["Centralized-P"], arms[other])
        mean, half, _ = interval(diff)
        out[name] = {"mean": mean, "ci95_half_width": half, "per_seed": [float(d) for d in diff],
                     "target": f">= {target}", "holds": mean >= target}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="applied to every arm (an arm's own settings win)")
    args = parse_args(parser, argv, __file__, tiny={"seeds": [0, 1], "overrides": ["federation.rounds=1"]})
    tic = time.perf_counter()
    arms: dict[str, list[float]] = {}
    curves: dict[str, list[dict[int, float]]] = {}
    for name, (config, overrides) in ARMS.items():
        for seed in args.seeds:
            spec = bench_spec(config, [*args.overrides, *overrides, f"seed={seed}"], args.tiny)
            result = run_federated(spec, progress=False)
            arms.setdefault(name, []).append(result.final["val_accuracy"])
            curves.setdefault(name, []).append({0: result.initial["val_accuracy"], **{
                h["round"]: h["val_accuracy"] for h in result.history if "val_accuracy" in h}})
            print(f"{name} seed {seed}: val accuracy {arms[name][-1]:.4f}, curve "
                  f"{', '.join(f'{r}: {v:.3f}' for r, v in curves[name][-1].items())}", flush=True)
    figures = {"machine": machine(), "seeds": args.seeds, "overrides": args.overrides, "val_accuracy": arms,
               "val_curves": curves, "diagnostics": judge(arms), "wall_seconds": time.perf_counter() - tic}
    for name, d in figures["diagnostics"].items():
        print(f"{'holds' if d['holds'] else 'FAILS'}  {name}: {d['mean']:+.4f} ± {d['ci95_half_width']:.4f} "
              f"(target {d['target']})")
    write_results("recipes_world", figures, args)


if __name__ == "__main__":
    main()
