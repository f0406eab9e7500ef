"""The extension guide's plugins (examples/fedvlp_examples, outside the package) run as users run them: a method,
a server optimiser, a dataset reader and a partitioner through `fedvlp run` on Ray, the method through a two-trial
`fedvlp sweep`; and a server optimiser's state survives a resume bitwise."""
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import REPO, fedvlp_cli, small_run
from mlflow import MlflowClient

from fedvlp.platform.records.checkpoint import load_checkpoint, read_checkpoint
from fedvlp.platform.runtime.engine import run_federated

EXAMPLES = REPO / "examples"
CLASSES = ("red", "green", "blue", "yellow")
RGB = {"red": (220, 30, 30), "green": (30, 180, 40), "blue": (40, 70, 230), "yellow": (240, 220, 40)}


@pytest.fixture
def examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")]))


def folder_csv_tree(root: Path, seed: int = 0) -> Path:
    """A tiny dataset in the folder-csv layout: 32 px images of one or two colour squares, labelled by colour."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True)
    for split, count in (("train", 96), ("test", 32)):
        lines = ["file,labels"]
        for i in range(count):
            names = list(rng.choice(CLASSES, size=rng.integers(1, 3), replace=False))
            pixels = np.full((32, 32, 3), 90, np.uint8)
            for j, name in enumerate(names):
                pixels[4 + 14 * j: 16 + 14 * j, 4:28] = RGB[name]
            Image.fromarray(pixels).save(root / "images" / f"{split}{i:03d}.png")
            lines.append(f"{split}{i:03d}.png,{';'.join(names)}")
        (root / f"{split}.csv").write_text("\n".join(lines) + "\n")
    return root


@pytest.mark.usefixtures("tiny_clip", "examples_on_path")
def test_all_four_example_plugins_in_one_fedvlp_run_on_ray(ray_cluster, tmp_path, capsys, monkeypatch, tracking_uri):
    from fedvlp.cli import main

    root = folder_csv_tree(tmp_path / "colours")
    uri = tracking_uri
    config = tmp_path / "plugins.yaml"
    config.write_text(yaml.safe_dump({
        "plugins": ["fedvlp_examples"], "seed": 0,
        "method": {"name": "promptfl_prox", "prox_mu": 0.5, "local_epochs": 2, "batch_size": 16},
        "data": {"name": "folder-csv", "root": str(root), "options": {"multilabel": True}},
        "federation": {"clients": 4, "rounds": 2, "partition": "shards", "partition_options": {"shards_per_client": 1}},
        "server": {"rules": {"": "fedlion"}, "options": {"fedlion": {"lr": 0.001}}},
        "resources": {"workers": 2}, "tracking": {"uri": uri, "experiment": "plugins"},
        "output_dir": str(tmp_path / "runs")}))
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(config), "--quiet"]) == 0, capsys.readouterr().err
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("plugins").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["dataset"] == "folder-csv"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train_drift")] == [1, 2]  # its own statistic
    checkpoint = torch.load(run.data.tags["checkpoint"], weights_only=True)
    assert set(checkpoint["rule_states"]) == {"fedlion"} and set(checkpoint["rule_states"]["fedlion"]["m"]) == \
        set(checkpoint["global"])  # the server optimiser's momentum, per parameter, in the checkpoint
    from fedvlp.config import load_spec
    from fedvlp.data import prepare_data

    spec = load_spec(config)
    data = prepare_data(spec)
    assert spec.data.options.multilabel and data.dataset.class_names == tuple(sorted(CLASSES))
    # one shard each: a client's samples share their first label
    firsts = [set(data.dataset.train.labels[p].argmax(1).tolist()) for p in data.parts]
    assert all(len(f) <= 2 for f in firsts) and len(set().union(*firsts)) >= 3


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_the_example_method_runs_through_a_two_trial_sweep(tmp_path, tracking_uri):
    uri = tracking_uri
    space = tmp_path / "prox.yaml"
    space.write_text(yaml.safe_dump({
        "base": "quickstart", "name": "prox", "storage": str(tmp_path / "ray_results"), "seeds": [0],
        "set": {"plugins": ["fedvlp_examples"], "method.name": "promptfl_prox", "federation.rounds": 1,
                "federation.clients": 4, "data.num_train": 400, "data.num_val": 128, "data.num_test": 128,
                "data.num_holdout": 64, "method.local_epochs": 1, "resources.workers": 1, "resources.num_cpus": 0.5,
                "resources.coordinator_cpus": 0.25, "tracking.uri": uri, "output_dir": str(tmp_path / "runs")},
        "space": {"method.prox_mu": {"grid": [0.01, 10.0]}}, "metric": "val_mAP", "max_concurrent_trials": 2}))
    env = {"PYTHONPATH": os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")])}
    proc = fedvlp_cli(["sweep", str(space)], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("sweep-prox").experiment_id],
                              "tags.`fedvlp.role` = 'trial'")
    assert sorted(r.data.params["method.prox_mu"] for r in runs) == ["0.01", "10.0"]
    assert all(r.info.status == "FINISHED" for r in runs)
    drift = {r.data.params["method.prox_mu"]: r.data.metrics["train_drift"] for r in runs}
    assert drift["10.0"] < drift["0.01"]  # a strong proximal term keeps the clients near the global state


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_a_server_optimiser_resumes_bitwise(ray_cluster, tracking_uri, tmp_path):
    """FedAdam's moments live in the checkpoint: 2 rounds, then resume to 3, equals 3 rounds straight."""
    overrides = ("server.rules={'': fedadam}", "server.options={fedadam: {lr: 0.01}}", "method.local_epochs=1",
                 "resources.workers=1")
    whole = run_federated(small_run(tracking_uri, tmp_path, *overrides, "federation.rounds=3"), progress=False)
    first = run_federated(small_run(tracking_uri, tmp_path, *overrides, "federation.rounds=2"), progress=False)
    path = tmp_path / "runs" / first.run_id / "checkpoint.pt"
    assert set(load_checkpoint(path)["rule_states"]["fedadam"]) == {"m", "v"}
    resumed = run_federated(small_run(tracking_uri, tmp_path, *overrides, "federation.rounds=3"), progress=False,
                            resume=read_checkpoint(path))
    assert all(torch.equal(whole.final_state[k], resumed.final_state[k]) for k in whole.final_state)
    assert resumed.final == whole.final
    ends = [load_checkpoint(tmp_path / "runs" / r.run_id / "checkpoint.pt")["rule_states"]["fedadam"]
            for r in (whole, resumed)]
    assert all(torch.equal(ends[0][m][k], ends[1][m][k]) for m in ("m", "v") for k in ends[0][m])
