"""One federated workload five ways: fedvlp on a Ray it starts (cold) and on a running cluster (warm), a bare loop
with the same parallelism, and Flower's simulation engine with the client its documentation writes and with the
client its best practice caches in the actor.

Workload, per method (promptfl from fedvlp/configs/quickstart.yaml, fedmpt from fedvlp/configs/fedmpt_scenes.yaml,
their local-training params unchanged): synthetic-scenes, tiny CLIP, 50 clients, participation 0.2
(10 per round), 20 rounds and 200 rounds (each length a separate run of every arm). Every arm trains the same
clients every round (fedvlp's `sample_cohort` with the run's seed), with the same per-(round, client) generators,
so the same local optimizer steps, which every arm counts and the script prints side by side. Evaluation is the
same in all four, before training and after the last round: what fedvlp's engine scores, the global model on val
and on test, and each client's model on its local test set (`personal_*`); the two methods keep no client-local
state, so that is the global model on each client's local test set. Doing fedvlp's evaluation in every arm keeps
fedvlp as users run it, and lets the bare loop be checked against all of its metrics.

  (a) fedvlp   `run_federated(spec)`: Coordinator + 2 ClientWorker actors, MLflow (scratch sqlite store
               under the temp dir), a checkpoint every round; federation.eval_every = rounds. It starts a private
               local Ray and its actors, and stops them at the end.
  (a') fedvlp_warm  the same run on a cluster that is already up: a head started for the arm (`ray start
               --head`, not timed) and a 1-round run that leaves its actors in the cluster's warm pool (not
               timed); the timed run attaches (RAY_ADDRESS) and borrows them (`resources.keep_warm_s`).
  (b) bare     `_common.run_bare(spec, processes=2)`: the same pieces without Ray, MLflow or checkpoints;
               each round's cohort is split over 2 worker processes (spawned at start-up, one torch
               thread each, as fedvlp's 2 workers) as fedvlp splits it (`balance_cohort`), and the same processes
               score the evaluation as fedvlp's workers do (blocks dealt round-robin, each client's local sets on
               its home process); this process aggregates and computes the metrics: the same
               features (fedvlp's disk cache), cohorts, per-(round, client) generators, local updates and
               FedAvg. It should reach (a)'s final metrics exactly; the script prints whether it does.
  (c) flower   Flower's Simulation Engine (`flwr.simulation.run_simulation`, Ray backend, 2 actors of
               1 CPU), written the way Flower's docs write a simulation: `ClientApp(client_fn)`, where
               `client_fn(context)` builds a `NumPyClient` per message (loads the model, i.e. the frozen
               backbone and the prompt learner, and the partition it trains); the dataset is generated and
               partitioned once per process, like the docs' global `FederatedDataset`. The client encodes its
               partition through the frozen backbone once per message (per round it is sampled), not per step:
               kinder to Flower than a literal port of a CoOp trainer, which re-encodes every step
               (benchmarks/feature_cache.py measures that). `ServerApp(server_fn)` with FedAvg on fedvlp's
               cohorts: Flower's server sees node ids, not the partitions behind them, so each round's fit
               instructions name the partitions of fedvlp's cohort (the simulation's nodes are interchangeable
               slots) and the updates are averaged in partition order. A centralised `evaluate_fn` scores rounds
               0 and last as fedvlp does (val, test, local test sets), from fedvlp's feature cache.
               Its metrics are close to fedvlp's, not equal: Flower averages in numpy, fedvlp in torch.
               (flwr 1.42 marks `run_simulation` deprecated in favour of the `flwr run` CLI; it still runs the
               same Simulation Engine, and is the Python entry point its API reference documents.)
  (d) flower_cached  the same, with the client Flower's guides recommend for heavy models: the actor process
               keeps the backbone, the model and the partitions' frozen features (read once from fedvlp's
               feature cache) between messages, so a message only sets the parameters and trains.

Every arm's wall time (from its call, after imports) is split into start-up (up to the end of the
round-0 evaluation), round 1, the median of rounds 2..last, and the rest (tear-down). Round times
include all per-round work; a fedvlp round ends when its driver hands the round's metrics to the MLflow tracker
and starts the next, while the tracker's thread sends them, writes the checkpoint and prints the round (its CPU
counts, and the total waits for it). Beside wall time, the
CPU seconds of the process and its descendants (Ray's processes, the actors): other work on the machine
stretches wall time far more than CPU time. Printed side by side with the ratios of fedvlp to each
other arm (and their targets), where fedvlp's time goes (phases timed in place) and where Flower's client time goes.

(c) and (d) need Flower: pip install 'flwr>=1.42,<2' (not `flwr[simulation]`, which pins ray==2.55.1; Flower's
simulation runs on the Ray fedvlp already installs). Without flwr, they are skipped (and the JSON says so).
Flower's telemetry is switched off (FLWR_TELEMETRY_ENABLED=0). The frozen features must be cached for every arm
to read the same ones: the script fills fedvlp's feature cache before timing anything.

With --repeats R every arm runs R times per length, in alternating order (forward, then backward), and reports
its run of median total time: on a machine whose speed drifts (this project's 2 cores vary by 20-30 % from one
minute to the next) that keeps the ratios from resting on which arm ran in a fast minute. Every run starts in a
fresh Python process, as a user's job does (a driver that met an earlier Ray head is slow in each later
`ray.shutdown`, which would charge one arm for another's); close targets need --repeats 3 or more.

Run: python benchmarks/overhead.py [--methods promptfl fedmpt] [--arms fedvlp fedvlp_warm bare flower flower_cached]
     [--clients 50] [--participation 0.2] [--rounds 20 200] [--workers 2] [--repeats 1]
Writes benchmarks/results/overhead.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import time
from collections import defaultdict
from pathlib import Path

import _common as common
import numpy as np
import torch

from fedvlp.backbones.loaders import load_backbone, prepare_backbone
from fedvlp.data import prepare_data
from fedvlp.methods.base import ClientData, Task
from fedvlp.platform.runtime.cohorts import cohort_size, sample_cohort
from fedvlp.platform.runtime.worker import build_method
from fedvlp.seeding import torch_generator

CONFIGS = {"promptfl": "quickstart", "fedmpt": "fedmpt_scenes"}
ARMS = ("fedvlp", "fedvlp_warm", "bare", "flower", "flower_cached")
FEDVLP_ARMS = ("fedvlp", "fedvlp_warm")
OTHER_ARMS = ("bare", "flower", "flower_cached")
FLOWER_ARMS = {"flower": False, "flower_cached": True}  # arm -> the client kept in the actor


def target(other: str, rounds: int, method: str) -> float | None:
    """The total wall-time ratio fedvlp / `other` to stay under (the bare loop's depends on the run's length:
    a short run cannot amortise Ray's start-up). None against cached Flower for FedMPT: training is 95 % of its
    round in both, so that ratio measures the training code, not the platform."""
    if other == "bare":
        return 1.15 if rounds >= 200 else 1.5
    if other == "flower_cached" and method == "fedmpt":
        return None
    return {"flower": 0.5, "flower_cached": 0.8}[other]


HEADLINE = "test_mAP"
RATIOS = {"total": "total_s", "start-up + round 1": "to_round_1_s", "median round": "median_round_s",
          "CPU": "cpu_to_last_round_s", "median round CPU": "median_round_cpu_s"}
CLIENT_PARTS = ("data_s", "load_s", "encode_s", "train_s")  # a Flower client message: data, model, features, training


def workload_spec(method: str, args):
    """The method's shipped config at a fixed workload: 5 local epochs whatever its tuned value, so the figures
    stay comparable when a config is re-tuned."""
    return common.bench_spec(CONFIGS[method], [
        "method.local_epochs=5", f"federation.clients={args.clients}", f"federation.participation={args.participation}",
        f"federation.rounds={args.rounds}", f"federation.eval_every={args.rounds}",
        f"resources.workers={args.workers}", f"tracking.experiment=bench-overhead-{method}"], args.tiny)


def warm_feature_cache(spec) -> None:
    """Encode and cache the frozen features once, so no arm's time includes a first encoding."""
    prepare_backbone(spec)
    data = prepare_data(spec)
    backbone = load_backbone(spec)
    kind = build_method(spec, backbone, Task(data.dataset.class_names, data.dataset.multilabel)).feature_kind
    for split in ("train", "val", "test", "holdout"):
        common.frozen_features(spec, data, backbone, kind, split)


def summary(total: float, startup: float, rounds: list[float], clock: common.RoundClock, final: dict,
            local_steps: list[int], cohorts: list[list[int]], **extra) -> dict:
    """An arm's figures; its work: the local optimizer steps of every round and a digest of its cohorts (equal
    digests: the same clients trained in every round)."""
    return {"total_s": round(total, 2), "startup_s": round(startup, 2), "first_round_s": round(rounds[0], 2),
            "to_round_1_s": round(startup + rounds[0], 2), "median_round_s": round(common.median(rounds[1:]), 3),
            "rounds_s": round(sum(rounds), 2), "rest_s": round(total - startup - sum(rounds), 2),
            "cpu_to_last_round_s": round(clock.cpu_to_last_round(), 2),
            "median_round_cpu_s": round(common.median(clock.round_cpu()), 3),
            "round_s": [round(r, 3) for r in rounds], "final": final, "local_steps": sum(local_steps),
            "local_steps_per_round": local_steps,
            "cohorts_digest": hashlib.sha256(json.dumps(cohorts).encode()).hexdigest()[:16], **extra}


# ---------------------------------------------------------------- (a) fedvlp

def run_fedvlp(spec) -> dict:
    from mlflow import MlflowClient

    result, clock, phases, total, startup, rounds = common.timed_fedvlp_run(spec)
    busiest, _ = common.worker_seconds(result.history)
    actors = MlflowClient(result.tracking_uri).get_run(result.run_id).data.tags.get("actors")
    return summary(total, startup, rounds, clock, result.final, [h["local_steps"] for h in result.history],
                   [sorted(cid for cid, *_ in h["timings"]) for h in result.history], initial=result.initial,
                   feature_cache=result.feature_cache, actors=actors,
                   phases_s={k: round(v, 2) for k, v in sorted(phases.seconds.items())},
                   busiest_worker_compute_s=[round(c, 3) for c in busiest])


def run_fedvlp_warm(spec) -> dict:
    with common.ray_head(os.cpu_count() or 1):
        primer = dataclasses.replace(spec, federation=dataclasses.replace(spec.federation, rounds=1, eval_every=1))
        common.engine.run_federated(primer, progress=False)  # leaves the actors in the warm pool; not timed
        figures = run_fedvlp(spec)
    assert figures["actors"] == "warm", figures["actors"]
    return {**figures, "cpu_counts_cluster": True}  # the head's processes and actors count (common.TreeCpu)


# ---------------------------------------------------------------- (b) bare

def run_bare(spec) -> dict:
    clock = common.RoundClock()
    result = common.run_bare(spec, threads=1, on_round=clock, processes=spec.resources.workers)
    return summary(result.total_seconds, result.startup_seconds, result.round_seconds, clock, result.final,
                   result.local_steps, result.cohorts, initial=result.initial)


# ---------------------------------------------------------------- (c) Flower

def _flower_parts(spec, clock: common.RoundClock, evaluations: dict, client_metrics: list, cached: bool):
    """Flower's ClientApp and ServerApp for `spec`, in the style of Flower's simulation docs (`cached`: with
    the client state kept in the actor). The server's evaluate_fn, called after every round, marks `clock` and
    keeps the metrics in `evaluations`; every round's fit metrics go to `client_metrics`."""
    from flwr.client import ClientApp, NumPyClient
    from flwr.common import Context, FitIns, ndarrays_to_parameters
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.server.strategy import FedAvg

    fed = spec.federation

    class DocsClient(NumPyClient):
        """One virtual client, built per message: its model (frozen backbone + prompt learner), then in `fit` the
        partition it is told to train, through the frozen backbone."""

        def __init__(self):
            tic = time.perf_counter()
            self.federated = common.process_federated_data(spec)  # generated and partitioned once per process
            data = self.federated.dataset
            prepared = time.perf_counter()
            self.backbone = load_backbone(spec)
            self.method = build_method(spec, self.backbone, Task(data.class_names, data.multilabel))
            self.keys = list(self.method.global_state())
            self.setup = {"data_s": prepared - tic, "load_s": time.perf_counter() - prepared}

        def partition(self, partition_id: int) -> ClientData:
            tic = time.perf_counter()
            indices = self.federated.parts[partition_id]
            images = self.federated.dataset.train.images.load(indices, self.backbone.image_size[0])
            # through float16, as fedvlp's workers hand features over, so both train on the same numbers
            features = self.backbone.encode_images(images, self.method.feature_kind).numpy().astype(np.float16)
            labels = common.as_labels(self.federated.train_labels[indices])
            self.setup["encode_s"] = time.perf_counter() - tic
            return ClientData(common.as_inputs(self.method, features), labels)

        def get_parameters(self, config):
            return [t.numpy() for t in self.method.global_state().values()]

        def fit(self, parameters, config):
            partition_id = int(config["partition-id"])
            data = self.partition(partition_id)
            self.method.load({k: torch.from_numpy(np.array(p)) for k, p in zip(self.keys, parameters)}, None)
            tic = time.perf_counter()
            generator = torch_generator(spec.seed, "client", int(config["server_round"]), partition_id)
            stats = self.method.local_update(data, generator)
            timing = {**self.setup, "train_s": time.perf_counter() - tic, "pid": os.getpid(),
                      "torch_threads": torch.get_num_threads()}
            return self.get_parameters({}), len(data), {"partition-id": partition_id, "loss": stats["loss"],
                                                        "steps": stats["steps"], **timing}

    class CachedClient(DocsClient):
        """Flower's best practice: the actor process keeps the backbone, the model and every partition's frozen
        features (from fedvlp's feature cache, as fedvlp's workers read them); a message only trains."""

        def __init__(self):
            tic = time.perf_counter()
            self.method, self.clients = common.process_clients(spec)
            self.keys = list(self.method.global_state())
            self.setup = {"data_s": 0.0, "load_s": time.perf_counter() - tic, "encode_s": 0.0}

        def partition(self, partition_id: int) -> ClientData:
            return self.clients[partition_id]

    client_class = CachedClient if cached else DocsClient

    def client_fn(context: Context):
        return client_class().to_client()

    class FedvlpCohorts(FedAvg):
        """FedAvg on fedvlp's cohorts: round r trains the partitions `sample_cohort(seed, r, ...)` draws, one per
        node (the nodes are interchangeable slots), and averages their updates in partition order."""

        def configure_fit(self, server_round, parameters, client_manager):
            cohort = sample_cohort(spec.seed, server_round, fed.clients, fed.participation)
            client_manager.wait_for(fed.clients)
            nodes = [proxy for _, proxy in sorted(client_manager.all().items())]
            return [(node, FitIns(parameters, {"server_round": server_round, "partition-id": partition_id}))
                    for node, partition_id in zip(nodes, cohort)]

        def aggregate_fit(self, server_round, results, failures):
            results = sorted(results, key=lambda result: int(result[1].metrics["partition-id"]))
            return super().aggregate_fit(server_round, results, failures)

    def server_fn(context: Context):
        data = prepare_data(spec)
        backbone = load_backbone(spec)
        method = build_method(spec, backbone, Task(data.dataset.class_names, data.dataset.multilabel))
        keys, initial = list(method.global_state()), method.global_state()
        evaluate = common.Evaluator(spec, data, method, backbone)  # what fedvlp's engine scores

        def evaluate_fn(server_round: int, parameters, config):
            if server_round in (0, fed.rounds):
                # the clients keep no local state here (promptfl, fedmpt): each scores the global model
                state = {k: torch.from_numpy(np.array(p)) for k, p in zip(keys, parameters)}
                evaluations[server_round] = evaluate(state)
            if server_round == 0:
                evaluations["startup_end"] = time.perf_counter()
            else:
                clock(server_round)
            return (0.0, evaluations[server_round]) if server_round in evaluations else None

        def collect_fit_metrics(results):
            client_metrics.append([metrics for _, metrics in results])
            return {}

        strategy = FedvlpCohorts(fraction_evaluate=0.0, evaluate_fn=evaluate_fn,
                                 initial_parameters=ndarrays_to_parameters([t.numpy() for t in initial.values()]),
                                 fit_metrics_aggregation_fn=collect_fit_metrics)
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=fed.rounds))

    return ClientApp(client_fn=client_fn), ServerApp(server_fn=server_fn)


def run_flower(spec, cached: bool = False) -> dict:
    os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
    import flwr
    from flwr.simulation import run_simulation

    logging.getLogger("flwr").setLevel(logging.ERROR)  # its INFO lines, and run_simulation's deprecation notice
    client_metrics: list[list[dict]] = []
    evaluations: dict = {}
    clock = common.RoundClock()
    client_app, server_app = _flower_parts(spec, clock, evaluations, client_metrics, cached)
    actors = spec.resources.workers  # one CPU each, so as many run at once as fedvlp has workers
    backend = {"init_args": {"num_cpus": actors}, "client_resources": {"num_cpus": 1, "num_gpus": 0.0}}
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=spec.federation.clients,
                   backend_config=backend)
    total = time.perf_counter() - clock.start[0]
    last = spec.federation.rounds
    if last not in evaluations:
        raise RuntimeError("flower: the simulation ended without the final evaluation (see Flower's log above)")
    startup = evaluations["startup_end"] - clock.start[0]
    rounds = list(np.diff([evaluations["startup_end"], *(wall for wall, _ in clock.marks)]))
    cohort = cohort_size(spec.federation.clients, spec.federation.participation)
    failed = sum(cohort - len(results) for results in client_metrics)
    flat = [m for results in client_metrics for m in results]
    per_actor = [max(_sum_by(results, "pid").values()) for results in client_metrics]
    return summary(total, startup, rounds, clock, evaluations[last],
                   [int(sum(m["steps"] for m in results)) for results in client_metrics],
                   [sorted(int(m["partition-id"]) for m in results) for results in client_metrics],
                   initial=evaluations[0], flwr=flwr.__version__, failed_client_updates=failed,
                   client_mean_s={k: round(float(np.mean([m[k] for m in flat])), 3) for k in CLIENT_PARTS},
                   client_torch_threads=sorted({int(m["torch_threads"]) for m in flat}),
                   busiest_actor_compute_s=[round(s, 3) for s in per_actor])


def _sum_by(results: list[dict], key: str) -> dict:
    sums = defaultdict(float)
    for m in results:
        sums[m[key]] += sum(m[part] for part in CLIENT_PARTS)
    return sums


# ---------------------------------------------------------------- report

def median_run(runs: list[dict]) -> dict:
    """The run of median total time (the lower middle one of an even count), so its figures stay one run's."""
    return sorted(runs, key=lambda r: r["total_s"])[(len(runs) - 1) // 2]


def flower_available() -> bool:
    try:
        import flwr.simulation  # noqa: F401
        return True
    except ImportError:
        return False


def print_method(method: str, arms: dict, totals: dict[str, list[float]], args) -> tuple[dict, dict]:
    """Print one workload's arms (their median runs) side by side, with each target read over the repeats' paired
    total-time ratios (`totals`: every run's total s per arm, in repeat order); (the ratios of each fedvlp arm to
    the others, `same_work`)."""
    print(f"\n{method}: {args.clients} clients, {round(args.participation * args.clients)} per round, "
          f"{args.rounds} rounds, evaluation before round 1 and after round {args.rounds}")
    print(f"{'arm':<14}{'total s':>9}{'start-up s':>12}{'round 1 s':>11}{'median round s':>16}{'rest s':>8}"
          f"{'CPU s':>8}{'median round CPU s':>20}{'local steps':>13}{'final ' + HEADLINE:>16}")
    for name, r in arms.items():
        print(f"{name:<14}{r['total_s']:>9.1f}{r['startup_s']:>12.1f}{r['first_round_s']:>11.1f}"
              f"{r['median_round_s']:>16.3f}{r['rest_s']:>8.1f}{r['cpu_to_last_round_s']:>8.1f}"
              f"{r['median_round_cpu_s']:>20.3f}{r['local_steps']:>13}{r['final'].get(HEADLINE, float('nan')):>16.4f}")
    print("(start-up: to the end of the round-0 evaluation; median round: rounds 2..last; rest: tear-down; CPU s: this "
          "process and its descendants up to the end of the last round. Flower's Ray and actor start-up fall in its "
          "round 1: its server evaluates round 0 before the actors start.)")
    ratios = {}
    for ours in (arm for arm in FEDVLP_ARMS if arm in arms):
        for other in (arm for arm in OTHER_ARMS if arm in arms):
            key = f"{ours}/{other}"
            a, b = arms[ours], arms[other]
            ratios[key] = {name: round(a[field] / b[field], 3) for name, field in RATIOS.items()}
            goal = target(other, args.rounds, method)
            paired = [round(x / y, 3) for x, y in zip(totals[ours], totals[other])]
            ratios[key]["total_per_repeat"] = paired
            met = "no target" if goal is None else f"target <= {goal}: " + common.against_target(paired, goal)
            print(f"{key:<26} total x{ratios[key]['total']:.2f} ({met}); "
                  + "; ".join(f"{name} x{ratios[key][name]:.2f}" for name in RATIOS if name != "total"))
    if "fedvlp" in arms and "bare" in arms:
        gap = common.metrics_gap(arms["fedvlp"]["final"], arms["bare"]["final"])
        ratios["bare_matches_fedvlp"] = gap == 0.0
        print("bare vs fedvlp final metrics: " + ("identical" if gap == 0.0 else f"differ, max |diff| {gap:.2e}"))
    work = same_work(arms)
    print(f"the same work in every arm: local optimizer steps {work['same_local_steps']} "
          f"({', '.join(f'{arm} {n}' for arm, n in work['local_steps'].items())}), cohorts {work['same_cohorts']}; "
          "largest |final metric - fedvlp's|: "
          + (", ".join(f"{arm} {gap:.1e}" for arm, gap in work["max_metric_gap_to_fedvlp"].items()) or "-"))
    if "fedvlp" in arms:
        f = arms["fedvlp"]
        overhead = [r - c for r, c in zip(f["round_s"], f["busiest_worker_compute_s"])]
        print("fedvlp phases (s): " + ", ".join(f"{k} {v:.1f}" for k, v in f["phases_s"].items())
              + f"; start-up in no phase {f['startup_s'] - _startup_phases(f):.1f} (the actors' start: Ray worker "
              f"processes import torch and open_clip and load the backbone)")
        print(f"fedvlp per round (median): busiest worker in local updates "
              f"{common.median(f['busiest_worker_compute_s']):.3f} s, the rest {common.median(overhead):.3f} s "
              f"(dispatch, aggregation, checkpoint, MLflow)")
    for name in FLOWER_ARMS:
        if name in arms:
            c = arms[name]
            print(f"{name} per client message (mean s): {c['client_mean_s']}; busiest actor per round "
                  f"{common.median(c['busiest_actor_compute_s']):.3f} s (median); failed updates "
                  f"{c['failed_client_updates']}")
    return ratios, work


def same_work(arms: dict) -> dict:
    """Did every arm do the same work: the same local optimizer steps in every round, the same cohorts; and how far
    each arm's final metrics are from fedvlp's (over the metrics both report)."""
    steps = [r["local_steps_per_round"] for r in arms.values()]
    return {"local_steps": {arm: r["local_steps"] for arm, r in arms.items()},
            "same_local_steps": all(s == steps[0] for s in steps),
            "same_cohorts": len({r["cohorts_digest"] for r in arms.values()}) == 1,
            "max_metric_gap_to_fedvlp": {arm: common.metrics_gap(arms["fedvlp"]["final"], r["final"])
                                         for arm, r in arms.items() if arm != "fedvlp" and "fedvlp" in arms}}


def _startup_phases(fedvlp: dict) -> float:
    """The start-up share of the timed phases (the round-0 evaluation is half of the two evaluations)."""
    phases = fedvlp["phases_s"]
    return sum(phases.get(k, 0.0) for k in common.STARTUP_PHASES) + phases.get("evaluation", 0.0) / 2


RUNNERS = {"fedvlp": run_fedvlp, "fedvlp_warm": run_fedvlp_warm, "bare": run_bare, "flower": run_flower,
           "flower_cached": lambda spec: run_flower(spec, cached=True)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", choices=sorted(CONFIGS), default=["promptfl", "fedmpt"])
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--participation", type=float, default=0.2)
    parser.add_argument("--rounds", type=int, nargs="+", default=[20, 200],
                        help="run lengths, each a separate run of every arm")
    parser.add_argument("--workers", type=int, default=2, help="fedvlp workers = bare-loop processes = Flower actors")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of every arm, in alternating order; each arm reports its run of median total time")
    parser.add_argument("--run-arm", nargs=4, metavar=("ARM", "METHOD", "ROUNDS", "OUT"), help=argparse.SUPPRESS)
    args = common.parse_args(parser, argv, __file__,
                             tiny={"methods": ["promptfl"], "clients": 4, "participation": 0.5, "rounds": [2]})
    if args.run_arm:
        arm, method, rounds, out = args.run_arm
        args.rounds = int(rounds)
        Path(out).write_text(json.dumps(RUNNERS[arm](workload_spec(method, args))))
        return
    arms = list(args.arms)
    figures = {"machine": common.machine(), "clients": args.clients, "participation": args.participation,
               "rounds": args.rounds, "workers": args.workers, "repeats": args.repeats, "fresh_process_per_run": True,
               "evaluation": "rounds 0 and last: val, test, the clients' local test sets", "skipped": {},
               "methods": {}}
    if any(arm in FLOWER_ARMS for arm in arms) and not flower_available():
        print("flower: skipped (pip install 'flwr>=1.42,<2')")
        figures["skipped"] = {arm: "flwr is not installed" for arm in arms if arm in FLOWER_ARMS}
        arms = [arm for arm in arms if arm not in FLOWER_ARMS]

    lengths = list(args.rounds)
    for method in args.methods:
        for rounds in lengths:
            args.rounds = rounds
            spec = workload_spec(method, args)
            warm_feature_cache(spec)
            runs = common.alternating_runs(__file__, argv, arms, args.repeats, method, rounds)
            results = {arm: median_run(arm_runs) for arm, arm_runs in runs.items()}
            if args.repeats > 1:
                print("  totals over the repeats (s): " + "; ".join(
                    f"{arm} " + " / ".join(f"{r['total_s']:.1f}" for r in arm_runs) for arm, arm_runs in runs.items()))
            totals = {arm: [r["total_s"] for r in arm_runs] for arm, arm_runs in runs.items()}
            ratios, work = print_method(method, results, totals, args)
            figures["methods"].setdefault(method, {})[f"{rounds}_rounds"] = {
                "arms": results, "ratios": ratios, "work": work, "totals_s": totals,
                "targets": {other: target(other, rounds, method) for other in OTHER_ARMS}}
    common.write_results("overhead", figures, args)


if __name__ == "__main__":
    main()
