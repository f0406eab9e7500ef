"""MLflow tracking for one federated run (DESIGN §6).

One run = one MLflow run: params are the flattened config, tags name the method and dataset,
metrics are stepped by round, and the resolved config and final metrics are artifacts. The run
is always ended: FINISHED, FAILED on an error, KILLED on Ctrl-C; never left RUNNING.
"""
from __future__ import annotations

import json
import logging
import os
import time

import yaml

from fedvlp.errors import FedvlpError
from fedvlp.paths import default_tracking_uri

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
logging.getLogger("alembic").setLevel(logging.WARNING)


def open_experiment(uri: str, name: str):
    """(client, experiment id) of experiment `name` in the store at `uri`, created if new."""
    from mlflow import MlflowClient

    try:
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name(name)
        return client, experiment.experiment_id if experiment else client.create_experiment(name)
    except Exception as exc:
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise FedvlpError(f"tracking.uri: cannot open MLflow store {uri} ({type(exc).__name__}: {first})") from None


class RunTracker:
    """Opens a new MLflow run for `spec`, or reopens `run_id` to continue a resumed run."""

    def __init__(self, spec, tags: dict[str, str] | None = None, run_id: str | None = None):
        from mlflow.entities import Metric, Param, RunTag

        self._Metric, self._Param, self._RunTag = Metric, Param, RunTag
        self.uri = spec.tracking.uri or default_tracking_uri()
        self.client, self.experiment_id = open_experiment(self.uri, spec.tracking.experiment)
        if run_id is not None:
            self.run = self.client.get_run(run_id)
            self.run_id = run_id
            self.client.update_run(run_id, status="RUNNING")
            return
        run_tags = {"method": spec.method.name, "dataset": spec.data.name, **(tags or {})}
        run_name = spec.tracking.run_name or f"{spec.method.name}-{spec.data.name}"
        self.run = self.client.create_run(self.experiment_id, run_name=run_name, tags=run_tags)
        self.run_id = self.run.info.run_id
        params = [self._Param(k, str(v)[:6000]) for k, v in sorted(spec.flat().items())]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        self.client.log_text(self.run_id, yaml.safe_dump(spec.to_dict(), sort_keys=False), "config.yaml")

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        batch = [self._Metric(k, float(v), now, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def set_tags(self, tags: dict[str, str]) -> None:
        self.client.log_batch(self.run_id, tags=[self._RunTag(k, str(v)) for k, v in tags.items()])

    def log_json(self, obj, name: str) -> None:
        self.client.log_text(self.run_id, json.dumps(obj, indent=2, sort_keys=True), name)

    def end(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status)


def resumable_run(run_id: str, tracking_uri: str | None = None):
    """(spec, checkpoint path) of an earlier run, from its config.yaml artifact and checkpoint tag."""
    from mlflow import MlflowClient

    from fedvlp.config import build_spec

    uri = tracking_uri or default_tracking_uri()
    client = MlflowClient(tracking_uri=uri)
    try:
        run = client.get_run(run_id)
        raw = yaml.safe_load(client.download_artifacts(run_id, "config.yaml"))
    except Exception as exc:
        raise FedvlpError(f"--resume {run_id}: no such run with a config.yaml in {uri} ({type(exc).__name__})") from None
    if "checkpoint" not in run.data.tags:
        raise FedvlpError(f"--resume {run_id}: the run has no checkpoint tag (it never finished a round)")
    raw.setdefault("tracking", {})["uri"] = uri
    return build_spec(raw), run.data.tags["checkpoint"]
