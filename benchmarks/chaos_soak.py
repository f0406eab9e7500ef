"""Chaos soak: a tiny run of many rounds on 2 workers, with faults injected at seeded random rounds, against the same
run without them. The faults: 3 workers SIGKILLed mid-round (ray.kill of a worker whose client is busy), 3 clients
that raise, 1 hung worker (a client that sleeps past `resources.round_timeout_s`), and the driver SIGKILLed (its
whole process group, its local Ray included) once a round's checkpoint is on disk, then resumed from it.

With `federation.on_client_failure: retry`, every failed update is trained again from its own (seed, round, client)
stream, so the soaked run must end with the clean run's final metrics and global state, bitwise, and its MLflow
history must hold every round's step exactly once. Prints one line (faults injected, survived, rounds lost) and
writes benchmarks/results/chaos_soak.json.
Run: python benchmarks/chaos_soak.py            (60 rounds, about 4 minutes on 2 cores)
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from _common import SCRATCH, parse_args, write_results

FAULTS = {"kill": 3, "raise": 3, "hang": 1}  # client faults; plus one driver kill
ROUND_TIMEOUT_S = 30  # what a hung client costs; far above a tiny client's update, even on a loaded machine
METRICS = ("val_mAP", "test_mAP", "train_loss")


def fault_plan(rounds: int, seed: int) -> dict:
    """{round: (kind, worker, client)} for the client faults, and the round after whose checkpoint the driver is
    killed; distinct rounds from 2 on, drawn by `seed`. Client k trains on worker k mod 2 (cohort_placement=home)."""
    rng = np.random.default_rng(seed)
    kinds = [kind for kind, count in FAULTS.items() for _ in range(count)]
    fault_rounds = sorted(int(r) for r in rng.choice(np.arange(2, rounds), size=len(kinds), replace=False))
    faults = {}
    for r, kind in zip(fault_rounds, rng.permutation(kinds)):
        client = int(rng.integers(4))
        faults[r] = (str(kind), client % 2, client)
    # a fault is armed after the round before it, in the workers the driver kill ends: none right after the kill
    free = [r for r in range(2, rounds) if r not in faults and r + 1 not in faults]
    return {"client_faults": faults, "driver_kill_after_round": int(rng.choice(free))}


def overrides(rounds: int, out: Path, uri: str) -> list[str]:
    return [f"federation.rounds={rounds}", "federation.clients=4", "federation.participation=1.0",
            "federation.eval_every=10", "federation.on_client_failure=retry", "method.local_epochs=1",
            "data.num_train=400", "data.num_val=64", "data.num_test=64", "data.num_holdout=48",
            "resources.workers=2", "resources.cohort_placement=home", f"resources.round_timeout_s={ROUND_TIMEOUT_S}",
            f"output_dir={out}", f"tracking.uri={uri}"]


def _live_worker(run_id: str, index: int):
    """Worker `index` of the run as it is now (a replacement is named with the replacement count)."""
    import ray

    prefix = f"fedvlp-{run_id}-worker-{index}"
    names = [n for n in ray.util.list_named_actors() if n == prefix or n.startswith(prefix + "-")]
    return ray.get_actor(max(names, key=lambda n: int(n[len(prefix) + 1:] or 0)))


def drive(plan: dict, resume_run: str | None, argv: list[str], log: Path) -> None:
    """One driver: the run (resumed from `resume_run`'s checkpoint if given), arming each planned fault after the
    round before it, and killing its own process group after the planned round (only when not resuming)."""
    import ray

    from fedvlp.config import load_spec
    from fedvlp.platform.records.checkpoint import read_checkpoint
    from fedvlp.platform.records.tracking import resumable_run
    from fedvlp.platform.runtime.engine import run_federated

    faults = {int(r): f for r, f in plan["client_faults"].items()}

    def on_round(round_index, metrics, checkpoint):
        if (fault := faults.get(round_index + 1)) is not None:
            kind, worker, client = fault
            actor = _live_worker(checkpoint.parent.name, worker)
            ray.get(actor.inject_fault.remote(round_index + 1, client, "raise" if kind == "raise" else "hang"))
            if kind == "kill":  # while its client is mid-update
                threading.Timer(1.0, ray.kill, [actor]).start()
            with open(log, "a") as out:
                out.write(json.dumps({"round": round_index + 1, "kind": kind, "worker": worker}) + "\n")
        if resume_run is None and round_index == plan["driver_kill_after_round"]:
            with open(log, "a") as out:
                out.write(json.dumps({"round": round_index, "kind": "driver"}) + "\n")
            os.killpg(0, signal.SIGKILL)

    if resume_run is None:
        run_federated(load_spec(None, argv), progress=False, on_round=on_round)
    else:
        spec, checkpoint = resumable_run(resume_run, next(a.split("=", 1)[1] for a in argv if a.startswith(
            "tracking.uri=")))
        run_federated(spec, progress=False, on_round=on_round, resume=read_checkpoint(checkpoint))


def _driver(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, __file__, "--driver", *args], start_new_session=True,
                          capture_output=True, text=True, timeout=timeout)


def soak(rounds: int, seed: int, root: Path) -> dict:
    import torch
    from mlflow import MlflowClient

    from fedvlp.config import load_spec
    from fedvlp.platform.runtime.engine import run_federated

    root.mkdir(parents=True, exist_ok=True)
    uri, log, plan = f"sqlite:///{root / 'mlflow.db'}", root / "faults.jsonl", fault_plan(rounds, seed)
    log.write_text("")
    started = time.monotonic()
    killed = _driver([json.dumps(plan), "-", str(log), *overrides(rounds, root / "soaked", uri)], 1800)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    (run_id,) = [p.name for p in (root / "soaked").iterdir()]
    client = MlflowClient(uri)
    logged_at_kill = max(m.step for m in client.get_metric_history(run_id, "train_loss"))
    checkpointed_at_kill = int(torch.load(root / "soaked" / run_id / "checkpoint.pt", weights_only=True)["round"])
    time.sleep(2)  # as a user would: the killed group's processes are gone before the resume starts
    resumed = _driver([json.dumps(plan), run_id, str(log), *overrides(rounds, root / "soaked", uri)], 1800)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    soaked_s = time.monotonic() - started

    started = time.monotonic()
    clean = run_federated(load_spec(None, overrides(rounds, root / "clean", uri)), progress=False)
    clean_s = time.monotonic() - started

    soaked_ckpt = torch.load(root / "soaked" / run_id / "checkpoint.pt", weights_only=True)
    clean_ckpt = torch.load(root / "clean" / clean.run_id / "checkpoint.pt", weights_only=True)
    same_state = all(torch.equal(soaked_ckpt["global"][k], clean_ckpt["global"][k]) for k in clean_ckpt["global"])
    steps_once, same_history = True, True
    for metric in METRICS:
        soaked_steps = [(m.step, m.value) for m in client.get_metric_history(run_id, metric)]
        clean_steps = sorted((m.step, m.value) for m in client.get_metric_history(clean.run_id, metric))
        steps_once &= len({s for s, _ in soaked_steps}) == len(soaked_steps)
        same_history &= sorted(soaked_steps) == clean_steps
    run = client.get_run(run_id)
    injected = [json.loads(line) for line in log.read_text().splitlines()]
    counts = {kind: sum(f["kind"] == kind for f in injected) for kind in (*FAULTS, "driver")}
    history = {int(m.step): m.value for m in client.get_metric_history(run_id, "failed_clients")}
    replaced = {int(m.step): m.value for m in client.get_metric_history(run_id, "replaced_workers")}
    return {
        "rounds": rounds, "seed": seed, "plan": plan, "injected": counts,
        "failed_updates": int(sum(history.values())), "replaced_workers": int(sum(replaced.values())),
        "status": run.info.status, "final_equal": soaked_ckpt["final"] == clean_ckpt["final"],
        "global_state_equal": same_state, "history_steps_once": steps_once, "history_equal": same_history,
        "rounds_lost": logged_at_kill - checkpointed_at_kill, "finished_rounds": int(soaked_ckpt["round"]),
        "soaked_seconds": round(soaked_s, 1),
        "clean_seconds": round(clean_s, 1),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0, help="draws the rounds and clients of the faults")
    parser.add_argument("--out", type=Path, default=SCRATCH / "chaos-soak", help="scratch: stores and checkpoints")
    args = parse_args(parser, argv, __file__, {"rounds": 16})
    figures = soak(args.rounds, args.seed, args.out / str(os.getpid()))
    n = sum(figures["injected"].values())
    survived = figures["status"] == "FINISHED" and figures["final_equal"] and figures["global_state_equal"]
    print(f"chaos soak: {n} faults injected ({', '.join(f'{v} {k}' for k, v in figures['injected'].items())}), "
          f"{'survived' if survived else 'NOT survived'}: final metrics and global state "
          f"{'bitwise equal' if survived else 'differ from'} a clean run's, MLflow steps "
          f"{'once each' if figures['history_steps_once'] else 'duplicated'}, {figures['rounds_lost']} rounds lost "
          f"({figures['soaked_seconds']:.0f} s against {figures['clean_seconds']:.0f} s clean)")
    write_results("chaos_soak", figures, args)
    return figures


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--driver":
        plan_json, resume_run, log_path, *spec_args = sys.argv[2:]
        drive(json.loads(plan_json), None if resume_run == "-" else resume_run, spec_args, Path(log_path))
    else:
        main()
