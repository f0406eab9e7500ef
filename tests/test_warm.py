"""Warm pools on a running cluster (`ray start --head`, then `fedvlp run` with RAY_ADDRESS), each claim of
docs/cluster.md: the second run of a shape borrows the first one's actors and ends with the same metrics; a run of
another shape makes an idle pool give way; an idle pool ends after `resources.keep_warm_s`; an interrupted or failed
run leaves no pool behind; the keeper holds no CPU; a pool is lent to one live run at a time, and the next borrower
removes the pool of a driver that died."""
import dataclasses
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import CLI_TIMEOUT_S, INTERRUPTIBLE_FEDVLP, REPO, read_until
from mlflow import MlflowClient

from fedvlp.config import CONFIGS_DIR, load_spec

sys.path.insert(0, str(REPO / "benchmarks"))
import _common as common  # noqa: E402

from fedvlp.platform.runtime import warm  # noqa: E402

SMALL = ["federation.rounds=2", "data.num_train=600", "resources.workers=1"]


def test_a_pool_is_named_by_the_code_plugins_and_resources_not_by_the_method_or_data():
    spec = load_spec(CONFIGS_DIR / "quickstart.yaml")
    name = warm.pool_name(spec)
    assert name.startswith("pool-") and len(name) == 21
    other_run = load_spec(CONFIGS_DIR / "fedmpt_scenes.yaml", ["seed=3", "data.num_train=500"])
    assert warm.pool_name(other_run) == name
    for changed in (dataclasses.replace(spec, resources=dataclasses.replace(spec.resources, workers=3)),
                    dataclasses.replace(spec, resources=dataclasses.replace(spec.resources, num_cpus=0.5)),
                    dataclasses.replace(spec, plugins=("fedvlp_examples",))):
        assert warm.pool_name(changed) != name


def test_pools_serve_only_runs_that_attach_to_a_running_cluster(monkeypatch):
    spec = load_spec(CONFIGS_DIR / "quickstart.yaml")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert not warm.enabled(spec, started_ray=True)  # a private local Ray ends with the run
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    assert warm.enabled(spec, started_ray=True)
    assert not warm.enabled(spec, started_ray=False)  # the caller's Ray: its actors are the caller's business
    off = dataclasses.replace(spec, resources=dataclasses.replace(spec.resources, keep_warm_s=0))
    assert not warm.enabled(off, started_ray=True)


@pytest.fixture
def head():
    """A Ray head started as a user starts one (`ray start --head`; the benchmarks' helper): the environment that
    attaches to it."""
    with common.ray_head(2):
        yield dict(os.environ)


def _run(env, tmp_path, *overrides, timeout=CLI_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedvlp", "run", "--quiet", *(f"--set={o}" for o in SMALL),
                           f"--set=output_dir={tmp_path / 'runs'}", *(f"--set={o}" for o in overrides)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


def _runs(uri: str) -> list:
    client = MlflowClient(uri)
    return client.search_runs([e.experiment_id for e in client.search_experiments()], order_by=["start_time ASC"])


def _ask_the_head(env, expression: str):
    """`expression`'s value, evaluated in a driver attached to the head (a fresh process: what a user would see)."""
    code = f"import ray, time; ray.init(logging_level='ERROR', log_to_driver=False); print({expression})"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True, timeout=CLI_TIMEOUT_S).stdout
    return eval(out.strip().splitlines()[-1])


def _placement_groups(env) -> dict[str, str]:
    """The cluster's placement groups that hold resources: id -> state."""
    return _ask_the_head(env, "{k: v['state'] for k, v in ray.util.placement_group_table().items() "
                              "if v['state'] != 'REMOVED'}")


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_a_second_run_borrows_the_warm_pool_and_matches_a_cold_run(head, tmp_path, tracking_uri):
    env = {**head, "MLFLOW_TRACKING_URI": tracking_uri}
    for _ in range(2):
        done = _run(env, tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
    cold, warm_run = _runs(tracking_uri)
    assert (cold.data.tags["actors"], warm_run.data.tags["actors"]) == ("new", "warm")
    # the borrowed actors start afresh: the same numbers as new ones
    for key in ("val_mAP", "test_mAP", "personal_mAP", "train_loss"):
        assert warm_run.data.metrics[key] == cold.data.metrics[key], key
    assert warm_run.data.metrics["startup_actors_seconds"] < cold.data.metrics["startup_actors_seconds"] / 2
    assert len(_placement_groups(head)) == 1  # the pool's, kept for the next run

    # a run of another shape: the idle pool gives its CPUs way (2 workers + coordinator need 2 of the 2 CPUs)
    other = _run(env, tmp_path, "resources.workers=2", "resources.num_cpus=0.75", "resources.placement_timeout_s=20")
    assert other.returncode == 0, other.stderr[-3000:]
    assert _runs(tracking_uri)[-1].data.tags["actors"] == "new"

    # an idle pool ends after keep_warm_s
    short = _run(env, tmp_path, "resources.workers=2", "resources.num_cpus=0.75", "resources.keep_warm_s=2")
    assert short.returncode == 0 and _runs(tracking_uri)[-1].data.tags["actors"] == "warm"
    deadline = time.time() + 30
    while _placement_groups(head) and time.time() < deadline:
        time.sleep(1)
    assert not _placement_groups(head)


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_an_interrupted_warm_run_leaves_no_pool_behind(head, tmp_path, tracking_uri):
    env = {**head, "MLFLOW_TRACKING_URI": tracking_uri, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([*INTERRUPTIBLE_FEDVLP, "run", *(f"--set={o}" for o in SMALL),
                             "--set=federation.rounds=1000", f"--set=output_dir={tmp_path / 'runs'}"],
                            cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        read_until(proc, "round 1/1000")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=CLI_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out[-3000:]
    assert _runs(tracking_uri)[-1].info.status == "KILLED"
    assert not _placement_groups(head)  # its actors may be mid-round: never lent again


def _cpus(env) -> dict[str, float]:
    """The cluster's CPUs: in all, free, and reserved by live placement groups (the pools'); read after 2 s, once
    the attaching driver's view of the resources has settled."""
    return _ask_the_head(env, "(time.sleep(2), {'total': ray.cluster_resources()['CPU'], "
                              "'free': ray.available_resources().get('CPU', 0.0), "
                              "'pools': sum(b.get('CPU', 0.0) for v in ray.util.placement_group_table().values() "
                              "if v['state'] != 'REMOVED' for b in v['bundles'].values())})[1]")


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_the_keeper_holds_no_cpu_and_a_failed_warm_run_removes_its_pool(head, tmp_path, tracking_uri):
    env = {**head, "MLFLOW_TRACKING_URI": tracking_uri}
    done = _run(env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(_placement_groups(head)) == 1  # the pool, kept
    cpus = _cpus(head)  # the pool's keeper is alive, and lends the pool; it never takes a CPU from the runs
    assert cpus["pools"] == 1.25 and cpus["free"] == cpus["total"] - cpus["pools"], cpus  # 1 worker + coordinator

    # every update arrives after a 1 µs deadline: round 1 fails with the pool borrowed, its actors maybe mid-round
    failed = _run(env, tmp_path, "federation.round_deadline_s=0.000001")
    assert failed.returncode != 0 and "min_clients_per_round" in failed.stderr, failed.stderr[-3000:]
    run = _runs(tracking_uri)[-1]
    assert (run.info.status, run.data.tags["actors"]) == ("FAILED", "warm")
    assert not _placement_groups(head)  # never lent again


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_a_pool_is_lent_to_one_live_run_and_a_dead_borrowers_pool_is_removed(head, tmp_path, tracking_uri):
    env = {**head, "MLFLOW_TRACKING_URI": tracking_uri, "PYTHONUNBUFFERED": "1"}
    shape = ["resources.num_cpus=0.25", "resources.coordinator_cpus=0.25"]  # two runs fit the head's 2 CPUs
    assert _run(env, tmp_path, *shape).returncode == 0
    (first_pool,) = _placement_groups(head)

    log = tmp_path / "long.log"
    with open(log, "w") as out:  # a file, not a pipe: the long run never blocks on a reader that stopped reading
        long = subprocess.Popen([sys.executable, "-m", "fedvlp", "run", *(f"--set={o}" for o in [*SMALL, *shape]),
                                 "--set=federation.rounds=1000", f"--set=output_dir={tmp_path / 'runs'}"],
                                cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + CLI_TIMEOUT_S
        while "round 1/1000" not in log.read_text():
            assert long.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        assert _runs(tracking_uri)[-1].data.tags["actors"] == "warm"  # the long run holds the pool

        beside = _run(env, tmp_path, *shape)  # the same shape while the pool is lent: actors of its own
        assert beside.returncode == 0, beside.stderr[-3000:]
        assert _runs(tracking_uri)[-1].data.tags["actors"] == "new"
        assert set(_placement_groups(head)) == {first_pool}  # its own actors ended with it; the pool stays lent
    finally:
        os.killpg(long.pid, signal.SIGKILL)  # the borrower's driver dies mid-run
        long.wait(timeout=60)

    after = _run(env, tmp_path, *shape)  # the next borrower finds the holder dead: removes the pool, starts anew
    assert after.returncode == 0, after.stderr[-3000:]
    assert _runs(tracking_uri)[-1].data.tags["actors"] == "new"
    pools = _placement_groups(head)
    assert len(pools) == 1 and first_pool not in pools  # the dead borrower's actors are gone, the new pool kept
