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
from _common import bench_spec, machine, run_bare, write_results

from fedvlp.backbones import load_backbone, prepare_backbone
from fedvlp.backbones.pretrain_clip import zero_shot_maps
from fedvlp.data.scenes import generate_scenes
from fedvlp.platform.metrics import mean_average_precision

VAL_SIZE = 2000
PROBE_SIZE = 2000
PROBE_STEPS = 300


def probe_map(backbone, images: np.ndarray, labels: np.ndarray, val) -> float:
    """Val mAP of a linear probe on the frozen pooled features: full-batch BCE, Adam 0.01, PROBE_STEPS steps
    from zero weights (deterministic)."""
    x, y = backbone.encode_images(images).float(), torch.from_numpy(labels).float()
    weight = torch.zeros(x.shape[1], y.shape[1], requires_grad=True)
    bias = torch.zeros(y.shape[1], requires_grad=True)
    optimizer = torch.optim.Adam([weight, bias], lr=0.01)
    for _ in range(PROBE_STEPS):
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="quickstart")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--t", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    figures: dict = {"machine": machine(), "config": args.config, "overrides": args.overrides, "runs": []}
    tic = time.perf_counter()
    spec = bench_spec(args.config, args.overrides)
    prepare_backbone(spec, progress=True)
    val = generate_scenes(VAL_SIZE, "val", spec.seed)
    backbone = load_backbone(spec)
    figures["zero_shot_val"] = zero_shot_maps(backbone, val.images, val.labels, val.class_names)
    print(f"zero-shot val mAP: {figures['zero_shot_val']}", flush=True)
    train = generate_scenes(PROBE_SIZE, "train", spec.seed)
    more_val = generate_scenes(VAL_SIZE + PROBE_SIZE, "val", spec.seed)  # a prefix is the scored val set
    figures["probe_val"] = {
        "train split": probe_map(backbone, train.images, train.labels, val),
        "decorrelated": probe_map(backbone, more_val.images[VAL_SIZE:], more_val.labels[VAL_SIZE:], val)}
    print(f"linear probe on pooled features, val mAP: {figures['probe_val']}", flush=True)
    holdout = generate_scenes(PROBE_SIZE, "holdout", spec.seed)  # the train split's co-occurrence and styles
    figures["holdout"] = {"zero-shot": zero_shot_maps(backbone, holdout.images, holdout.labels,
                                                      holdout.class_names)["pooled"],
                          "probe on the train split": probe_map(backbone, train.images, train.labels, holdout)}
    print(f"holdout mAP: {figures['holdout']}", flush=True)
    for seed in args.seeds:
        for t in args.t:
            run_spec = bench_spec(args.config, [*args.overrides, f"seed={seed}", f"federation.heterogeneity={t}"])
            final = run_bare(run_spec, threads=2, eval_split="val").final
            run = {"seed": seed, "t": t, "val_map": final["mAP"], "gap": final["hallucination_gap"]}
            print(f"seed {seed} t {t}: val mAP {run['val_map']:.4f} gap {run['gap']:+.4f}", flush=True)
            figures["runs"].append(run)
    figures["mean"] = summarise(figures["runs"], args.t)
    figures["wall_seconds"] = time.perf_counter() - tic
    print(figures["mean"])
    write_results("scenes_world", figures)


if __name__ == "__main__":
    main()
