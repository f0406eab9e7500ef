"""Cross-device: many small clients per round, fedvlp against the fastest published simulator (pfl-research),
Flower with cached actors and the bare loop, all on the same work.

Workload, shaped like pfl-research's cross-device benchmark (CIFAR-10, 1,000 clients, 50 per round, 1 local epoch,
batch 10): PromptFL (fedvlp/configs/quickstart.yaml, its lr and context) over the tiny CLIP's cached image
features of synthetic-scenes, 1,000 clients with 50 training images each (50,000 in all, an IID split, as pfl's
CIFAR-10 benchmark splits), 50 and 200 clients per round (each its own run of every arm), 1 local epoch at batch 10
(5 local steps a client), evaluation before round 1 and after the last on 1,000 val and 1,000 test images (no
local test sets: pfl's arm scores the global model only). PromptFL over cached features rather than pfl's CIFAR-10
CNN: it is the work fedvlp's users run (a prompt through a frozen text encoder, scored against frozen image
features), and pfl trains any torch module; a CNN on raw images would measure convolutions, not the platform.

Arms, each on 2 processes:
  fedvlp              `run_federated`: a Ray it starts, Coordinator + 2 ClientWorker actors, MLflow, a checkpoint
                      every round; one task per worker per round (`resources.client_dispatch: per_worker`)
  fedvlp_warm         the same on a running cluster, borrowing a warm pool (overhead.py's warm arm)
  fedvlp_per_client   fedvlp_warm with a task per client (`resources.client_dispatch=per_client`: the old dispatch)
  bare                the same pieces with no Ray, MLflow or checkpoint: 2 worker processes train the cohort
                      split as fedvlp splits it and score the evaluation as fedvlp's workers score it, this
                      process aggregates (overhead.py's bare arm)
  flower_cached       Flower's Simulation Engine, 2 actors of 1 CPU, the client kept in the actor with its
                      model and every partition's cached features (overhead.py's flower_cached arm)
  pfl                 pfl-research's own simulator and FedAvg on 2 processes, the same module, cohorts, local
                      optimiser (Adam, a fresh one per client and round) and steps (`_pfl_arm.py`; it runs in a
                      virtual environment of its own under the temp dir, created on first use, since pfl pins
                      dp-accounting < 0.6 and packaging < 26)

Every arm trains the same cohorts (fedvlp's `sample_cohort`) with the same number of local steps, both checked
and printed. Per arm: wall time (total, start-up to the end of the round-0 evaluation, median of rounds 2..last),
CPU seconds of every process doing the arm's work (a warm cluster's head and actors included; a figure that
cannot be counted prints as missing), local steps, and the platform's cost per client: (median round - the
busiest worker's compute in it) / clients per round, where the arm reports its workers' compute.

Targets (ratios of total wall time, read over the repeats' paired runs: met only if every repeat meets it):
fedvlp_warm <= 1.0x pfl at 50 and at 200 per round; fedvlp_warm <= 1.2x bare; fedvlp and fedvlp_warm <= 0.2x
flower_cached; fedvlp_warm's platform cost <= 0.5 ms per client at 200 per round (every repeat).

Run: python benchmarks/cross_device.py [--per-round 50 200] [--rounds 10] [--repeats 3] [--arms ...]
Writes benchmarks/results/cross_device.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import tempfile
from pathlib import Path

import _common as common
import _pfl_arm
import overhead

ARMS = ("fedvlp", "fedvlp_warm", "fedvlp_per_client", "bare", "flower_cached", "pfl")
FEDVLP_ARMS = ("fedvlp", "fedvlp_warm", "fedvlp_per_client")
SAMPLES_PER_CLIENT = 50
# (ours, theirs) -> the total wall-time ratio to stay under
TARGETS = {("fedvlp_warm", "pfl"): 1.0, ("fedvlp_warm", "bare"): 1.2, ("fedvlp", "flower_cached"): 0.2,
           ("fedvlp_warm", "flower_cached"): 0.2}
COST_TARGET_MS = 0.5  # fedvlp_warm's platform cost per client at 200 per round


def workload(args, per_round: int) -> list[str]:
    """The overrides of quickstart.yaml that make the cross-device workload."""
    return ["method.local_epochs=1", "method.batch_size=10", f"federation.clients={args.clients}",
            f"federation.participation={per_round / args.clients}", f"federation.rounds={args.rounds}",
            f"federation.eval_every={args.rounds}", f"data.num_train={args.clients * SAMPLES_PER_CLIENT}",
            "federation.partition=iid", "data.num_val=1000", "data.num_test=1000", "data.num_holdout=0",
            "resources.workers=2", "resources.round_timeout_s=600", "tracking.experiment=bench-cross-device"]


def run_pfl(overrides: list[str], rounds: int) -> dict:
    """pfl's arm in its own virtual environment, with the same overrides; its figures in overhead's shape."""
    python = _pfl_arm.ensure_venv()
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "pfl.json"
        command = [str(python), str(Path(__file__).with_name("_pfl_arm.py")), "--rounds", str(rounds),
                   "--processes", "2", "--out", str(out)] + [arg for o in overrides for arg in ("--set", o)]
        subprocess.run(command, check=True, timeout=3600)
        figures = json.loads(out.read_text())
    return {**figures, "to_round_1_s": round(figures["startup_s"] + figures["round_s"][0], 2),
            "cpu_to_last_round_s": figures.get("cpu_s")}


def cost_per_client_ms(arm: dict, per_round: int) -> float | None:
    """(median round - the busiest worker's compute in it) / clients per round, in ms, over rounds 2..last; None
    where the arm does not report its workers' compute."""
    compute = arm.get("busiest_worker_compute_s") or arm.get("busiest_actor_compute_s")
    if not compute or any(c is None for c in compute):
        return None
    rest = [r - c for r, c in zip(arm["round_s"][1:], compute[1:])]
    return round(1000 * common.median(rest) / per_round, 3)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--per-round", type=int, nargs="+", default=[50, 200], help="clients per round, each a run")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of every arm, in alternating order; each arm reports its run of median total time")
    parser.add_argument("--run-arm", nargs=3, metavar=("ARM", "PER_ROUND", "OUT"), help=argparse.SUPPRESS)
    args = common.parse_args(parser, argv, __file__, tiny={"clients": 40, "per_round": [4], "rounds": 3,
                                                           "repeats": 1, "arms": list(ARMS[:4])})
    if args.run_arm:
        arm, per_round, out = args.run_arm
        Path(out).write_text(json.dumps(run_arm(arm, args, int(per_round))))
        return
    arms = list(args.arms)
    figures = {"machine": common.machine(), "clients": args.clients, "per_round": args.per_round,
               "rounds": args.rounds, "repeats": args.repeats, "samples_per_client": SAMPLES_PER_CLIENT,
               "processes_per_arm": 2, "skipped": {}, "runs": {}}
    if "flower_cached" in arms and not overhead.flower_available():
        figures["skipped"]["flower_cached"] = "flwr is not installed (pip install 'flwr>=1.42,<2')"
        arms.remove("flower_cached")
    for per_round in args.per_round:
        overhead.warm_feature_cache(common.bench_spec("quickstart", workload(args, per_round), args.tiny))
        runs = common.alternating_runs(__file__, argv, arms, args.repeats, per_round)
        figures["runs"][f"{per_round}_per_round"] = report(runs, per_round, args)
    common.write_results("cross_device", figures, args)


def run_arm(arm: str, args, per_round: int) -> dict:
    overrides = workload(args, per_round)
    spec = common.bench_spec("quickstart", overrides, args.tiny)
    if arm == "pfl":
        return run_pfl((common.TINY_DATA if args.tiny else []) + overrides, args.rounds)
    if arm == "fedvlp_per_client":
        spec = dataclasses.replace(spec, resources=dataclasses.replace(spec.resources, client_dispatch="per_client"))
    runners = {"fedvlp": overhead.run_fedvlp, "fedvlp_warm": overhead.run_fedvlp_warm,
               "fedvlp_per_client": overhead.run_fedvlp_warm, "bare": overhead.run_bare,
               "flower_cached": lambda spec: overhead.run_flower(spec, cached=True)}
    return runners[arm](spec)


def report(runs: dict[str, list[dict]], per_round: int, args) -> dict:
    """Print one cohort size's arms (their median runs) side by side with the targets; its figures."""
    arms = {arm: overhead.median_run(arm_runs) for arm, arm_runs in runs.items()}
    totals = {arm: [r["total_s"] for r in arm_runs] for arm, arm_runs in runs.items()}
    costs = {arm: [cost_per_client_ms(r, per_round) for r in arm_runs] for arm, arm_runs in runs.items()}
    print(f"\n{args.clients} clients, {per_round} per round, {args.rounds} rounds, 1 local epoch at batch 10")
    print(f"{'arm':<19}{'total s':>9}{'start-up s':>12}{'median round s':>16}{'CPU s':>9}{'local steps':>13}"
          f"{'cost/client ms':>16}{'final val_mAP':>15}")
    missing = "missing"
    for name, r in arms.items():
        cpu, cost = r.get("cpu_to_last_round_s"), cost_per_client_ms(r, per_round)
        print(f"{name:<19}{r['total_s']:>9.1f}{r['startup_s']:>12.1f}{r['median_round_s']:>16.3f}"
              f"{cpu if cpu is not None else missing:>9}{r['local_steps']:>13}"
              f"{cost if cost is not None else missing:>16}{r['final'].get('val_mAP', float('nan')):>15.4f}")
    ratios = {}
    for (ours, theirs), goal in TARGETS.items():
        if ours in arms and theirs in arms:
            paired = [round(a / b, 3) for a, b in zip(totals[ours], totals[theirs])]
            rounds = round(arms[ours]["median_round_s"] / arms[theirs]["median_round_s"], 3)
            ratios[f"{ours}/{theirs}"] = {"total_per_repeat": paired, "median_round": rounds, "target": goal,
                                          "verdict": common.against_target(paired, goal)}
            print(f"{ours}/{theirs}: total x{common.median(paired):.2f} per repeat {paired} (target <= {goal}: "
                  f"{ratios[f'{ours}/{theirs}']['verdict']}); median round x{rounds:.2f}")
    verdicts = {"ratios": ratios}
    if per_round >= 200 and "fedvlp_warm" in arms and all(c is not None for c in costs["fedvlp_warm"]):
        verdicts["cost_target"] = {"target_ms": COST_TARGET_MS,
                                   "verdict": common.against_target(costs["fedvlp_warm"], COST_TARGET_MS)}
        print(f"fedvlp_warm platform cost per client {costs['fedvlp_warm']} ms (target <= {COST_TARGET_MS}: "
              f"{verdicts['cost_target']['verdict']})")
    work = overhead.same_work(arms)
    print(f"the same work in every arm: local steps {work['same_local_steps']} {work['local_steps']}, "
          f"cohorts {work['same_cohorts']}")
    return {"arms": arms, "totals_s": totals, "cost_per_client_ms": costs, "work": work, **verdicts}


if __name__ == "__main__":
    main()
