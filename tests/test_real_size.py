"""Real-size dry runs: the shipped real-data configs, end to end through `fedvlp run` for one round, at the real
architecture's size with random weights (`backbone.pretrained=none`: nothing to download), on tiny trees written
here in the published layouts:

* FedMPT and DualCoOp on a VOC2007 tree with ViT-B/16 (224 px, 196 patch tokens, width 768, text width 512);
* FED-PRIME on a UPMC Food-101 tree with a ViLT-B-sized `ViltConfig()` (hidden 768, 12 layers) and a vocabulary
  this test writes, in a Hugging Face cache laid out as `dandelin/vilt-b32-mlm`'s.

What the tiny backbones never exercise runs here: the real image pipelines, the real token counts, the batch sizes
the configs set, and each worker's memory at that size (`worker<i>_host_peak_mib`, and `worker<i>_gpu_peak_mib`
on CUDA), which docs/cluster.md names as the basis for `resources.num_gpus`. Only the federation is cut to the
tree (4 clients, 2 workers, no GPU).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from test_bad_inputs import hf_cache_snapshot
from test_readers import COLOURS, voc_xml, write_image, write_text

from fedvlp.data.readers import VOC_CLASSES

FOOD_WORDS = ("tasty", "hot", "cold", "fresh", "spicy", "sweet", "plate", "bowl")
CUT_TO_THE_TREE = ["federation.rounds=1", "federation.clients=4", "resources.workers=2", "resources.num_gpus=0",
                   "resources.num_cpus=0.5", "resources.coordinator_cpus=0.5"]


def voc2007_tree(root: Path, trainval: int = 24, test: int = 8) -> Path:
    """VOCdevkit/VOC2007 with image sets, annotations (one to three objects, some difficult) and JPEGs."""
    voc = root / "VOCdevkit" / "VOC2007"
    for split, count, first in (("trainval", trainval, 0), ("test", test, 1000)):
        ids = [f"{first + i:06d}" for i in range(count)]
        write_text(voc / "ImageSets" / "Main" / f"{split}.txt", "".join(f"{i}\n" for i in ids))
        for j, image_id in enumerate(ids):
            objects = [(VOC_CLASSES[(7 * j + k) % len(VOC_CLASSES)], int(k == 2)) for k in range(1 + j % 3)]
            write_text(voc / "Annotations" / f"{image_id}.xml", voc_xml(objects))
            write_image(voc / "JPEGImages" / f"{image_id}.jpg", COLOURS[j % len(COLOURS)], size=(64, 48))
    return root


def food101_tree(root: Path, train: int = 32, test: int = 8, classes: int = 10) -> Path:
    """images/{train,test}/<class>/<file>.jpg and texts/{train,test}_titles.csv (file,title,class)."""
    names = [f"dish_{i:02d}" for i in range(classes)]
    for split, count in (("train", train), ("test", test)):
        titles = []
        for j in range(count):
            name = names[j % classes]
            file = f"{name}_{split}_{j}.jpg"
            titles.append(f"{file},{FOOD_WORDS[j % 8]} {FOOD_WORDS[3 * j % 8]} {name.replace('_', ' ')},{name}\n")
            write_image(root / "images" / split / name / file, COLOURS[j % len(COLOURS)], size=(64, 48))
        write_text(root / "texts" / f"{split}_titles.csv", "".join(titles))
    return root


def vilt_b_without_weights(hf_home: Path) -> None:
    """`dandelin/vilt-b32-mlm` as the Hugging Face cache would hold it, less its weights: ViLT-B's configuration
    (`ViltConfig()`) and a BERT tokenizer over a vocabulary of the tree's words."""
    from transformers import ViltConfig

    from fedvlp.backbones.vilt import make_tokenizer, tiny_vocabulary

    snapshot = hf_cache_snapshot(hf_home, "dandelin/vilt-b32-mlm")
    ViltConfig().save_pretrained(snapshot)
    words = [*FOOD_WORDS, "dish", *(f"{i:02d}" for i in range(10))]
    make_tokenizer(tiny_vocabulary(words)).save_pretrained(snapshot)


def real_size_run(tmp_path: Path, config: str, root: Path, env: dict) -> tuple[dict, dict]:
    """`fedvlp run CONFIG` at the real size, cut to the tree: (the run's metrics, its trained global state)."""
    store = tmp_path / "mlflow.db"
    done = subprocess.run(
        [sys.executable, "-m", "fedvlp", "run", config, "--quiet", "--set", f"data.root={root}",
         "--set", "backbone.pretrained=none", "--set", f"tracking.uri=sqlite:///{store}",
         *(arg for key in CUT_TO_THE_TREE for arg in ("--set", key))],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{store}")
    run = max((r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])),
              key=lambda r: r.info.start_time)  # this run: the store's latest
    assert run.info.status == "FINISHED" and run.data.params["backbone.pretrained"] == "none"
    checkpoint = torch.load(run.data.tags["checkpoint"], weights_only=True, map_location="cpu")
    return run.data.metrics, checkpoint["global"]


def assert_memory_logged_per_worker(metrics: dict, workers: int = 2) -> None:
    peaks = [metrics[f"worker{i}_host_peak_mib"] for i in range(workers)]
    assert all(peak > 500 for peak in peaks), peaks  # a process with torch and a ViT-B at the least


@pytest.mark.slow
def test_fedmpt_and_dualcoop_run_a_round_of_vit_b16_on_a_voc2007_tree(tmp_path):
    root = voc2007_tree(tmp_path / "voc")
    trained = {}
    for config in ("fedmpt_voc2007", "dualcoop_voc2007"):
        metrics, trained[config] = real_size_run(tmp_path, config, root, dict(os.environ))
        assert 0.0 <= metrics["val_mAP"] <= 1.0 and 0.0 <= metrics["test_mAP"] <= 1.0
        assert_memory_logged_per_worker(metrics)
        # the prompts live in ViT-B/16's text width, 512 (the tiny CLIP's is 128)
        widths = {tuple(v.shape)[-1] for v in trained[config].values() if v.dim() >= 2}
        assert 512 in widths and 128 not in widths, {k: tuple(v.shape) for k, v in trained[config].items()}
    assert tuple(trained["fedmpt_voc2007"]["cond_ctx"].shape) == (5, 4, 512)  # 5 conditions, 4 context tokens


@pytest.mark.slow
def test_fedprime_runs_a_round_of_a_vilt_b_sized_model_on_a_food101_tree(tmp_path):
    root = food101_tree(tmp_path / "food")
    vilt_b_without_weights(tmp_path / "hf")
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf")}  # the driver and its Ray workers read this cache
    metrics, trained = real_size_run(tmp_path, "fedprime_food101", root, env)
    assert 0.0 <= metrics["val_accuracy"] <= 1.0
    assert {"test_miss_text_accuracy", "test_miss_image_accuracy", "test_full_accuracy"} <= set(metrics)
    assert_memory_logged_per_worker(metrics)
    assert tuple(trained["pooler.dense.weight"].shape) == (768, 768)  # ViLT-B's hidden size
    assert tuple(trained["intra_pool.prompts"].shape) == (20, 768)  # the reference's pool of 20
    assert trained["classifier.3.weight"].shape[0] == 8  # the paper's 8 classes (data.options.top_k)
