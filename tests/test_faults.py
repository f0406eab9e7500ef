"""Client faults and stragglers on real Ray actors: killed workers, crashed processes, raising clients,
wall-clock deadlines, the simulated device clock, and a driver killed mid-run then resumed bitwise."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import ray
import torch
from conftest import CLI_TIMEOUT_S, INTERRUPTIBLE_FEDVLP, KILLED_AFTER_ROUND, read_until, small_run
from mlflow import MlflowClient

from fedvlp.errors import RoundFailedError
from fedvlp.platform.runtime.client_states import ClientStateStore
from fedvlp.platform.runtime.clock import VirtualClock
from fedvlp.platform.runtime.engine import run_federated

pytestmark = pytest.mark.usefixtures("tiny_clip")

# 4 clients on 2 workers: client k trains on worker k mod 2, so a drill knows where to put its fault
FOUR_CLIENTS = ("federation.participation=1.0", "method.local_epochs=1", "resources.round_timeout_s=120",
                "resources.cohort_placement=home")


def fault_in_round(fault_round: int, worker: int, client: int, kind: str, seconds: float = 1e6,
                   kill_after_s: float | None = None):
    """An on_round callback that, after the round before `fault_round`, arms a fault on a live worker
    (and optionally ray.kill()s that worker a little later, while the round runs)."""
    def on_round(round_index, metrics, checkpoint):
        if round_index == fault_round - 1:
            actor = ray.get_actor(f"fedvlp-{checkpoint.parent.name}-worker-{worker}")
            ray.get(actor.inject_fault.remote(fault_round, client, kind, seconds))
            if kill_after_s is not None:
                threading.Timer(kill_after_s, ray.kill, [actor]).start()
    return on_round


def _run(tracking_uri, run_id):
    return MlflowClient(tracking_uri).get_run(run_id)


@pytest.mark.slow
def test_a_worker_killed_mid_round_is_replaced_and_the_retried_run_matches_a_fault_free_one(
        ray_cluster, tracking_uri, tmp_path, capfd):
    spec = small_run(tracking_uri, tmp_path, *FOUR_CLIENTS, "federation.on_client_failure=retry")
    clean = run_federated(spec, progress=False)
    # client 0 hangs in round 2 on worker 0, which is killed 1 s into the round
    faulty = run_federated(spec, progress=False, on_round=fault_in_round(2, 0, 0, "hang", kill_after_s=1.0))
    second = faulty.history[1]
    assert second["replaced_workers"] == 1 and second["failed_clients"] >= 1 and second["clients"] == 4
    # every retried client trains from its own (seed, round, client) stream: the result is unchanged
    assert faulty.final == clean.final
    assert all(torch.equal(faulty.final_state[k], clean.final_state[k]) for k in clean.final_state)
    run = _run(tracking_uri, faulty.run_id)
    assert run.info.status == "FINISHED"
    assert "died" in run.data.tags["failure.round2.client0"]
    assert run.data.metrics["failed_clients"] == second["failed_clients"]
    assert "round 2: client 0 failed: worker 0 died" in capfd.readouterr().err


def test_a_client_failing_past_client_retries_is_dropped(ray_cluster, tracking_uri, tmp_path, capfd):
    """on_client_failure=retry with client_retries=0: the first failure is already past the limit."""
    spec = small_run(tracking_uri, tmp_path, *FOUR_CLIENTS, "federation.on_client_failure=retry",
                     "federation.client_retries=0")
    result = run_federated(spec, progress=False, on_round=fault_in_round(2, 1, 3, "raise"))
    second = result.history[1]
    assert (second["clients"], second["failed_clients"]) == (3, 1)  # aggregated without client 3
    assert "round 2: client 3 failed: RuntimeError: injected fault in client 3, round 2; dropped" in \
        capfd.readouterr().err
    assert MlflowClient(tracking_uri).get_run(result.run_id).info.status == "FINISHED"


def test_a_client_that_raises_is_dropped_and_its_cause_logged(ray_cluster, tracking_uri, tmp_path, capfd):
    spec = small_run(tracking_uri, tmp_path, *FOUR_CLIENTS, "federation.rounds=2")
    result = run_federated(spec, progress=False, on_round=fault_in_round(2, 1, 1, "raise"))
    assert [h["clients"] for h in result.history] == [4, 3]
    assert [h["failed_clients"] for h in result.history] == [0, 1]
    run = _run(tracking_uri, result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["failure.round2.client1"] == "RuntimeError: injected fault in client 1, round 2"
    expected = "round 2: client 1 failed: RuntimeError: injected fault in client 1, round 2; dropped"
    assert expected in capfd.readouterr().err


@pytest.mark.slow
def test_a_crashed_worker_process_is_replaced_and_its_clients_move_to_the_replacement(
        ray_cluster, tracking_uri, tmp_path):
    spec = small_run(tracking_uri, tmp_path, *FOUR_CLIENTS, "federation.rounds=3")
    result = run_federated(spec, progress=False, on_round=fault_in_round(2, 0, 0, "exit"))
    crashed, after = result.history[1], result.history[2]
    assert crashed["replaced_workers"] == 1
    assert crashed["clients"] == 4 - crashed["failed_clients"] and crashed["failed_clients"] in (1, 2)
    assert after["clients"] == 4 and after["failed_clients"] == 0  # clients 0 and 2 train on the replacement
    assert {w for _, w, _, _ in after["timings"]} == {0, 1}


def test_a_round_below_min_clients_fails_loudly_and_the_run_is_marked_failed(ray_cluster, tracking_uri, tmp_path):
    spec = small_run(tracking_uri, tmp_path, *FOUR_CLIENTS, "federation.min_clients_per_round=4")
    with pytest.raises(RoundFailedError, match=r"round 2: 3 of 4 client updates arrived \(1 failed, 0 late\), below "
                                               r"federation\.min_clients_per_round=4 \(client 3: RuntimeError"):
        run_federated(spec, progress=False, on_round=fault_in_round(2, 1, 3, "raise"))
    client = MlflowClient(tracking_uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FAILED" and "min_clients_per_round" in run.data.tags["error"]


@pytest.mark.slow
def test_updates_after_the_wall_clock_deadline_are_left_out(ray_cluster, tracking_uri, tmp_path):
    spec = small_run(tracking_uri, tmp_path, *FOUR_CLIENTS, "federation.round_deadline_s=10")
    # client 0 stalls 20 s in round 2; client 2 waits behind it on worker 0: both miss the deadline, while clients 1
    # and 3 (a second or two each, several on busy cores) have 10 s
    result = run_federated(spec, progress=False, on_round=fault_in_round(2, 0, 0, "hang", seconds=20))
    assert [h["late_clients"] for h in result.history] == [0, 2]
    assert [h["clients"] for h in result.history] == [4, 2]
    assert result.history[1]["failed_clients"] == 0
    assert _run(tracking_uri, result.run_id).data.metrics["late_clients"] == 2


@pytest.mark.slow
def test_a_hung_worker_is_replaced_and_the_run_goes_on(ray_cluster, tracking_uri, tmp_path, capfd):
    spec = small_run(tracking_uri, tmp_path, "federation.participation=1.0", "method.local_epochs=1",
                     "resources.round_timeout_s=8", "federation.rounds=3")
    result = run_federated(spec, progress=False, on_round=fault_in_round(2, 1, 1, "hang"))
    hung, after = result.history[1], result.history[2]
    assert hung["failed_clients"] >= 1 and hung["replaced_workers"] == 1
    assert hung["clients"] == 4 - hung["failed_clients"]
    assert after["clients"] == 4 and after["failed_clients"] == 0  # worker 1's clients trained on its replacement
    assert "no update within resources.round_timeout_s=8 s; dropped" in capfd.readouterr().err
    assert _run(tracking_uri, result.run_id).info.status == "FINISHED"


def test_the_virtual_clock_by_hand():
    from types import SimpleNamespace

    even = SimpleNamespace(seconds_per_sample=0.01, uplink_mbps=8.0, speed_spread=0.0)
    clock = VirtualClock(even, seed=0, client_sizes=[100, 300], local_epochs=2, update_bytes=1_000_000)
    # 100 samples x 2 epochs x 0.01 s + 1 MB x 8 bit / 8 Mbit/s = 2 + 1 s
    assert clock.client_seconds(0) == pytest.approx(3.0) and clock.client_seconds(1) == pytest.approx(7.0)
    assert clock.run_round([0, 1], deadline=5.0) == ([0], [1], 5.0)  # the server waits out the deadline
    assert clock.run_round([0, 1], deadline=None) == ([0, 1], [], pytest.approx(7.0))
    assert clock.elapsed == pytest.approx(12.0)
    spread = VirtualClock(SimpleNamespace(seconds_per_sample=0.01, uplink_mbps=8.0, speed_spread=1.0), 0, [100] * 50,
                          2, 0)
    speeds = [spread.device(c)[0] for c in range(50)]
    assert len(set(speeds)) == 50 and speeds == [spread.device(c)[0] for c in range(50)]  # per client, seeded
    assert spread.client_seconds(7) == pytest.approx(2.0 / speeds[7])


@pytest.mark.slow
def test_the_virtual_clock_leaves_out_slow_devices_reproducibly(ray_cluster, tracking_uri, tmp_path):
    spec = small_run(tracking_uri, tmp_path, *FOUR_CLIENTS, "federation.virtual_clock.enabled=true",
                     "federation.virtual_clock.speed_spread=1.0", "federation.round_deadline_s=6")
    one = run_federated(spec, progress=False)
    two = run_federated(spec, progress=False)
    assert one.final == two.final
    # the same late clients the clock predicts: 250 samples x 1 epoch x 0.02 s / speed + upload
    from fedvlp.data import prepare_data

    sizes = [len(p) for p in prepare_data(spec).parts]
    clock = VirtualClock(spec.federation.virtual_clock, 0, sizes, 1, 0)
    expected_late = [c for c in range(4) if clock.client_seconds(c) > 6]
    assert 0 < len(expected_late) < 4, [clock.client_seconds(c) for c in range(4)]
    assert [h["late_clients"] for h in one.history] == [len(expected_late)] * 2
    assert [h["clients"] for h in one.history] == [4 - len(expected_late)] * 2
    assert one.history[-1]["virtual_clock_seconds"] == pytest.approx(12.0)  # two rounds cut at the deadline


# ---------------------------------------------------------------- the driver killed mid-run, or interrupted

def _fedvlp(tmp_path, env, *args, **kwargs):
    return subprocess.Popen([*INTERRUPTIBLE_FEDVLP, *args], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, **kwargs)


def _ray_processes(session_root) -> list:
    import psutil

    return [p for p in psutil.process_iter(["cmdline"])
            if any(str(session_root) in c for c in (p.info["cmdline"] or []))]


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster", "tiny_clip")
def test_a_killed_fedotp_driver_resumes_bitwise_in_the_same_mlflow_run(tmp_path, tracking_uri):
    """FedOTP keeps a local prompt per client: kill -9 after round 2, --resume, and the run ends bitwise equal
    to an uninterrupted one, client states and all."""
    uri = tracking_uri
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONUNBUFFERED": "1"}
    overrides = ["method.name=fedotp", "data.num_train=600", "data.num_val=128", "data.num_test=128",
                 "data.num_holdout=100", "federation.clients=4", "federation.rounds=3",
                 "federation.participation=0.5", "method.local_epochs=1", "resources.workers=1",
                 f"output_dir={tmp_path / 'runs'}"]
    # the driver kills itself and its local Ray (kill -9 of its group) once round 2's checkpoint is on disk, so the
    # kill lands mid-run whatever the load (a pipe reader that lagged by a round would let the run finish first)
    first = subprocess.Popen([*KILLED_AFTER_ROUND, "2", *overrides], cwd=tmp_path, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    out, _ = first.communicate(timeout=CLI_TIMEOUT_S)
    assert first.returncode == -signal.SIGKILL, out[-3000:]
    client = MlflowClient(uri)
    (killed,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert killed.info.status == "RUNNING"  # kill -9 gives no chance to end it; --resume will
    time.sleep(2)

    resumed = _fedvlp(tmp_path, env, "run", "--resume", killed.info.run_id)
    out, _ = resumed.communicate(timeout=CLI_TIMEOUT_S)
    assert resumed.returncode == 0, out[-3000:]
    assert "resuming after round 2" in out
    whole = run_federated(small_run(uri, tmp_path, *overrides), progress=False)  # uninterrupted, in this process

    assert client.get_run(killed.info.run_id).info.status == "FINISHED"
    resumed_state = torch.load(tmp_path / "runs" / killed.info.run_id / "checkpoint.pt", weights_only=True)
    whole_state = torch.load(tmp_path / "runs" / whole.run_id / "checkpoint.pt", weights_only=True)
    assert resumed_state["round"] == whole_state["round"] == 3
    assert resumed_state["final"] == whole_state["final"]
    for part in ("global",):
        assert all(torch.equal(resumed_state[part][k], whole_state[part][k]) for k in whole_state[part])
    mine, theirs = (ClientStateStore(tmp_path / "none", 0, state["clients"]).in_memory
                    for state in (resumed_state, whole_state))
    assert sorted(mine) == sorted(theirs) and len(mine) >= 2  # the local prompts of every client that trained
    assert all(torch.equal(mine[c]["local_ctx"], theirs[c]["local_ctx"]) for c in mine)
    history = {m.step: m.value for m in client.get_metric_history(killed.info.run_id, "val_mAP")}
    assert history == {m.step: m.value for m in client.get_metric_history(whole.run_id, "val_mAP")}
    assert sorted(history) == [0, 1, 2, 3]


# The driver is killed after round 2's metrics are in MLflow but before its checkpoint is on disk: at round 1 it keeps
# a copy of the checkpoint, and at round 2 (metrics logged, checkpoint written) it puts round 1's back and kills its
# group, which is what the disk holds when a kill lands between the two. Argv: the run config's --set overrides.
KILLED_BETWEEN_LOGGING_AND_CHECKPOINT = [
    sys.executable, "-c", "import os, shutil, signal, sys; from fedvlp.config import load_spec; "
    "from fedvlp.platform.runtime.engine import run_federated\n"
    "def on_round(r, metrics, checkpoint):\n"
    "    if r == 1: shutil.copy(checkpoint, str(checkpoint) + '.round1')\n"
    "    if r == 2: os.replace(str(checkpoint) + '.round1', checkpoint); os.killpg(0, signal.SIGKILL)\n"
    "run_federated(load_spec(None, sys.argv[1:]), on_round=on_round)"]


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster", "tiny_clip")
def test_a_round_logged_but_not_checkpointed_is_trained_again_on_resume_with_two_workers(tmp_path, tracking_uri):
    """PromptFL on 2 workers (not FedOTP's one): killed between round 2's MLflow logging and its checkpoint,
    --resume trains round 2 again, with the same result, and ends bitwise equal to an uninterrupted run."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "PYTHONUNBUFFERED": "1"}
    overrides = ["data.num_train=600", "data.num_val=128", "data.num_test=128", "data.num_holdout=100",
                 "federation.clients=4", "federation.rounds=3", "method.local_epochs=1", "resources.workers=2",
                 "resources.num_cpus=0.5", f"output_dir={tmp_path / 'runs'}"]
    first = subprocess.Popen([*KILLED_BETWEEN_LOGGING_AND_CHECKPOINT, *overrides], cwd=tmp_path, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    out, _ = first.communicate(timeout=CLI_TIMEOUT_S)
    assert first.returncode == -signal.SIGKILL, out[-3000:]
    client = MlflowClient(tracking_uri)
    (killed,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    run_id = killed.info.run_id
    assert max(m.step for m in client.get_metric_history(run_id, "val_mAP")) == 2  # round 2 is in MLflow ...
    assert torch.load(tmp_path / "runs" / run_id / "checkpoint.pt", weights_only=True)["round"] == 1  # ... not on disk
    time.sleep(2)

    resumed = _fedvlp(tmp_path, env, "run", "--resume", run_id)
    out, _ = resumed.communicate(timeout=CLI_TIMEOUT_S)
    assert resumed.returncode == 0, out[-3000:]
    assert "resuming after round 1" in out
    whole = run_federated(small_run(tracking_uri, tmp_path, *overrides), progress=False)

    assert client.get_run(run_id).info.status == "FINISHED"
    resumed_state = torch.load(tmp_path / "runs" / run_id / "checkpoint.pt", weights_only=True)
    whole_state = torch.load(tmp_path / "runs" / whole.run_id / "checkpoint.pt", weights_only=True)
    assert resumed_state["round"] == whole_state["round"] == 3 and resumed_state["final"] == whole_state["final"]
    assert all(torch.equal(resumed_state["global"][k], whole_state["global"][k]) for k in whole_state["global"])
    for metric in ("val_mAP", "train_loss"):
        logged: dict[int, set[float]] = {}
        for m in client.get_metric_history(run_id, metric):
            logged.setdefault(m.step, set()).add(m.value)
        # round 2 was logged twice, with the same value; every round as in the uninterrupted run
        assert logged == {m.step: {m.value} for m in client.get_metric_history(whole.run_id, metric)}, metric


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_ctrl_c_ends_the_run_killed_and_leaves_no_ray_behind(tmp_path, tracking_uri):
    uri = tracking_uri
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # Ray's socket paths must stay short
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONUNBUFFERED": "1", "RAY_TMPDIR": str(ray_tmp)}
    # far more rounds than can pass before the signal lands: the test reads the driver's output through a pipe,
    # and on busy cores it fell behind until a 20-round run had finished before its Ctrl-C was sent
    proc = _fedvlp(tmp_path, env, "run", "--set", "federation.rounds=1000", "--set", "data.num_train=600",
                   "--set", "resources.workers=1", "--set", f"output_dir={tmp_path / 'runs'}")
    read_until(proc, "round 1/1000")
    assert _ray_processes(ray_tmp)  # the run's own Ray is there to be cleaned up
    proc.send_signal(signal.SIGINT)  # Ctrl-C reaches the driver only, as from a terminal
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
    assert proc.returncode == 130 and "fedvlp: interrupted" in out
    client = MlflowClient(uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "KILLED"
    deadline = time.time() + 120  # a condition with a generous deadline: Ray's daemons exit in seconds when idle
    while _ray_processes(ray_tmp) and time.time() < deadline:
        time.sleep(1)
    assert not _ray_processes(ray_tmp)
    shutil.rmtree(ray_tmp, ignore_errors=True)
