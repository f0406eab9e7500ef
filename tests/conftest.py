"""Shared fixtures: offline, the tiny CLIP and tiny ViLT pretrained by fedvlp itself, one small Ray for the
session, a sqlite MLflow per test, and the fedvlp CLI in a subprocess with timeouts that always clean up."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# Feature caches and pretraining results are keyed by what produced them, so a cache shared across sessions is never
# stale; the tiny backbones themselves ship in the package.
os.environ.setdefault("FEDVLP_CACHE_DIR", str(REPO / ".fedvlp-cache"))
os.environ.pop("RAY_ADDRESS", None)
os.environ.pop("MLFLOW_TRACKING_URI", None)
os.environ.pop("FEDVLP_PLUGINS", None)
CLI_TIMEOUT_S = 300  # well below pytest's per-test timeout (pyproject), so a test's own cleanup always runs
# `python -m fedvlp` as from a terminal, where Ctrl-C interrupts it: a shell without job control starts a background
# job with SIGINT ignored, and a Python started so keeps ignoring it, so CI launched that way would lose the signal
INTERRUPTIBLE_FEDVLP = [sys.executable, "-c", "import runpy, signal, sys; signal.signal(signal.SIGINT, "
                        "signal.default_int_handler); sys.argv[0] = 'fedvlp'; runpy.run_module('fedvlp', "
                        "run_name='__main__', alter_sys=True)"]

# A driver that kills itself and its own Ray (kill -9 of its process group) right after a given round's
# checkpoint is on disk: a kill drill that lands mid-run whatever the load, instead of racing a pipe reader.
# Argv: the round, then the run config's --set overrides.
KILLED_AFTER_ROUND = [sys.executable, "-c", "import os, signal, sys; from fedvlp.config import load_spec; "
                      "from fedvlp.platform.runtime.engine import run_federated; kill_round = int(sys.argv[1]); "
                      "run_federated(load_spec(None, sys.argv[2:]), on_round=lambda r, *_: r == kill_round and "
                      "os.killpg(0, signal.SIGKILL))"]


def read_until(proc: subprocess.Popen, prefix: str, timeout: float = CLI_TIMEOUT_S) -> list[str]:
    """The lines `proc` prints until one starts with `prefix`. A thread reads the pipe, so the deadline holds even
    when the child falls silent; if the line never comes, the child's process group is killed and the test fails."""
    import queue
    import threading
    import time

    lines: queue.Queue = queue.Queue()

    def pump() -> None:  # stops at the line it waits for, so the caller can read the rest (communicate)
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.put(line)
            if line.startswith(prefix):
                return
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline, seen = time.monotonic() + timeout, []
    try:
        while True:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            if line is None:
                raise AssertionError(f"the process ended before {prefix!r}:\n" + "".join(seen[-30:]))
            seen.append(line)
            if line.startswith(prefix):
                return seen
    except queue.Empty:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"no line {prefix!r} within {timeout:.0f} s:\n" + "".join(seen[-30:])) from None
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


# Whole sweeps and tuning runs first, so the two test processes end together instead of one waiting on them.
HEAVY_FIRST = ("test_sweep.py::", "test_extending.py::test_the_example_method_runs_through_a_two_trial_sweep",
               "test_faults.py::test_a_killed_fedotp_driver", "test_engine.py::test_eight_workers",
               "test_fedprime.py::test_federated_fedprime_logs", "test_benchmarks.py::test_overhead",
               "test_benchmarks.py::test_startup", "test_benchmarks.py::test_sweep_trials",
               "test_plugin_doors.py::test_a_plugin_by_each_door")


@pytest.fixture(autouse=True)
def plugins_forgotten():
    """A plugin a test imports in this process is forgotten after it: the registries are as they were and its
    modules unimported, so what a later test in the same process lists or looks up never depends on the order."""
    from fedvlp.data.catalogue import datasets
    from fedvlp.data.partition import PARTITIONERS
    from fedvlp.methods import METHODS
    from fedvlp.platform.aggregation import RULES

    registries = (PARTITIONERS, datasets(), METHODS, RULES)
    for registry in registries:
        registry.names()  # the built-ins all registered (METHODS imports its own on first use) before the snapshot
    entries, modules = [dict(r._entries) for r in registries], set(sys.modules)
    yield
    for registry, before in zip(registries, entries):
        registry._entries = before
    for name in set(sys.modules) - modules:
        path = getattr(sys.modules[name], "__file__", None) or ""
        if path and not path.startswith((sys.prefix, sys.base_prefix, str(REPO / "fedvlp"))):
            del sys.modules[name]  # a plugin's module (examples/, a test's tmp_path), not a library's


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: not any(part in item.nodeid for part in HEAVY_FIRST))


@pytest.fixture(scope="session")
def tiny_clip():
    """The path of the tiny CLIP's weights shipped in the package (checksum checked)."""
    from fedvlp.backbones.shipped import shipped_weights

    return shipped_weights("tiny-clip")


@pytest.fixture(scope="session")
def tiny_vilt():
    """The path of the tiny ViLT's weights shipped in the package (checksum checked)."""
    from fedvlp.backbones.shipped import shipped_weights

    return shipped_weights("tiny-vilt")


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray for every in-process engine test, with explicit small resources; 4 logical GPUs so
    fractional placement is testable on CPU."""
    import ray

    ray.init(address="local", num_cpus=2, num_gpus=4, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory) -> Path:
    """An MLflow sqlite store with its tables made, once per test process: a new store runs MLflow's schema
    migrations (4-5 s on 2 cores), a copy of this one opens in about 0.15 s."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def tracking_uri(tmp_path, empty_store):
    """A fresh, empty MLflow store for one test (a copy of `empty_store`, at tmp_path/mlflow.db)."""
    import shutil

    shutil.copy(empty_store, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def small_run(tracking_uri: str, tmp_path, *overrides: str, config: str | None = None):
    """A fast run spec on the quickstart config (or `config`)."""
    from fedvlp.config import load_spec

    return load_spec(config, [
        "data.num_train=800", "data.num_val=256", "data.num_test=256", "data.num_holdout=200",
        "federation.clients=4", "federation.rounds=2", f"tracking.uri={tracking_uri}",
        f"output_dir={tmp_path / 'runs'}", *overrides,
    ])


def run_in_group(argv: list[str], cwd, env: dict | None = None, timeout: float = CLI_TIMEOUT_S,
                 **popen) -> subprocess.CompletedProcess:
    """`argv` in its own process group; on timeout the whole group (its local Ray included) is killed before the
    test fails, so nothing is left running. `env` adds to this process's environment (None removes a variable)."""
    environment = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **popen}
    proc = subprocess.Popen([str(a) for a in argv], cwd=cwd, env=environment, text=True, start_new_session=True,
                            **popen)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(map(str, argv))} did not finish within {timeout} s:\n{(err or out)[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def fedvlp_cli(args: list[str], cwd, env: dict | None = None, timeout: float = CLI_TIMEOUT_S,
               python=sys.executable, driver_path=None, **popen) -> subprocess.CompletedProcess:
    """`python -m fedvlp ARGS` through `run_in_group`. `driver_path` goes on the driver's sys.path alone: Ray hands
    its workers the driver's working and script directories, never other sys.path entries."""
    command = ["-m", "fedvlp"] if driver_path is None else ["-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); "
                                                           "from fedvlp.cli import main; sys.exit(main(sys.argv[1:]))",
                                                           str(driver_path)]
    return run_in_group([python, *command, *args], cwd, env, timeout, **popen)
