"""Are the multi-label studies' 10 rounds enough? Each method's tuned config run longer, its val mAP every round.

Runs fedvlp's bare loop (the engine's partition, cohorts, per-(round, client) generators and server rules, no
Ray) on the tuned configs' settings (label skew t = 0.5, 10 clients, 2,000 training images), scoring val, never test.
Prints, per method, the val mAP at round 0, at the studies' round 10 and at the last round, mean over seeds, and
the gain after round 10. Writes benchmarks/results/convergence.json.
Run: python benchmarks/convergence.py [--rounds 20] [--seeds 0 1 2]   (~10 min per seed on 2 cores)
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
from _common import bench_spec, machine, parse_args, run_bare, write_results

CONFIGS = ("quickstart", "fedmpt_scenes", "dualcoop_scenes", "fedotp_scenes", "fedtpg_scenes", "fedlora_scenes")
STUDY_ROUNDS = 10


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--num-train", type=int, default=2000)
    args = parse_args(parser, argv, __file__, tiny={"configs": ["quickstart"], "rounds": 1, "seeds": [0],
                                                    "num_train": 240})
    study = min(STUDY_ROUNDS, args.rounds)
    figures: dict = {"machine": machine(), "rounds": args.rounds, "seeds": args.seeds, "study_rounds": study,
                     "curves": {}}
    for config in args.configs:
        curves = []
        for seed in args.seeds:
            tic = time.perf_counter()
            spec = bench_spec(config, [f"seed={seed}", "federation.heterogeneity=0.5",
                                       f"data.num_train={args.num_train}", f"federation.rounds={args.rounds}",
                                       "federation.eval_every=1"], args.tiny)
            result = run_bare(spec, threads=min(2, os.cpu_count() or 1), eval_sets=("val",))
            curves.append([result.initial["val_mAP"]] + [metrics["val_mAP"] for _, metrics in result.curve])
            print(f"{config} seed {seed}: {time.perf_counter() - tic:.0f} s", flush=True)
        mean = np.mean(curves, axis=0)
        gains = [c[-1] - c[study] for c in curves]
        figures["curves"][config] = {"per_seed": curves, "mean": mean.tolist(), "gain_after_study": gains}
        print(f"{config}: val mAP round 0 {mean[0]:.3f}, round {study} {mean[study]:.3f}, "
              f"round {args.rounds} {mean[-1]:.3f}; gain after round {study} {np.mean(gains):+.3f} "
              f"(per seed {', '.join(f'{g:+.3f}' for g in gains)})", flush=True)
    write_results("convergence", figures, args)


if __name__ == "__main__":
    main()
