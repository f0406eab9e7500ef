"""The federated engine end to end: real Ray actors, a real MLflow store, real training."""
import json

import pytest
import torch
from mlflow import MlflowClient

from conftest import small_run
from fedvlp.errors import ResourceError, RoundFailedError
from fedvlp.platform.engine import run_federated

pytestmark = pytest.mark.usefixtures("tiny_clip")


def _only_run(uri):
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1
    return client, runs[0]


def test_promptfl_learns_and_mlflow_holds_the_run(ray_cluster, tracking_uri, tmp_path):
    spec = small_run(tracking_uri, tmp_path)
    result = run_federated(spec, progress=False)
    # trained prompts beat their zero-shot starting point (round 0 = "a photo of a {class}.")
    assert result.final["mAP"] > result.initial["mAP"] + 0.02
    assert [h["round"] for h in result.history] == [1, 2]
    client, run = _only_run(tracking_uri)
    assert run.info.status == "FINISHED" and run.info.run_id == result.run_id
    assert run.data.tags["method"] == "promptfl" and run.data.tags["dataset"] == "synthetic-scenes"
    assert run.data.params["federation.clients"] == "4" and run.data.params["method.lr"] == "0.002"
    for metric in ("test_mAP", "test_CF1", "test_OF1"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, metric)] == [0, 1, 2]
    for metric in ("train_loss", "round_seconds", "bytes_up", "bytes_down"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, metric)] == [1, 2]
    # 4 clients each send/receive ctx (4x128) + scale + bias in float32 every round
    assert run.data.metrics["bytes_up"] == run.data.metrics["bytes_down"] == 4 * (4 * 128 + 2) * 4
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "final_metrics.json"} <= artifacts
    final = json.loads(open(client.download_artifacts(run.info.run_id, "final_metrics.json", str(tmp_path))).read())
    assert final["final"]["mAP"] == pytest.approx(result.final["mAP"])
    checkpoint = torch.load(run.data.tags["checkpoint"], weights_only=True)
    assert checkpoint["round"] == 2 and torch.equal(checkpoint["global"]["ctx"], result.final_state["ctx"])


def test_zeroshot_is_the_untrained_starting_point_of_promptfl(ray_cluster, tracking_uri, tmp_path):
    zeroshot = run_federated(small_run(tracking_uri, tmp_path, "method.name=zeroshot", "federation.rounds=1"),
                             progress=False)
    promptfl_start = run_federated(small_run(tracking_uri, tmp_path, "federation.rounds=1",
                                             "method.local_epochs=1"), progress=False).initial
    assert zeroshot.final == zeroshot.initial  # nothing is trained
    assert zeroshot.final["mAP"] == pytest.approx(promptfl_start["mAP"], abs=1e-6)


def test_same_seed_same_metrics_with_one_or_two_workers(ray_cluster, tracking_uri, tmp_path):
    one = run_federated(small_run(tracking_uri, tmp_path, "resources.workers=1", "federation.participation=0.5"),
                        progress=False)
    two = run_federated(small_run(tracking_uri, tmp_path, "resources.workers=2", "federation.participation=0.5"),
                        progress=False)
    assert one.final == two.final and one.initial == two.initial
    assert all(torch.equal(one.final_state[k], two.final_state[k]) for k in one.final_state)
    assert [h["train_loss"] for h in one.history] == [h["train_loss"] for h in two.history]


def test_eight_workers_share_four_gpus_and_run_concurrently(ray_cluster, tracking_uri, tmp_path):
    spec = small_run(tracking_uri, tmp_path, "resources.workers=8", "resources.num_gpus=0.5",
                     "resources.num_cpus=0.1", "resources.coordinator_cpus=0.1", "federation.clients=8",
                     "federation.rounds=1", "data.num_train=400")
    result = run_federated(spec, progress=False)
    assert len(result.workers) == 8
    gpu_use = {}
    for worker in result.workers:
        assert len(worker["gpu_ids"]) == 1  # a fractional GPU still names the GPU it sits on
        gpu_use[worker["gpu_ids"][0]] = gpu_use.get(worker["gpu_ids"][0], 0) + 1
    assert sorted(gpu_use.values()) == [2, 2, 2, 2]
    intervals = [(start, end) for _, _, start, end in result.history[0]["timings"]]
    assert len({w for _, w, _, _ in result.history[0]["timings"]}) == 8
    overlapping = max(sum(s <= t < e for s, e in intervals) for t, _ in intervals)
    assert overlapping >= 4, intervals  # the 8 workers' local updates ran at the same time


def test_unplaceable_request_fails_clearly_and_marks_the_run_failed(ray_cluster, tracking_uri, tmp_path):
    spec = small_run(tracking_uri, tmp_path, "resources.workers=8", "resources.num_gpus=1", "resources.num_cpus=0.1",
                     "resources.placement_timeout_s=20")
    with pytest.raises(ResourceError, match=r"resources: the run needs 8 GPU .* cluster has 4"):
        run_federated(spec, progress=False)
    assert _only_run(tracking_uri)[1].info.status == "FAILED"


def test_a_round_that_hangs_times_out_loudly(ray_cluster, tracking_uri, tmp_path):
    spec = small_run(tracking_uri, tmp_path, "resources.round_timeout_s=0.2", "method.local_epochs=200")
    with pytest.raises(RoundFailedError, match=r"round 1: 0 of 4 client updates arrived .*no update within resources\.round_timeout_s=0\.2 s"):
        run_federated(spec, progress=False)
    assert _only_run(tracking_uri)[1].info.status == "FAILED"


def test_second_run_hits_the_feature_cache_with_identical_results(ray_cluster, tracking_uri, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDVLP_FEATURE_CACHE", str(tmp_path / "features"))
    spec = small_run(tracking_uri, tmp_path, "federation.rounds=1")
    cold = run_federated(spec, progress=False)
    warm = run_federated(spec, progress=False)
    assert cold.feature_cache == {"feature_cache.train": "miss", "feature_cache.test": "miss"}
    assert warm.feature_cache == {"feature_cache.train": "hit", "feature_cache.test": "hit"}
    assert len(list((tmp_path / "features").glob("*.npy"))) == 2
    assert warm.final == cold.final
    off = run_federated(small_run(tracking_uri, tmp_path, "federation.rounds=1", "data.feature_cache=false"),
                        progress=False)
    assert off.feature_cache == {"feature_cache.train": "off", "feature_cache.test": "off"}
    assert off.final == cold.final


def test_a_real_layout_dataset_runs_from_disk(ray_cluster, tracking_uri, tmp_path):
    """data.name + data.root select a reader; images are loaded lazily by the workers, resized to the backbone."""
    from test_readers import voc_xml, write_image, write_text

    voc = tmp_path / "voc" / "VOCdevkit" / "VOC2007"
    classes = ["dog", "cat", "car", "person"]
    rng = __import__("numpy").random.default_rng(0)
    for split, count in (("trainval", 40), ("test", 20)):
        ids = [f"{split[:2]}{i:04d}" for i in range(count)]
        write_text(voc / "ImageSets" / "Main" / f"{split}.txt", "".join(f"{i}\n" for i in ids))
        for image_id in ids:
            objects = [(c, 0) for c in rng.choice(classes, size=rng.integers(1, 3), replace=False)]
            write_text(voc / "Annotations" / f"{image_id}.xml", voc_xml(objects))
            write_image(voc / "JPEGImages" / f"{image_id}.jpg", tuple(int(v) for v in rng.integers(0, 255, 3)),
                        size=(48, 40))
    spec = small_run(tracking_uri, tmp_path, "data.name=voc2007", f"data.root={tmp_path / 'voc'}",
                     "federation.rounds=1", "method.batch_size=8")
    result = run_federated(spec, progress=False)
    assert 0 <= result.final["mAP"] <= 1 and result.history[0]["clients"] == 4
    _, run = _only_run(tracking_uri)
    assert run.data.tags["dataset"] == "voc2007" and run.info.status == "FINISHED"


def test_fedmpt_runs_federated_on_cached_token_features(ray_cluster, tracking_uri, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDVLP_FEATURE_CACHE", str(tmp_path / "features"))
    from fedvlp.config import load_spec

    spec = load_spec("configs/fedmpt_scenes.yaml", [
        "data.num_train=600", "data.num_test=256", "federation.clients=4", "federation.rounds=2",
        "method.local_epochs=2", f"tracking.uri={tracking_uri}", f"output_dir={tmp_path / 'runs'}"])
    result = run_federated(spec, progress=False)
    assert result.final["mAP"] > result.initial["mAP"]
    cached = list((tmp_path / "features").glob("*.npy"))
    assert len(cached) == 2 and all(__import__("numpy").load(p, mmap_mode="r").shape[1:] == (17, 128) for p in cached)
    client, run = _only_run(tracking_uri)
    trainable = client.get_metric_history(run.info.run_id, "trainable_params")[0].value
    assert run.data.metrics["bytes_up"] == 4 * trainable * 4  # every trainable float goes up, per client
