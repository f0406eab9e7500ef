"""Are the multi-label studies' 5 rounds enough? Each method's tuned config run longer, its val mAP every round.

Runs fedvlp's bare loop (the engine's partition, cohorts, per-(round, client) generators and server rules, no
Ray) on the studies' settings (label skew t = 0.5, 10 clients, 1,500 training images), scoring val, never test.
Prints, per method, the val mAP at round 0, at the studies' round 5 and at the last round, mean over seeds, and
the gain after round 5. Writes benchmarks/results/convergence.json.
Run: python benchmarks/convergence.py [--rounds 20] [--seeds 0 1 2]   (~17 min on 2 quiet cores)
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from _common import bench_spec, machine, run_bare, write_results

CONFIGS = ("quickstart", "fedmpt_scenes", "dualcoop_scenes", "fedotp_scenes", "fedtpg_scenes", "fedlora_scenes")
STUDY_ROUNDS = 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    figures: dict = {"machine": machine(), "rounds": args.rounds, "seeds": args.seeds, "curves": {}}
    for config in args.configs:
        curves = []
        for seed in args.seeds:
            tic = time.perf_counter()
            spec = bench_spec(config, [f"seed={seed}", "federation.heterogeneity=0.5", "data.num_train=1500",
                                       f"federation.rounds={args.rounds}", "federation.eval_every=1"])
            result = run_bare(spec, threads=2, eval_split="val")
            curves.append([result.initial["mAP"]] + [metrics["mAP"] for _, metrics in result.curve])
            print(f"{config} seed {seed}: {time.perf_counter() - tic:.0f} s", flush=True)
        mean = np.mean(curves, axis=0)
        gains = [c[-1] - c[STUDY_ROUNDS] for c in curves]
        figures["curves"][config] = {"per_seed": curves, "mean": mean.tolist(), "gain_after_study": gains}
        print(f"{config}: val mAP round 0 {mean[0]:.3f}, round {STUDY_ROUNDS} {mean[STUDY_ROUNDS]:.3f}, "
              f"round {args.rounds} {mean[-1]:.3f}; gain after round {STUDY_ROUNDS} {np.mean(gains):+.3f} "
              f"(per seed {', '.join(f'{g:+.3f}' for g in gains)})", flush=True)
    write_results("convergence", figures)


if __name__ == "__main__":
    main()
