"""The pfl arm: fedvlp's cross-device workload run by pfl-research's simulator (Apple's `pfl` 0.6.0) and its own
FedAvg, on `--processes` local processes.

Run with the venv's python (`ensure_venv()`; pfl pins dp-accounting<0.6 and packaging<26, which clash with the
system site):
    python benchmarks/_pfl_arm.py --set federation.clients=100 ... --rounds R --processes 2 --out FILE.json

The work is fedvlp's: `_common.bench_spec("quickstart", --set ...)`, the PromptFL module `build_method` builds,
every client's cached frozen features (`_common._client_data`), each round's cohort from
`fedvlp.platform.runtime.cohorts.sample_cohort`, a fresh Adam per client per round at `method.lr`, `local_epochs` epochs
of ceil(n / batch_size) steps of the method's own loss (masked BCE), the server average weighted by sample
counts, and `_common.Evaluator` on val and test before round 1 and after the last round.

How pfl runs it:
  processes  With P > 1 the arm starts `torchrun --standalone --nnodes=1 --nproc_per_node=P` on itself, the launch
             pfl's docs give for PyTorch ("Fast distributed simulations"): on import pfl joins torch.distributed's
             process group (gloo without CUDA), each process trains its share of the cohort, and the summed
             updates are all-reduced. No horovod. With P = 1 the worker is a plain child process.
  cohort     `FederatedDataset` with a user sampler that yields fedvlp's cohorts, round after round. With P > 1
             `user_id_to_weight` (each client's sample count) makes pfl take each round's cohort as exactly the next
             `cohort_size` draws, in a sampling subprocess of its own, and spread it over the processes by weight
             (pfl's load balancing); without it each process draws P users for every user it trains, so processes
             with unequal shares (P not dividing the cohort) would fall out of step. The clients each process
             trained are gathered every round and checked against fedvlp's cohort.
  training   `PyTorchModel(local_optimizer_create=torch.optim.Adam)`, `NNTrainHyperParams(local_learning_rate=
             method.lr, local_num_epochs=method.local_epochs, local_batch_size=method.batch_size)`. pfl's
             `Dataset.iter` does not shuffle: each epoch walks the client's samples in order (fedvlp shuffles with
             its per-(round, client) generator): the same steps on the same data, not the same bits.
  server     `FederatedAveraging` with `SimulatedBackend` and a central `SGD(lr=1.0)`: x + mean of the updates.
             pfl weights every user's update 1 unless a weighting postprocessor says otherwise, so the one
             postprocessor is pfl's `WeightByDatapoints` (fedvlp's FedAvg weights by sample counts); no DP.

Timing: `total_s` from the launcher's start (after its imports) until every process has exited; `startup_s` up to
the end of the round-0 evaluation (process launch, imports, process group, data, backbone, features, round-0
evaluation; the processes then meet at a barrier so round 1 starts together); round r ends after the round's update
and bookkeeping, the last one after the final evaluation (as `_common._bare_loop` times it). `cpu_s`: user + system
CPU seconds of the launcher and every descendant, from `resource.getrusage(RUSAGE_CHILDREN)` once all have exited:
torchrun waits for its workers and pfl's sampling subprocess is terminated and joined, so every one is counted
(null if any process of the run is still alive then); `round_cpu_s`, per round, the same tree's CPU seconds read
with psutil (`_common.TreeCpu`) at each round's end. `busiest_worker_compute_s`: per round, the largest over the
processes of the seconds spent in pfl's `train_one_user` (local training and the update's difference).
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VENV = Path(tempfile.gettempdir()) / "fedvlp-benchmarks" / "pfl-venv"
PFL_REQUIREMENT = "pfl[pytorch]==0.6.0"  # pyproject.toml's `bench-pfl` extra
# What the arm imports, fedvlp's benchmark stack (_common) included, and fedvlp's privacy accounting: it imports
# dp_accounting on use, and the venv holds pfl's pin (<0.6), not the system's.
VENV_CHECK = ("import sys; sys.path.insert(0, sys.argv[1]); import pfl, pfl.model.pytorch, torch, fedvlp, _common; "
              "from fedvlp.platform.aggregation import privacy; "
              "privacy._epsilon_of(privacy.dp_event(1.0, 100, 10, 5), 1e-5)")
T0_ENV = "FEDVLP_PFL_T0"  # the launcher's start (time.time()), for the workers' start-up figure
ROOT_ENV = "FEDVLP_PFL_ROOT"  # the launcher's pid: the root of the process tree whose CPU a round uses


def ensure_venv() -> Path:
    """The python of pfl's virtual environment (created on first use: the system site plus pfl and its pins)."""
    python = VENV / "bin" / "python"
    check = [str(python), "-c", VENV_CHECK, str(Path(__file__).resolve().parent)]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    for what, command in (("python -m venv", [sys.executable, "-m", "venv", "--system-site-packages", str(VENV)]),
                          (f"pip install {PFL_REQUIREMENT}", [str(python), "-m", "pip", "install", "--quiet",
                                                              "--disable-pip-version-check", PFL_REQUIREMENT]),
                          ("import check (pfl, torch, fedvlp)", check)):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
            raise RuntimeError(f"pfl venv at {VENV}: {what} failed: {last}")
    return python


# ---------------------------------------------------------------- the launcher

def launch(args, argv: list[str]) -> dict:
    """Runs the workers (torchrun for P > 1), then completes rank 0's figures with the total wall and CPU time."""
    t0, cpu0 = time.time(), time.process_time()
    part = Path(args.out).with_suffix(".rank0.json")
    worker = [str(Path(__file__).resolve()), "--worker", *argv]
    if args.processes > 1:
        worker = ["-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                  f"--nproc_per_node={args.processes}", *worker]
    env = {**os.environ, T0_ENV: repr(t0), ROOT_ENV: str(os.getpid()), "OMP_NUM_THREADS": str(args.threads)}
    subprocess.run([sys.executable, *worker], env=env, check=True)
    total = time.time() - t0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    figures = json.loads(part.read_text())
    part.unlink()
    leftover = _leftovers(worker)
    figures.update(total_s=round(total, 2),
                   cpu_s=None if leftover else round(children.ru_utime + children.ru_stime
                                                     + time.process_time() - cpu0, 2))
    if leftover:
        figures["notes"] += f" cpu_s: null, processes still alive after the run: {leftover}."
    Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
    return figures


def _leftovers(worker: list[str]) -> list[int]:
    """Live processes of this run (the workers and whatever they forked carry their command line), orphans too."""
    import psutil

    return [p.pid for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] and p.pid != os.getpid()
            and " ".join(worker[worker.index("--worker"):]) in " ".join(p.info["cmdline"])]


# ---------------------------------------------------------------- a worker process

def work(args) -> None:
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    import _common as common
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByDatapoints
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.pytorch import PyTorchTensorDataset
    from pfl.hyperparam import NNTrainHyperParams
    from pfl.internal.ops.selector import get_default_framework_module
    from pfl.metrics import Metrics
    from pfl.model.pytorch import PyTorchModel
    from pfl.version import __version__ as pfl_version

    from fedvlp.backbones.loaders import load_backbone, prepare_backbone
    from fedvlp.data import prepare_data
    from fedvlp.methods.base import Task
    from fedvlp.platform.runtime.cohorts import cohort_size, sample_cohort
    from fedvlp.platform.runtime.worker import build_method

    # set on importing pfl.model.pytorch, which under torchrun joins the process group
    distributed = get_default_framework_module().distributed
    rank, world = distributed.global_rank, distributed.world_size
    spec = common.bench_spec(args.config, [*args.set, f"federation.rounds={args.rounds}",
                                           f"federation.eval_every={args.rounds}"])
    fed, rounds = spec.federation, args.rounds
    np.random.seed(spec.seed)  # pfl's samplers draw their seeds from numpy's global state: the same on every process
    torch.manual_seed(spec.seed)

    prepare_backbone(spec)
    data = prepare_data(spec)
    backbone = load_backbone(spec)
    method = build_method(spec, backbone, Task(data.dataset.class_names, data.dataset.multilabel))
    clients = common._client_data(spec, data, method, backbone)
    params = method.params

    class Module(torch.nn.Module):
        """The method as pfl's PyTorchModel wants it: `loss(*user_data)`, called once per local step (counted)."""

        def __init__(self):
            super().__init__()
            self.method, self.steps = method, 0

        def loss(self, features, labels):
            self.steps += 1
            self.method.train()
            return self.method.loss(self.method(features), labels)

        def metrics(self, features, labels):
            # pfl scores each user before and after local training in evaluation rounds (its first round always);
            # fedvlp does not, so nothing is computed.
            return {}

    class TimedFedAvg(FederatedAveraging):
        """pfl's FedAvg, keeping this process's seconds of local training and the users it trained."""

        def __init__(self):
            super().__init__()
            self.train_s, self.trained = 0.0, []

        def train_one_user(self, initial_model_state, model, user_dataset, central_context):
            tic = time.perf_counter()
            try:
                return super().train_one_user(initial_model_state, model, user_dataset, central_context)
            finally:
                self.train_s += time.perf_counter() - tic
                self.trained.append(user_dataset.user_id)

    module, algorithm = Module(), TimedFedAvg()
    model = PyTorchModel(module, local_optimizer_create=torch.optim.Adam,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))
    size = cohort_size(fed.clients, fed.participation)
    cohorts = [sample_cohort(spec.seed, r, fed.clients, fed.participation) for r in range(1, rounds + 1)]
    # pfl's sampling subprocess caches draws ahead, past the last round: the sequence wraps around
    draws = itertools.cycle([cid for cohort in cohorts for cid in cohort])
    dataset = FederatedDataset(
        lambda cid: PyTorchTensorDataset((clients[cid].features, clients[cid].labels), user_id=cid),
        user_sampler=functools.partial(next, draws),
        user_id_to_weight={cid: len(c) for cid, c in clients.items()})

    def global_state():
        return {name.removeprefix("method."): value for name, value in model.get_parameters().items()}

    evaluate = common.Evaluator(spec, data, method, backbone, ("val", "test")) if rank == 0 else None
    initial = evaluate(global_state()) if rank == 0 else None
    if world > 1:
        torch.distributed.barrier()
    figures = {"arm": "pfl", "pfl_version": pfl_version, "processes": world, "threads_per_process": args.threads,
               "rounds": rounds, "cohort_size": size, "initial": initial,
               "startup_s": round(time.time() - float(os.environ[T0_ENV]), 2),
               "round_s": [], "local_steps_per_round": [], "busiest_worker_compute_s": [], "clients_per_process": [],
               "trained": []}
    if rank == 0:  # the CPU of the launcher's whole tree (torchrun, every worker, pfl's sampling subprocesses)
        meter = common.TreeCpu()
        meter.roots = [int(os.environ[ROOT_ENV])]
        cpu_marks = [meter()]
    tic = [time.perf_counter()]

    class Rounds(TrainingProcessCallback):
        """After each round on every process: the steps, clients and training seconds of every process; on
        process 0 the round's figures, and after the last round fedvlp's evaluation."""

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            mine = (module.steps, algorithm.trained, algorithm.train_s)
            module.steps, algorithm.trained, algorithm.train_s = 0, [], 0.0
            everyone = [mine]
            if world > 1:
                everyone = [None] * world
                torch.distributed.all_gather_object(everyone, mine)
            if rank == 0:
                figures["local_steps_per_round"].append(sum(steps for steps, _, _ in everyone))
                figures["trained"].append(sorted(cid for _, cids, _ in everyone for cid in cids))
                figures["clients_per_process"].append([len(cids) for _, cids, _ in everyone])
                figures["busiest_worker_compute_s"].append(round(max(s for _, _, s in everyone), 3))
                if central_iteration == rounds - 1:
                    figures["final"] = evaluate(global_state())
                figures["round_s"].append(round(time.perf_counter() - tic[0], 3))
                cpu_marks.append(meter())  # outside the round's wall time, as _common.RoundClock reads it
                tic[0] = time.perf_counter()
            return False, Metrics()

    backend = SimulatedBackend(training_data=dataset, val_data=dataset, postprocessors=[WeightByDatapoints()])
    algorithm.run(
        algorithm_params=NNAlgorithmParams(central_num_iterations=rounds, evaluation_frequency=rounds,
                                           train_cohort_size=size, val_cohort_size=None),
        backend=backend, model=model,
        model_train_params=NNTrainHyperParams(local_learning_rate=params.lr, local_num_epochs=params.local_epochs,
                                              local_batch_size=params.batch_size),
        callbacks=[Rounds()], send_metrics_to_platform=False)
    if rank != 0:
        return

    trained = figures.pop("trained")
    if trained != cohorts:
        raise RuntimeError(f"pfl trained other clients than fedvlp's cohorts: {trained} vs {cohorts}")
    # fedvlp's steps (`minibatches`): ceil(n / batch) per epoch, and one empty step for a client without data
    fedvlp_steps = [sum(params.local_epochs * len(torch.arange(len(clients[cid])).split(params.batch_size))
                        for cid in cohort) for cohort in cohorts]
    steps_note = ("the same local steps as fedvlp (checked)" if figures["local_steps_per_round"] == fedvlp_steps else
                  f"local steps differ from fedvlp's {fedvlp_steps} (pfl takes none for a client without data)")
    round_cpu = [round(b - a, 3) for a, b in zip(cpu_marks, cpu_marks[1:])]
    figures.update(
        median_round_s=round(common.median(figures["round_s"][1:]), 3),
        round_cpu_s=round_cpu, median_round_cpu_s=round(common.median(round_cpu[1:]), 3),
        local_steps=sum(figures["local_steps_per_round"]),
        cohorts_digest=hashlib.sha256(json.dumps(trained).encode()).hexdigest()[:16],
        notes=(f"pfl {pfl_version} on {world} process(es) "
               f"({'torchrun, torch.distributed gloo' if world > 1 else 'one plain process'}), "
               f"{args.threads} torch thread(s) each; FederatedAveraging + SimulatedBackend + central SGD lr 1.0, "
               f"updates weighted by sample counts (WeightByDatapoints), no DP; fedvlp's cohorts (checked), "
               f"{steps_note}; pfl does not shuffle local batches; last round includes the final evaluation; "
               "cpu_s from getrusage(RUSAGE_CHILDREN) after every process exited."))
    Path(args.out).with_suffix(".rank0.json").write_text(json.dumps(figures))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a spec override")
    parser.add_argument("--config", default="quickstart")
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--out", required=True)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        work(args)
    else:
        figures = launch(args, argv)
        print(json.dumps({k: figures[k] for k in ("processes", "total_s", "startup_s", "median_round_s", "cpu_s",
                                                  "local_steps")} | {"initial": figures["initial"].get("val_mAP"),
                                                                     "final": figures["final"].get("val_mAP")}))


if __name__ == "__main__":
    main()
