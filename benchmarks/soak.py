"""Soak: a long run, watching the memory of every process of the run for growth.

Runs `--rounds` (default 300) rounds of PromptFL on synthetic-scenes with the tiny CLIP, on real Ray
actors with MLflow logging every round, and prints the resident memory (RSS) of the driver, the
coordinator and each client worker every `--every` rounds. Growth is measured after a warm-up
(`--warmup` rounds: imports, allocator pools and caches settle) up to the last round; the target
is under 50 MB per process. Writes benchmarks/results/soak.json.

Run: python benchmarks/soak.py [--rounds 300] [--every 50] [--warmup 50]
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import _common as common
import psutil

from fedvlp.config import load_spec
from fedvlp.platform.runtime.engine import run_federated

MB = 1024 * 1024
TARGET_MB = 50


def run_processes() -> dict[str, psutil.Process]:
    """The driver and the run's actors: among the processes of the driver's own local Ray, by the
    titles Ray gives them (ray::<Class>)."""
    driver = psutil.Process(os.getpid())
    found = {"driver": driver}
    workers = []
    for proc in driver.children(recursive=True):
        title = " ".join(proc.cmdline())
        if title.startswith("ray::Coordinator"):
            found["coordinator"] = proc
        elif title.startswith("ray::ClientWorker"):
            workers.append(proc)
    for i, proc in enumerate(sorted(workers, key=lambda p: p.pid)):
        found[f"worker {i}"] = proc
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--every", type=int, default=50, help="print memory every this many rounds")
    parser.add_argument("--warmup", type=int, default=50, help="growth is measured from this round on")
    args = common.parse_args(parser, argv, __file__, tiny={"rounds": 2, "every": 1, "warmup": 1})
    machine = common.machine()

    workdir = Path(tempfile.mkdtemp(prefix="fedvlp-soak-"))
    spec = load_spec(None, [
        "data.num_train=500", "data.num_test=256", "federation.clients=10", "federation.participation=0.5",
        f"federation.rounds={args.rounds}", f"federation.eval_every={args.every}", "method.local_epochs=1",
        f"tracking.uri=sqlite:///{workdir / 'mlflow.db'}", "tracking.experiment=soak", f"output_dir={workdir / 'runs'}",
        *(common.TINY_DATA if args.tiny else [])])
    samples: dict[int, dict[str, float]] = {}

    def on_round(round_index, metrics, checkpoint):
        if round_index == 1 or round_index % args.every == 0:
            processes = run_processes()
            samples[round_index] = {name: p.memory_info().rss / MB for name, p in processes.items()}
            sizes = "  ".join(f"{n} {mb:7.1f} MB" for n, mb in samples[round_index].items())
            print(f"round {round_index:4d}  " + sizes, flush=True)

    tic = time.perf_counter()
    try:
        run_federated(spec, progress=False, on_round=on_round)
        seconds = time.perf_counter() - tic
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    start = min((r for r in samples if r >= args.warmup), default=min(samples))
    end = max(samples)
    growth = {name: samples[end][name] - samples[start].get(name, float("nan")) for name in samples[end]}
    print(f"\n{args.rounds} rounds in {seconds:.0f} s ({seconds / args.rounds:.2f} s per round)")
    print(f"RSS growth from round {start} to round {end} (target < {TARGET_MB} MB per process):")
    for name, mb in growth.items():
        print(f"  {name:<12} {mb:+7.1f} MB  {'met' if mb < TARGET_MB else 'MISSED'}")
    common.write_results("soak", {"machine": machine, "rounds": args.rounds, "seconds": round(seconds, 1),
                                  "seconds_per_round": round(seconds / args.rounds, 3), "rss_mb_by_round": samples,
                                  "growth_mb": growth, "from_round": start, "to_round": end, "target_mb": TARGET_MB},
                         args)


if __name__ == "__main__":
    main()
