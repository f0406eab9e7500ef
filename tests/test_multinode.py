"""`ray up` a local cluster with the node types of cluster.yaml, `ray job submit` a sweep whose trials ask for
fractional GPUs, and show that the autoscaler adds GPU worker nodes for them, that the trials' workers ran on those
nodes, and that `ray down` leaves no process behind.

What runs here and what does not (Ray 2.60, one machine, no Docker daemon, no sshd):

* `ray up` with `provider: type: fake_multinode` cannot run: `prepare_config` merges the provider's defaults from
  `fake_multi_node/example.yaml`, which the Ray wheel does not ship (FileNotFoundError). Loading the same class
  through `type: external` gets past that, but Ray's `FakeMultiNodeProvider` pre-registers a head node without a
  launch hash, so `ray up` decides to relaunch it and the provider's `terminate_node` fails (KeyError: 'node'); past
  that, `ray up` would SSH into the fake node id as a host name. (Ray's own `ray up` path for fake clusters is
  `fake_multinode_docker`, which needs docker compose.)
* So the test's provider is `type: external` with `LaunchableFakeMultiNodeProvider` below: Ray's
  `FakeMultiNodeProvider` plus three things a real cloud provider has and it lacks: the head node can be created
  (registered) and terminated by the launcher, its tags can be updated, and the launcher's commands for it run
  through local bash (HOME = a private head home) instead of SSH. Everything else is Ray's own: `ray up` validates
  and bootstraps the config, writes `~/ray_bootstrap_config.yaml` and the file mounts to the head, runs the head
  start commands (cluster.yaml's own, ports changed) with the node type's resources and autoscaler v2 switched on,
  and the head's autoscaler launches worker nodes through the fake provider (local raylets with the node type's
  resources; no worker start commands run). `ray down` runs `ray stop` on the head and terminates the head node;
  the worker nodes are raylets on this machine, ended by that `ray stop` (the `ray down` process's provider does
  not see them: the fake provider keeps its node list in the head's autoscaler process).
* `ray stop` stops every Ray process it can see, including other people's on a shared machine, so the whole
  cluster (`ray up`, `ray down` and everything they start) lives in a PID namespace of its own: there `ray stop`
  sees only this test's processes, and killing the namespace's init ends whatever is left, on every path. Making
  one needs root (unshare); elsewhere the test is skipped.
"""
from __future__ import annotations

import copy
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import pytest
import yaml
from ray.autoscaler._private.command_runner import _with_environment_variables
from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider
from ray.autoscaler.command_runner import CommandRunnerInterface
from ray.autoscaler.tags import NODE_KIND_HEAD, TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE

REPO = Path(__file__).resolve().parent.parent
CLUSTER_YAML = REPO / "cluster.yaml"
PROVIDER_CLASS = f"{Path(__file__).stem}.LaunchableFakeMultiNodeProvider"  # importable with tests/ on PYTHONPATH
MAX_WORKERS = 2  # per worker node type and in all: each fake node is a raylet and its agents on this machine


# ------------------------------------------------------------------------------------ the launcher config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_cluster_yaml() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def scaled_node_types(cluster: dict) -> dict:
    """cluster.yaml's node types, scaled down to this machine: the same names, one CPU each, the same (logical)
    GPUs, the same min_workers, max_workers capped at MAX_WORKERS; node_config is the cloud's, meaningless here."""
    types = {}
    for name, node_type in cluster["available_node_types"].items():
        scaled = {"resources": {**node_type.get("resources", {}), "CPU": 1}, "node_config": {}}
        for key in ("min_workers", "max_workers"):
            if key in node_type:
                scaled[key] = min(node_type[key], MAX_WORKERS)
        types[name] = scaled
    return types


def head_start_commands(cluster: dict, port: int, dashboard: int) -> list[str]:
    """cluster.yaml's head start commands (its `ray stop` only sees this test's PID namespace) without the MLflow
    server (the test tracks to sqlite), with the fake cluster's node ids switched on, and on free ports: the ports
    whose defaults are fixed (GCS 6379, dashboard 8265, the dashboard agent's 52365, Ray client 10001) may be taken
    by another Ray on a shared machine; a head whose job agent cannot bind never accepts a job."""
    commands = []
    for command in cluster["head_start_ray_commands"]:
        if "mlflow" in command:
            continue
        if "ray start --head" in command:
            assert "--port=6379" in command and "--autoscaling-config=~/ray_bootstrap_config.yaml" in command
            command = (command.replace("ray start --head", "RAY_FAKE_CLUSTER=1 ray start --head")
                       .replace("--port=6379", f"--port={port}")
                       + f" --dashboard-port={dashboard} --dashboard-agent-listen-port={free_port()}"
                       f" --ray-client-server-port={free_port()} --disable-usage-stats")
        commands.append(command)
    return commands


def launcher_config(cluster: dict, *, gcs_address: str, port: int, dashboard: int, head_home: Path,
                    file_mounts: dict) -> dict:
    return {
        "cluster_name": "fedvlp-fake",
        "max_workers": min(cluster["max_workers"], MAX_WORKERS),
        "idle_timeout_minutes": cluster["idle_timeout_minutes"],
        "upscaling_speed": 1.0,
        "provider": {
            "type": "external", "module": PROVIDER_CLASS,
            "gcs_address": gcs_address,         # the fake worker nodes join the head's GCS on this port
            "launch_multiple": True,            # what the fake provider needs under autoscaler v2 (`ray up`'s default)
            "head_node_type": cluster["head_node_type"],
            "head_home": str(head_home),
        },
        "auth": {"ssh_user": "fedvlp"},          # no SSH here: the provider's command runner is local bash
        "available_node_types": scaled_node_types(cluster),
        "head_node_type": cluster["head_node_type"],
        "file_mounts": file_mounts,
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        "initialization_commands": [],
        "setup_commands": [],                   # fedvlp and Ray are installed on this machine already
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": head_start_commands(cluster, port, dashboard),
        "worker_start_ray_commands": [],        # the fake provider starts its worker raylets itself
    }


class LocalCommandRunner(CommandRunnerInterface):
    """The launcher's commands for the (fake) head node, run here by bash, with HOME = the head's home."""

    def __init__(self, home: str):
        self.home = home

    def _env(self) -> dict:
        return {**os.environ, "HOME": self.home}

    def _remote(self, path: str) -> str:
        return self.home + path[1:] if path.startswith("~") else path

    def run(self, cmd=None, timeout=120, exit_on_fail=False, port_forward=None, with_output=False,
            environment_variables=None, run_env="auto", ssh_options_override_ssh_key="", shutdown_after_run=False,
            silent=False):
        if environment_variables:
            cmd = _with_environment_variables(cmd, environment_variables)
        final = ["bash", "-c", f"cd ~ && ({cmd})"]
        try:
            if with_output:
                return subprocess.check_output(final, env=self._env())
            return subprocess.check_call(final, env=self._env())
        except subprocess.CalledProcessError:
            raise click.ClickException(f"Command failed:\n\n  {cmd}\n") from None

    def run_rsync_up(self, source, target, options=None):
        target = self._remote(target)
        if os.path.isdir(source):
            shutil.copytree(source, target, dirs_exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy(source, target)

    def run_rsync_down(self, source, target, options=None):
        source = self._remote(source)
        if os.path.isdir(source):
            shutil.copytree(source, target, dirs_exist_ok=True)
        else:
            shutil.copy(source, target)

    def remote_shell_command_str(self):
        return "bash"


class LaunchableFakeMultiNodeProvider(FakeMultiNodeProvider):
    """Ray's FakeMultiNodeProvider, usable by `ray up` / `ray down` on this machine (see the module docstring)."""

    def __init__(self, provider_config, cluster_name):
        super().__init__(provider_config, cluster_name)
        self._nodes[self._head_node_id]["tags"][TAG_RAY_USER_NODE_TYPE] = provider_config["head_node_type"]

    def create_node(self, node_config, tags, count):
        # `ray up` creates the head only; the autoscaler's workers come through create_node_with_resources_and_labels
        assert tags[TAG_RAY_NODE_KIND] == NODE_KIND_HEAD and count == 1, tags
        with self.lock:
            self._nodes[self._head_node_id] = {"tags": dict(tags)}

    def set_node_tags(self, node_id, tags):
        with self.lock:
            self._nodes[node_id]["tags"].update(tags)

    def _terminate_node(self, node):
        if "node" in node:  # a worker raylet this process started; the head's processes end with `ray stop`
            super()._terminate_node(node)

    def get_command_runner(self, log_prefix, node_id, auth_config, cluster_name, process_runner, use_internal_ip,
                           docker_config=None):
        return LocalCommandRunner(self.provider_config["head_home"])


# ------------------------------------------------------------------------------------ the PID namespace

REAPER = """import os, time
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.2)
"""


class PidNamespace:
    """A PID namespace whose init reaps orphans; `run` executes a command inside it, `kill` ends all of it."""

    def __init__(self):
        import psutil

        self.unshare = subprocess.Popen(["unshare", "--pid", "--mount-proc", "--kill-child", sys.executable, "-c",
                                         REAPER], start_new_session=True, stderr=subprocess.PIPE)
        deadline = time.time() + 10
        while not psutil.Process(self.unshare.pid).children():
            if self.unshare.poll() is not None or time.time() > deadline:
                self.kill()
                raise OSError(self.unshare.stderr.read().decode().strip() or "unshare did not start its child")
            time.sleep(0.05)
        self.init = psutil.Process(self.unshare.pid).children()[0].pid
        self.ns = os.readlink(f"/proc/{self.init}/ns/pid")

    def run(self, args: list[str], log: Path, timeout: float, env: dict) -> subprocess.CompletedProcess:
        with open(log, "a") as out:
            try:
                return subprocess.run(["nsenter", f"--target={self.init}", "--pid", "--mount", "--", *args],
                                      env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
            except subprocess.TimeoutExpired:  # what it started inside stays until `kill`
                out.write(f"\n*** timed out after {timeout} s ***\n")
                return subprocess.CompletedProcess(args, 124)

    def processes(self) -> list[str]:
        """The command lines of every process in the namespace but its init."""
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if int(pid) != self.init and os.readlink(f"/proc/{pid}/ns/pid") == self.ns:
                    found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip())
            except OSError:
                pass  # gone meanwhile
        return found

    def kill(self):
        try:
            os.killpg(self.unshare.pid, signal.SIGKILL)  # init dies, and with it every process in the namespace
        except ProcessLookupError:
            pass
        self.unshare.wait(timeout=30)


def processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{pid}: {cmdline[:300]}")
    return found


# ------------------------------------------------------------------------------------ the tests


def test_the_fake_cluster_has_the_node_types_of_cluster_yaml():
    """The launcher config is derived from cluster.yaml; check that what the autoscaling test relies on holds."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    cluster = load_cluster_yaml()
    config = launcher_config(cluster, gcs_address="127.0.0.1:1", port=1, dashboard=2, head_home=Path("/nonexistent"),
                             file_mounts={})
    types, original = config["available_node_types"], cluster["available_node_types"]
    assert set(types) == set(original) and config["head_node_type"] == cluster["head_node_type"]
    head = cluster["head_node_type"]
    assert types[head]["resources"] == {"CPU": 1}  # a CPU head, as in cluster.yaml (whose head declares no GPU)
    assert "GPU" not in original[head].get("resources", {})
    gpu_types = [name for name, t in original.items() if name != head and t.get("resources", {}).get("GPU", 0) >= 1]
    assert gpu_types, "cluster.yaml has no GPU worker node type"
    for name in gpu_types:
        assert types[name]["resources"] == {"CPU": 1, "GPU": original[name]["resources"]["GPU"]}
        assert types[name]["min_workers"] == original[name].get("min_workers", 0) == 0  # only the autoscaler adds them
        assert types[name]["max_workers"] >= 1
    starts = config["head_start_ray_commands"]
    assert any("RAY_FAKE_CLUSTER=1 ray start --head --port=1 " in c
               and "--autoscaling-config=~/ray_bootstrap_config.yaml" in c for c in starts)
    validate_config(prepare_config(copy.deepcopy(config)))  # what `ray up` does first


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_ray_up_autoscales_gpu_workers_for_a_sweep(tmp_path, tracking_uri):
    import ray
    from mlflow import MlflowClient

    try:
        namespace = PidNamespace()
    except OSError as error:
        pytest.skip(f"needs a PID namespace (unshare, as root) so that `ray stop` only sees this test: {error}")
    ray_tmp = tempfile.mkdtemp(prefix="fvmn-", dir="/tmp")  # short: Ray's socket paths must stay under 107 bytes
    try:
        port, dashboard = free_port(), free_port()
        gcs = f"{ray.util.get_node_ip_address()}:{port}"  # the nodes register under this machine's address
        head_home, laptop_home = tmp_path / "head_home", tmp_path / "laptop_home"
        head_home.mkdir()
        laptop_home.mkdir()
        env = {**os.environ, "HOME": str(laptop_home), "RAY_TMPDIR": ray_tmp,
               # Ray's token authentication (on by default for `ray start` clusters), with a token private to this test
               "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
               "RAY_FAKE_CLUSTER": "1",                # the fake provider refuses to start without it
               "RAY_UP_enable_autoscaler_v2": "1",     # `ray up`'s default since Ray 2.50, set to keep it quiet
               "AUTOSCALER_UPDATE_INTERVAL_S": "1",    # the autoscaler's loop, 5 s by default
               "RAY_USAGE_STATS_ENABLED": "0",
               "TMPDIR": ray_tmp,  # `ray up` caches the prepared config and the bootstrap file in the temp dir
               "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))}

        uri = tracking_uri
        space = tmp_path / "fake_cluster.yaml"
        space.write_text(yaml.safe_dump({
            "base": "quickstart", "name": "fake_cluster", "storage": str(tmp_path / "tune"),
            "set": {"federation.rounds": 1, "federation.clients": 4, "data.num_train": 400, "data.num_val": 128,
                    "data.num_test": 128, "data.num_holdout": 64, "method.local_epochs": 1,
                    "resources.workers": 1, "resources.num_cpus": 0.5, "resources.num_gpus": 0.5,
                    "resources.coordinator_cpus": 0.25, "tracking.uri": uri, "output_dir": str(tmp_path / "runs")},
            "space": {"method.name": {"grid": ["promptfl", "zeroshot"]}}, "seeds": [0], "metric": "val_mAP",
            "max_concurrent_trials": 2, "trial_cpus": 0.1}))
        config = launcher_config(load_cluster_yaml(), gcs_address=gcs, port=port, dashboard=dashboard,
                                 head_home=head_home, file_mounts={"~/spaces/fake_cluster.yaml": str(space)})
        config_file = tmp_path / "fake_cluster_launcher.yaml"
        config_file.write_text(yaml.safe_dump(config))
        logs = {name: tmp_path / f"{name}.log" for name in ("up", "down")}

        def log_tail(name: str) -> str:
            path = logs.get(name) or Path(ray_tmp, "ray", "session_latest", "logs", name)
            return f"\n--- {path} ---\n" + (path.read_text(errors="replace")[-4000:] if path.exists() else "(none)")

        def cluster_state() -> dict:
            """The alive nodes (id, resources), their autoscaler node types, and every actor the cluster ran."""
            probe = ("import json, ray\n"
                     "from ray.autoscaler.v2.sdk import get_cluster_status\n"
                     "from ray.util.state import list_actors\n"
                     f"ray.init(address={gcs!r}, logging_level='ERROR')\n"
                     f"status = get_cluster_status({gcs!r})\n"
                     f"actors = list_actors(address='http://127.0.0.1:{dashboard}', limit=10000, detail=True, "
                     "raise_on_missing_output=False)\n"
                     "print(json.dumps({'nodes': [{'id': n['NodeID'], 'resources': n['Resources']} "
                     "for n in ray.nodes() if n['Alive']], 'types': {n.node_id: n.ray_node_type_name for n in "
                     "status.active_nodes + status.idle_nodes}, "
                     "'actors': [{'class': a.class_name, 'node': a.node_id} for a in actors]}))")
            out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env)
            assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
            return json.loads(out.stdout.strip().splitlines()[-1])

        def submit(entrypoint: list[str], timeout: float) -> subprocess.CompletedProcess:
            """`ray job submit`, again while the head's job agent has not registered yet (nothing is submitted then;
            up to 60 s), then up to `timeout` s for the job."""
            agent_deadline = time.time() + 60
            while True:
                try:
                    job = subprocess.run(["ray", "job", "submit", f"--address=http://127.0.0.1:{dashboard}", "--",
                                          *entrypoint], capture_output=True, text=True, timeout=timeout, env=env)
                except subprocess.TimeoutExpired as timeout_error:  # its output comes as bytes
                    output = (timeout_error.stdout or b"").decode(errors="replace")[-3000:]
                    pytest.fail(f"the job did not finish in {timeout} s:\n{output}" + log_tail("monitor.log"))
                if "No available agent to submit job" not in job.stdout + job.stderr:
                    return job
                if time.time() > agent_deadline:
                    pytest.fail("the head's job agent did not register in 60 s" + log_tail("dashboard_agent.log"))
                time.sleep(2)

        started = time.time()
        up = namespace.run(["ray", "up", "-y", "--disable-usage-stats", str(config_file)], logs["up"], 90, env)
        assert up.returncode == 0, log_tail("up")
        assert (head_home / "ray_bootstrap_config.yaml").exists() and (head_home / "spaces/fake_cluster.yaml").exists()

        before = cluster_state()  # min_workers 0: the head alone, with the head type's resources and no GPU
        assert len(before["nodes"]) == 1, before
        assert before["nodes"][0]["resources"]["CPU"] == 1 and "GPU" not in before["nodes"][0]["resources"], before
        head_id = before["nodes"][0]["id"]
        assert before["types"] == {head_id: config["head_node_type"]}, before

        # As in cluster.yaml's walk-through: no --working-dir (fedvlp is installed on the nodes, and Ray deletes a
        # job's working dir when its trial workers exit, under the still-running driver); the space is the copy
        # `ray up` file-mounted to the head, and `~` is the head's home (the entrypoint runs in the head's shell).
        job = submit(["fedvlp", "sweep", "~/spaces/fake_cluster.yaml"], timeout=240)
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-2000:] + log_tail("monitor.log")
        assert "sweep fake_cluster: 2 trials, 0 failed" in job.stdout, job.stdout[-3000:]

        after = cluster_state()
        gpu_type = next(name for name, t in config["available_node_types"].items() if "GPU" in t["resources"])
        added = {n["id"]: n for n in after["nodes"] if n["id"] != head_id}
        assert added, f"the autoscaler added no node: {after}"
        for node_id, node in added.items():  # launched by the autoscaler, of the GPU worker type and its resources
            assert after["types"].get(node_id) == gpu_type, after
            assert node["resources"]["GPU"] == config["available_node_types"][gpu_type]["resources"]["GPU"], after
        assert len(added) <= config["available_node_types"][gpu_type]["max_workers"]

        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name("sweep-fake_cluster")
        trials = [r for r in client.search_runs([experiment.experiment_id])
                  if r.data.tags.get("fedvlp.role") == "trial"]
        assert len(trials) == 2 and {t.info.status for t in trials} == {"FINISHED"}, trials
        used = set()
        for trial in trials:  # every trial's workers ran on GPU worker nodes the autoscaler added, none on the head
            nodes = set(trial.data.tags["nodes"].split(","))
            assert nodes and nodes <= set(added), (trial.data.tags.get("method"), nodes, after)
            used |= nodes
        # Ray's own record agrees: the ClientWorker actors ran where the trials say, and the rest of the job (the job
        # supervisor, Tune's trial actors, pinned by fedvlp to the head) on the head: each trial spans two nodes.
        actors = {(a["class"], a["node"]) for a in after["actors"]}
        assert {node for cls, node in actors if cls == "ClientWorker"} == used, actors
        assert {node for cls, node in actors if cls not in ("ClientWorker", "Coordinator")} == {head_id}, actors

        down = namespace.run(["ray", "down", "-y", str(config_file)], logs["down"], 60, env)
        assert down.returncode == 0, log_tail("down")
        deadline = time.time() + 30  # `ray stop` waits for its processes; give stragglers a moment to exit
        while (left := namespace.processes() or processes_mentioning(ray_tmp)) and time.time() < deadline:
            time.sleep(1)
        assert not left, f"`ray down` left processes behind: {left}"
        print(f"ray up .. ray down: {time.time() - started:.0f} s; nodes added: {sorted(added)}")
    finally:
        namespace.kill()  # whatever is still in the namespace ends here, on every path
        deadline = time.time() + 10
        while processes_mentioning(ray_tmp) and time.time() < deadline:
            time.sleep(0.5)
        shutil.rmtree(ray_tmp, ignore_errors=True)
