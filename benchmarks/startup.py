"""The quickstart's start-up, cold and on a running cluster, in wall seconds and in CPU seconds, and what each of
its processes costs alone.

Start-up is launch to the end of round 1 of the quickstart (2 workers, 10 clients), with warm caches (backbone
and features), measured two ways: from the shell (`fedvlp run` in a new process until it prints round 1, what a
user waits for) and in this process (`run_federated` called with fedvlp, torch and MLflow already imported,
wall and CPU seconds). Two cases:
  - cold: `fedvlp run` starts a private local Ray and its actors, and stops them at the end;
  - warm: a cluster is already up as cluster.yaml brings one up (`ray start --head`, here on this machine, and
    the MLflow tracking server on the head's 127.0.0.1 that the runs log to) and `fedvlp run` attaches to it
    (RAY_ADDRESS); the run before it left its actors in the cluster's warm pool (`resources.keep_warm_s`), so
    the run borrows and resets them instead of starting processes. The engine's logged `startup_*` phases of
    the warm runs are printed too.
The cold runs from the shell each log to a new sqlite store (./mlflow.db in a new directory: MLflow creates its
tables, off the critical path, while Ray starts).
On a 2-core machine the wall time cannot fall below the CPU seconds / 2 while every process it starts is needed,
so this prints both, and the CPU seconds each process spends before it can work,
measured alone in a fresh process:
  - the driver's imports (fedvlp, Ray, MLflow; no torch: the actors hold every tensor);
  - `ray.init` of a private local Ray (GCS, raylet, agents), with its daemons' CPU;
  - a client worker: its imports (torch, open_clip, the methods) and the tiny CLIP;
  - the coordinator: its imports (torch, Ray, the server rules and client-state store it loads).
Run: python benchmarks/startup.py [--runs 5]   (~5 min on 2 quiet cores)
Writes benchmarks/results/startup.json.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import _common as common

TARGET_S = 10.0  # cold start-up from the shell on 2 quiet cores, warm caches
TARGET_WARM_S = 2.0  # start-up on a running cluster with a warm pool, from the shell: the median of the runs
CEILING_WARM_S = 2.5  # ... and every run
ALONE = {
    "driver imports": "import fedvlp.cli, fedvlp.platform.runtime.engine, mlflow",
    "client worker": ("import fedvlp.platform.runtime.worker as w; from fedvlp.config import load_spec; "
                      "from fedvlp.methods.base import Task; spec = load_spec('quickstart'); "
                      "task = Task([str(i) for i in range(10)], multilabel=True); "
                      "w.build_method(spec, w.load_backbone(spec), task)"),
    "coordinator": ("import torch, fedvlp.platform.runtime.coordinator, fedvlp.platform.aggregation, "
                    "fedvlp.platform.runtime.client_states"),
    "ray.init": ("import ray, sys; sys.path.insert(0, {bench!r}); import _common as c; cpu = c.TreeCpu(); "
                 "ray.init(address='local', num_cpus=2, include_dashboard=False); print(cpu()); "
                 "ray.shutdown()"),
}


def cpu_alone(code: str) -> float:
    """CPU seconds (user + system, with reaped children) of `python -c code` in a fresh process; for ray.init,
    the figure the code prints (the process tree's CPU while Ray starts)."""
    before = os.times()
    out = subprocess.run([sys.executable, "-c", code.format(bench=os.path.dirname(os.path.abspath(__file__)))],
                         capture_output=True, text=True, check=True).stdout.strip().splitlines()
    after = os.times()
    if out:
        return float(out[-1])
    return (after.children_user - before.children_user) + (after.children_system - before.children_system)


def quickstart_to_round_1(tiny: bool, tracking_uri: str | None = None) -> tuple[float, float]:
    """(wall s, CPU s of this process and its descendants) from launch to the end of round 1."""
    spec = common.bench_spec("quickstart", ["federation.rounds=1", *([f"tracking.uri={tracking_uri}"]
                                                                     if tracking_uri else [])], tiny)
    clock = common.RoundClock()
    common.engine.run_federated(spec, progress=False, on_round=clock)
    wall, cpu = clock.marks[0]
    return wall - clock.start[0], cpu - clock.start[1]


def shell_to_round_1(tiny: bool, tracking_uri: str | None = None) -> tuple[float, float, dict[str, float]]:
    """(wall seconds from launching `fedvlp run` (the quickstart, 1 round) to its printing round 1, the same to its
    printing round 0 (round 1 starts then), the startup_* metrics and round 1's round_seconds the run logged). It
    logs to `tracking_uri`, else
    to a new ./mlflow.db in its new directory."""
    from mlflow import MlflowClient

    overrides = ["federation.rounds=1", *(common.TINY_DATA if tiny else [])]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir:  # its outputs (and MLflow store) land here
        uri = tracking_uri or f"sqlite:///{workdir}/mlflow.db"
        proc = subprocess.Popen([sys.executable, "-m", "fedvlp", "run", *(f"--set={o}" for o in overrides)],
                                cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                env={**os.environ, "MLFLOW_TRACKING_URI": uri})
        assert proc.stdout is not None
        printed = {}
        for line in proc.stdout:
            printed.setdefault(line.split("  ")[0], time.perf_counter() - started)
            if line.startswith("round 1/1"):
                break
        proc.communicate()
        client = MlflowClient(uri)
        (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                    order_by=["attributes.start_time DESC"], max_results=1)
        logged = {k: round(v, 2) for k, v in run.data.metrics.items()
                  if k.startswith("startup") or k == "round_seconds"}
        logged["actors"] = run.data.tags.get("actors")
    return printed["round 1/1"], printed["round 0/1"], logged


def warm_case(tiny: bool, runs: int, cores: int) -> dict:
    """Start-up on a running cluster whose warm pool holds the quickstart's actors: a head and an MLflow server
    started here, one run that fills the pool (not counted), then `runs` runs from the shell and `runs` in this
    process, all logging to the server."""
    with common.ray_head(cores) as root, common.mlflow_server(root) as (uri, _):
        shell_to_round_1(tiny, uri)  # fills the pool; not counted
        shell = [shell_to_round_1(tiny, uri) for _ in range(runs)]
        in_process = [quickstart_to_round_1(tiny, uri) for _ in range(runs)]
    assert all(logged["actors"] == "warm" for *_, logged in shell), [logged for *_, logged in shell]
    phases = {key: statistics.median(logged[key] for *_, logged in shell) for key in shell[0][2] if key != "actors"}
    seconds = [s for s, *_ in shell]
    return {"shell_s": [round(s, 2) for s in seconds], "shell_median_s": round(statistics.median(seconds), 2),
            "shell_to_round_1_start_s": round(statistics.median(s for _, s, _ in shell), 2),
            "wall_s": round(statistics.median(w for w, _ in in_process), 2),
            "cpu_s": round(statistics.median(c for _, c in in_process), 2), "cpu_counts_cluster": True,
            "logged_startup_s": {k: round(v, 2) for k, v in phases.items()}, "target_s": TARGET_WARM_S,
            "ceiling_s": CEILING_WARM_S}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="quickstart runs (the median is reported)")
    args = common.parse_args(parser, argv, __file__, tiny={"runs": 1})
    machine = common.machine()
    cores = os.cpu_count() or 1
    quickstart_to_round_1(args.tiny)  # warms the backbone and feature caches; not counted
    runs = [quickstart_to_round_1(args.tiny) for _ in range(args.runs)]
    wall, cpu = statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)
    shell = [seconds for seconds, *_ in (shell_to_round_1(args.tiny) for _ in range(args.runs))]
    warm = warm_case(args.tiny, args.runs, cores)
    alone = {name: round(statistics.median(cpu_alone(code) for _ in range(args.runs)), 2)
             for name, code in ALONE.items()}
    processes = alone["driver imports"] + alone["ray.init"] + 2 * alone["client worker"] + alone["coordinator"]
    print(f"quickstart, `fedvlp run` from the shell to round 1 (median of {args.runs}): "
          f"{statistics.median(shell):.2f} s; target {TARGET_S} s, every run: "
          + common.against_target(shell, TARGET_S))
    print(f"quickstart, run_federated in this process to the end of round 1 (median of {args.runs}): {wall:.2f} s "
          f"wall, {cpu:.2f} CPU s on {cores} cores -> the CPU alone needs {cpu / cores:.2f} s")
    print("CPU s of each process before it can work, alone in a fresh process: "
          + ", ".join(f"{k} {v:.2f}" for k, v in alone.items())
          + f"; driver + Ray + 2 workers + coordinator = {processes:.2f} CPU s -> {processes / cores:.2f} s on "
          f"{cores} cores")
    print(f"on a running cluster (a head and its MLflow server) with a warm pool, `fedvlp run` from the shell to "
          f"round 1 (median of {args.runs}): "
          f"{warm['shell_median_s']:.2f} s; target: median {TARGET_WARM_S} s, every run {CEILING_WARM_S} s: "
          + common.against_median_target(warm["shell_s"], TARGET_WARM_S, CEILING_WARM_S)
          + f" (round 1 starts at {warm['shell_to_round_1_start_s']:.2f} s)"
          + f"; in this process {warm['wall_s']:.2f} s wall, {warm['cpu_s']:.2f} CPU s; logged by the engine: "
          + ", ".join(f"{k} {v:.2f}" for k, v in warm["logged_startup_s"].items()))
    common.write_results("startup", {
        "machine": machine, "runs": [{"wall_s": round(w, 2), "cpu_s": round(c, 2)} for w, c in runs],
        "shell_s": [round(s, 2) for s in shell], "shell_median_s": round(statistics.median(shell), 2),
        "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "cpu_floor_s": round(cpu / cores, 2),
        "alone_cpu_s": alone, "processes_cpu_s": round(processes, 2),
        "processes_floor_s": round(processes / cores, 2), "target_s": TARGET_S, "warm": warm}, args)


if __name__ == "__main__":
    main()
