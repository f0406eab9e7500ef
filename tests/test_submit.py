"""`fedvlp submit`: a fedvlp command as a Ray job on a running cluster, as README.md and docs/cluster.md write it.

The fast tests check what the job is given before any cluster work (its directory, the token, the refusals); the
drill starts a head the way a user does (`ray start --head`, Ray's defaults: token authentication on), submits the
documented command from another directory with only the environment the docs name, and checks where everything
landed. The head lives in a PID namespace (see test_multinode), so that `ray stop` sees only this test's Ray.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from test_multinode import PidNamespace, free_port

from fedvlp.cli import main
from fedvlp.platform.runtime.submit import HEAD_RESULTS, auth_token, carried_env, entrypoint

REPO = Path(__file__).resolve().parent.parent


def run_entrypoint(tmp_path: Path, command: str, home: Path) -> list[str]:
    """Run a job's entrypoint in bash with a stand-in `fedvlp` that prints where it runs and what it was given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "fedvlp").write_text('#!/bin/sh\necho "ran in $(pwd) with: $*"\n')
    (bin_dir / "fedvlp").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home)}
    done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.splitlines()


def test_a_job_runs_in_the_submitting_directory_else_in_one_it_names(tmp_path):
    home, mine = tmp_path / "home", tmp_path / "my study"
    home.mkdir()
    mine.mkdir()
    # the head has the submitting directory (a head on this machine): the job runs there, arguments intact
    lines = run_entrypoint(tmp_path, entrypoint(["sweep", "smoke", "--set", "a=b c"], None, str(mine)), home)
    assert lines[-1] == f"ran in {mine} with: sweep smoke --set a=b c"
    assert lines[0].endswith(f":{mine}") and lines[0].startswith("fedvlp submit: the job runs in ")
    # a head elsewhere lacks it: the job runs in ~/fedvlp-results on the head, made for it, and says so
    lines = run_entrypoint(tmp_path, entrypoint(["report", "x"], None, str(tmp_path / "not on the head")), home)
    assert HEAD_RESULTS == "~/fedvlp-results" and (home / "fedvlp-results").is_dir()
    assert lines[-1] == f"ran in {home / 'fedvlp-results'} with: report x"
    # --results wins over both, a leading ~ is the head's home
    lines = run_entrypoint(tmp_path, entrypoint(["run"], "~/studies/p 1", str(mine)), home)
    assert lines[-1] == f"ran in {home / 'studies' / 'p 1'} with: run"


def test_the_token_is_found_where_ray_looks(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert auth_token() == (None, str(tmp_path / ".ray" / "auth_token"))
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("from-the-file\n")
    assert auth_token()[0] == "from-the-file"
    (tmp_path / "elsewhere").write_text("from-the-path")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "elsewhere"))
    assert auth_token()[0] == "from-the-path"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-the-variable")
    assert auth_token() == ("from-the-variable", "$RAY_AUTH_TOKEN")


def test_the_job_gets_the_submitters_mlflow_store_and_fedvlp_settings_only(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    monkeypatch.setenv("FEDVLP_PLUGINS", "my_plugin")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("FEDVLP_NO_ENTRY_POINTS", raising=False)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not for the job")
    assert carried_env() == {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000", "FEDVLP_PLUGINS": "my_plugin",
                             "HF_HUB_OFFLINE": "1"}


@pytest.mark.parametrize("argv, named", [
    (["submit"], "no command given"),
    (["submit", "pretrain", "tiny-clip"], "'pretrain' is not a fedvlp command to submit"),
    (["submit", "--address", "http://127.0.0.1:{port}", "sweep", "smoke"], "--address: no Ray job API answers"),
])
def test_submit_refuses_in_one_line_before_any_cluster_work(argv, named, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [a.format(port=free_port()) for a in argv]  # a port nobody listens on
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert named in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # no store, no results directory


def documented_line(path: Path, prefix: str) -> str:
    """The first command in `path` that starts with `prefix`, as a user would copy it (its comment left out)."""
    found = re.search(rf"^({re.escape(prefix)}[^#\n]*?)\s*(?:#.*)?$", path.read_text(), re.M)
    assert found, f"{path.name} shows no `{prefix}` command"
    return found.group(1)


@pytest.mark.slow
def test_the_documented_submit_runs_a_study_on_a_default_head_and_its_results_land_here(tmp_path):
    submit_line = documented_line(REPO / "README.md", "fedvlp submit")
    assert documented_line(REPO / "docs" / "cluster.md", "fedvlp submit") == submit_line
    report_line = documented_line(REPO / "docs" / "cluster.md", "fedvlp report")
    try:
        namespace = PidNamespace()
    except OSError as error:
        pytest.skip(f"needs a PID namespace (unshare, as root) so that `ray stop` only sees this test: {error}")
    home, head_dir, mine, log = tmp_path / "home", tmp_path / "head", tmp_path / "mine", tmp_path / "ray.log"
    for folder in (home, head_dir, mine):
        folder.mkdir()
    # The user's shell: nothing of Ray's or MLflow's set (CI's HF_HUB_OFFLINE and cache dir stay), a home of its own
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_"))} | {"HOME": str(home)}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    dashboard = free_port()  # Ray's fixed default ports may be taken by another Ray on a shared machine
    try:
        # Ray writes ~/.ray/auth_token the first time any local Ray starts (the quickstart's `fedvlp run` does), and
        # `ray start` then turns token authentication on: the head of the user, who ran the quickstart first
        assert namespace.run(["ray", "get-auth-token", "--generate"], log, timeout=60, env=env).returncode == 0
        start = namespace.run(["bash", "-c", f"cd {shlex.quote(str(head_dir))} && ray start --head "
                               f"--port={free_port()} --dashboard-port={dashboard} "
                               f"--dashboard-agent-listen-port={free_port()} --ray-client-server-port={free_port()} "
                               "--disable-usage-stats"], log, timeout=180, env=env)
        assert start.returncode == 0, log.read_text()[-3000:]
        assert "Token authentication is enabled" in log.read_text()
        user = {**env, "RAY_API_SERVER_ADDRESS": f"http://127.0.0.1:{dashboard}"}  # docs: when not on 8265

        def fedvlp(line: str, extra: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
            return subprocess.run(shlex.split(line), cwd=mine, env={**user, **(extra or {})}, capture_output=True,
                                  text=True, timeout=timeout)

        refused = fedvlp(submit_line, {"RAY_AUTH_TOKEN": "0" * 64})
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr[-2000:]
        assert "refused the token in $RAY_AUTH_TOKEN" in refused.stderr and "ray get-auth-token" in refused.stderr

        done = fedvlp(submit_line, timeout=720)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert f"the job runs in {os.uname().nodename}:{mine}" in done.stdout
        assert "SUCCEEDED" in done.stdout
        assert (mine / "mlflow.db").is_file() and (mine / "reports" / "sweep-smoke" / "index.md").is_file()
        assert sorted(p.name for p in head_dir.iterdir()) == []  # nothing landed where `ray start` ran

        from mlflow import MlflowClient

        client = MlflowClient(f"sqlite:///{mine / 'mlflow.db'}")
        experiment = client.get_experiment_by_name("sweep-smoke")
        runs = client.search_runs([experiment.experiment_id])
        trials = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
        assert len(trials) == 8 and all(r.info.status == "FINISHED" for r in runs)

        (mine / "reports").rename(mine / "first-reports")
        reported = fedvlp(report_line, timeout=300)
        assert reported.returncode == 0, reported.stderr[-2000:]
        assert (mine / "reports" / "sweep-smoke" / "summary.md").is_file()
    finally:
        namespace.run(["ray", "stop", "--force"], log, timeout=60, env=env)
        namespace.kill()
