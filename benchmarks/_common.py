"""What the platform benchmarks share: run specs, clocks (wall and CPU seconds per round, the phases of
a fedvlp run timed in place), process memory, the frozen features the engine uses, a bare federated
loop without Ray or MLflow, and the JSON output.

The bare loop (`run_bare`) is the platform's own pieces in one process (or its local updates spread over
worker processes, fedvlp's parallelism without Ray): `prepare_data`,
`load_backbone`, `build_method`, the frozen features from fedvlp's on-disk cache (the entry a run
writes), `sample_cohort`, the per-(round, client) generators, `method.local_update` and the server
rules of `AGGREGATORS` applied in sorted client-id order, as the coordinator applies them. With the
same spec it reaches the metrics `run_federated` reaches, on the same evaluation sets (val, test, and each
client's model on its local test set). It covers the CLIP methods (cached image features); image+text methods
(missing-modality tables) are not wired in.

Every benchmark parses its arguments with `parse_args` (which adds `--tiny`, a size that runs in seconds, for
tests) and writes its figures with `write_results`, which records the command line, the machine and the time.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import psutil
import torch

from fedvlp.backbones.loaders import backbone_id, load_backbone, prepare_backbone
from fedvlp.config import load_spec
from fedvlp.data import prepare_data
from fedvlp.data.feature_cache import FeatureCache, feature_key
from fedvlp.methods.base import ClientData, Task
from fedvlp.platform.aggregation import RuleInputs, apply_rule
from fedvlp.platform.metrics import cooccurring_pairs
from fedvlp.platform.records import tracking
from fedvlp.platform.runtime import engine, evaluation
from fedvlp.platform.runtime.cohorts import balance_cohort, client_costs, sample_cohort
from fedvlp.platform.runtime.worker import build_method, server_rules
from fedvlp.seeding import torch_generator

RESULTS = Path(__file__).resolve().parent / "results"  # the committed figures, which docs/performance.md renders
RESULTS_ENV = "FEDVLP_BENCH_RESULTS"  # another results folder (tests write theirs to a temporary one)
SCRATCH = Path(tempfile.gettempdir()) / "fedvlp-benchmarks"  # MLflow store and checkpoints of benchmark runs
# --tiny: small synthetic splits and one local epoch (a script's own overrides, applied after, still win)
TINY_DATA = ["data.num_train=240", "data.num_val=64", "data.num_test=64", "data.num_holdout=48",
             "method.local_epochs=1"]
MiB = 2**20
# The engine scores the test split in blocks of this many samples. Scores depend on the block where a
# method stops an iteration on a whole-batch tolerance (FedMPT's Sinkhorn), so the bare loop uses it too.
EVAL_BLOCK = 256


def bench_spec(config: str, overrides: list[str], tiny: bool = False):
    """The spec of `config` with `overrides` (after TINY_DATA if `tiny`), tracked in a scratch sqlite store, never
    the repo's mlflow.db."""
    SCRATCH.mkdir(parents=True, exist_ok=True)
    scratch = [f"tracking.uri=sqlite:///{SCRATCH / 'mlflow.db'}", f"output_dir={SCRATCH / 'runs'}"]
    return load_spec(config, scratch + (TINY_DATA if tiny else []) + list(overrides))


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None, script: str, tiny: dict) -> argparse.Namespace:
    """`argv` (default: the command line) parsed, with `--tiny` added: then `tiny`'s values are the defaults
    (explicit arguments still win), a size that runs in seconds. The namespace also carries the command line
    (`command`) that `write_results` records."""
    parser.add_argument("--tiny", action="store_true",
                        help=f"a tiny size that runs in seconds, for tests; writes under ${RESULTS_ENV} or "
                             f"{SCRATCH / 'results'}, never {RESULTS}")
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--tiny" in argv:
        parser.set_defaults(**tiny)
    args = parser.parse_args(argv)
    args.command = shlex.join(["python", f"benchmarks/{Path(script).name}", *argv])
    return args


def machine() -> dict:
    """What the figures depend on: cores, the load other work puts on them, versions."""
    import ray

    return {"cpu_count": os.cpu_count(), "load_average_1min": round(os.getloadavg()[0], 2),
            "torch": torch.__version__, "ray": ray.__version__, "python": platform.python_version(),
            "machine": platform.processor() or platform.machine()}


@contextmanager
def torch_threads(count: int | None):
    """torch's intra-op threads at `count` (None: as they are) for the block, then as they were: a benchmark run
    inside a test process leaves it as it found it."""
    previous = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def results_dir(tiny: bool) -> Path:
    """$FEDVLP_BENCH_RESULTS, else benchmarks/results/; a tiny run's figures never land there."""
    if os.environ.get(RESULTS_ENV):
        return Path(os.environ[RESULTS_ENV])
    return SCRATCH / "results" if tiny else RESULTS


def write_results(name: str, figures: dict, args: argparse.Namespace) -> Path:
    """`figures` as <results>/<name>.json, with what produced them: the command line, whether it ran at the tiny
    size, the UTC time and the machine (`figures`' own "machine", taken before the run, if it has one)."""
    record = {"command": args.command, "tiny": args.tiny,
              "utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "machine": figures.get("machine") or machine(), **figures}
    out = results_dir(args.tiny) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")
    return out


def timed_write_to_disk(write, path: Path) -> dict:
    """`write(path)` timed twice: until it returns (the data in the page cache; fedvlp's checkpoint stops there) and
    until the file and its folder are fsynced (the data on the disk); with the bytes written and the filesystem
    (on tmpfs nothing reaches a disk)."""
    tic = time.perf_counter()
    write(path)
    written = time.perf_counter() - tic
    for target in (path, path.parent):  # the folder too: the checkpoint is renamed into place
        fd = os.open(target, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    on_disk = time.perf_counter() - tic
    mounts = [p for p in psutil.disk_partitions(all=True) if path.resolve().is_relative_to(p.mountpoint)]
    filesystem = max(mounts, key=lambda p: len(p.mountpoint)).fstype if mounts else "unknown"
    return {"write_s": written, "on_disk_s": on_disk, "bytes": path.stat().st_size, "filesystem": filesystem}


def rss_mib(pid: int) -> float:
    return round(psutil.Process(pid).memory_info().rss / MiB, 1)


class TreeCpu:
    """CPU seconds (user + system) used by this process and its descendants (Ray's own processes and actors) since
    the meter was made; call it to read. Inside `ray_head`, the running cluster's processes count too (its GCS and
    raylet, which `ray start` leaves to init, and their children: the workers and actors a run attaches to). A
    process counts from the meter's first reading, or from its start if it started later, and one that has ended
    keeps its last reading: a sum over the live tree falls when a Ray worker exits (a benchmark in a process with a
    used Ray read -0.85 CPU s). Processes that start and end between two readings are not seen. Other people's work
    on the machine stretches wall time much more than CPU time, so CPU seconds tell a slow round from a busy
    machine."""

    def __init__(self):
        self.first: dict[tuple[int, float], float] = {}
        self.last: dict[tuple[int, float], float] = {}
        self.roots = [os.getpid()]
        if RUNNING_HEAD:  # the head's own processes: their command lines name its temp dir
            self.roots += [proc.pid for proc in psutil.process_iter(["cmdline"])
                           if any(RUNNING_HEAD in part for part in proc.info["cmdline"] or [])]
        self()

    def processes(self) -> list[psutil.Process]:
        """The roots and their descendants, from one scan of the process table."""
        children: dict[int, list[psutil.Process]] = defaultdict(list)
        by_pid = {}
        for proc in psutil.process_iter(["ppid"]):
            by_pid[proc.pid] = proc
            children[proc.info["ppid"]].append(proc)
        found, todo = {}, [by_pid[pid] for pid in self.roots if pid in by_pid]
        while todo:
            proc = todo.pop()
            if proc.pid not in found:
                found[proc.pid] = proc
                todo += children[proc.pid]
        return list(found.values())

    def __call__(self) -> float:
        made_now = not self.first
        for proc in self.processes():
            try:
                with proc.oneshot():
                    key, times = (proc.pid, proc.create_time()), proc.cpu_times()
            except psutil.Error:  # ended since the listing
                continue
            self.first.setdefault(key, times.user + times.system if made_now else 0.0)
            self.last[key] = times.user + times.system
        return sum(self.last[key] - self.first[key] for key in self.last)


RUNNING_HEAD: str | None = None  # the temp dir of the cluster `ray_head` is running, while it runs


@contextmanager
def ray_head(cpus: int):
    """A running cluster, as a user starts one (`ray start --head`; free ports, its own temp dir): while the block
    runs, RAY_ADDRESS and RAY_TMPDIR point at it, so `fedvlp run` and `run_federated` attach to it. Its processes
    are killed at the end (`ray stop` would stop every Ray on the machine)."""
    import shutil
    import socket
    import subprocess

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    root = tempfile.mkdtemp(prefix="rh", dir="/tmp")  # Ray's socket paths must stay short
    saved = {key: os.environ.get(key) for key in ("RAY_ADDRESS", "RAY_TMPDIR")}
    os.environ.update(RAY_TMPDIR=root)
    try:
        subprocess.run([str(Path(sys.executable).parent / "ray"), "start", "--head", f"--port={free_port()}",
                        f"--num-cpus={cpus}", "--include-dashboard=false", f"--ray-client-server-port={free_port()}",
                        f"--dashboard-agent-listen-port={free_port()}", "--disable-usage-stats"],
                       check=True, capture_output=True)
        os.environ["RAY_ADDRESS"] = "auto"  # the head in RAY_TMPDIR
        global RUNNING_HEAD
        RUNNING_HEAD = root
        yield root
    finally:
        RUNNING_HEAD = None
        for proc in psutil.process_iter(["cmdline"]):
            if any(root in part for part in proc.info["cmdline"] or []):
                proc.kill()
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def mlflow_server(root: str | Path, startup_timeout_s: float = 180):
    """The tracking server cluster.yaml starts on a head: `mlflow server` on 127.0.0.1, a sqlite store, served
    artifacts and its log (mlflow-server.log) under `root`. Yields (its URI, a function that kills it) once it
    answers; always killed at the end, with its own workers. tests/test_tracking_fallback.py uses it too."""
    import signal
    import socket
    import subprocess
    import urllib.request

    root = Path(root)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    uri = f"http://127.0.0.1:{port}"
    log = (root / "mlflow-server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
         "--artifacts-destination", str(root / "mlartifacts")],
        cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # its own group: kill them all

    def kill() -> None:
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server.wait(timeout=30)

    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    raise RuntimeError(f"mlflow server did not start:\n"
                                       f"{(root / 'mlflow-server.log').read_text()[-3000:]}") from None
                time.sleep(0.3)
        yield uri, kill
    finally:
        kill()
        log.close()


class RoundClock:
    """Wall and CPU seconds (CPU counted from the start) when made or restarted (the run starts) and at the end of
    every round; pass it as `on_round`."""

    def __init__(self):
        self.restart()

    def restart(self) -> None:
        self.cpu = TreeCpu()
        self.start = (time.perf_counter(), 0.0)
        self.marks: list[tuple[float, float]] = []

    def __call__(self, *_) -> None:
        self.marks.append((time.perf_counter(), self.cpu()))

    def round_cpu(self) -> list[float]:
        """CPU seconds of rounds 2.. (round 1's start is not marked)."""
        return [b[1] - a[1] for a, b in zip(self.marks, self.marks[1:])]

    def cpu_to_last_round(self) -> float:
        return self.marks[-1][1] - self.start[1]


def timed_fedvlp_run(spec, on_round=None):
    """(RunResult, RoundClock, PhaseTimer, total s, start-up s, wall s of every round) of one fedvlp run.

    Start-up is what the engine logs at round 0 (everything up to the round-0 evaluation). Round r ends when the
    driver hands its metrics to the MLflow tracker: the next round starts then, while the tracker's thread sends
    them, writes the checkpoint and prints the round, as in `fedvlp run`. `on_round`, if given, is passed to the
    run (which then waits for that thread every round, as a sweep's trial does).
    """
    from unittest import mock

    from mlflow import MlflowClient

    clock = RoundClock()
    with PhaseTimer(FEDVLP_PHASES) as phases:
        log_metrics = tracking.RunTracker.log_metrics  # as PhaseTimer times it

        def logged(tracker, step: int, metrics: dict) -> None:
            log_metrics(tracker, step, metrics)
            if step >= 1:
                clock()

        with mock.patch.object(tracking.RunTracker, "log_metrics", logged):
            clock.restart()
            result = engine.run_federated(spec, progress=False, on_round=on_round)
            total = time.perf_counter() - clock.start[0]
    startup = MlflowClient(result.tracking_uri).get_metric_history(result.run_id, "startup_seconds")[0].value
    rounds = list(np.diff([clock.start[0] + startup, *(wall for wall, _ in clock.marks)]))
    return result, clock, phases, total, startup, rounds


# Phases of a fedvlp run, timed in place by PhaseTimer: (owner, attribute) -> phase. Attributes an engine
# version lacks are skipped, so the breakdown survives refactors of the engine.
FEDVLP_PHASES = {
    (engine, "prepare_backbone"): "prepare (data, backbone, method)",
    (engine, "prepare_data"): "prepare (data, backbone, method)",
    (engine, "load_backbone"): "prepare (data, backbone, method)",
    (engine, "ensure_ray"): "ray.init",
    (engine, "reserve"): "placement group",
    (engine, "attach_data"): "features + attach client data",
    (engine, "evaluate_models"): "evaluation",
    (engine, "write_checkpoint"): "checkpoint",
    (tracking.RunTracker, "__init__"): "mlflow: open run",
    (tracking.RunTracker, "log_metrics"): "mlflow: log",
    (tracking.RunTracker, "set_tags"): "mlflow: log",
    (tracking.RunTracker, "log_json"): "mlflow: log",
    (tracking.RunTracker, "end"): "mlflow: log",
}
STARTUP_PHASES = ("prepare (data, backbone, method)", "mlflow: open run", "ray.init", "placement group",
                  "features + attach client data")


class PhaseTimer:
    """While active, wraps the `phases` callables ((owner, attribute) -> phase name) and sums their wall
    time per phase."""

    def __init__(self, phases: dict):
        self.phases, self.seconds = phases, defaultdict(float)

    def __enter__(self):
        self.originals = {key: getattr(*key) for key in self.phases if hasattr(*key)}
        for (owner, name), fn in self.originals.items():
            setattr(owner, name, self._timed(fn, self.phases[(owner, name)]))
        return self

    def __exit__(self, *exc):
        for (owner, name), fn in self.originals.items():
            setattr(owner, name, fn)

    def _timed(self, fn, phase: str):
        def timed(*args, **kwargs):
            tic = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - tic
        return timed


def worker_seconds(history: list[dict]) -> tuple[list[float], list[float]]:
    """Per round of a RunResult's history: the busiest worker's seconds in local updates (the round can
    end no sooner), and the median seconds of one client's local update (load, train, copy back)."""
    busiest, per_client = [], []
    for entry in history:
        per_worker, durations = defaultdict(float), []
        for _, worker, began, finished in entry["timings"]:
            per_worker[worker] += finished - began
            durations.append(finished - began)
        busiest.append(max(per_worker.values()))
        per_client.append(median(durations))
    return busiest, per_client


def against_target(values: list[float], goal: float) -> str:
    """A target read over repeated runs (each run's ratio or seconds, lower is better): "met" only when every run
    meets it, "missed" only when none does, otherwise "within noise" with the runs' spread."""
    met = [value <= goal for value in values]
    if all(met):
        return "met"
    if not any(met):
        return "missed"
    return f"within noise ({min(values):.2f}-{max(values):.2f} over {len(values)} runs)"


def against_median_target(values: list[float], goal: float, ceiling: float) -> str:
    """A target on the median of repeated runs with a ceiling on every run (seconds, lower is better): "met" when the
    median meets `goal` and no run is over `ceiling`, "missed" when no run meets `goal` or one is over `ceiling`,
    otherwise "within noise" with the runs' spread."""
    if median(values) <= goal and max(values) <= ceiling:
        return "met"
    if min(values) > goal or max(values) > ceiling:
        return "missed"
    return f"within noise ({min(values):.2f}-{max(values):.2f} over {len(values)} runs)"


def median(values: list[float]) -> float:
    return float(np.median(values)) if values else float("nan")


_PROCESS_DATA: dict = {}


def process_federated_data(spec):
    """`prepare_data(spec)` once per process (a Flower actor's data, like the global FederatedDataset of
    Flower's docs). It lives here, in an importable module: a function of the running script travels to
    Ray actors by value, with a fresh copy of its globals every message."""
    key = repr(spec)
    if key not in _PROCESS_DATA:
        _PROCESS_DATA[key] = prepare_data(spec)
    return _PROCESS_DATA[key]


_PROCESS_CLIENTS: dict = {}


def process_clients(spec):
    """(method, every client's ClientData) built once per process from fedvlp's feature cache: what a Flower
    actor keeps between messages when it follows Flower's advice to cache the model and data in the actor."""
    key = repr(spec)
    if key not in _PROCESS_CLIENTS:
        data = process_federated_data(spec)
        backbone = load_backbone(spec)
        method = build_method(spec, backbone, Task(data.dataset.class_names, data.dataset.multilabel))
        _PROCESS_CLIENTS[key] = method, _client_data(spec, data, method, backbone)
    return _PROCESS_CLIENTS[key]


# ---------------------------------------------------------------- frozen features

def frozen_features(spec, data, backbone, kind: str, split: str) -> np.ndarray:
    """Frozen float16 features of a split, from fedvlp's on-disk cache under the key the engine uses;
    encoded here (in the backbone's fixed chunks, as the workers encode) and cached on a miss."""
    images = getattr(data.dataset, split).images
    parts = {"backbone": backbone_id(spec), "dataset": data.dataset.name, "split": split,
             "images": images.cache_key(), "transform": backbone.transform_id, "kind": kind}
    cache, key = FeatureCache(), feature_key(**parts)
    features = cache.get(key)
    if features is None:
        encoded = backbone.encode_images(images.load(range(len(images)), backbone.image_size[0]), kind)
        cache.put(key, encoded.numpy(), parts)
        features = cache.get(key)
    return np.asarray(features)


def as_inputs(method, features: np.ndarray) -> torch.Tensor:
    """float16 features as a worker hands them to the method: float32, through `make_inputs`."""
    return method.make_inputs(torch.from_numpy(features.astype(np.float32)), None)


def as_labels(labels: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(labels.astype(np.float32 if labels.ndim == 2 else np.int64))


EVAL_SETS = ("val", "test", "shift", "personal")  # "shift" where the dataset has one


class Evaluator:
    """The engine's evaluation (`evaluation.evaluate_models`) in this process, under the engine's metric names: the
    global model (`Method.load_global`) on each split of `sets` ("val", "test", "shift" where the dataset has one),
    scored in blocks of EVAL_BLOCK as the workers score them, and for "personal" each client's model (the global state
    with its own local state) on its local test set and on its local val set, the mean and spread over the clients."""

    def __init__(self, spec, data, method, backbone, sets=EVAL_SETS):
        self.method, self.task = method, method.task
        kind = method.feature_kind
        self.splits = {name: (as_inputs(method, frozen_features(spec, data, backbone, kind, name)),
                              data.labels_of(name))
                       for name in sets if name != "personal" and getattr(data.dataset, name) is not None}
        self.cooccurring = cooccurring_pairs(data.dataset.train.labels) if self.task.multilabel else None
        self.local_sets: dict[str, dict[int, tuple]] = {}  # "personal" / "personal_val" -> client -> its set
        if "personal" in sets and len(data.holdout):
            holdout = frozen_features(spec, data, backbone, kind, "holdout")
            self.local_sets = {name: {cid: (as_inputs(method, holdout[idx]), data.holdout.labels[idx])
                                      for cid, idx in enumerate(indices) if len(idx)}
                               for name, indices in (("personal", data.local_tests), ("personal_val", data.local_vals))}

    def __call__(self, state: dict, client_states: dict | None = None) -> dict[str, float]:
        return self.metrics([self.logits(state, client_states)])

    def logits(self, state: dict, client_states: dict | None = None, share: int = 0, shares: int = 1) -> dict:
        """One share of the evaluation, as one of `shares` workers scores it: its blocks of every split (dealt
        round-robin, as the engine deals them) and the local sets of its home clients (client id % shares)."""
        self.method.load_global(state)
        blocks = {name: [(start, self.method.score(inputs[start : start + EVAL_BLOCK]).numpy())
                         for start in range(0, len(inputs), EVAL_BLOCK)[share::shares]]
                  for name, (inputs, _) in self.splits.items()}
        local: dict[str, dict[int, np.ndarray]] = {}
        for name, sets in self.local_sets.items():
            local[name] = {}
            for cid, (inputs, _) in sorted(sets.items()):
                if cid % shares == share:
                    self.method.load(state, (client_states or {}).get(cid))
                    local[name][cid] = self.method.score(inputs).numpy()
        return {"blocks": blocks, "local": local}

    def metrics(self, shares: list[dict]) -> dict[str, float]:
        """The engine's metrics from every share's logits (`logits`), computed here as the engine's driver does."""
        metrics = {}
        for name, (_, labels) in self.splits.items():
            blocks = sorted((block for share in shares for block in share["blocks"][name]), key=lambda b: b[0])
            logits = np.concatenate([scores for _, scores in blocks])
            metrics.update({f"{name}_{k}": v for k, v in evaluation.scores(self.task, logits, labels,
                                                                              self.cooccurring).items()})
        for name, sets in self.local_sets.items():
            logits = {cid: scores for share in shares for cid, scores in share["local"][name].items()}
            metrics.update(evaluation.personal_metrics([evaluation.scores(self.task, logits[cid], labels)
                                                        for cid, (_, labels) in sorted(sets.items())], name))
        return metrics


def aggregate(rules: dict[str, str], options: dict, rule_states: dict, seed: int, round_index: int,
              previous: dict, updates: list[dict]) -> dict:
    """The coordinator's server step: each rule's keys combined over the updates in sorted client-id order
    (`rule_states` carries a stateful rule's moments from round to round)."""
    updates = sorted(updates, key=lambda u: u["client_id"])
    sizes = [u["num_samples"] for u in updates]
    by_rule: dict[str, list[str]] = {}
    for key, rule in rules.items():
        by_rule.setdefault(rule, []).append(key)
    state = {}
    for rule, keys in sorted(by_rule.items()):
        inputs = RuleInputs([{k: u["global"][k] for k in keys} for u in updates], sizes,
                            {k: previous[k] for k in keys}, rule_states.get(rule, {}),
                            torch_generator(seed, "aggregate", round_index), options.get(rule))
        params, rule_states[rule], _ = apply_rule(rule, inputs)
        state.update(params)
    return state


# ---------------------------------------------------------------- the bare loop

@dataclass
class BareResult:
    initial: dict[str, float]
    final: dict[str, float]
    startup_seconds: float                  # data, backbone, features, round-0 evaluation
    round_seconds: list[float] = field(default_factory=list)  # local updates + aggregation (+ evaluation)
    total_seconds: float = 0.0
    curve: list[tuple[int, dict[str, float]]] = field(default_factory=list)  # (round, metrics) at each evaluation
    local_steps: list[int] = field(default_factory=list)  # the cohort's optimizer steps, per round
    cohorts: list[list[int]] = field(default_factory=list)


def run_bare(spec, threads: int = 1, on_round=None, processes: int = 1, eval_sets=EVAL_SETS) -> BareResult:
    """`spec`'s federated run with no Ray, no MLflow and no checkpoints: the cohort's local updates in this
    process (`processes=1`) or split over that many worker processes (spawned at start-up, each with
    `threads` torch threads, as fedvlp's workers are). `on_round(round)` is called after each round, as
    `run_federated` calls it. Evaluates `eval_sets` (`Evaluator`; ("val",) for anything that chooses)."""
    with torch_threads(threads):
        if processes == 1:
            return _bare_loop(spec, on_round or (lambda *_: None), None, eval_sets)
        cost = client_costs(spec, prepare_data(spec).parts)
        # an executor, not a Pool: a worker that fails to start breaks it (an error) instead of being restarted forever
        with ProcessPoolExecutor(processes, multiprocessing.get_context("spawn"), initializer=_bare_worker_start,
                                 initargs=(spec, threads, eval_sets)) as pool:
            def train(jobs: list) -> list[dict]:
                # the cohort split as fedvlp's workers split it: homes cid % processes, then balanced
                cohort = [cid for _, _, cid, _, _ in jobs]
                placed = balance_cohort(cohort, {cid: cid % processes for cid in cohort}, cost, processes)
                shares = [[job for job in jobs if placed[job[2]] == w] for w in range(processes)]
                return [u for share in pool.map(_bare_worker_updates, shares) for u in share]

            def evaluate(evaluator: Evaluator, state: dict, client_states: dict | None = None) -> dict[str, float]:
                # scored on the worker processes as fedvlp's workers score it: blocks round-robin, clients at home
                held = client_states or {}
                shares = [(state, {c: s for c, s in held.items() if c % processes == w}, w, processes)
                          for w in range(processes)]
                return evaluator.metrics(list(pool.map(_bare_worker_logits, shares)))
            return _bare_loop(spec, on_round or (lambda *_: None), train, eval_sets, evaluate)


_BARE_WORKER: dict = {}


def _client_data(spec, data, method, backbone) -> dict[int, ClientData]:
    train = frozen_features(spec, data, backbone, method.feature_kind, "train")
    return {cid: ClientData(as_inputs(method, train[idx]), as_labels(data.train_labels[idx]))
            for cid, idx in enumerate(data.parts)}


def _bare_worker_start(spec, threads: int, eval_sets) -> None:
    """A worker process of the parallel bare loop: its method, every client's features and the evaluation sets,
    held for the run."""
    torch.set_num_threads(threads)
    data = prepare_data(spec)
    backbone = load_backbone(spec)
    method = build_method(spec, backbone, Task(data.dataset.class_names, data.dataset.multilabel))
    _BARE_WORKER.update(method=method, clients=_client_data(spec, data, method, backbone),
                        evaluator=Evaluator(spec, data, method, backbone, eval_sets))


def _bare_worker_updates(jobs: list) -> list[dict]:
    return _local_updates(jobs, _BARE_WORKER["method"], _BARE_WORKER["clients"])


def _bare_worker_logits(share: tuple) -> dict:
    return _BARE_WORKER["evaluator"].logits(*share)


def _local_updates(jobs: list, method, clients: dict[int, ClientData]) -> list[dict]:
    """Local updates of (seed, round, client id, global state, the client's local state or None) jobs."""
    updates = []
    for seed, round_index, cid, state, local in jobs:
        method.load(state, local)
        stats = method.local_update(clients[cid], torch_generator(seed, "client", round_index, cid))
        updates.append({"client_id": cid, "num_samples": len(clients[cid]), "global": method.global_state(),
                        "local": method.local_state(), **stats})
    return updates


def _bare_loop(spec, on_round, train, eval_sets, evaluate_on=None) -> BareResult:
    """The loop itself; `train(jobs)` runs a cohort's local updates and `evaluate_on(evaluator, state, client
    states)` scores them (None: in this process)."""
    started = time.perf_counter()
    fed = spec.federation
    prepare_backbone(spec)
    data = prepare_data(spec)
    task = Task(data.dataset.class_names, multilabel=data.dataset.multilabel)
    backbone = load_backbone(spec)
    method = build_method(spec, backbone, task)
    if train is None:
        clients = _client_data(spec, data, method, backbone)
        train = lambda jobs: _local_updates(jobs, method, clients)  # noqa: E731
    evaluator = Evaluator(spec, data, method, backbone, eval_sets)
    evaluate = evaluator if evaluate_on is None else lambda *state: evaluate_on(evaluator, *state)
    state = method.global_state()
    rules, options = server_rules(method, spec)
    rule_states: dict[str, dict] = {}
    client_states: dict[int, dict] = {}
    initial = evaluate(state)
    result = BareResult(initial, initial, time.perf_counter() - started)

    for round_index in range(1, fed.rounds + 1):
        tic = time.perf_counter()
        cohort = sample_cohort(spec.seed, round_index, fed.clients, fed.participation)
        updates = train([(spec.seed, round_index, cid, state, client_states.get(cid)) for cid in cohort])
        state = aggregate(rules, options, rule_states, spec.seed, round_index, state, updates)
        client_states.update({u["client_id"]: u["local"] for u in updates if u["local"]})
        result.local_steps.append(sum(int(u["steps"]) for u in updates))
        result.cohorts.append(sorted(cohort))
        if round_index % fed.eval_every == 0 or round_index == fed.rounds:
            result.final = evaluate(state, client_states)
            result.curve.append((round_index, result.final))
        result.round_seconds.append(time.perf_counter() - tic)
        on_round(round_index)
    result.total_seconds = time.perf_counter() - started
    return result


def metrics_gap(a: dict[str, float], b: dict[str, float]) -> float:
    """The largest absolute difference over the metrics both report (0.0: identical)."""
    shared = sorted(set(a) & set(b))
    return max((abs(a[k] - b[k]) for k in shared), default=float("nan"))


def in_fresh_process(script: str, argv: list[str] | None, *arm: object) -> dict:
    """One run of an arm in a Python process of its own, as a user runs one job: `script` called again with its own
    arguments and `--run-arm *arm OUT`, its figures read back from OUT. A driver that connected to an earlier, since
    stopped Ray head takes about 16 s in every later `ray.shutdown` (measured), which would charge one arm for
    another's."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "arm.json"
        command = [sys.executable, script, *(sys.argv[1:] if argv is None else argv),
                   "--run-arm", *map(str, arm), str(out)]
        subprocess.run(command, check=True, timeout=3600)
        return json.loads(out.read_text())


def alternating_runs(script: str, argv: list[str] | None, arms: list[str], repeats: int, *workload: object) -> dict:
    """Every arm run `repeats` times on one workload, each run in a fresh process (`in_fresh_process`), in
    alternating order (forward, then backward), so that a drift in the machine's speed reaches every arm: each arm's
    runs, in repeat order, with the load average each met."""
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    for repeat in range(repeats):
        for arm in arms if repeat % 2 == 0 else arms[::-1]:
            load = os.getloadavg()[0]
            runs[arm].append({**in_fresh_process(script, argv, arm, *workload), "load_average_before": round(load, 2)})
            print(f"  {' '.join(map(str, workload))}, {arm}: {runs[arm][-1]['total_s']:.1f} s", flush=True)
    return runs
