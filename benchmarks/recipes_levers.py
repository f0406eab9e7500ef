"""Levers on the prompts' own training, measured on the missing-modality world's prompt headroom: Centralized-P with
each lever against the same model without prompts (the trainable pooler and head alone), on tuning seeds only and
val only, so that no lever is chosen by what the verdicts will read.

A lever is a set of `--set` overrides of the prompted arm (`--lever NAME=KEY=VALUE[,KEY=VALUE]`). A lever on the
prompts' training (`method.prompt_lr`) has nothing to move in the head alone, which has no prompts, so the head
alone runs once per seed with the shipped settings. `--baseline recipes_noise.json` takes the shipped Centralized-P
and the head alone from that measurement's runs at the shipped val size (the same configs and seeds, so the same
runs: a seed gives identical metrics) instead of running them again. Writes benchmarks/results/recipes_levers.json.
Run: python benchmarks/recipes_levers.py --lever "prompt lr x10=method.prompt_lr=0.7617"
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from _common import machine, parse_args, write_results
from recipes_world import readouts, run_arms

from fedvlp.platform.studies.report import interval

HEAD_ALONE = "Centralized, no prompts"
SHIPPED_VAL = 500  # data.num_val of the recipes configs


def lever(text: str) -> tuple[str, list[str]]:
    name, _, overrides = text.partition("=")
    if not name or "=" not in overrides:
        raise argparse.ArgumentTypeError(f"expected NAME=KEY=VALUE[,KEY=VALUE], got {text!r}")
    return name, overrides.split(",")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lever", type=lever, action="append", help="NAME=KEY=VALUE[,KEY=VALUE]; at least one")
    parser.add_argument("--seeds", type=int, nargs="+", default=[100, 101, 102, 103, 104])
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side, one core each")
    parser.add_argument("--baseline", type=Path, help="a recipes_noise.json whose shipped-val runs stand for the "
                                                       "shipped Centralized-P and the head alone")
    args = parse_args(parser, argv, __file__, tiny={"seeds": [100, 101], "jobs": 1})
    if not args.lever:
        if not args.tiny:
            parser.error("--lever: give at least one lever")
        args.lever = [("prompt lr x10", ["method.prompt_lr=0.7617"])]
    if any(seed < 100 for seed in args.seeds):
        parser.error("--seeds: tuning seeds only (100 and above); evaluation seeds start at 0")
    tic = time.perf_counter()
    rounds = ["federation.rounds=1"] if args.tiny else []
    arms = {"Centralized-P": ("centralized_p_recipes", []), HEAD_ALONE: ("centralized_p_recipes",
                                                                        ["method.prompt_length=0"])}
    arms |= {f"Centralized-P, {name}": ("centralized_p_recipes", overrides) for name, overrides in args.lever}
    baseline = {}
    if args.baseline:
        noise = json.loads(args.baseline.read_text())
        if noise.get("seeds") != args.seeds or noise.get("tiny") != args.tiny or \
                str(SHIPPED_VAL) not in noise.get("val_curves", {}):
            parser.error(f"--baseline: {args.baseline} is not a recipes_noise record of seeds {args.seeds} at val "
                         f"{SHIPPED_VAL}{' (tiny)' if args.tiny else ''}")
        runs = noise["val_curves"][str(SHIPPED_VAL)]
        baseline = {name: [{int(r): v for r, v in c.items()} for c in runs[name]] for name in ("Centralized-P",
                                                                                                 HEAD_ALONE)}
    curves = baseline | run_arms({k: v for k, v in arms.items() if k not in baseline}, args.seeds, rounds, args.jobs,
                                 args.tiny)
    figure = {name: [readouts(c)["last"] for c in arm] for name, arm in curves.items()}
    headroom = {}
    for name in arms:
        if name != HEAD_ALONE:
            mean, half, _ = interval(np.subtract(figure[name], figure[HEAD_ALONE]))
            headroom[name] = {"mean": mean, "ci95_half_width": half}
            print(f"{name:<40} val {np.mean(figure[name]):.3f}  - head alone {mean:+.3f} ± {half:.3f}")
    print(f"{HEAD_ALONE:<40} val {np.mean(figure[HEAD_ALONE]):.3f}")
    write_results("recipes_levers", {"machine": machine(), "seeds": args.seeds, "levers": dict(args.lever),
                                     "baseline": str(args.baseline) if args.baseline else None,
                                     "val_accuracy": figure, "headroom": headroom, "val_curves": curves,
                                     "wall_seconds": time.perf_counter() - tic}, args)


if __name__ == "__main__":
    main()
