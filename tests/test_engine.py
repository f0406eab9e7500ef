"""The federated engine end to end: real Ray actors, a real MLflow store, real training."""
import json

import numpy as np
import pytest
import torch
from conftest import small_run
from mlflow import MlflowClient

from fedvlp.config import CONFIGS_DIR
from fedvlp.errors import ResourceError, RoundFailedError
from fedvlp.methods import METHODS
from fedvlp.platform.aggregation import state_nbytes
from fedvlp.platform.runtime.engine import run_federated

SPLITS = ("val", "test", "shift")


def _only_run(uri):
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1
    return client, runs[0]


def _steps(client, run_id, metric):
    return [m.step for m in client.get_metric_history(run_id, metric)]


@pytest.mark.usefixtures("tiny_clip")
def test_promptfl_learns_and_mlflow_holds_the_run(ray_cluster, tracking_uri, tmp_path):
    spec = small_run(tracking_uri, tmp_path, "federation.eval_every=2", "federation.rounds=3",
                     "tracking.run_name=my run")
    result = run_federated(spec, progress=False)
    # trained prompts beat their starting point (round 0: a random context, as the PromptFL reference starts)
    for split in SPLITS:
        assert result.final[f"{split}_mAP"] > result.initial[f"{split}_mAP"] + 0.01
    assert [h["round"] for h in result.history] == [1, 2, 3]
    client, run = _only_run(tracking_uri)
    assert run.info.status == "FINISHED" and run.info.run_id == result.run_id and run.info.run_name == "my run"
    assert run.data.tags["method"] == "promptfl" and run.data.tags["dataset"] == "synthetic-scenes"
    assert run.data.params["federation.clients"] == "4" and run.data.params["method.lr"] == str(spec.method.params.lr)
    assert run.data.tags["actors"] == "new"  # only a Tune trial's actors are kept for the next run
    for metric in ("val_mAP", "test_mAP", "test_CF1", "shift_mAP", "shift_hallucination_gap", "personal_mAP",
                   "personal_mAP_std"):
        assert _steps(client, run.info.run_id, metric) == [0, 2, 3]  # eval_every=2, and after the last round
    for metric in ("train_loss", "round_seconds", "bytes_up", "bytes_down"):
        assert _steps(client, run.info.run_id, metric) == [1, 2, 3]
    for phase in ("data", "backbone", "mlflow", "ray", "actors", "features", "evaluation", "tracking_wait"):
        assert _steps(client, run.info.run_id, f"startup_{phase}_seconds") == [0]
    # each worker's peak memory (its process's resident set here; its GPU allocations on a GPU), logged once
    assert [w["device"] for w in result.workers] == ["cpu"] * spec.resources.workers
    for i, worker in enumerate(result.workers):
        assert 100 < worker["host_peak_mib"] < 16_000 and "gpu_peak_mib" not in worker
        assert _steps(client, run.info.run_id, f"worker{i}_host_peak_mib") == [3]
        assert run.data.metrics[f"worker{i}_host_peak_mib"] == pytest.approx(worker["host_peak_mib"])
    # 4 clients each send/receive ctx (16x128) + scale + bias in float32 every round
    assert run.data.metrics["bytes_up"] == run.data.metrics["bytes_down"] == 4 * (16 * 128 + 2) * 4
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "final_metrics.json"} <= artifacts
    final = json.loads(open(client.download_artifacts(run.info.run_id, "final_metrics.json", str(tmp_path))).read())
    assert final["final"]["test_mAP"] == result.final["test_mAP"]
    checkpoint = torch.load(run.data.tags["checkpoint"], weights_only=True)
    assert checkpoint["round"] == 3 and torch.equal(checkpoint["global"]["ctx"], result.final_state["ctx"])


def _shipped_config(method: str) -> str:
    """Every registered method ships a config on a synthetic world (PromptFL's is the quickstart)."""
    names = ["quickstart"] if method == "promptfl" else [f"{method}_scenes", f"{method}_recipes"]
    found = [n for n in names if (CONFIGS_DIR / f"{n}.yaml").exists()]
    assert found, f"method {method} has no shipped config on a synthetic world ({' or '.join(names)})"
    return found[0]


@pytest.mark.parametrize("method", METHODS.names())
def test_every_registered_method_runs_a_round_through_the_engine(method, ray_cluster, tracking_uri, tmp_path,
                                                                 request):
    cls = METHODS[method]
    request.getfixturevalue("tiny_vilt" if cls.backbone_kind == "vilt" else "tiny_clip")
    epochs = ["method.local_epochs=1"] if "local_epochs" in cls.Params.__dataclass_fields__ else []
    spec = small_run(tracking_uri, tmp_path, "data.num_train=240", "data.num_val=128", "data.num_test=128",
                     "data.num_holdout=64", "federation.clients=2", "federation.rounds=1", "resources.workers=1",
                     *epochs, config=_shipped_config(method))
    result = run_federated(spec, progress=False)
    client, run = _only_run(tracking_uri)
    assert run.info.status == "FINISHED" and run.data.tags["method"] == method
    scenes = run.data.tags["dataset"] == "synthetic-scenes"
    headline = "mAP" if scenes else "accuracy"
    for split in SPLITS if scenes else ("val", "test"):  # only synthetic-scenes has a shift split
        assert _steps(client, run.info.run_id, f"{split}_{headline}") == [0, 1]
    assert _steps(client, run.info.run_id, f"personal_{headline}") == [0, 1]
    start = torch.load(run.data.tags["checkpoint"], weights_only=True)
    assert start["round"] == 1
    from fedvlp.backbones.loaders import load_backbone
    from fedvlp.data import load_dataset
    from fedvlp.methods.base import Task
    from fedvlp.platform.runtime.worker import build_method

    dataset = load_dataset(spec)
    initial = build_method(spec, load_backbone(spec), Task(dataset.class_names, dataset.multilabel)).global_state()
    # both clients got the initial global state and sent back the same parameters (FED-PRIME's server may then
    # resize its inter pool, so the final state is not the measure)
    assert run.data.metrics["bytes_down"] == run.data.metrics["bytes_up"] == 2 * state_nbytes(initial)
    if method == "zeroshot":
        assert result.final == result.initial  # nothing to train
    else:
        assert any(not torch.equal(initial[k], result.final_state[k]) for k in initial)  # the round trained


@pytest.mark.usefixtures("tiny_clip")
def test_a_client_gets_exactly_its_own_local_state_back(ray_cluster, tracking_uri, tmp_path):
    """The coordinator keeps each client's local state and hands it back to that client only, in later rounds it
    joins (clients skip rounds at participation 0.5); personal metrics use it, the global ones do not."""
    from fedvlp.data import prepare_data
    from fedvlp.platform.metrics import multilabel_metrics
    from fedvlp.platform.runtime.cohorts import sample_cohort

    spec = small_run(tracking_uri, tmp_path, "plugins=[fedvlp_test_plugin]", "method.name=ownerecho",
                     "federation.rounds=4", "federation.participation=0.5", "resources.client_state_memory_mb=0")
    result = run_federated(spec, progress=False)
    assert [h["train_wrong_state"] for h in result.history] == [0.0] * 4  # nobody got another client's state
    checkpoint = torch.load(tmp_path / "runs" / result.run_id / "checkpoint.pt", weights_only=True)
    from fedvlp.platform.runtime.client_states import ClientStateStore

    store = ClientStateStore(tmp_path / "runs" / result.run_id / "client_states", 0, checkpoint["clients"])
    joined = {c: sum(c in sample_cohort(0, r, 4, 0.5) for r in range(1, 5)) for c in range(4)}
    assert {c: int(store.get(c)["count"]) for c in range(4) if joined[c]} == {c: n for c, n in joined.items() if n}
    # personal metrics by hand: each client's logits come from its own centroids (and the global bias) on the
    # frozen features of its local test set, as cached (float16)
    from fedvlp_test_plugin import SCALE

    from fedvlp.backbones.loaders import load_backbone

    data = prepare_data(spec)
    holdout = data.dataset.holdout
    features = load_backbone(spec).encode_images(holdout.images.load(range(len(holdout)), 32)).numpy()
    features = torch.from_numpy(features.astype(np.float16).astype(np.float32))
    for name, local_sets in (("personal", data.local_tests), ("personal_val", data.local_vals)):
        per_client = []
        for c in range(4):
            rows = local_sets[c]
            logits = SCALE * features[rows] @ store.get(c)["centroids"].T + result.final_state["bias"]
            per_client.append(multilabel_metrics(logits.numpy(), holdout.labels[rows])["mAP"])
        assert result.final[f"{name}_mAP"] == pytest.approx(np.mean(per_client), abs=1e-9)
    assert result.final["personal_val_mAP"] != result.final["personal_mAP"]  # two disjoint sets
    # the global model (zero centroids) scores every class alike: its mAP is the positive rate
    assert result.final["personal_mAP"] > result.final["test_mAP"] + 0.2


@pytest.mark.usefixtures("tiny_clip")
def test_zeroshot_is_the_untrained_starting_point_of_promptfl(ray_cluster, tracking_uri, tmp_path):
    zeroshot = run_federated(small_run(tracking_uri, tmp_path, "method.name=zeroshot", "federation.rounds=1"),
                             progress=False)
    # a context started from the words "a photo of a" is the zero-shot prompt before it learns
    promptfl_start = run_federated(small_run(tracking_uri, tmp_path, "federation.rounds=1", "method.local_epochs=1",
                                             "method.n_ctx=4", "method.ctx_init=a photo of a"), progress=False).initial
    assert zeroshot.final == zeroshot.initial  # nothing is trained
    for split in SPLITS:
        assert zeroshot.final[f"{split}_mAP"] == pytest.approx(promptfl_start[f"{split}_mAP"], abs=1e-6)


@pytest.mark.usefixtures("tiny_clip")
def test_same_seed_same_metrics_with_one_or_two_workers(ray_cluster, tracking_uri, tmp_path):
    """Rounds 1 and 2 sample clients 1, 3 and then 0, 2, both homed on one of the two workers: the balanced
    placement sends one of them to the other worker, which reads its data from the shared training set. A client's
    update does not depend on where it trains, so the run equals the one-worker run bitwise."""
    one = run_federated(small_run(tracking_uri, tmp_path, "resources.workers=1", "federation.participation=0.5"),
                        progress=False)
    two = run_federated(small_run(tracking_uri, tmp_path, "resources.workers=2", "federation.participation=0.5"),
                        progress=False)
    visits = [cid for h in two.history for cid, worker, *_ in h["timings"] if worker != cid % 2]
    assert len(visits) == 2  # one visitor a round
    assert one.final == two.final and one.initial == two.initial
    assert all(torch.equal(one.final_state[k], two.final_state[k]) for k in one.final_state)
    assert [h["train_loss"] for h in one.history] == [h["train_loss"] for h in two.history]


@pytest.mark.usefixtures("tiny_clip")
def test_one_task_per_worker_trains_the_same_updates_as_one_task_per_client(ray_cluster, tracking_uri, tmp_path):
    """Each round's 4 clients over 2 workers: 2 tasks of 2 clients, or 4 tasks; the same run bitwise."""
    runs = {dispatch: run_federated(small_run(tracking_uri, tmp_path, "federation.clients=4",
                                              f"resources.client_dispatch={dispatch}"), progress=False)
            for dispatch in ("per_worker", "per_client")}
    batched, single = runs["per_worker"], runs["per_client"]
    assert [h["client_tasks"] for h in batched.history] == [2] * len(batched.history)
    assert [h["client_tasks"] for h in single.history] == [4] * len(single.history)
    assert batched.final == single.final
    assert all(torch.equal(batched.final_state[k], single.final_state[k]) for k in single.final_state)
    assert [h["train_loss"] for h in batched.history] == [h["train_loss"] for h in single.history]


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_eight_workers_share_four_gpus_each_a_process_of_its_own(ray_cluster, tracking_uri, tmp_path):
    spec = small_run(tracking_uri, tmp_path, "resources.workers=8", "resources.num_gpus=0.5",
                     "resources.num_cpus=0.1", "resources.coordinator_cpus=0.1", "federation.clients=8",
                     "federation.rounds=1", "data.num_train=400", "data.num_holdout=0")
    result = run_federated(spec, progress=False)
    assert len(result.workers) == 8
    gpu_use = {}
    for worker in result.workers:
        assert len(worker["gpu_ids"]) == 1  # a fractional GPU still names the GPU it sits on
        gpu_use[worker["gpu_ids"][0]] = gpu_use.get(worker["gpu_ids"][0], 0) + 1
    assert sorted(gpu_use.values()) == [2, 2, 2, 2]
    assert len({w for _, w, _, _ in result.history[0]["timings"]}) == 8  # every worker trained its client
    # all 8 hold their share at once, each a live process of its own: a condition, not a timing (how much their
    # updates overlap in time is up to the OS on a loaded 2-core machine)
    assert len({worker["pid"] for worker in result.workers}) == 8


@pytest.mark.usefixtures("tiny_clip")
def test_a_request_larger_than_the_cluster_fails_at_once(ray_cluster, tracking_uri, tmp_path):
    spec = small_run(tracking_uri, tmp_path, "resources.workers=8", "resources.num_gpus=1", "resources.num_cpus=0.1")
    with pytest.raises(ResourceError, match=r"resources: the run needs 8 GPU .* cluster has 4"):
        run_federated(spec, progress=False)
    assert _only_run(tracking_uri)[1].info.status == "FAILED"


@pytest.mark.usefixtures("tiny_clip")
def test_actors_that_cannot_be_placed_in_time_fail_after_placement_timeout(ray_cluster, tracking_uri, tmp_path):
    """The cluster has the GPUs, but another job holds them: the run waits placement_timeout_s, then fails."""
    from ray.util.placement_group import placement_group, remove_placement_group

    blocker = placement_group([{"GPU": 4}])
    ray_cluster.get(blocker.ready(), timeout=30)
    try:
        spec = small_run(tracking_uri, tmp_path, "resources.num_gpus=1", "resources.placement_timeout_s=2")
        with pytest.raises(ResourceError, match=r"resources: could not place 3 bundles .* within 2 s"):
            run_federated(spec, progress=False)
    finally:
        remove_placement_group(blocker)
    assert _only_run(tracking_uri)[1].info.status == "FAILED"


@pytest.mark.usefixtures("tiny_clip")
def test_a_round_that_hangs_times_out_loudly(ray_cluster, tracking_uri, tmp_path):
    # the timeout also bounds the round-0 evaluation (under a second, seconds on busy cores): 20 s, against a round
    # that would take about an hour
    spec = small_run(tracking_uri, tmp_path, "resources.round_timeout_s=20", "method.local_epochs=200000")
    with pytest.raises(RoundFailedError, match=r"round 1: 0 of 4 client updates arrived .*no update within "
                                               r"resources\.round_timeout_s=20 s"):
        run_federated(spec, progress=False)
    assert _only_run(tracking_uri)[1].info.status == "FAILED"


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_second_run_hits_the_feature_cache_with_identical_results(ray_cluster, tracking_uri, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDVLP_FEATURE_CACHE", str(tmp_path / "features"))
    spec = small_run(tracking_uri, tmp_path, "federation.rounds=1")
    sets = ("train", "holdout", "val", "test", "shift")
    cold = run_federated(spec, progress=False)
    warm = run_federated(spec, progress=False)
    assert cold.feature_cache == {f"feature_cache.{s}": "miss" for s in sets}
    assert warm.feature_cache == {f"feature_cache.{s}": "hit" for s in sets}
    assert len(list((tmp_path / "features").glob("*.npy"))) == len(sets)
    assert warm.final == cold.final
    off = run_federated(small_run(tracking_uri, tmp_path, "federation.rounds=1", "data.feature_cache=false"),
                        progress=False)
    assert off.feature_cache == {f"feature_cache.{s}": "off" for s in sets}
    assert off.final == cold.final


@pytest.mark.usefixtures("tiny_clip")
def test_a_real_layout_dataset_runs_from_disk_with_val_split_off_its_training_data(ray_cluster, tracking_uri,
                                                                                   tmp_path):
    """data.name + data.root select a reader; val and the held-out pool are split off trainval by the seed;
    images are loaded lazily by the workers, resized to the backbone."""
    from test_readers import voc_xml, write_image, write_text

    voc = tmp_path / "voc" / "VOCdevkit" / "VOC2007"
    classes = ["dog", "cat", "car", "person"]
    rng = np.random.default_rng(0)
    for split, count in (("trainval", 60), ("test", 20)):
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
    assert result.history[0]["clients"] == 4 and "val_mAP" in result.final and "personal_mAP" in result.final
    _, run = _only_run(tracking_uri)
    assert run.data.tags["dataset"] == "voc2007" and run.info.status == "FINISHED"
    from fedvlp.data import load_dataset

    dataset = load_dataset(spec)
    assert (len(dataset.train), len(dataset.val), len(dataset.holdout), len(dataset.test)) == (49, 6, 5, 20)
    paths = [set(s.images.paths) for s in (dataset.train, dataset.val, dataset.holdout)]
    assert not (paths[0] & paths[1]) and not (paths[0] & paths[2]) and not (paths[1] & paths[2])


@pytest.mark.usefixtures("tiny_clip")
def test_fedmpt_reads_cached_token_features(ray_cluster, tracking_uri, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDVLP_FEATURE_CACHE", str(tmp_path / "features"))
    spec = small_run(tracking_uri, tmp_path, "method.local_epochs=2", "federation.rounds=1", "data.num_train=400",
                     config="fedmpt_scenes")
    run_federated(spec, progress=False)
    cached = list((tmp_path / "features").glob("*.npy"))
    # train, the held-out pool, val, test and shift
    assert len(cached) == 5 and all(np.load(p, mmap_mode="r").shape[1:] == (17, 128) for p in cached)
    client, run = _only_run(tracking_uri)
    trainable = client.get_metric_history(run.info.run_id, "trainable_params")[0].value
    assert run.data.metrics["bytes_up"] == 4 * trainable * 4  # every trainable float goes up, per client


@pytest.mark.usefixtures("tiny_clip")
def test_fedotp_global_metrics_score_the_global_prompt_alone(ray_cluster, tracking_uri, tmp_path):
    """The workers score val and test with the global model as `Method.load_global` gives it: FedOTP's global
    prompt alone, not beside the untrained initial local prompt (which took half the transported mass)."""
    from fedvlp.backbones.loaders import load_backbone
    from fedvlp.data import prepare_data
    from fedvlp.methods.base import Task
    from fedvlp.platform.metrics import multilabel_metrics
    from fedvlp.platform.runtime.worker import build_method

    spec = small_run(tracking_uri, tmp_path, "data.num_train=240", "data.num_val=128", "data.num_test=128",
                     "data.num_holdout=64", "federation.clients=2", "federation.rounds=1", "resources.workers=1",
                     "method.local_epochs=1", config="fedotp_scenes")
    result = run_federated(spec, progress=False)
    data, backbone = prepare_data(spec), load_backbone(spec)
    val = data.dataset.val
    features = backbone.encode_images(val.images.load(range(len(val)), backbone.image_size[0]), "tokens").numpy()
    features = torch.from_numpy(features.astype(np.float16).astype(np.float32))  # as the feature cache holds them
    method = build_method(spec, backbone, Task(data.dataset.class_names))
    val_map = lambda: multilabel_metrics(method.score(features).numpy(), val.labels)["mAP"]  # noqa: E731
    method.load_global(result.final_state)
    assert result.final["val_mAP"] == pytest.approx(val_map(), abs=1e-6)
    method.load(result.final_state, None)  # the global prompt with the initial local prompt
    assert abs(result.final["val_mAP"] - val_map()) > 1e-3
