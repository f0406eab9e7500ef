"""Round time of PromptFL with the frozen-feature cache against without it, and the disk cache at start-up.

A round here is the local updates of one cohort: the workload of benchmarks/overhead.py (fedvlp/configs/quickstart.yaml,
50 clients, 10 per round), round 1's cohort, in one process with one torch thread (what a worker uses).

  cached   what fedvlp does: `method.local_update` reads the client's frozen image features, encoded once
           per run (fedvlp's disk cache) and handed over as float32.
  encoder  what a naive implementation does: the same `local_update`, with the same generator and so the same
           minibatches and steps, but every step runs the frozen image encoder on that step's images
           (already loaded and resized to the model's input: image decoding is not counted).

Both start every client from the same global state. Prints seconds per round for each, the ratio
(target: cached >= 5x faster) and the steps taken. Then the disk cache at start-up: reading the
train+test features from fedvlp's FeatureCache (hit) against encoding them in this process and writing
them (miss, into a scratch cache directory; a run encodes on its workers in parallel).

--backbone ViT-B-16 (random weights: the cost of a real-size encoder without downloading one) repeats the
round on a smaller cohort (--cohort) to show the ratio at a real CLIP's size; it is slow on a CPU.

Run: python benchmarks/feature_cache.py [--clients 50] [--cohort 10] [--repeats 3] [--backbone tiny-clip]
Writes benchmarks/results/feature_cache.json.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import _common as common
import numpy as np
import torch

from fedvlp.backbones.loaders import load_backbone, prepare_backbone
from fedvlp.data import prepare_data
from fedvlp.data.feature_cache import FeatureCache
from fedvlp.methods.base import ClientData, Task
from fedvlp.platform.runtime.cohorts import sample_cohort
from fedvlp.platform.runtime.worker import build_method
from fedvlp.seeding import torch_generator

TARGET_SPEEDUP = 5.0


class EncodedPerStep:
    """Stands in for a client's feature tensor: indexing a batch runs the frozen image encoder on its images."""

    def __init__(self, pixels: np.ndarray, backbone, kind: str):
        self.pixels, self.backbone, self.kind = pixels, backbone, kind

    def __len__(self) -> int:
        return len(self.pixels)

    def __getitem__(self, batch: torch.Tensor) -> torch.Tensor:
        return self.backbone.encode_images(self.pixels[batch.numpy()], self.kind)


def time_round(method, clients: dict[int, ClientData], state: dict, seed: int) -> tuple[float, int, float]:
    """(seconds, local steps, mean loss) of the cohort's local updates, each from `state`."""
    steps, losses = 0, []
    tic = time.perf_counter()
    for cid, data in clients.items():
        method.load(state, None)
        stats = method.local_update(data, torch_generator(seed, "client", 1, cid))
        steps += stats["steps"]
        losses.append(stats["loss"])
    return time.perf_counter() - tic, steps, float(np.mean(losses))


def round_comparison(spec, cohort_size: int, repeats: int) -> dict:
    data = prepare_data(spec)
    task = Task(data.dataset.class_names, data.dataset.multilabel)
    backbone = load_backbone(spec)
    method = build_method(spec, backbone, task)
    kind, size = method.feature_kind, backbone.image_size[0]
    cohort = sample_cohort(spec.seed, 1, spec.federation.clients, spec.federation.participation)[:cohort_size]
    pixels = {cid: data.dataset.train.images.load(data.parts[cid], size) for cid in cohort}
    if spec.backbone.pretrained == "fedvlp":
        train = common.frozen_features(spec, data, backbone, kind, "train")
        features = {cid: train[data.parts[cid]] for cid in cohort}
    else:  # a random-weight stand-in has no cache entry worth keeping: encode just the cohort's images
        features = {cid: backbone.encode_images(pixels[cid], kind).numpy().astype(np.float16) for cid in cohort}
    labels = {cid: common.as_labels(data.train_labels[data.parts[cid]]) for cid in cohort}
    cached = {cid: ClientData(common.as_inputs(method, features[cid]), labels[cid]) for cid in cohort}
    encoder = {cid: ClientData(EncodedPerStep(pixels[cid], backbone, kind), labels[cid]) for cid in cohort}
    state = method.global_state()
    time_round(method, {cohort[0]: cached[cohort[0]]}, state, spec.seed)  # warm-up: lazy inits, not timed
    runs = {"cached": [], "encoder": []}
    for _ in range(repeats):  # interleaved, so a change in the machine's load hits both alike
        for name, clients in (("cached", cached), ("encoder", encoder)):
            runs[name].append(time_round(method, clients, state, spec.seed))
    seconds = {name: common.median([r[0] for r in rs]) for name, rs in runs.items()}
    return {"backbone": spec.backbone.name, "cohort": cohort, "samples": int(sum(len(d) for d in cached.values())),
            "steps": {name: rs[0][1] for name, rs in runs.items()},
            "mean_loss": {name: round(rs[0][2], 5) for name, rs in runs.items()},
            "round_s": {name: round(s, 3) for name, s in seconds.items()},
            "round_s_all": {name: [round(r[0], 3) for r in rs] for name, rs in runs.items()},
            "speedup": round(seconds["encoder"] / seconds["cached"], 2)}


def disk_cache_startup(spec) -> dict:
    """Seconds to have the train+test features in memory at run start: disk-cache hit against miss."""
    data = prepare_data(spec)
    backbone = load_backbone(spec)
    kind = build_method(spec, backbone, Task(data.dataset.class_names, data.dataset.multilabel)).feature_kind
    common.frozen_features(spec, data, backbone, kind, "train")  # make sure the hit below is a hit
    common.frozen_features(spec, data, backbone, kind, "test")
    tic = time.perf_counter()
    hit = [np.array(common.frozen_features(spec, data, backbone, kind, split)) for split in ("train", "test")]
    hit_s = time.perf_counter() - tic
    with tempfile.TemporaryDirectory() as scratch:
        tic = time.perf_counter()
        for split in ("train", "test"):
            images = getattr(data.dataset, split).images
            features = backbone.encode_images(images.load(range(len(images)), backbone.image_size[0]), kind)
            FeatureCache(Path(scratch)).put(split, features.numpy())
        miss_s = time.perf_counter() - tic
    return {"samples": int(sum(len(h) for h in hit)), "hit_s": round(hit_s, 3), "miss_s": round(miss_s, 2),
            "miss_over_hit": round(miss_s / hit_s, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--participation", type=float, default=0.2)
    parser.add_argument("--cohort", type=int, default=10, help="clients of the round timed (at most the cohort)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backbone", default="tiny-clip",
                        help="tiny-clip (fedvlp's), or an open_clip name with random weights")
    args = common.parse_args(parser, argv, __file__, tiny={"clients": 4, "participation": 0.5, "cohort": 2,
                                                           "repeats": 1})
    with common.torch_threads(1):
        figures = measure(args)
    common.write_results(f"feature_cache{'' if args.backbone == 'tiny-clip' else '-' + args.backbone}", figures, args)


def measure(args) -> dict:
    overrides = [f"federation.clients={args.clients}", f"federation.participation={args.participation}"]
    if args.backbone != "tiny-clip":
        overrides += [f"backbone.name={args.backbone}", "backbone.pretrained=none"]
    spec = common.bench_spec("quickstart", overrides, args.tiny)
    prepare_backbone(spec)
    figures = {"machine": common.machine(), "method": "promptfl", "torch_threads": 1,
               "local_epochs": spec.method.params.local_epochs, "batch_size": spec.method.params.batch_size,
               "target_speedup": TARGET_SPEEDUP}

    rounds = round_comparison(spec, args.cohort, args.repeats)
    figures["round"] = rounds
    met = "met" if rounds["speedup"] >= TARGET_SPEEDUP else "MISSED"
    print(f"promptfl, {args.backbone}: one round = {len(rounds['cohort'])} clients, {rounds['samples']} samples, "
          f"{rounds['steps']['cached']} local steps ({args.repeats} repeats, median)")
    print(f"{'features':<26}{'s/round':>9}{'steps':>7}{'ms/step':>9}{'mean loss':>11}")
    for name, label in (("cached", "cached (fedvlp)"), ("encoder", "image encoder every step")):
        print(f"{label:<26}{rounds['round_s'][name]:>9.3f}{rounds['steps'][name]:>7}"
              f"{1000 * rounds['round_s'][name] / rounds['steps'][name]:>9.1f}{rounds['mean_loss'][name]:>11.4f}")
    print(f"cache speed-up x{rounds['speedup']:.1f} (target >= {TARGET_SPEEDUP:g}: {met}); a cached step is the prompt "
          f"learner's text-encoder pass over all class prompts, forward and backward, which no cache removes")

    if args.backbone == "tiny-clip":
        startup = disk_cache_startup(spec)
        figures["disk_cache_startup"] = startup
        print(f"start-up, {startup['samples']} train+test features: disk-cache hit {startup['hit_s']:.3f} s, "
              f"miss (encode in this process + write) {startup['miss_s']:.2f} s, x{startup['miss_over_hit']:.0f}")
    return figures


if __name__ == "__main__":
    main()
