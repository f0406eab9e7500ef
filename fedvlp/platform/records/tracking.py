"""MLflow tracking for one federated run.

One run = one MLflow run: params are the flattened config, tags name the method and dataset,
metrics are stepped by round, and the resolved config and final metrics are artifacts. The run
is always ended: FINISHED, FAILED on an error, KILLED on Ctrl-C; never left RUNNING.

A store that cannot be reached when a command starts is a one-line `TrackingError` before any
other work (`check_tracking_store`). A store that stops answering mid-run loses nothing: the
run goes on and its tracking continues in a local file (`RunTracker`). Logging never holds a
round up: a thread of the tracker sends to the store, in order, while the next round trains.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from urllib.parse import urlparse

import yaml

from fedvlp.errors import FedvlpError, TrackingError
from fedvlp.paths import default_tracking_uri
from fedvlp.platform.metrics import EVALUATION_SETS, split_metric

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
logging.getLogger("alembic").setLevel(logging.WARNING)
logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # "Creating initial MLflow database tables..."

CONNECT_TIMEOUT_S = 5.0
FALLBACK_FILE = "tracking-fallback.jsonl"


def _reason(exc: BaseException) -> str:
    """The first line of an exception, for a one-line message."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if len(first) > 160:
        first = first[:160] + "..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def check_tracking_store(uri: str, source: str = "tracking.uri") -> None:
    """Fail fast, in one line naming `source`, on a store that cannot work: an HTTP server that does
    not accept connections (MLflow itself retries one for minutes) or a sqlite file in a missing directory."""
    parsed = urlparse(uri)
    if parsed.scheme in ("http", "https"):
        try:
            host, port = parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)
        except ValueError:  # a port that is not a number
            host = port = None
        if not host or not port:
            raise TrackingError(f"{source}: {uri} is not a valid URL; expected http(s)://HOST:PORT of an MLflow server")
        try:
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise TrackingError(
                f"{source}: cannot reach the MLflow server at {uri} ({reason}); expected a running server "
                f"(mlflow server --host {host} --port {port}), or leave it unset for the local ./mlflow.db") from None
    elif parsed.scheme == "sqlite":
        path = uri[len("sqlite:///"):]
        if path and path != ":memory:" and not Path(path).parent.is_dir():
            raise TrackingError(f"{source}: {uri}: no directory {Path(path).parent}; "
                                f"expected the sqlite file in an existing directory")


EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}  # the UI opens on runs, not GenAI traces
UI_HOST, UI_PORT = "127.0.0.1", 5000


def open_experiment(uri: str, name: str):
    """(client, experiment id) of experiment `name` in the store at `uri`, created if new; tagged as a
    model-training experiment, so MLflow's UI opens it on its runs."""
    from mlflow import MlflowClient

    check_tracking_store(uri)
    try:
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            return client, client.create_experiment(name, tags=EXPERIMENT_KIND)
        if experiment.tags.get("mlflow.experimentKind") is None:
            client.set_experiment_tag(experiment.experiment_id, *next(iter(EXPERIMENT_KIND.items())))
        return client, experiment.experiment_id
    except Exception as exc:
        raise TrackingError(f"tracking.uri: cannot open MLflow store {uri} ({_reason(exc)})") from None


def ui_command(uri: str) -> str:
    """The command that serves MLflow's UI for the store at `uri` on this machine's loopback only."""
    return f"mlflow ui --backend-store-uri {uri} --host {UI_HOST} --port {UI_PORT}"


def ui_link(experiment_id: str, run_id: str | None = None, *, metric: str | None = None,
            grouped: bool = False, port: int = UI_PORT) -> str:
    """The UI's link to a run, or to an experiment's runs, in the UI's "Model training" workflow.

    MLflow 3.17's UI picks the workflow from the link (`workflowType`) or from what this browser chose
    last, not from the experiment's `mlflow.experimentKind` tag: a bare experiment link opens a fresh
    browser on the GenAI "Overview" of traces. With `metric`, the experiment link opens fedvlp's saved
    view of its runs (method and `metric` as columns, best first; `grouped`: the trials grouped by
    method, charts of the metric per round as mean and min-max band per method), which must have been
    stored in the experiment first by `save_ui_views(..., metric)`: a saved view the experiment lacks
    sends the UI to the GenAI overview.
    """
    from urllib.parse import urlencode

    base = f"http://{UI_HOST}:{port}/#/experiments/{experiment_id}/runs"
    query: dict[str, str] = {}
    if run_id:
        base = f"{base}/{run_id}"
    elif metric:
        query["viewStateShareKey"] = f"fedvlp.{metric}{'.by-method' if grouped else ''}"
        if grouped:
            query["compareRunsMode"] = "CHART"
    query["workflowType"] = "machine_learning"
    return f"{base}?{urlencode(query)}"


def save_ui_views(store, experiment_id: str, metric: str = "val_mAP") -> bool:
    """Store fedvlp's two saved views of an experiment's runs in MLflow's UI (experiment tags
    `mlflow.sharedViewState.<key>`, listed under "Views" on the runs page), for `ui_link(..., metric=metric)`:

    - `fedvlp.<metric>` "fedvlp: runs by <metric>": columns method, `metric` and its test and personal
      counterparts, sorted by `metric`, best first;
    - `fedvlp.<metric>.by-method` "fedvlp: by method, <metric>": the same, grouped by the method tag; its
      chart view draws the metric (and its counterparts and train_loss) per round as each method's mean
      over its runs with the min-max range as a band.

    `store` is an MlflowClient or a tracking URI. A view already stored is left as it is (a user may have
    edited it in the UI). True when both views are there, False (never an exception) when the store failed.
    """
    from mlflow import MlflowClient

    split, key = split_metric(metric)
    twins = [f"{s}_{key}" for s in EVALUATION_SETS] if split else [metric]
    columns = ["tags.`method`", *(f"metrics.`{m}`" for m in twins)]
    table = {"selectedColumns": columns, "orderByKey": f"metrics.`{metric}`", "orderByAsc": False,
             "columnOrder": ["attributes.`Run Name`", "runDateAndNestInfo", "duration", *columns],  # widths need it
             "columnWidths": {"attributes.`Run Name`": 270, **{c: 140 for c in columns[1:]}}}
    plotted = [*twins, "train_loss"]  # in this order, one line chart each, by round
    section = {"uuid": "fedvlp-metrics", "name": "Model metrics", "display": True, "isReordered": False,
               "deleted": False, "isGenerated": True}
    line = {"type": "LINE", "metricSectionId": section["uuid"], "runsCountToCompare": 10, "deleted": False,
            "isGenerated": True, "xAxisKey": "step", "yAxisKey": "metric", "scaleType": "linear",
            "xAxisScaleType": "linear", "lineSmoothness": 0, "selectedXAxisMetricKey": "", "yAxisExpressions": [],
            "ignoreOutliers": False, "useGlobalXaxisKey": True, "useGlobalLineSmoothing": True, "range": {}}
    charts = [{**line, "uuid": f"fedvlp-{m}", "metricKey": m, "displayName": m} for m in plotted]
    views = {
        f"fedvlp.{metric}": (f"fedvlp: runs by {metric}", table),
        f"fedvlp.{metric}.by-method": (f"fedvlp: by method, {metric}", {
            **table,
            "groupBy": {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": "method"}]},
            "useGroupedValuesInCharts": True, "runsHiddenMode": "SHOW_ALL", "compareRunCharts": charts,
            "compareRunSections": [section], "chartsSearchFilter": "^(" + "|".join(plotted) + ")$"}),
    }
    try:
        client = store if isinstance(store, MlflowClient) else MlflowClient(tracking_uri=store)
        present = client.get_experiment(experiment_id).tags
        now = int(time.time() * 1000)
        for view, (name, state) in views.items():
            if f"mlflow.sharedViewState.{view}" not in present:
                envelope = {"name": name, "createdAt": now, "updatedAt": now, "state": json.dumps(state)}
                client.set_experiment_tag(experiment_id, f"mlflow.sharedViewState.{view}", json.dumps(envelope))
        return True
    except Exception:
        return False


class RunTracker:
    """Opens a new MLflow run for `spec`, or reopens `run_id` to continue a resumed run.

    If the store fails after the run is open (the server died, the disk filled), the run goes on
    unharmed: everything this tracker has logged -- config, tags, metrics by round, JSON artifacts
    and, at the end, the status -- is written to `<output_dir>/<run id>/tracking-fallback.jsonl`
    (one JSON object per line), and so is everything after. stderr says where, once when it
    happens and again at the end. A dead HTTP server is noticed after MLflow's own retries
    ($MLFLOW_HTTP_REQUEST_MAX_RETRIES, $MLFLOW_HTTP_REQUEST_TIMEOUT).

    Opening the run is synchronous (its failure is the command's error); everything logged after is sent by
    the tracker's own thread, in order, so a round never waits on the store (about 10 ms a round on the local
    sqlite file). `then` runs an action in that order too (the engine writes a round's checkpoint once the
    round's metrics are sent, so a run killed at any moment resumes from a round MLflow has). `flush` waits for
    what is queued and `end` flushes; what failed in the thread (writing the fallback file, an action) is raised
    by the next call after it failed, once.
    """

    def __init__(self, spec, tags: dict[str, str] | None = None, run_id: str | None = None):
        from mlflow.entities import Metric, Param, RunTag

        self._Metric, self._Param, self._RunTag = Metric, Param, RunTag
        self.uri = spec.tracking.uri or default_tracking_uri()
        self.client, self.experiment_id = open_experiment(self.uri, spec.tracking.experiment)
        run_tags = {"method": spec.method.name, "dataset": spec.data.name, **(tags or {})}
        resumed = run_id is not None
        try:
            if not resumed:
                run_name = spec.tracking.run_name or f"{spec.method.name}-{spec.data.name}"
                run_id = self.client.create_run(self.experiment_id, run_name=run_name, tags=run_tags).info.run_id
            else:
                self.client.update_run(run_id, status="RUNNING")
        except Exception as exc:
            raise TrackingError(f"tracking.uri: cannot open a run in MLflow store {self.uri} "
                                f"({_reason(exc)})") from None
        assert run_id is not None
        self.run_id: str = run_id
        self.fallback_path = Path(spec.output_dir).resolve() / run_id / FALLBACK_FILE
        self.offline = False  # True once the store failed: from then on, the fallback file only
        self._journal: list[dict] = []  # everything logged, so the fallback file is the run's whole record
        self._sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedvlp-mlflow-log")  # one: in order
        self._last_sent: Future | None = None
        self._failure: BaseException | None = None  # the first failure in the thread, until raised
        config = spec.to_dict()
        opened = {"event": "run", "run_id": run_id, "tracking_uri": self.uri, "experiment": spec.tracking.experiment,
                  "resumed": resumed, "tags": run_tags, "config": config}
        # A resumed run has its params and config already.
        self._record(opened, (lambda: None) if resumed else (lambda: self._log_config(spec, config)))

    def _log_config(self, spec, config: dict) -> None:
        params = [self._Param(k, str(v)[:6000]) for k, v in sorted(spec.flat().items())]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        self.client.log_text(self.run_id, yaml.safe_dump(config, sort_keys=False), "config.yaml")

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        values = {k: float(v) for k, v in metrics.items()}
        batch = [self._Metric(k, v, now, step) for k, v in values.items()]
        self._record({"event": "metrics", "step": step, "timestamp": now, "metrics": values},
                     lambda: self.client.log_batch(self.run_id, metrics=batch))

    def set_tags(self, tags: dict[str, str]) -> None:
        tags = {k: str(v) for k, v in tags.items()}
        self._record({"event": "tags", "tags": tags},
                     lambda: self.client.log_batch(self.run_id, tags=[self._RunTag(k, v) for k, v in tags.items()]))

    def log_json(self, obj, name: str) -> None:
        self._record({"event": "artifact", "name": name, "content": obj},
                     lambda: self.client.log_text(self.run_id, json.dumps(obj, indent=2, sort_keys=True), name))

    def then(self, action) -> None:
        """Call `action()` in the tracker's thread once everything queued before it is done."""
        self._raise_failure()
        self._last_sent = self._sender.submit(self._guarded, action)

    def end(self, status: str = "FINISHED") -> None:
        self._record({"event": "end", "status": status}, lambda: self.client.set_terminated(self.run_id, status))
        try:
            self.flush()
        finally:
            self._sender.shutdown()
        if self.offline:
            _warn(f"fedvlp: warning: run {self.run_id} ended {status}; MLflow at {self.uri} failed during the run, "
                  f"so its whole tracking is in {self.fallback_path}")

    def flush(self) -> None:
        """Wait until everything queued so far is done: sent to the store (or the fallback file), actions run."""
        if self._last_sent is not None:
            wait([self._last_sent])
        self._raise_failure()

    def _record(self, entry: dict, send) -> None:
        """Queue the entry: the thread sends it (`_send`) behind everything queued before it."""
        self.then(lambda: self._send(entry, send))

    def _guarded(self, work) -> None:
        try:
            work()
        except BaseException as exc:  # kept for the caller's thread: nothing is lost silently
            self._failure = self._failure or exc

    def _raise_failure(self) -> None:
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def _send(self, entry: dict, send) -> None:
        """`send` the entry to MLflow; if MLflow fails, or failed before, write it to the fallback file."""
        self._journal.append(entry)
        if not self.offline:
            try:
                send()
                return
            except Exception as exc:
                self.offline = True
                _warn(f"fedvlp: warning: MLflow at {self.uri} failed ({_reason(exc)}); run {self.run_id} goes on, "
                      f"tracked in {self.fallback_path} from now on")
                self._append(self._journal)
                return
        self._append([entry])

    def _append(self, entries: list[dict]) -> None:
        self.fallback_path.parent.mkdir(parents=True, exist_ok=True)
        with self.fallback_path.open("a") as file:
            for entry in entries:
                file.write(json.dumps(entry, default=str) + "\n")


def _warn(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def resumable_run(run_id: str, tracking_uri: str | None = None):
    """(spec, checkpoint path) of an earlier run, from its config.yaml artifact and checkpoint tag."""
    from mlflow import MlflowClient

    from fedvlp.config import build_spec

    uri = tracking_uri or default_tracking_uri()
    client = MlflowClient(tracking_uri=uri)
    try:
        run = client.get_run(run_id)
        raw = yaml.safe_load(Path(client.download_artifacts(run_id, "config.yaml")).read_text())
    except Exception as exc:
        raise FedvlpError(f"--resume {run_id}: no such run with a config.yaml in {uri} ({type(exc).__name__}); "
                          f"expected the MLflow run id that `fedvlp run` printed") from None
    if "checkpoint" not in run.data.tags:
        raise FedvlpError(f"--resume {run_id}: the run has no checkpoint tag (it never finished a round); "
                          f"expected a run that checkpointed at least one round")
    raw.setdefault("tracking", {})["uri"] = uri
    return build_spec(raw), run.data.tags["checkpoint"]
