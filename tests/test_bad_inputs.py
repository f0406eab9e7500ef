"""Every bad input is answered clearly: through the CLI's `main`, each case must

1. exit non-zero,
2. end stderr with one line `fedvlp: error: ...` naming the field or path and what was expected, with no traceback,
3. leave no Ray process behind,
4. leave no MLflow run RUNNING, and create none at all where it fails before the cluster.

Most cases fail at config load, long before any Ray work: they run in this process, and are checked never to
reach Ray at all. A representative few (`THROUGH_THE_CLI`) run as a real `fedvlp` process with a private Ray
temp dir, so only their own Ray processes are counted; `starts_ray` marks those that fail inside a running
cluster, and the others are checked never to have started one, nor to print anything but the error line.
Real backbones whose weights are not on the machine fail in the driver too: their cases look in their own empty
Hugging Face cache, and the last tests check that weights laid out where the loaders look pass.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import torch
from test_readers import COLOURS, coco_json, voc_tree, write_image, write_json, write_text

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "fedvlp" / "configs" / "quickstart.yaml"
# Small enough that a case reaching the cluster stays cheap.
SMALL = ("data.num_train=64", "data.num_test=32", "federation.clients=2", "resources.workers=1",
         "data.feature_cache=false")
SMALL_RUN = ["--quiet", *[arg for override in SMALL for arg in ("--set", override)]]
ERROR_PREFIX = "fedvlp: error: "


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CLOSED_PORT = _closed_port()


# --------------------------------------------------------------------------- inputs written per case

def run_with(*overrides: str) -> Callable[[Path], list[str]]:
    return lambda tmp: ["run", *[a for o in overrides for a in ("--set", o)]]


def config_file(text: str) -> Callable[[Path], list[str]]:
    return lambda tmp: ["run", str(write_text(tmp / "config.yaml", text))]


def space_file(body: dict) -> Callable[[Path], list[str]]:
    """`fedvlp sweep` of a space on the quickstart config."""
    def build(tmp: Path) -> list[str]:
        space = {"base": str(QUICKSTART), "metric": "val_mAP", **body}
        return ["sweep", str(write_text(tmp / "space.yaml", json.dumps(space)))]   # JSON is YAML
    return build


def voc_run(damage: Callable[[Path], None]) -> Callable[[Path], list[str]]:
    """A run on a tiny VOC2007 tree after `damage(VOC2007 folder)`."""
    def build(tmp: Path) -> list[str]:
        root = voc_tree(tmp)
        damage(root / "VOCdevkit" / "VOC2007")
        return ["run", "--set", "data.name=voc2007", "--set", f"data.root={root}", *SMALL_RUN]
    return build


def coco_run(damage: Callable[[dict], None]) -> Callable[[Path], list[str]]:
    """A run on a tiny COCO2014 tree whose instances_train2014.json went through `damage(json)`."""
    def build(tmp: Path) -> list[str]:
        root = tmp / "coco"
        for split, images, anns in [("train2014", [10, 5, 7], [(10, 0), (5, 3), (7, 12)]),
                                    ("val2014", [3, 1], [(1, 40), (3, 1)])]:
            data = coco_json(images, anns)
            if split == "train2014":
                damage(data)
            write_json(root / "annotations" / f"instances_{split}.json", data)
            for j, i in enumerate(images):
                write_image(root / split / f"COCO_x_{i:012d}.jpg", COLOURS[j])
        return ["run", "--set", "data.name=coco2014", "--set", f"data.root={root}", *SMALL_RUN]
    return build


def _earlier_run(tmp: Path, checkpoint: str | None) -> str:
    """A failed run in the case's store, as `fedvlp run` leaves one: config.yaml, and a checkpoint tag if given."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri(tmp))
    experiment = client.create_experiment("earlier", artifact_location=(tmp / "artifacts").as_uri())
    run_id = client.create_run(experiment).info.run_id
    client.log_text(run_id, QUICKSTART.read_text(), "config.yaml")
    if checkpoint is not None:
        client.set_tag(run_id, "checkpoint", checkpoint)
    client.set_terminated(run_id, "FAILED")
    return run_id


def resume_garbage_checkpoint(tmp: Path) -> list[str]:
    checkpoint = tmp / "runs" / "checkpoint.pt"
    write_text(checkpoint, "this is not a torch checkpoint")
    return ["run", "--resume", _earlier_run(tmp, str(checkpoint))]


def resume_without_checkpoint(tmp: Path) -> list[str]:
    return ["run", "--resume", _earlier_run(tmp, None)]


def without(key: str) -> Callable[[dict], None]:
    return lambda data: data.pop(key)


def fedmpt_voc2007(tmp: Path) -> list[str]:
    """The README's real-data run as a new user types it, on a tiny VOC2007 tree (3 training images: 2 clients)."""
    return ["run", "fedmpt_voc2007", "--set", f"data.root={voc_tree(tmp)}", "--set", "resources.workers=1",
            "--set", "resources.num_cpus=1", "--set", "resources.num_gpus=0", "--set", "federation.clients=2"]


def fedprime_recipes_with(*overrides: str, folder: str | None = None) -> Callable[[Path], list[str]]:
    """A small FED-PRIME run on synthetic recipes; `folder` is made empty under the case's temp dir first."""
    def build(tmp: Path) -> list[str]:
        if folder:
            (tmp / folder).mkdir()
        sets = [a for o in overrides for a in ("--set", o.replace("{tmp}", str(tmp)))]
        return ["run", "fedprime_recipes", *SMALL_RUN, *sets]
    return build


# A real backbone's weights looked up in the case's own empty Hugging Face cache, never this machine's.
EMPTY_HF_CACHE = {"HF_HOME": "{tmp}/hf"}


# --------------------------------------------------------------------------- the table

@dataclass(frozen=True)
class Case:
    id: str
    argv: Callable[[Path], list[str]]   # after `fedvlp`, given the case's temp dir
    expect: tuple[str, ...]             # substrings of the error line; "{tmp}" is the case's temp dir
    env: tuple[tuple[str, str], ...] = ()
    starts_ray: bool = False            # fails inside a running cluster (checks its processes are gone)


def case(id, argv, *expect, env=None, starts_ray=False) -> Case:
    return Case(id, argv, expect, tuple((env or {}).items()), starts_ray)


CASES = [
    # ---- run configs
    case("unknown-method", run_with("method.name=nope"),
         "method.name: unknown method 'nope'", "expected one of", "promptfl"),
    case("heterogeneity-above-1", run_with("federation.heterogeneity=1.5"),
         "federation.heterogeneity: expected a value <= 1, got 1.5"),
    case("participation-0", run_with("federation.participation=0"),
         "federation.participation: expected a value > 0, got 0"),
    case("negative-num-gpus", run_with("resources.num_gpus=-1"), "resources.num_gpus: expected a value >= 0"),
    case("workers-0", run_with("resources.workers=0"), "resources.workers: expected a value >= 1, got 0"),
    case("eval-every-0", run_with("federation.eval_every=0"), "federation.eval_every: expected a value >= 1"),
    case("rounds-not-a-number", run_with("federation.rounds=ten"),
         "federation.rounds: expected an integer, got 'ten'"),
    case("label-mask-1", run_with("data.label_mask=1.0"), "data.label_mask: expected a value < 1, got 1.0"),
    case("unknown-missing-type", run_with("data.missing_type=audio"),
         "data.missing_type: expected one of 'text', 'image', 'both', got 'audio'"),
    case("seed-negative", run_with("seed=-1"), "seed: expected a value >= 0, got -1"),
    case("unknown-dataset", run_with("data.name=imagenet"), "data.name: unknown dataset 'imagenet'",
         "synthetic-scenes"),
    case("unknown-partitioner", run_with("federation.partition=kmeans"), "federation.partition: unknown partitioner"),
    case("unknown-server-rule", run_with("server.rules={'': fedadma}"), "server.rules: unknown server rule 'fedadma'"),
    case("plugin-that-does-not-import", run_with("plugins=[no_such_module_xyz]"),
         "plugins: cannot import 'no_such_module_xyz' (ModuleNotFoundError"),
    case("dataset-option-unknown", run_with("data.options={top_k: 3}"), "data.options: takes no options"),
    case("method-param-wrong-type", run_with("method.lr=fast"), "method.lr: expected a number, got 'fast'"),
    case("unknown-dotted-key", run_with("federation.bogus=1"), "federation.bogus: unknown key", "expected one of"),
    case("override-without-value", run_with("federation.rounds"), "--set federation.rounds: expected KEY=VALUE"),
    case("section-set-to-a-scalar", run_with("federation=3"), "federation: expected a mapping, got 3"),
    case("backbone-method-mismatch", run_with("method.name=fedprime"),
         "backbone.name: fedprime needs a ViLT backbone", "'tiny-clip' is a CLIP one"),
    case("dataset-root-missing", run_with("data.name=voc2007", "data.root=/nonexistent/voc"),
         "data.root: /nonexistent/voc is not a directory", "expected the voc2007 dataset root"),
    case("dataset-root-not-given", run_with("data.name=coco2014"), "data.root: required for coco2014"),
    case("clip-weights-not-on-this-machine", fedmpt_voc2007,
         "backbone.pretrained: the 'openai' weights of backbone.name ViT-B-16 are not on this machine",
         "looked for timm/vit_base_patch16_clip_224.openai in the Hugging Face cache",
         "copy the Hugging Face cache ({tmp}/hf/hub) here, or set backbone.pretrained to a local checkpoint file",
         env=EMPTY_HF_CACHE),
    case("vilt-weights-not-on-this-machine", fedprime_recipes_with("backbone.name=dandelin/vilt-b32-mlm"),
         "backbone.name dandelin/vilt-b32-mlm: ViLT files not on this machine: config.json; tokenizer.json or "
         "vocab.txt; model.safetensors or pytorch_model.bin (looked in the Hugging Face cache {tmp}/hf/hub)",
         "set backbone.pretrained (or backbone.name) to DIR", env=EMPTY_HF_CACHE),
    case("random-vilt-without-its-config",
         fedprime_recipes_with("backbone.name={tmp}/my-vilt", "backbone.pretrained=none", folder="my-vilt"),
         "backbone.name {tmp}/my-vilt: ViLT files not on this machine (backbone.pretrained none still needs the "
         "config and tokenizer): config.json; tokenizer.json or vocab.txt (looked in {tmp}/my-vilt)"),
    case("unknown-open-clip-model", run_with("backbone.name=ViT-Z-99", "backbone.pretrained=none"),
         "backbone.name: unknown open_clip model 'ViT-Z-99'"),
    case("backbone-checkpoint-missing", lambda tmp: run_with(f"backbone.pretrained={tmp}/nope.pt", *SMALL)(tmp),
         "backbone.pretrained: {tmp}/nope.pt does not exist", "expected an existing checkpoint file"),
    # ---- config files
    case("config-file-missing", lambda tmp: ["run", str(tmp / "nope.yaml")],
         "{tmp}/nope.yaml: config file not found", "expected a YAML file"),
    case("config-invalid-yaml", config_file("method: [unclosed\n"), "config.yaml: not valid YAML at line 2 (expected"),
    case("config-not-a-mapping", config_file("- just\n- a list\n"),
         "config.yaml: expected a mapping of config sections"),
    case("config-with-python-tag", config_file("method: !!python/object/apply:os.system ['echo pwned']\n"),
         "config.yaml: not valid YAML at line 1 (could not determine a constructor for the tag"),
    case("config-unknown-section", config_file(QUICKSTART.read_text() + "training:\n  epochs: 3\n"),
         "training: unknown key", "expected one of"),
    # ---- real-format data on disk
    case("voc-xml-missing-name", voc_run(lambda voc: write_text(voc / "Annotations" / "000002.xml",
                                                                "<annotation><object><difficult>0</difficult>"
                                                                "</object></annotation>")),
         "Annotations/000002.xml: missing <object><name>", "expected a VOC annotation"),
    case("coco-json-missing-annotations", coco_run(without("annotations")),
         "instances_train2014.json: missing key 'annotations'", "expected a COCO instances file"),
    case("corrupt-image", voc_run(lambda voc: (voc / "JPEGImages" / "000002.jpg").write_bytes(b"not a jpeg")),
         "JPEGImages/000002.jpg: cannot read image (cannot identify image file); expected a JPEG/PNG file",
         starts_ray=True),
    # ---- resources
    case("more-gpus-than-the-machine", run_with("resources.num_gpus=1", *SMALL),
         "resources: the run needs 1 GPU", "but this machine has 0"),
    # ---- tracking
    case("mlflow-unreachable-env", run_with(), "$MLFLOW_TRACKING_URI: cannot reach", f"127.0.0.1:{CLOSED_PORT}",
         env={"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{CLOSED_PORT}"}),
    case("mlflow-sqlite-in-missing-dir", run_with("tracking.uri=sqlite:////nonexistent/dir/mlflow.db"),
         "tracking.uri: sqlite:////nonexistent/dir/mlflow.db", "/nonexistent/dir"),
    case("report-mlflow-unreachable", lambda tmp: ["report", "sweep-x", "--tracking-uri",
                                                   f"http://127.0.0.1:{CLOSED_PORT}"],
         "--tracking-uri: cannot reach", f"127.0.0.1:{CLOSED_PORT}"),
    case("report-missing-store", lambda tmp: ["report", "sweep-x", "--tracking-uri", f"sqlite:///{tmp}/none.db"],
         "--tracking-uri: sqlite:///{tmp}/none.db: no MLflow store at {tmp}/none.db", "expected the store the sweep"),
    case("report-unknown-experiment", lambda tmp: ["report", "sweep-nope"],
         "experiment 'sweep-nope' not found", "expected the MLflow experiment of a `fedvlp sweep`"),
    # ---- resume and checkpoints
    case("resume-unknown-run", lambda tmp: ["run", "--resume", "0123456789abcdef"],
         "--resume 0123456789abcdef: no such run", "expected the MLflow run id"),
    case("resume-unreadable-checkpoint", resume_garbage_checkpoint,
         "{tmp}/runs/checkpoint.pt: not a readable fedvlp checkpoint", "expected a file written by a fedvlp run"),
    case("resume-run-without-checkpoint", resume_without_checkpoint, "has no checkpoint tag"),
    # ---- tune spaces
    case("sweep-cut-unknown-method", lambda tmp: ["sweep", "smoke", "--methods", "fedprime"],
         "--methods: fedprime not in this space; expected some of"),
    case("sweep-cut-unswept-key", lambda tmp: ["sweep", "participation", "--values", "federation.rounds=1,2"],
         "--values federation.rounds: not a grid key of this space"),
    case("sweep-resume-with-a-cut", lambda tmp: ["sweep", "smoke", "--resume", "--seeds", "0"],
         "--resume: continues the sweep as it was started; expected no --seeds, --methods or --values with it"),
    case("space-minutes-per-trial-negative", space_file({"space": {"seed": {"grid": [0]}}, "minutes_per_trial": -1}),
         "space.yaml: minutes_per_trial: expected a number > 0"),
    case("space-unknown-top-level-key", space_file({"space": {"federation.rounds": {"grid": [1]}}, "sapce": {}}),
         "space.yaml: sapce: unknown key", "expected one of"),
    case("space-unknown-dotted-key", space_file({"space": {"federation.bogus": {"grid": [1, 2]}}}),
         "space.yaml: trial", "federation.bogus: unknown key"),
    case("space-empty-grid", space_file({"space": {"federation.heterogeneity": {"grid": []}}}),
         "space.yaml: space.federation.heterogeneity.grid: expected a non-empty list, got []"),
    case("space-grid-value-out-of-range", space_file({"space": {"federation.heterogeneity": {"grid": [0.5, 2]}}}),
         "space.yaml: trial", "federation.heterogeneity: expected a value <= 1, got 2"),
    case("space-unknown-distribution", space_file({"space": {"federation.heterogeneity": {"normal": [0, 1]}}}),
         "space.yaml: space.federation.heterogeneity: expected one of {grid: ..."),
    case("space-bad-mode", space_file({"space": {"seed": {"grid": [0]}}, "mode": "maximize"}),
         "space.yaml: mode: expected max or min, got 'maximize'"),
    case("space-unknown-scheduler", space_file({"space": {"seed": {"grid": [0]}}, "scheduler": {"type": "pbt"}}),
         "space.yaml: scheduler: expected {type: none} or {type: asha"),
    case("space-selects-on-test", space_file({"space": {"seed": {"grid": [0]}}, "metric": "test_mAP"}),
         "space.yaml: metric: expected a val_* metric", "got 'test_mAP'"),
    case("tune-on-a-test-metric", lambda tmp: ["tune", "quickstart", "--budget", "2", "--metric", "test_mAP"],
         "--metric: expected a val_* metric", "got 'test_mAP'"),
    case("tune-zero-budget", lambda tmp: ["tune", "quickstart", "--budget", "0"], "--budget: expected an integer >= 1"),
    case("tune-nothing-to-tune", lambda tmp: ["tune", "zeroshot_scenes", "--budget", "2"],
         "method.name: zeroshot declares no tunable hyper-parameters"),
    case("space-without-metric", lambda tmp: ["sweep", str(write_text(
        tmp / "space.yaml", json.dumps({"base": str(QUICKSTART), "space": {"seed": {"grid": [0]}}})))],
         "space.yaml: metric: expected a value (required)"),
    case("space-base-missing", lambda tmp: ["sweep", str(write_text(
        tmp / "space.yaml", json.dumps({"base": "nope.yaml", "metric": "m", "space": {"seed": {"grid": [0]}}})))],
         "space.yaml: base: nope.yaml not found", "expected a run config file"),
]


# --------------------------------------------------------------------------- the checks

def tracking_uri(tmp: Path) -> str:
    return f"sqlite:///{tmp / 'mlflow.db'}"


def ray_processes(ray_dir: str) -> list[psutil.Process]:
    """Live processes of the Ray cluster whose temp dir is `ray_dir` (raylet, gcs_server, workers ...)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if ray_dir in " ".join(process.info["cmdline"] or ()) and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            continue
    return found


def run_ids(db: Path, where: str = "") -> list[str]:
    """The store's runs (those matching the MLflow filter `where`)."""
    if not db.exists():
        return []
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    if not experiments:
        return []
    return [r.info.run_id for r in client.search_runs(experiments, where, run_view_type=ViewType.ALL)]


def running_runs(db: Path) -> list[str]:
    return run_ids(db, "attributes.status = 'RUNNING'")


THROUGH_THE_CLI = {"unknown-method", "voc-xml-missing-name", "corrupt-image", "more-gpus-than-the-machine",
                   "mlflow-unreachable-env", "resume-unknown-run", "space-unknown-dotted-key",
                   "clip-weights-not-on-this-machine", "vilt-weights-not-on-this-machine"}


@pytest.mark.parametrize("bad", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_clear_line(bad: Case, tmp_path, empty_store, monkeypatch, capsys, request):
    if bad.starts_ray:
        request.getfixturevalue("tiny_clip")  # it reaches the workers, which load the tiny CLIP
    shutil.copy(empty_store, tmp_path / "mlflow.db")
    argv = bad.argv(tmp_path)
    runs_before = run_ids(tmp_path / "mlflow.db")
    if bad.id in THROUGH_THE_CLI:
        code, stderr, leftover, ray_started = _through_the_cli(bad, argv, tmp_path)
    else:
        code, stderr, leftover, ray_started = _in_process(bad, argv, tmp_path, monkeypatch, capsys)
    lines = [line for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    context = f"argv={argv}\nstderr:\n{stderr[-3000:]}"
    assert code != 0, context
    assert last.startswith(ERROR_PREFIX), context
    assert "Traceback" not in stderr, context
    if bad.id in THROUGH_THE_CLI and not bad.starts_ray:  # a process that fails before the cluster says only that
        assert len(lines) == 1, context
    for part in bad.expect:
        assert part.replace("{tmp}", str(tmp_path)) in last, f"{part!r} not in the error line\n{context}"
    assert not leftover, f"Ray processes left behind: {leftover}\n{context}"
    assert ray_started == bad.starts_ray, f"Ray {'did not start' if bad.starts_ray else 'started'}\n{context}"
    assert running_runs(tmp_path / "mlflow.db") == [], context
    assert not (tmp_path / "none.db").exists(), context  # a report against a missing store creates none
    if not bad.starts_ray:  # it failed before the engine opens its MLflow run
        assert run_ids(tmp_path / "mlflow.db") == runs_before, context


def case_env(bad: Case, tmp_path: Path) -> dict[str, str]:
    return {key: value.replace("{tmp}", str(tmp_path)) for key, value in bad.env}


def _in_process(bad: Case, argv: list[str], tmp_path: Path, monkeypatch, capsys):
    """`main(argv)` here, with the case's environment; reaching Ray at all fails the case."""
    from fedvlp.cli import main
    from fedvlp.platform.runtime import engine, placement

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri(tmp_path))
    for key, value in case_env(bad, tmp_path).items():
        monkeypatch.setenv(key, value)
    reached = []

    def no_ray(*args, **kwargs):
        reached.append(True)
        raise AssertionError("this bad input reached Ray")

    for module in (engine, placement):  # where a run, and a sweep or tune, look it up
        monkeypatch.setattr(module, "ensure_ray", no_ray)
    capsys.readouterr()
    code = main(argv)
    return code, capsys.readouterr().err, [], bool(reached)


def _through_the_cli(bad: Case, argv: list[str], tmp_path: Path):
    """A real `fedvlp` process with a short private Ray temp dir that marks this case's Ray processes."""
    ray_dir = tempfile.mkdtemp(prefix="fvray", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO), RAY_TMPDIR=ray_dir, MLFLOW_TRACKING_URI=tracking_uri(tmp_path),
               FEDVLP_CACHE_DIR=os.environ["FEDVLP_CACHE_DIR"])
    env.update(case_env(bad, tmp_path))
    try:
        proc = subprocess.run([sys.executable, "-m", "fedvlp", *argv], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=150)
        deadline = time.monotonic() + 15   # ray.shutdown returns before every process has exited
        while ray_processes(ray_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        leftover = [" ".join(p.cmdline()[:2]) for p in ray_processes(ray_dir)]
        ray_started = any(Path(ray_dir).iterdir())
    finally:
        for process in ray_processes(ray_dir):   # never leak them into the next case, even on failure
            process.kill()
        shutil.rmtree(ray_dir, ignore_errors=True)
    return proc.returncode, proc.stderr, leftover, ray_started


def test_enough_cases():
    assert len(CASES) >= 28 and len({c.id for c in CASES}) == len(CASES)
    assert THROUGH_THE_CLI <= {c.id for c in CASES}


# --------------------------------------------------------------------------- weights the driver's check must find

def hf_cache_snapshot(hf_home: Path, repo: str) -> Path:
    """The folder of `repo`'s main-branch files in a Hugging Face cache laid out as huggingface_hub writes it:
    hub/models--ORG--NAME, whose refs/main names the commit whose snapshot folder holds the files."""
    commit = hashlib.sha1(repo.encode()).hexdigest()
    folder = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    write_text(folder / "refs" / "main", commit)
    (folder / "snapshots" / commit).mkdir(parents=True)
    return folder / "snapshots" / commit


DRIVER_CHECK = """
from fedvlp.config import load_spec
from fedvlp.backbones.loaders import load_backbone, prepare_backbone
for overrides in {runs!r}:
    spec = load_spec({config!r}, overrides)
    try:
        prepare_backbone(spec)
    except Exception as exc:
        print(type(exc).__name__, exc)
    else:
        print("found", {then})
"""


def driver_check(hf_home: Path, config: str, runs: list[list[str]], then: str = "''") -> list[str]:
    """The driver's `prepare_backbone` on each run's overrides of `config`, in a fresh process whose Hugging Face
    cache is `hf_home` (huggingface_hub reads it at import): 'found' and `then` (an expression of `spec`) where it
    passes, else the error. One line per run."""
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", DRIVER_CHECK.format(runs=runs, config=config, then=then)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


def test_real_clip_weights_in_the_hf_cache_or_a_local_file_pass_the_driver_check(tmp_path):
    from safetensors.torch import save_file

    # open_clip looks for the tag's hub file, safetensors first, in the HF cache: a real (tiny) file there passes.
    tensors = {"proj": torch.arange(4.0)}
    save_file(tensors, hf_cache_snapshot(tmp_path / "hf", "timm/vit_base_patch16_clip_224.openai")
              / "open_clip_model.safetensors")
    save_file(tensors, tmp_path / "ViT-B-16.safetensors")
    runs = [[f"data.root={tmp_path}"],
            [f"data.root={tmp_path}", "backbone.pretrained=laion2b_s34b_b88k"],      # another tag: not there
            [f"data.root={tmp_path}", f"backbone.pretrained={tmp_path / 'ViT-B-16.safetensors'}"],
            [f"data.root={tmp_path}", f"backbone.pretrained={tmp_path}"]]
    openai, laion, local_file, folder = driver_check(tmp_path / "hf", "fedmpt_voc2007", runs)
    assert openai == "found " and local_file == "found ", (openai, local_file)
    assert laion.startswith("BackboneError backbone.pretrained: the 'laion2b_s34b_b88k' weights of backbone.name "
                            "ViT-B-16 are not on this machine"), laion
    assert "in the Hugging Face cache); " in laion and f"({tmp_path}/hf/hub) here" in laion, laion
    assert folder == (f"BackboneError backbone.pretrained: {tmp_path} is a directory; expected an open_clip "
                      f"checkpoint file or an open_clip tag of ViT-B-16")


def test_a_real_vilt_in_the_hf_cache_passes_the_driver_check_and_is_what_the_loader_loads(tmp_path):
    from fedvlp.backbones.vilt import create_vilt

    # fedvlp's tiny ViLT architecture saved where transformers keeps two real ViLTs, one without its weights
    torch.manual_seed(0)
    tiny = create_vilt()
    for repo in ("dandelin/vilt-b32-mlm", "dandelin/vilt-b32-finetuned-vqa"):
        snapshot = hf_cache_snapshot(tmp_path / "hf", repo)
        tiny.model.save_pretrained(snapshot)
        tiny.tokenizer.save_pretrained(snapshot)
    (snapshot / "model.safetensors").unlink()
    runs = [["backbone.name=dandelin/vilt-b32-mlm"], ["backbone.name=dandelin/vilt-b32-finetuned-vqa"],
            ["backbone.name=dandelin/vilt-b32-finetuned-vqa", "backbone.pretrained=none"]]
    loaded = "((b := load_backbone(spec)).hidden_size, float(b.model.pooler.dense.weight.sum()))"
    mlm, vqa, vqa_random = driver_check(tmp_path / "hf", "fedprime_recipes", runs, then=loaded)
    assert mlm == f"found {(128, float(tiny.model.pooler.dense.weight.sum()))}", mlm   # the very weights saved
    assert vqa.startswith("BackboneError backbone.name dandelin/vilt-b32-finetuned-vqa: ViLT files not on this "
                          "machine: model.safetensors or pytorch_model.bin (looked in the Hugging Face cache "
                          f"{tmp_path}/hf/hub); download it where there is internet"), vqa
    assert vqa.endswith("set backbone.pretrained (or backbone.name) to DIR"), vqa
    assert vqa_random.startswith("found (128, ") and vqa_random != mlm, vqa_random   # config and tokenizer suffice


def test_a_remote_cluster_skips_the_driver_check(tmp_path, monkeypatch):
    """Under RAY_ADDRESS the workers run elsewhere and look in their own caches: this machine's lack no proof."""
    from fedvlp.backbones.loaders import prepare_backbone
    from fedvlp.config import load_spec
    from fedvlp.errors import BackboneError

    (tmp_path / "my-vilt").mkdir()
    spec = load_spec("fedprime_recipes", [f"backbone.name={tmp_path / 'my-vilt'}"])
    with pytest.raises(BackboneError, match="ViLT files not on this machine: config.json"):
        prepare_backbone(spec)
    monkeypatch.setenv("RAY_ADDRESS", "ray://head.elsewhere:10001")
    prepare_backbone(spec)
