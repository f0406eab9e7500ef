"""Seconds per round and memory as the number of virtual clients grows, with a fixed cohort of 10 per round.

fedvlp runs promptfl (fedvlp/configs/quickstart.yaml) on 2 workers with N = 100, 1,000 and 10,000 virtual clients
and participation 10/N, for 10 rounds. The work of a round is held fixed across N: every client holds the
same number of samples (--samples-per-client, 2 by default: the training set is 2N samples, 20,000 at
N = 10,000; its frozen features are encoded once and shared through fedvlp's disk cache), an iid split
(the label-skew k-means leaves a third of 10,000 clients empty at 2 samples each), and batch_size 256, so
a cohort always trains 10 x 2 samples in local_epochs steps per client. The global model is evaluated before
round 1 and after the last round only.

Per N it prints start-up seconds (to the end of the round-0 evaluation, with its slowest phases), the
median seconds per round over rounds 2..R-1 (round 1 warms up, round R also evaluates) and their spread
across N (target: within +-15% of their mean). The same client work runs slower when other jobs load
the machine, so beside it: the median seconds of one client's local update (inside a worker), the rest
of a round (round - busiest worker's updates: dispatch, aggregation, checkpoint, MLflow), the round
in units of one client's update (the load-independent figure, also compared across N), the median
CPU seconds per round of the driver and its descendants (Ray's processes and the actors), and the peak RSS
over the rounds of the driver, the coordinator actor and each worker (psutil; the actors are this
driver's descendant processes titled ray::Coordinator / ray::ClientWorker, checked against
RunResult.workers).

Client-local state: the coordinator keeps each client's local state in its ClientStateStore, in memory
up to resources.client_state_memory_mb and spilled to one file per client past it; every round's
checkpoint holds the in-memory states and the index of the spilled ones. fedotp (fedvlp/configs/fedotp_scenes.yaml,
a local prompt per client) runs at the largest N: round time, coordinator RSS, what one state weighs.
Then a ClientStateStore is given a state of that shape for every one of the N clients, as the
coordinator's is once all have taken part, with the default budget and with budget 0 (all spilled):
memory held, files, and per round the cohort's reads and the checkpoint, written as a run writes it (the
coordinator's `encode`, the driver's `write_checkpoint`, into the runs' output_dir): its bytes, the seconds until
the write returns (the page cache: fedvlp does not fsync) and until it is on the disk (file and folder fsynced),
and the filesystem it went to.

Run: python benchmarks/scale.py [--clients 100 1000 10000] [--rounds 10] [--samples-per-client 2] [--no-local-state]
Writes benchmarks/results/scale.json.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import _common as common
import numpy as np
import psutil
import torch

COHORT = 10
TARGET_SPREAD = 0.15
MiB = common.MiB


def scale_spec(config: str, clients: int, args, method_overrides: list[str]):
    return common.bench_spec(config, [
        f"federation.clients={clients}", f"federation.participation={COHORT / clients}",
        "federation.partition=iid", f"federation.rounds={args.rounds}", f"federation.eval_every={args.rounds}",
        f"data.num_train={clients * args.samples_per_client}", "resources.workers=2", "tracking.experiment=bench-scale",
        *method_overrides], args.tiny)


class MemoryPeaks:
    """Peak RSS (MiB) of the driver and of this run's actors, sampled when called."""

    def __init__(self):
        self.peaks: dict[str, dict[int, float]] = defaultdict(dict)

    def __call__(self, *_):
        for role, pids in {"driver": [os.getpid()], **actor_pids()}.items():
            for pid in pids:
                try:
                    self.peaks[role][pid] = max(self.peaks[role].get(pid, 0.0), common.rss_mib(pid))
                except psutil.Error:  # the actor ended between the listing and the reading
                    pass

    def summary(self) -> dict:
        return {role: {str(pid): rss for pid, rss in sorted(by_pid.items())} for role, by_pid in self.peaks.items()}


def actor_pids() -> dict[str, list[int]]:
    """This run's Ray actors: the descendants of this driver whose process title names the actor class."""
    found = {"coordinator": [], "workers": []}
    for proc in psutil.Process().children(recursive=True):
        try:
            title = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if title.startswith("ray::Coordinator"):
            found["coordinator"].append(proc.pid)
        elif title.startswith("ray::ClientWorker"):
            found["workers"].append(proc.pid)
    return found


def timed_run(spec) -> tuple[dict, object]:
    """(figures, RunResult) of one fedvlp run: start-up, round times (wall and CPU), phases and peak memory."""
    memory = MemoryPeaks()

    result, clock, phases, total, startup, rounds = common.timed_fedvlp_run(spec, on_round=lambda *a: memory())
    round_cpu = clock.round_cpu()  # rounds 2..R
    peaks = memory.summary()
    worker_pids = sorted(str(w["pid"]) for w in result.workers)
    if sorted(peaks.get("workers", {})) != worker_pids:
        print(f"  note: measured worker pids {sorted(peaks.get('workers', {}))}, RunResult.workers {worker_pids}")
    startup_phases = {k: round(v, 2) for k, v in phases.seconds.items() if k in common.STARTUP_PHASES}
    busiest, per_client = common.worker_seconds(result.history)
    steady = slice(1, -1)  # rounds 2..R-1
    return {"total_s": round(total, 2), "startup_s": round(startup, 2), "startup_phases_s": startup_phases,
            "round_s": [round(r, 3) for r in rounds], "steady_round_s": round(common.median(rounds[steady]), 3),
            "client_update_s": round(common.median(per_client[steady]), 4),
            "round_rest_s": round(common.median([r - b for r, b in zip(rounds[steady], busiest[steady])]), 3),
            "round_over_client_update": round(common.median(
                [r / c for r, c in zip(rounds[steady], per_client[steady])]), 2),
            "round_cpu_s": [round(c, 3) for c in round_cpu],
            "steady_round_cpu_s": round(common.median(round_cpu[:-1]), 3),
            "rss_mib": peaks, "final_mAP": round(result.final.get("mAP", float("nan")), 4)}, result


def client_state_footprint(spec, clients: int) -> dict:
    """fedotp at `clients`: a real run, then the coordinator's ClientStateStore holding a state for every client."""
    figures, result = timed_run(spec)
    checkpoint_path = Path(spec.output_dir).resolve() / result.run_id / "checkpoint.pt"
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    from fedvlp.platform.runtime.client_states import ClientStateStore

    with tempfile.TemporaryDirectory() as spill_dir:  # the run's own store, restored from its checkpoint
        stored = ClientStateStore(spill_dir, 0, snapshot=checkpoint["clients"])
    one = next(iter(stored.in_memory.values()), None)
    if one is None:
        raise RuntimeError("fedotp run: no client-local state in memory to measure "
                           "(resources.client_state_memory_mb=0?)")
    budget_mib = spec.resources.client_state_memory_mb
    out_dir = Path(spec.output_dir).resolve()
    return {"clients": clients, "run": figures, "states_in_memory": len(stored.in_memory),
            "states_on_disk": len(stored.on_disk), "state_shapes": {k: list(t.shape) for k, t in one.items()},
            "state_bytes": sum(t.numel() * t.element_size() for t in one.values()),
            "checkpoint_mib_after_run": round(checkpoint_path.stat().st_size / MiB, 2),
            "every_client_has_state": {
                f"in memory (budget {budget_mib:g} MiB)": filled_store(one, clients, int(budget_mib * MiB), checkpoint,
                                                                       out_dir),
                "spilled (budget 0)": filled_store(one, clients, 0, checkpoint, out_dir)}}


def filled_store(state: dict, clients: int, budget_bytes: int, checkpoint: dict, out_dir: Path) -> dict:
    """A ClientStateStore given `state` for every client, as the coordinator's is once all have taken part:
    what it holds, and what a round then costs it (its checkpoint, written into `out_dir`; the cohort's reads)."""
    from fedvlp.platform.records.checkpoint import encode, write_checkpoint
    from fedvlp.platform.runtime.client_states import ClientStateStore

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as spill_dir:
        store = ClientStateStore(spill_dir, budget_bytes)
        tic = time.perf_counter()
        for cid in range(clients):
            store.put(cid, {k: t.clone() for k, t in state.items()}, round_index=1)
        put_s = time.perf_counter() - tic
        written = common.timed_write_to_disk(  # what the engine writes each round
            lambda path: write_checkpoint(path, encode({**checkpoint, "clients": store.snapshot()})),
            Path(spill_dir) / "round" / "checkpoint.pt")
        tic = time.perf_counter()
        for cid in range(COHORT):
            store.get(cid)
        cohort_get_s = time.perf_counter() - tic
        files = list(Path(spill_dir).glob("*.safetensors"))
        return {"memory_mib": round(store.memory_bytes / MiB, 1), "spilled_files": len(files),
                "disk_mib": round(sum(f.stat().st_size for f in files) / MiB, 1), "put_all_s": round(put_s, 2),
                "checkpoint_mib": round(written["bytes"] / MiB, 2), "checkpoint_s": round(written["write_s"], 3),
                "checkpoint_on_disk_s": round(written["on_disk_s"], 3), "checkpoint_filesystem": written["filesystem"],
                "cohort_get_s": round(cohort_get_s, 4)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 1_000, 10_000])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--samples-per-client", type=int, default=2,
                        help="every client's samples (the training set is N times this), so a cohort's work is fixed")
    parser.add_argument("--no-local-state", action="store_true", help="skip the fedotp client-local state run")
    args = common.parse_args(parser, argv, __file__, tiny={"clients": [COHORT, 2 * COHORT], "rounds": 3})
    if args.rounds < 3:
        parser.error("--rounds: at least 3 (round 1 warms up, the last also evaluates)")

    figures = {"machine": common.machine(), "cohort": COHORT, "rounds": args.rounds,
               "samples_per_client": args.samples_per_client, "target_spread": TARGET_SPREAD,
               "method": "promptfl", "runs": []}
    print(f"{'clients':>8}{'start-up s':>12}{'s/round':>9}{'client update s':>17}{'rest s':>8}{'CPU s/round':>13}"
          f"{'driver MiB':>12}{'coord MiB':>11}{'workers MiB':>14}  slowest start-up phases")
    for clients in args.clients:
        spec = scale_spec("quickstart", clients, args, ["method.batch_size=256"])
        run, _ = timed_run(spec)
        run["clients"] = clients
        figures["runs"].append(run)
        rss = run["rss_mib"]
        slowest = sorted(run["startup_phases_s"].items(), key=lambda kv: -kv[1])[:3]
        print(f"{clients:>8}{run['startup_s']:>12.1f}{run['steady_round_s']:>9.3f}{run['client_update_s']:>17.4f}"
              f"{run['round_rest_s']:>8.3f}{run['steady_round_cpu_s']:>13.3f}{max(rss['driver'].values()):>12.0f}"
              f"{sum(rss.get('coordinator', {}).values()):>11.0f}"
              f"{' + '.join(f'{v:.0f}' for v in rss.get('workers', {}).values()):>14}  "
              + ", ".join(f"{k} {v:.1f}" for k, v in slowest), flush=True)

    for figure, label in (("steady_round_s", "seconds per round"),
                          ("round_over_client_update", "rounds in client updates (round / one client's update)")):
        values = [r[figure] for r in figures["runs"]]
        spread = max(abs(v - np.mean(values)) / np.mean(values) for v in values)
        figures[f"{figure}_spread"] = round(float(spread), 3)
        met = "met" if spread <= TARGET_SPREAD else "MISSED"
        print(f"{label} across N: {min(values):.3f}..{max(values):.3f}, at most {100 * spread:.0f}% "
              f"from their mean (target +-{100 * TARGET_SPREAD:.0f}%: {met})")

    if not args.no_local_state:
        clients = max(args.clients)
        local = client_state_footprint(scale_spec("fedotp_scenes", clients, args, []), clients)
        figures["client_local_state"] = local
        run = local["run"]
        print(f"fedotp, {clients} clients: start-up {run['startup_s']:.1f} s, {run['steady_round_s']:.3f} s/round, "
              f"{run['steady_round_cpu_s']:.3f} CPU s/round, coordinator "
              f"{sum(run['rss_mib'].get('coordinator', {}).values()):.0f} MiB; after the run "
              f"{local['states_in_memory']} local states in memory, {local['states_on_disk']} on disk, "
              f"{local['state_bytes']} B each {local['state_shapes']}, checkpoint "
              f"{local['checkpoint_mib_after_run']} MiB")
        print(f"  the coordinator's ClientStateStore with a state for every one of the {clients} clients:")
        for mode, f in local["every_client_has_state"].items():
            print(f"  {mode:<28} holds {f['memory_mib']:>6.1f} MiB, {f['spilled_files']:>5} files "
                  f"({f['disk_mib']} MiB); filled in {f['put_all_s']:.1f} s; per round: checkpoint "
                  f"{f['checkpoint_mib']:.2f} MiB written in {f['checkpoint_s']:.2f} s, on disk "
                  f"({f['checkpoint_filesystem']}) in {f['checkpoint_on_disk_s']:.2f} s, the cohort's states read in "
                  f"{f['cohort_get_s']:.4f} s")
    common.write_results("scale", figures, args)


if __name__ == "__main__":
    main()
