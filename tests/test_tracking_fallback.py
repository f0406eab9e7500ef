"""MLflow tracking: logging leaves the round (the tracker's thread sends in order), and a server that dies mid-run
loses nothing: the run goes on, its tracking in a local file."""
from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

from fedvlp.config import load_spec
from fedvlp.platform.records.tracking import FALLBACK_FILE, RunTracker

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _common import mlflow_server  # noqa: E402  # the server cluster.yaml starts, as the benchmarks run it


def metrics_of(step: int) -> dict[str, float]:
    return {"train_loss": 1.0 / (step + 1), "test_mAP": 0.1 * step}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_goes_on_when_the_server_dies(tmp_path, monkeypatch, capsys):
    # Fail fast once the server is gone (MLflow's default retries would stall this test for minutes).
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    with mlflow_server(tmp_path) as (uri, kill_server):
        spec = load_spec(None, [f"tracking.uri={uri}", f"output_dir={tmp_path / 'runs'}",
                                "tracking.experiment=fallback"])
        tracker = RunTracker(spec, tags={"sweep": "none"})
        for step in range(3):
            tracker.log_metrics(step, metrics_of(step))
        tracker.set_tags({"nodes": "head"})
        tracker.flush()
        logged = tracker.client.get_metric_history(tracker.run_id, "test_mAP")
        assert sorted(m.step for m in logged) == [0, 1, 2]   # the server had them while it lived
        assert not tracker.offline and not tracker.fallback_path.exists()

        kill_server()
        for step in range(3, 6):
            tracker.log_metrics(step, metrics_of(step))
        tracker.set_tags({"checkpoint": "somewhere"})
        tracker.log_json({"final": metrics_of(5)}, "final_metrics.json")
        tracker.end("FINISHED")

    assert tracker.offline
    assert tracker.fallback_path == tmp_path / "runs" / tracker.run_id / FALLBACK_FILE
    entries = [json.loads(line) for line in tracker.fallback_path.read_text().splitlines()]
    # The whole run is in the file, the steps logged before the server died included.
    opened = entries[0]
    assert opened["event"] == "run" and opened["run_id"] == tracker.run_id and opened["tracking_uri"] == uri
    assert opened["config"]["tracking"]["uri"] == uri and opened["tags"]["sweep"] == "none"
    steps = {e["step"]: e["metrics"] for e in entries if e["event"] == "metrics"}
    assert steps == {step: pytest.approx(metrics_of(step)) for step in range(6)}
    tags = {k: v for e in entries if e["event"] == "tags" for k, v in e["tags"].items()}
    assert tags == {"nodes": "head", "checkpoint": "somewhere"}
    assert [e["content"] for e in entries if e["event"] == "artifact"] == [{"final": pytest.approx(metrics_of(5))}]
    assert entries[-1] == {"event": "end", "status": "FINISHED"}

    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fedvlp: warning:")]
    assert len(warnings) == 2, warnings   # once when it happens, once at the end
    assert all(str(tracker.fallback_path) in line for line in warnings), warnings
    assert "failed" in warnings[0] and "ended FINISHED" in warnings[1]


def test_the_tracker_sends_from_its_thread_in_order_and_raises_a_failure_once(tmp_path):
    spec = load_spec(None, [f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", f"output_dir={tmp_path / 'runs'}",
                            "tracking.experiment=order"])
    tracker = RunTracker(spec)
    release, seen = threading.Event(), []
    tracker.then(lambda: release.wait(30))  # the thread is held: what is logged now only queues
    tracker.log_metrics(1, metrics_of(1))
    tracker.then(lambda: seen.append(sorted(m.step for m in tracker.client.get_metric_history(tracker.run_id,
                                                                                              "test_mAP"))))
    assert seen == [] and tracker.client.get_metric_history(tracker.run_id, "test_mAP") == []
    release.set()
    tracker.flush()
    assert seen == [[1]]  # an action runs once everything queued before it is sent

    def disk_full():
        raise OSError("No space left on device")

    tracker.then(disk_full)
    with pytest.raises(OSError, match="No space"):
        tracker.flush()  # a failure in the thread is the caller's, once
    tracker.end("FAILED")  # and the run still ends
    assert tracker.client.get_run(tracker.run_id).info.status == "FAILED"
