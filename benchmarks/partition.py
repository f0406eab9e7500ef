"""Partition a 1,000,000 x 80 multi-label matrix over 1,000 clients (heterogeneity t), timed.

Prints seconds and peak memory per phase and writes benchmarks/results/partition.json.
Run: python benchmarks/partition.py [--samples 1000000] [--classes 80] [--clients 1000]
"""
from __future__ import annotations

import argparse
import resource
import time
import tracemalloc

import _common as common
import numpy as np

from fedvlp.data.partition import label_distribution_js, partition_heterogeneity


def coco_like_labels(n: int, classes: int, seed: int = 0) -> np.ndarray:
    """Structured multi-hot labels: 300 co-occurrence prototypes, ~3 labels per sample, noise."""
    rng = np.random.default_rng(seed)
    prototypes = rng.random((300, classes)) < 3 / classes
    labels = prototypes[rng.integers(0, 300, n)]
    flips = rng.random((n, classes)) < 0.01
    return (labels ^ flips).astype(np.int8)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--classes", type=int, default=80)
    parser.add_argument("--clients", type=int, default=1_000)
    parser.add_argument("--t", type=float, default=0.5)
    args = common.parse_args(parser, argv, __file__, tiny={"samples": 20_000, "clients": 50})
    machine = common.machine()

    labels = coco_like_labels(args.samples, args.classes)
    tracemalloc.start()
    tic = time.perf_counter()
    parts = partition_heterogeneity(labels, args.clients, args.t, seed=0)
    partition_s = time.perf_counter() - tic
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    tic = time.perf_counter()
    js = label_distribution_js(labels, parts)
    js_s = time.perf_counter() - tic
    sizes = np.array([len(p) for p in parts])
    figures = {
        "machine": machine, "samples": args.samples, "classes": args.classes, "clients": args.clients, "t": args.t,
        "partition_seconds": round(partition_s, 2), "partition_peak_mib": round(peak / 2**20, 1),
        "labels_mib": round(labels.nbytes / 2**20, 1), "process_max_rss_mib": round(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "js_seconds": round(js_s, 2), "js_distance": round(js, 4),
        "client_size_min_median_max": [int(sizes.min()), int(np.median(sizes)), int(sizes.max())],
    }
    for key, value in figures.items():
        print(f"{key:>28}: {value}")
    common.write_results("partition", figures, args)


if __name__ == "__main__":
    main()
