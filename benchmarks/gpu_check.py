"""The prepared GPU check: fractional GPUs and the CUDA paths, one command, at most 5 minutes on one GPU.

For the tiny CLIP and a ViT-B/16 with random weights (`backbone.pretrained=none`, nothing downloaded), one round of
PromptFL on synthetic-scenes runs twice: 4 ClientWorkers at 0.25 GPU each, sharing the one device, and 2 workers on
the CPU. Both encode their frozen features themselves (no feature cache) and train the same clients. Recorded per
arm: each actor's device and GPU, its peak GPU memory (what `resources.num_gpus` per worker must hold) and its host
memory, and the largest gap between the GPU run's metrics and the CPU run's, which must stay within TOLERANCE
(float32 sums in another order on another device; the seeds and the data are the same).

Without a CUDA device it prints one line and exits 0. Writes benchmarks/results/gpu_check.json.
Run: python benchmarks/gpu_check.py
"""
from __future__ import annotations

import argparse
import time

import torch
from _common import bench_spec, machine, metrics_gap, parse_args, write_results

TOLERANCE = 5e-3  # the largest |GPU - CPU| of any val/test metric after one round
GPU_WORKERS, GPU_SHARE = 4, 0.25
ONE_ROUND = ["federation.rounds=1", "federation.clients=8", "data.num_train=400", "data.num_val=128",
             "data.num_test=128", "data.num_holdout=64", "data.feature_cache=false", "method.local_epochs=1"]
ARMS = {"tiny CLIP": [], "ViT-B/16, random weights": ["backbone.name=ViT-B-16", "backbone.pretrained=none"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    args = parse_args(parser, argv, __file__, tiny={})
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device on this machine; nothing to check (run it where `nvidia-smi` shows a GPU)")
        return 0
    import ray

    from fedvlp.platform.runtime.engine import run_federated

    tic = time.perf_counter()
    ray.init(num_gpus=1, include_dashboard=False)
    arms, ok = {}, True
    try:
        for name, overrides in ARMS.items():
            gpu = run_federated(bench_spec("quickstart", ONE_ROUND + overrides + [
                f"resources.workers={GPU_WORKERS}", f"resources.num_gpus={GPU_SHARE}"]), progress=False)
            cpu = run_federated(bench_spec("quickstart", ONE_ROUND + overrides + [
                "resources.workers=2", "resources.num_gpus=0"]), progress=False)
            gap = metrics_gap(gpu.final, cpu.final)
            devices = [w["device"] for w in gpu.workers]
            shared = len({g for w in gpu.workers for g in w["gpu_ids"]}) == 1
            met = gap <= TOLERANCE and all(d.startswith("cuda") for d in devices) and shared
            ok &= met
            arms[name] = {"gpu_workers": gpu.workers, "cpu_workers": cpu.workers, "metrics_gap": gap,
                          "val_mAP_gpu": gpu.final["val_mAP"], "val_mAP_cpu": cpu.final["val_mAP"], "met": met}
            peaks = ", ".join(f"{w['gpu_peak_mib']:.0f}" for w in gpu.workers)
            print(f"{name}: {GPU_WORKERS} workers at {GPU_SHARE} GPU on {sorted({d for d in devices})}, peak GPU "
                  f"MiB per actor {peaks}; metrics gap to the CPU run {gap:.2e} (tolerance {TOLERANCE:g}): "
                  f"{'met' if met else 'MISSED'}")
    finally:
        ray.shutdown()
    write_results("gpu_check", {"machine": machine(), "gpu": torch.cuda.get_device_name(0), "tolerance": TOLERANCE,
                                "arms": arms, "wall_seconds": time.perf_counter() - tic}, args)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
