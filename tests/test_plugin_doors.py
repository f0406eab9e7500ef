"""A plugin reached by each of its three doors runs inside a Tune trial's actors, with no PYTHONPATH: a method named
by $FEDVLP_PLUGINS, a server rule from an installed `fedvlp.plugins` entry point, a partitioner from the space's
`plugins:`. Only the entry-point plugin is installed (in a throwaway virtual environment, so it never loads in the
rest of the test session); the other two lie in a directory only the driver's sys.path holds, so Ray's workers
see them only if fedvlp ships them (runtime_env py_modules), as on the nodes of a cluster."""
import json
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from conftest import fedvlp_cli
from mlflow import MlflowClient

from fedvlp.config import build_spec
from fedvlp.platform.studies.spaces import load_sweep, trial_spec
from fedvlp.platform.studies.tune import load_tune, trial_raw

# Every plugin appends, from where its code runs, a line: what ran, in which Ray actor, from which file.
RECORD = '''
import json
import ray


def record(what, **extra):
    line = {"what": what, "actor": ray.get_runtime_context().get_actor_name(), "file": __file__, **extra}
    with open(EVIDENCE, "a") as out:
        out.write(json.dumps(line) + "\\n")
'''

METHOD = '''
from dataclasses import dataclass

import torch

from fedvlp.methods.base import Method
from fedvlp.methods.registry import register
from fedvlp.spec import spec_field


@dataclass(frozen=True)
class EnvDoorParams:
    lr: float = spec_field(0.5, "step of the bias towards -2", gt=0)


@register
class EnvDoor(Method):
    name = "envdoor"
    Params = EnvDoorParams

    def __init__(self, params, backbone, task, generator=None):
        super().__init__(params, backbone, task)
        self.bias = torch.nn.Parameter(torch.zeros(len(task.class_names)), requires_grad=False)

    def forward(self, features):
        return self.bias.expand(len(features), -1)

    @torch.no_grad()
    def local_update(self, data, generator):
        record("method")
        self.bias.add_(self.params.lr * (-2.0 - self.bias))
        return {"loss": 0.0, "steps": 1, "envdoor": 7.0}  # a statistic only this code produces
'''

RULE = '''
from fedvlp.platform.aggregation import ServerRule, register_rule


def epdoor(previous, average, state, options):
    record("rule")
    return average, {}, {"calls": 1.0}


register_rule(ServerRule("epdoor", "average", epdoor, doc="FedAvg that says where it ran"))
'''

PARTITIONER = '''
import numpy as np
from ray import tune

from fedvlp.data.partition import Partitioner, register_partitioner


def blocks(labels, num_clients, seed, federation):
    record("partitioner", trial=tune.get_context().get_trial_id())
    return np.array_split(np.arange(len(labels), dtype=np.int64), num_clients)


register_partitioner(Partitioner("cfgdoor", blocks, "any", doc="contiguous blocks that say where they were cut"))
'''


def plugin_source(body: str, evidence: Path) -> str:
    return f"EVIDENCE = {str(evidence)!r}\n" + RECORD + body


def venv_with_entry_point(tmp_path: Path, evidence: Path) -> Path:
    """A virtual environment over this one's packages with the wheel of `epdoorplug` pip-installed (offline): its
    `fedvlp.plugins` entry point loads in every fedvlp process of that interpreter, and no other. The wheel is
    written by hand, so no build backend (whose version differs between environments) takes part."""
    name, info = "epdoorplug", "epdoorplug-0.1.dist-info"
    files = {f"{name}/__init__.py": plugin_source(RULE, evidence),
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: fedvlp-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
             f"{info}/entry_points.txt": f"[fedvlp.plugins]\n{name} = {name}\n"}
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"])
    wheel = tmp_path / f"{name}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as out:
        for path, text in files.items():
            out.writestr(path, text)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # This environment's packages (fedvlp, Ray, pip), their .pth files included, behind the venv's own.
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    Path(purelib, "outer.pth").write_text("".join(f"import site; site.addsitedir({d!r})\n"
                                                  for d in site.getsitepackages()))
    pip = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
                         capture_output=True, text=True, timeout=120)
    assert pip.returncode == 0, pip.stderr[-2000:]
    return python


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_a_plugin_by_each_door_runs_in_the_actors_of_a_tune_trial(tmp_path, tracking_uri):
    evidence = tmp_path / "evidence.jsonl"
    python = venv_with_entry_point(tmp_path, evidence)
    plugins = tmp_path / "plugins"  # on no path of the trial's processes but what fedvlp ships
    (plugins / "cfgdoorplug").mkdir(parents=True)
    (plugins / "envdoorplug.py").write_text(plugin_source(METHOD, evidence))  # a single-file module
    (plugins / "cfgdoorplug" / "__init__.py").write_text(plugin_source(PARTITIONER, evidence))  # a package
    base = tmp_path / "doors.yaml"
    base.write_text(yaml.safe_dump({
        "seed": 0, "method": {"name": "envdoor"}, "backbone": {"name": "tiny-clip", "pretrained": "fedvlp"},
        "data": {"name": "synthetic-scenes", "num_train": 400, "num_val": 128, "num_test": 128, "num_holdout": 64},
        "federation": {"clients": 4, "rounds": 1}, "server": {"rules": {"": "epdoor"}},
        "resources": {"workers": 1, "num_cpus": 0.5, "coordinator_cpus": 0.25},
        "tracking": {"uri": tracking_uri}, "output_dir": str(tmp_path / "runs")}))
    space = tmp_path / "doors-space.yaml"
    space.write_text(yaml.safe_dump({
        "base": base.name, "name": "doors", "storage": str(tmp_path / "ray_results"), "seeds": [0],
        "set": {"plugins": ["cfgdoorplug"], "federation.partition": "cfgdoor"},
        "space": {"method.lr": {"grid": [0.5]}}, "metric": "val_mAP"}))
    (tmp_path / "elsewhere").mkdir()
    proc = fedvlp_cli(["sweep", str(space)], cwd=tmp_path / "elsewhere", python=python, driver_path=plugins,
                      env={"PYTHONPATH": None, "FEDVLP_PLUGINS": "envdoorplug"})
    errors = [path.read_text()[-2000:] for path in (tmp_path / "ray_results").rglob("error.txt")]  # a failed trial's
    assert proc.returncode == 0 and not errors, "\n".join(errors) or proc.stderr[-3000:]

    client = MlflowClient(tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("sweep-doors").experiment_id],
                                "tags.`fedvlp.role` = 'trial'")
    assert run.info.status == "FINISHED" and run.data.params["method.name"] == "envdoor"
    assert run.data.metrics["train_envdoor"] == 7.0  # the $FEDVLP_PLUGINS method's own statistic
    assert run.data.metrics["server/epdoor/calls"] == 1.0  # and the entry-point rule's, once in the one round
    lines = [json.loads(line) for line in evidence.read_text().splitlines()]
    by_what = {what: [line for line in lines if line["what"] == what] for what in ("method", "rule", "partitioner")}
    name = f"fedvlp-{run.info.run_id}"
    # $FEDVLP_PLUGINS: the method trained the 4 clients in the trial's ClientWorker, imported from a shipped copy
    assert len(by_what["method"]) == 4 and {line["actor"] for line in by_what["method"]} == {f"{name}-worker-0"}
    # the entry point: the server rule aggregated the round in the trial's Coordinator, from the installed package
    assert len(by_what["rule"]) == 1 and by_what["rule"][0]["actor"] == f"{name}-coordinator"
    assert Path(by_what["rule"][0]["file"]).is_relative_to(tmp_path / "venv")
    # `plugins:`: the partitioner cut the clients in the Tune trial itself, imported from a shipped copy
    assert by_what["partitioner"] and {line["trial"] for line in by_what["partitioner"]} == \
        {run.data.tags["tune_trial_id"]}
    for line in by_what["method"] + by_what["partitioner"]:
        assert not Path(line["file"]).is_relative_to(plugins), line  # never read from the driver's directory


def test_sweeps_and_tune_runs_name_the_env_plugins_for_trials_that_run_without_them(tmp_path, monkeypatch):
    """A trial on a cluster's node does not see the driver's $FEDVLP_PLUGINS: the sweep or tune run carries them."""
    (tmp_path / "envonlyplug.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"base": "quickstart", "space": {"method.lr": {"grid": [0.01]}},
                                     "metric": "val_mAP", "storage": str(tmp_path / "ray_results")}))
    monkeypatch.setenv("FEDVLP_PLUGINS", "envonlyplug")
    sweep, tuning = load_sweep(space), load_tune("quickstart", budget=1)
    monkeypatch.delenv("FEDVLP_PLUGINS")
    assert trial_spec(sweep, {"seed": 0}, "parent").plugins == ("envonlyplug",)
    assert build_spec(trial_raw(tuning, {"method.lr": 0.01}, seed=0)).plugins == ("envonlyplug",)
