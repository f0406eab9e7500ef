"""Reading a sweep's MLflow runs: the sweep's parent run, and one plain row per trial (`Row`) with its final
metrics, their histories and its costs. Only FINISHED trials that were not stopped early get metrics: a trial cut
short by ASHA or a failed one would compare a method at fewer rounds than the others."""
from __future__ import annotations

import math

import numpy as np

from fedvlp.errors import FedvlpError
from fedvlp.platform.runtime.cohorts import cohort_size
from fedvlp.platform.studies.spaces import VARIANT_KEY

METHOD_KEY = "method.name"
Row = dict  # one trial: run_id, status, method, seed, swept{key: value}, stopped_early, final{metric}, history, costs


def swept_value(text: str | None) -> float | str | None:
    """A swept value as logged (str) -> float when numeric, so "0.5" and "0.50" are one group."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return text


def find_sweep(client, experiment: str, tracking_uri: str):
    """(experiment id, newest parent run tagged fedvlp.role=sweep); FedvlpError when either is missing."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None or exp.lifecycle_stage != "active":
        raise FedvlpError(f"experiment {experiment!r} not found in {tracking_uri}; "
                          f"expected the MLflow experiment of a `fedvlp sweep`")
    parents = client.search_runs([exp.experiment_id], "tags.`fedvlp.role` = 'sweep'",
                                 order_by=["attributes.start_time DESC"], max_results=1)
    if not parents:
        raise FedvlpError(f"experiment {experiment!r} has no sweep parent run; "
                          f"expected a run tagged fedvlp.role=sweep written by `fedvlp sweep`")
    return exp.experiment_id, parents[0]


def _history(client, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)}


def collect(client, experiment_id: str, parent_id: str, metrics: list[str], swept_keys: list[str]) -> list[Row]:
    """One plain row per trial of the parent run; histories are fetched only for trials that count."""
    runs, token = [], None
    while True:  # search_runs pages at 1000
        page = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'",
                                  max_results=1000, page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            break
    rows = []
    for run in runs:
        tags, params = run.data.tags, run.data.params
        row = {"run_id": run.info.run_id, "status": run.info.status,
               # a named variant (e.g. fed_inter, a setting of fedprime) is reported as a method of its own
               "method": tags.get(f"swept.{VARIANT_KEY}") or tags.get("method") or params.get(METHOD_KEY, "?"),
               "seed": tags.get("seed") or params.get("seed") or run.info.run_id,
               "swept": {k: swept_value(tags.get(f"swept.{k}", params.get(k))) for k in swept_keys},
               "stopped_early": tags.get("stopped_early", "").lower() == "true",
               "final": {}, "history": {}}
        if row["status"] == "FINISHED" and not row["stopped_early"]:
            for metric in metrics:
                history = _history(client, run.info.run_id, metric)
                row["history"][metric] = history
                # "Final" = the last logged step: with eval_every > 1 that is still round R.
                if history:
                    row["final"][metric] = history[max(history)]
            per_round = cohort_size(int(params.get("federation.clients", 1)),
                                    float(params.get("federation.participation", 1.0)))
            bytes_up = list(_history(client, run.info.run_id, "bytes_up").values())
            seconds = list(_history(client, run.info.run_id, "round_seconds").values())
            trainable = list(_history(client, run.info.run_id, "trainable_params").values())
            row["bytes_up_per_client"] = float(np.mean(bytes_up)) / per_round if bytes_up else math.nan
            row["round_seconds"] = float(np.mean(seconds)) if seconds else math.nan
            row["trainable_params"] = trainable[0] if trainable else math.nan
            spent = _history(client, run.info.run_id, "privacy_epsilon")
            row["epsilon"] = spent[max(spent)] if spent else math.nan
        rows.append(row)
    return rows


def swept_columns(tags: dict) -> list[str]:
    """The swept keys a table has columns for: not the method, nor the variant (a variant is a method's row)."""
    return [k for k in tags.get("swept_keys", "").split(",") if k and k not in (METHOD_KEY, VARIANT_KEY)]
