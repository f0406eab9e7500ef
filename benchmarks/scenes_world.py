"""Does synthetic-scenes let FedMPT's questions be asked? The world's diagnostics, all on the val split.

1. Zero-shot headroom of the pretrained tiny CLIP: val mAP of "a photo of a {class}." from the pooled
   token and from the dense patch features (per class, the best of the 16 patches).
2. Label skew: the quickstart's PromptFL (10 clients, full participation, 2,000 training images) at
   heterogeneity t in {0, 0.5, 1}: final val mAP per seed, and the drop from t = 0 to t = 1.
3. Co-occurrence hallucination: the final model's val `hallucination_gap` at each t.
4. What any classifier on the frozen pooled features can learn: val mAP of a linear probe trained on the
   train split the clients share (2,000 images, with its co-occurrence and styles) and of one trained on
   2,000 decorrelated images (val-split draws after the scored ones), against zero-shot's; and, where the
   train split's shortcuts hold, the first probe and zero-shot on 2,000 holdout images.

Runs fedvlp's bare loop (the engine's partition, cohorts, per-(round, client) generators and server
rules, no Ray), scoring val, never test: these figures choose the world's design.
Writes benchmarks/results/scenes_world.json. Run: python benchmarks/scenes_world.py [--seeds 0 1 2]
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from _common import bench_spec, machine, parse_args, run_bare, torch_threads, write_results

from fedvlp.backbones import load_backbone, prepare_backbone
from fedvlp.backbones.pretrain_clip import zero_shot_maps
from fedvlp.data.scenes import generate_scenes
from fedvlp.platform.metrics import mean_average_precision


def probe_map(backbone, images: np.ndarray, labels: np.ndarray, val, steps: int) -> float:
    """Val mAP of a linear probe on the frozen pooled features: full-batch BCE, Adam 0.01, `steps` steps
    from zero weights (deterministic)."""
    x, y = backbone.encode_images(images).float(), torch.from_numpy(labels).float()
    weight = torch.zeros(x.shape[1], y.shape[1], requires_grad=True)
    bias = torch.zeros(y.shape[1], requires_grad=True)
    optimizer = torch.optim.Adam([weight, bias], lr=0.01)
    for _ in range(steps):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(10 * x @ weight + bias, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        scores = 10 * backbone.encode_images(val.images).float() @ weight + bias
    return mean_average_precision(scores.numpy(), val.labels)


def summarise(runs: list[dict], ts: list[float]) -> dict:
    """Mean val mAP and gap per t, and the per-seed drop in val mAP from the lowest t to the highest."""
    by = {(r["seed"], r["t"]): r for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    out = {f"t={t}": {k: float(np.mean([by[s, t][k] for s in seeds])) for k in ("val_map", "gap")} for t in ts}
    drops = [by[s, ts[0]]["val_map"] - by[s, ts[-1]]["val_map"] for s in seeds]
    out["drop"] = {"mean": float(np.mean(drops)), "per_seed": drops}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="quickstart")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--t", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--val-size", type=int, default=2000, help="val images scored (zero-shot, probes)")
    parser.add_argument("--probe-size", type=int, default=2000, help="training images of each linear probe")
    parser.add_argument("--probe-steps", type=int, default=300)
    args = parse_args(parser, argv, __file__, tiny={"seeds": [0], "t": [0.0, 1.0], "val_size": 64, "probe_size": 64,
                                                    "probe_steps": 5,
                                                    "overrides": ["federation.rounds=1", "federation.clients=4"]})
    with torch_threads(min(2, os.cpu_count() or 1)):
        figures = {"machine": machine(), **measure(args)}
    write_results("scenes_world", figures, args)


def measure(args) -> dict:
    figures: dict = {"config": args.config, "overrides": args.overrides, "val_size": args.val_size,
                     "probe_size": args.probe_size, "probe_steps": args.probe_steps, "runs": []}
    tic = time.perf_counter()
    spec = bench_spec(args.config, args.overrides, args.tiny)
    prepare_backbone(spec, progress=True)
    val = generate_scenes(args.val_size, "val", spec.seed)
    backbone = load_backbone(spec)
    figures["zero_shot_val"] = zero_shot_maps(backbone, val.images, val.labels, val.class_names)
    print(f"zero-shot val mAP: {figures['zero_shot_val']}", flush=True)
    train = generate_scenes(args.probe_size, "train", spec.seed)
    more_val = generate_scenes(args.val_size + args.probe_size, "val", spec.seed)  # a prefix is the scored val set
    figures["probe_val"] = {
        "train split": probe_map(backbone, train.images, train.labels, val, args.probe_steps),
        "decorrelated": probe_map(backbone, more_val.images[args.val_size:], more_val.labels[args.val_size:], val,
                                  args.probe_steps)}
    print(f"linear probe on pooled features, val mAP: {figures['probe_val']}", flush=True)
    holdout = generate_scenes(args.probe_size, "holdout", spec.seed)  # the train split's co-occurrence and styles
    figures["holdout"] = {"zero-shot": zero_shot_maps(backbone, holdout.images, holdout.labels,
                                                      holdout.class_names)["pooled"],
                          "probe on the train split": probe_map(backbone, train.images, train.labels, holdout,
                                                                args.probe_steps)}
    print(f"holdout mAP: {figures['holdout']}", flush=True)
    for seed in args.seeds:
        for t in args.t:
            run_spec = bench_spec(args.config, [*args.overrides, f"seed={seed}", f"federation.heterogeneity={t}"],
                                  args.tiny)
            final = run_bare(run_spec, threads=2, eval_sets=("val",)).final
            run = {"seed": seed, "t": t, "val_map": final["val_mAP"], "gap": final["val_hallucination_gap"]}
            print(f"seed {seed} t {t}: val mAP {run['val_map']:.4f} gap {run['gap']:+.4f}", flush=True)
            figures["runs"].append(run)
    figures["mean"] = summarise(figures["runs"], args.t)
    figures["wall_seconds"] = time.perf_counter() - tic
    print(figures["mean"])
    return figures


if __name__ == "__main__":
    main()
