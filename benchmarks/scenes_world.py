"""Can synthetic-scenes ask FedMPT's questions? The multi-label world's diagnostics, all on the val split.

Each diagnostic has a target (docs/worlds.md); a world that misses one cannot test the findings that rest on it.

1. Zero-shot: val mAP of "a photo of a {class}." against the shipped tiny CLIP's pooled token, between
   ZERO_SHOT_RANGE; and from the dense patches (per class, the best of the 16), at least PATCH_RATIO x pooled.
2. Headroom: centralised PromptFL and centralised DualCoOp (one client holding all the training data, the shipped
   config's settings) end at least HEADROOM above zero-shot.
3. Label skew: FedAvg PromptFL (the quickstart: 10 clients) ends at least SKEW_COST lower at t = 1 than at t = 0.
4. Label mask: PromptFL with 90 % of the training labels hidden ends at least MASK_COST lower than with 10 %.

Also logged, not targets: the hallucination gap on the decorrelated `shift` split is left to the studies.
Runs fedvlp's bare loop (the engine's partition, cohorts, per-(round, client) generators and server rules, no
Ray), scoring val, never test: these figures judge the world's design. Differences are paired by seed, with
95 % t intervals. Writes benchmarks/results/scenes_world.json. Run: python benchmarks/scenes_world.py
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
from _common import bench_spec, machine, parse_args, run_bare, torch_threads, write_results

from fedvlp.backbones.loaders import load_backbone
from fedvlp.backbones.pretrain_clip import zero_shot_maps
from fedvlp.data.scenes import generate_scenes
from fedvlp.platform.studies.report import interval

ZERO_SHOT_RANGE = (0.45, 0.75)
PATCH_RATIO = 0.9
HEADROOM = 0.08
SKEW_COST = 0.03
MASK_COST = 0.03

# name: (config, overrides); every one scored on val after its last round
ARMS = {
    "central PromptFL": ("quickstart", ["federation.clients=1", "federation.pooled_from=10"]),
    "central DualCoOp": ("dualcoop_scenes", ["federation.clients=1", "federation.pooled_from=10"]),
    "PromptFL t=0": ("quickstart", ["federation.heterogeneity=0"]),
    "PromptFL t=1": ("quickstart", ["federation.heterogeneity=1"]),
    "PromptFL mask 0.1": ("quickstart", ["data.label_mask=0.1"]),
    "PromptFL mask 0.9": ("quickstart", ["data.label_mask=0.9"]),
}


def paired(a: list[float], b: list[float]) -> dict:
    """Mean and 95 % interval of a - b over the seeds."""
    mean, half, _ = interval(np.subtract(a, b))
    return {"mean": mean, "ci95_half_width": half, "per_seed": [float(d) for d in np.subtract(a, b)]}


def judge(zero_shot: dict, arms: dict[str, list[float]]) -> dict:
    """Each diagnostic's figure, target and whether the mean meets it."""
    zs = zero_shot["pooled"]
    out = {"zero-shot mAP": {"figure": zs, "target": f"in [{ZERO_SHOT_RANGE[0]}, {ZERO_SHOT_RANGE[1]}]",
                             "holds": ZERO_SHOT_RANGE[0] <= zs <= ZERO_SHOT_RANGE[1]},
           "patch / pooled zero-shot": {"figure": zero_shot["patches"] / zs, "target": f">= {PATCH_RATIO}",
                                        "holds": zero_shot["patches"] >= PATCH_RATIO * zs}}
    for arm in ("central PromptFL", "central DualCoOp"):
        gain = paired(arms[arm], [zs] * len(arms[arm]))
        out[f"{arm} - zero-shot"] = {**gain, "target": f">= {HEADROOM}", "holds": gain["mean"] >= HEADROOM}
    for name, (low, high), target in (("PromptFL t=0 - t=1", ("PromptFL t=1", "PromptFL t=0"), SKEW_COST),
                                      ("PromptFL mask 0.1 - mask 0.9", ("PromptFL mask 0.9", "PromptFL mask 0.1"),
                                       MASK_COST)):
        cost = paired(arms[high], arms[low])
        out[name] = {**cost, "target": f">= {target}", "holds": cost["mean"] >= target}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), metavar="ARM")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="applied to every arm (an arm's own settings win)")
    parser.add_argument("--val-size", type=int, default=2000, help="val images scored by zero-shot")
    args = parse_args(parser, argv, __file__, tiny={"seeds": [0, 1], "val_size": 64,
                                                    "overrides": ["federation.rounds=1"]})
    with torch_threads(min(2, os.cpu_count() or 1)):
        figures = {"machine": machine(), **measure(args)}
    write_results("scenes_world", figures, args)


def measure(args) -> dict:
    tic = time.perf_counter()
    spec = bench_spec("quickstart", args.overrides, args.tiny)  # its seed and backbone: the shipped tiny CLIP
    val = generate_scenes(args.val_size, "val", spec.seed)
    zero_shot = zero_shot_maps(load_backbone(spec), val.images, val.labels, val.class_names)
    print(f"zero-shot val mAP: {zero_shot}", flush=True)
    arms: dict[str, list[float]] = {}
    for name in args.arms:
        config, overrides = ARMS[name]
        for seed in args.seeds:
            run_spec = bench_spec(config, [*args.overrides, *overrides, f"seed={seed}"], args.tiny)
            arms.setdefault(name, []).append(run_bare(run_spec, threads=2, eval_sets=("val",)).final["val_mAP"])
            print(f"{name} seed {seed}: val mAP {arms[name][-1]:.4f}", flush=True)
    figures = {"seeds": args.seeds, "overrides": args.overrides, "val_size": args.val_size, "zero_shot_val": zero_shot,
               "val_map": arms, "wall_seconds": 0.0}
    if set(arms) == set(ARMS):
        figures["diagnostics"] = judge(zero_shot, arms)
        for name, d in figures["diagnostics"].items():
            value = d.get("figure", d.get("mean"))
            print(f"{'holds' if d['holds'] else 'FAILS'}  {name}: {value:+.4f} (target {d['target']})")
    figures["wall_seconds"] = time.perf_counter() - tic
    return figures


if __name__ == "__main__":
    main()
