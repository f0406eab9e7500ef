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


class RunTracker:
    def __init__(self, spec, tags: dict[str, str] | None = None):
        from mlflow import MlflowClient
        from mlflow.entities import Metric, Param, RunTag

        self._Metric, self._Param, self._RunTag = Metric, Param, RunTag
        self.uri = spec.tracking.uri or default_tracking_uri()
        try:
            self.client = MlflowClient(tracking_uri=self.uri)
            experiment = self.client.get_experiment_by_name(spec.tracking.experiment)
            experiment_id = (experiment.experiment_id if experiment
                             else self.client.create_experiment(spec.tracking.experiment))
        except Exception as exc:
            raise FedvlpError(f"tracking.uri: cannot open MLflow store {self.uri} ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from None
        self.experiment_id = experiment_id
        run_tags = {"method": spec.method.name, "dataset": spec.data.name, **(tags or {})}
        run_name = spec.tracking.run_name or f"{spec.method.name}-{spec.data.name}"
        self.run = self.client.create_run(experiment_id, run_name=run_name, tags=run_tags)
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

    def ui_command(self) -> str:
        return f"mlflow ui --backend-store-uri {self.uri} --host 127.0.0.1 --port 5000"
