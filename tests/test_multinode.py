"""Two Ray nodes on one machine: `ray start` a head and a worker node, submit `fedvlp sweep` as a Ray job,
and show that the trials' workers ran on both nodes."""
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Ray's token authentication (on by default for `ray start` clusters), with a token private to this test.
ENV = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


def start_node(args, log: Path) -> subprocess.Popen:
    # --block keeps every process of the node in this process group, so it is stopped by its id
    return subprocess.Popen(["ray", "start", "--block", "--disable-usage-stats", *args], stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True, env=ENV)


def cluster_nodes(address: str) -> list[dict]:
    probe = ("import json, ray; ray.init(address=%r, logging_level='ERROR'); "
             "print(json.dumps([{'id': n['NodeID'], 'alive': n['Alive'], 'cpus': n['Resources'].get('CPU', 0)} "
             "for n in ray.nodes()]))") % address
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=ENV)
    return yaml.safe_load(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else []


@pytest.mark.usefixtures("tiny_clip")
def test_sweep_job_runs_on_two_nodes(tmp_path):
    import ray

    port, dashboard = free_port(), free_port()
    address = f"{ray.util.get_node_ip_address()}:{port}"  # the nodes register under this machine's address
    nodes = []
    try:
        nodes.append(start_node(["--head", f"--port={port}", "--num-cpus=1",
                                 "--num-gpus=0", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                                 f"--dashboard-port={dashboard}"], tmp_path / "head.log"))
        deadline = time.time() + 120
        while not cluster_nodes(address):
            assert time.time() < deadline, (tmp_path / "head.log").read_text()[-2000:]
            time.sleep(2)
        nodes.append(start_node([f"--address={address}", "--num-cpus=2",
                                 "--num-gpus=0"], tmp_path / "worker.log"))
        while len([n for n in cluster_nodes(address) if n["alive"]]) < 2:
            assert time.time() < deadline + 60, (tmp_path / "worker.log").read_text()[-2000:]
            time.sleep(2)
        node_ids = {n["cpus"]: n["id"] for n in cluster_nodes(address) if n["alive"]}

        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        space = tmp_path / "two_nodes.yaml"
        space.write_text(yaml.safe_dump({
            "base": str(REPO / "configs" / "quickstart.yaml"), "name": "two_nodes", "storage": str(tmp_path / "tune"),
            "set": {"federation.rounds": 1, "federation.clients": 4, "data.num_train": 600, "data.num_test": 256,
                    "method.local_epochs": 1, "resources.workers": 1, "resources.num_cpus": 0.5,
                    "resources.coordinator_cpus": 0.25, "tracking.uri": uri, "output_dir": str(tmp_path / "runs")},
            "space": {"method.name": {"grid": ["promptfl", "zeroshot"]}}, "seeds": [0], "metric": "test_mAP",
            "max_concurrent_trials": 2, "trial_cpus": 0.1}))
        # No --working-dir: fedvlp is installed on the nodes (as cluster.yaml does), and Ray deletes a job's
        # working dir when its trial workers exit, under the still-running driver.
        job = subprocess.run(["ray", "job", "submit", f"--address=http://127.0.0.1:{dashboard}",
                              "--", "fedvlp", "sweep", str(space)],
                             capture_output=True, text=True, timeout=900, env=ENV)
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-2000:]
        assert "sweep two_nodes: 2 trials, 0 failed" in job.stdout

        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name("sweep-two_nodes")
        trials = [r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get("fedvlp.role") == "trial"]
        assert len(trials) == 2 and {t.info.status for t in trials} == {"FINISHED"}
        used = {node for t in trials for node in t.data.tags["nodes"].split(",")}
        assert used == set(node_ids.values()), (used, node_ids)  # worker actors ran on the head and on the second node
    finally:
        for node in reversed(nodes):
            os.killpg(node.pid, signal.SIGTERM)
        for node in nodes:
            try:
                node.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(node.pid, signal.SIGKILL)
        current = Path("/tmp/ray/ray_current_cluster")
        if current.exists() and str(port) in current.read_text():
            current.unlink()  # a stale address would make a later plain ray.init() try to join a dead cluster
