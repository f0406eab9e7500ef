"""What the missing-modality world's verdicts read, and how noisy it is: the spread over seeds of each diagnostic arm
of `recipes_world` and of the two diagnostics' paired differences, with the val split at each size of `--val-sizes`
and each run's figure read two ways (its last evaluation; the mean of its last three). Tuning seeds only (100 on),
never an evaluation seed, and val only: this chooses the protocol, so it must not see what it will judge.

The val split is drawn prefix-stable (a larger val holds the smaller one's samples), and training does not depend on
its size, so the arms train alike at every size. Writes benchmarks/results/recipes_noise.json.
Run: python benchmarks/recipes_noise.py
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from _common import machine, parse_args, write_results
from recipes_world import ARMS, DIAGNOSTICS, readouts, run_arms

from fedvlp.platform.studies.report import interval


def spread(values: list[float]) -> dict[str, float]:
    """Mean, standard deviation over the seeds and the 95 % interval's half-width."""
    mean, half, _ = interval(values)
    return {"mean": mean, "sd": float(np.std(values, ddof=1)), "ci95_half_width": half}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[100, 101, 102, 103, 104])
    parser.add_argument("--val-sizes", type=int, nargs="+", default=[500, 2000])
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side, one core each")
    args = parse_args(parser, argv, __file__, tiny={"seeds": [100, 101], "val_sizes": [64, 128], "jobs": 1})
    if any(seed < 100 for seed in args.seeds):
        parser.error("--seeds: tuning seeds only (100 and above); evaluation seeds start at 0")
    tic = time.perf_counter()
    rounds = ["federation.rounds=1"] if args.tiny else []
    table, curves = {}, {}
    for size in args.val_sizes:
        curves[size] = run_arms(ARMS, args.seeds, [*rounds, f"data.num_val={size}"], args.jobs, args.tiny)
        for kind in ("last", "mean_last3"):
            figure = {name: [readouts(c)[kind] for c in arm] for name, arm in curves[size].items()}
            table[f"val {size}, {kind}"] = {
                **{name: spread(values) for name, values in figure.items()},
                **{diagnostic: spread(np.subtract(figure["Centralized-P"], figure[other]).tolist())
                   for diagnostic, other, _ in DIAGNOSTICS}}
    print(f"{'readout':<22}" + "".join(f"{name:>30}" for name in next(iter(table.values()))))
    for readout, row in table.items():
        cells = [f"{s['mean']:+.3f} sd {s['sd']:.3f} ±{s['ci95_half_width']:.3f}" for s in row.values()]
        print(f"{readout:<22}" + "".join(f"{cell:>30}" for cell in cells))
    write_results("recipes_noise", {"machine": machine(), "seeds": args.seeds, "val_sizes": args.val_sizes,
                                    "spread": table, "val_curves": {str(k): v for k, v in curves.items()},
                                    "wall_seconds": time.perf_counter() - tic}, args)


if __name__ == "__main__":
    main()
