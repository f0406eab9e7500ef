"""`fedvlp submit`: a fedvlp command as a Ray job on a running cluster (`ray start --head`, `ray up cluster.yaml`).

A Ray job does not inherit the submitting shell: its driver runs in the directory where the head was started, with
the head's environment, and a Ray 2.60 head asks for a token that `ray job submit` sends only when the shell sets
RAY_AUTH_MODE=token. So `fedvlp submit` gives the job what it would miss:

* the token: $RAY_AUTH_TOKEN, else the file $RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token (where `ray start` writes
  it), sent as the requests' bearer header; a refusal is one line that says what to set;
* a directory to run in, where its outputs land (the default store ./mlflow.db, reports/, fedvlp-runs/,
  ray_results/): `--results DIR`, else the submitting directory when the head has it (a head on this machine), else
  ~/fedvlp-results on the head; the job's first line names it;
* the submitter's MLflow and fedvlp variables (CARRIED); without them the job keeps the head's (cluster.yaml's head
  exports MLFLOW_TRACKING_URI, its MLflow server).
"""
from __future__ import annotations

import asyncio
import os
import shlex
import time
from pathlib import Path

from fedvlp.errors import ConfigError, FedvlpError

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
ADDRESS_ENV = "RAY_API_SERVER_ADDRESS"  # what `ray job` reads too
CARRIED = ("MLFLOW_TRACKING_URI", "HF_HUB_OFFLINE", "FEDVLP_PLUGINS", "FEDVLP_NO_ENTRY_POINTS")
HEAD_RESULTS = "~/fedvlp-results"  # where a job runs when the head lacks the submitting directory
AGENT_WAIT_S = 60.0  # a head just started has no job agent for some seconds: Ray then answers "No available agent"
SUBMITTABLE = ("run", "sweep", "tune", "report", "data", "list")


def auth_token() -> tuple[str | None, str]:
    """(the cluster token the submitter holds, or None; where it was looked for), in Ray's own order."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip(), "$RAY_AUTH_TOKEN"
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or "~/.ray/auth_token").expanduser()
    token = path.read_text().strip() if path.is_file() else ""
    return token or None, str(path)


def carried_env() -> dict[str, str]:
    """The submitter's variables the job gets (CARRIED, those set here); the rest of its environment is the head's."""
    return {name: os.environ[name] for name in CARRIED if os.environ.get(name)}


def _on_head(directory: str) -> str:
    """`directory` quoted for the head's shell, a leading `~` left for that shell to expand."""
    if directory == "~" or directory.startswith("~/"):
        return "~" + (f"/{shlex.quote(directory[2:])}" if directory[2:] else "")
    return shlex.quote(directory)


def entrypoint(command: list[str], results: str | None, here: str) -> str:
    """The job's shell command: go to the results directory (made if need be), say where it is, run fedvlp."""
    if results is not None:
        go = f"mkdir -p {_on_head(results)} && cd {_on_head(results)}"
    else:
        go = (f"{{ cd {_on_head(here)} 2>/dev/null || {{ mkdir -p {_on_head(HEAD_RESULTS)} && "
              f"cd {_on_head(HEAD_RESULTS)}; }}; }}")
    return (f"{go} && echo \"fedvlp submit: the job runs in $(hostname):$(pwd)\" && "
            f"exec fedvlp {shlex.join(command)}")


def check_command(command: list[str]) -> None:
    """Refuse, before any cluster work, a command fedvlp would not run as a job."""
    if not command:
        raise ConfigError(f"fedvlp submit: no command given; expected one of {', '.join(SUBMITTABLE)} and its "
                          "arguments, e.g. fedvlp submit sweep smoke")
    if command[0] not in SUBMITTABLE:
        raise ConfigError(f"fedvlp submit: {command[0]!r} is not a fedvlp command to submit; expected one of "
                          f"{', '.join(SUBMITTABLE)}")


def submit(command: list[str], address: str | None = None, results: str | None = None,
           wait: bool = True) -> int:
    """Submit `fedvlp COMMAND` as a Ray job; with `wait`, print its logs as they come and return 0 when it
    succeeded, 1 when not (the job's own exit line is in its logs)."""
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobStatus, JobSubmissionClient

    check_command(command)
    address = address or os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS
    token, where = auth_token()
    headers = {"Authorization": f"Bearer {token}"} if token else None
    job_entrypoint = entrypoint(command, results, os.getcwd())
    deadline = time.monotonic() + AGENT_WAIT_S
    try:
        client = JobSubmissionClient(address, headers=headers)
        while True:
            try:
                job_id = client.submit_job(entrypoint=job_entrypoint, runtime_env={"env_vars": carried_env()})
                break
            except RuntimeError as error:
                if "No available agent" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(2)
    except AuthenticationError as error:
        held = f"the token in {where}" if token else f"no token (none in {where}, nor $RAY_AUTH_TOKEN)"
        raise FedvlpError(f"the Ray cluster at {address} refused {held}: put the cluster's token (`ray "
                          f"get-auth-token` on the head) in ~/.ray/auth_token or $RAY_AUTH_TOKEN") from error
    except ConnectionError as error:
        raise FedvlpError(f"--address: no Ray job API answers at {address} ({type(error).__name__}); expected a "
                          f"running head (`ray start --head`, or `ray dashboard cluster.yaml` forwarding "
                          f"{DEFAULT_ADDRESS})") from error
    follow = f"RAY_AUTH_MODE=token ray job logs --address {address} --follow {job_id}"
    print(f"fedvlp submit: job {job_id} on {address}: fedvlp {shlex.join(command)}\n"
          f"  follow: {follow}\n  stop:   RAY_AUTH_MODE=token ray job stop --address {address} {job_id}", flush=True)
    if not wait:
        return 0

    async def tail() -> None:
        async for lines in client.tail_job_logs(job_id):
            print(lines, end="", flush=True)

    try:
        asyncio.run(tail())
    except KeyboardInterrupt:
        print(f"fedvlp submit: stopped following; job {job_id} goes on ({follow})", flush=True)
        return 130
    while (status := client.get_job_status(job_id)) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
        time.sleep(0.5)  # the log stream can end a moment before the status is final
    print(f"fedvlp submit: job {job_id} {status.value}", flush=True)
    return 0 if status == JobStatus.SUCCEEDED else 1
