"""cluster.yaml is a Ray cluster launcher file that Ray itself accepts.

Validation is Ray's own: the file as written against `ray/autoscaler/ray-schema.json`
(jsonschema; unknown keys are errors), then what `ray up` does before it contacts the cloud,
`prepare_config` (merge the provider's defaults) followed by `validate_config` (schema again
plus Ray's cross-field checks). The commented GCP and on-premise sketches are validated the
same way after uncommenting. No cloud, network or Ray cluster is needed.
"""
from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path

import jsonschema  # a dependency of Ray core; Ray's validator needs it
import pytest
import ray.autoscaler
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

CLUSTER_YAML = Path(__file__).resolve().parents[1] / "cluster.yaml"
TEXT = CLUSTER_YAML.read_text()


def load() -> dict:
    return yaml.safe_load(TEXT)  # what `ray up` does with the file


def ray_schema() -> dict:
    with open(os.path.join(os.path.dirname(ray.autoscaler.__file__), "ray-schema.json")) as f:
        return json.load(f)


def ray_validate(config: dict) -> dict:
    """Raise as Ray would; return the prepared config."""
    jsonschema.validate(config, ray_schema())
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def sketch(name: str) -> dict:
    """The commented block between `# BEGIN name` and `# END name`, uncommented and parsed."""
    match = re.search(rf"^# BEGIN {name}\n(.*?)^# END {name}$", TEXT, re.M | re.S)
    assert match, f"no {name} sketch in cluster.yaml"
    lines = match.group(1).splitlines()
    assert all(line == "#" or line.startswith("# ") for line in lines)
    return yaml.safe_load("\n".join(line[2:] for line in lines))


def node_types(config: dict) -> tuple[dict, dict]:
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    gpu = [t for name, t in types.items() if name != config["head_node_type"]
           and t.get("resources", {}).get("GPU", 0) > 0]
    assert len(gpu) == 1, "expected exactly one GPU worker node type"
    return head, gpu[0]


def head_start_commands(config: dict) -> str:
    return "\n".join(config["head_start_ray_commands"])


# ----------------------------------------------------------------------------- the AWS file


def test_ray_accepts_the_file():
    prepared = ray_validate(load())
    assert prepared["provider"]["type"] == "aws"
    assert prepared["cluster_name"] == "fedvlp"


def test_aws_provider_and_limits():
    config = load()
    provider = config["provider"]
    assert provider["type"] == "aws" and provider["region"]
    assert provider["cache_stopped_nodes"] is False
    assert config["max_workers"] >= 1 and config["idle_timeout_minutes"] > 0


def test_cpu_head_and_gpu_workers():
    config = load()
    head, gpu = node_types(config)
    assert head["resources"] == {}  # CPUs detected from the instance type; no GPU
    assert head["node_config"]["InstanceType"].startswith("m5.")
    assert gpu["resources"]["GPU"] >= 1 and gpu["resources"]["CPU"] >= 1
    assert gpu["node_config"]["InstanceType"].startswith("g5.")
    assert gpu.get("min_workers", 0) == 0
    assert 1 <= gpu["max_workers"] <= config["max_workers"]


PLACEHOLDER_AMI = "ami-CHANGE-ME"
AMI_ID = r"ami-([0-9a-f]{8}|[0-9a-f]{17})"  # what AWS image ids look like


def test_image_id_is_an_explicit_placeholder():
    # An empty ImageId (or "latest_dlami") makes Ray fall back to an Ubuntu 18.04 DLAMI whose Python is too old for
    # fedvlp, and a made-up id that looks real hides that it must be replaced: the file carries one placeholder, which
    # is not an AMI id, for every node type, on a line that says so.
    assert not re.fullmatch(AMI_ID, PLACEHOLDER_AMI)
    for name, node_type in load()["available_node_types"].items():
        assert node_type["node_config"].get("ImageId") == PLACEHOLDER_AMI, name
    lines = [line for line in TEXT.splitlines() if PLACEHOLDER_AMI in line and not line.lstrip().startswith("#")]
    assert len(lines) == 1, lines  # one anchor (&dlami): one value to replace
    assert "CHANGE ME" in lines[0] and "placeholder" in lines[0]
    assert f"placeholder `{PLACEHOLDER_AMI}`" in TEXT.split("\ncluster_name:")[0]  # step 0 of the walk-through
    values = [line.split("#")[0] for line in TEXT.splitlines()]
    assert not any(re.search(rf"\b{AMI_ID}\b", v) for v in values), "a real-looking AMI id outside the comments"


def test_a_real_image_id_replaces_the_placeholder_everywhere():
    real = "ami-0abcdef1234567890"  # AWS's documentation example
    config = yaml.safe_load(TEXT.replace(PLACEHOLDER_AMI, real))
    for name, node_type in config["available_node_types"].items():
        assert node_type["node_config"]["ImageId"] == real and re.fullmatch(AMI_ID, real), name
    ray_validate(config)


def test_dashboard_and_mlflow_bind_to_localhost_only():
    assert "0.0.0.0" not in TEXT
    config = load()
    commands = head_start_commands(config)
    assert config["head_start_ray_commands"][0] == "ray stop"
    ray_start = next(c for c in config["head_start_ray_commands"] if "ray start --head" in c)
    assert "--port=6379" in ray_start
    assert "--dashboard-host=127.0.0.1" in ray_start
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in ray_start
    mlflow = next(c for c in config["head_start_ray_commands"] if "mlflow server" in c)
    assert "--host 127.0.0.1" in mlflow and "--port 5000" in mlflow
    assert mlflow.rstrip().endswith("&") and "nohup" in mlflow  # in the background
    assert "sqlite:///" in mlflow
    # every --host / --dashboard-host anywhere in the file is localhost
    for flag, value in re.findall(r"--(host|dashboard-host)[= ](\S+)", TEXT):
        assert value == "127.0.0.1", (flag, value)
    assert "mlflow server" not in "\n".join(config["worker_start_ray_commands"])
    assert "mlflow" not in commands.split("ray start --head")[0]  # MLflow after Ray


def test_jobs_get_the_tracking_uri():
    config = load()
    uri = "MLFLOW_TRACKING_URI=http://127.0.0.1:5000"
    assert any(uri in c for c in config["head_setup_commands"])  # the job driver, started on the head, inherits it
    assert "unless your shell sets MLFLOW_TRACKING_URI" in TEXT  # which `fedvlp submit` carries


def test_workers_join_the_head():
    assert load()["worker_start_ray_commands"] == [
        "ray stop", "ulimit -n 65536; ray start --address=$RAY_HEAD_IP:6379"]


def test_setup_installs_fedvlp_from_the_mounted_repo():
    config = load()
    assert config["file_mounts"] == {"~/fedvlp": "."}
    assert "pip install -q -e ~/fedvlp" in config["setup_commands"]
    ray_pin = next(c for c in config["setup_commands"] if '"ray[' in c)
    assert "default" in ray_pin  # the dashboard and the job server


def test_header_walks_through_the_whole_path():
    header = TEXT.split("\ncluster_name:")[0]
    for step in ("ray up cluster.yaml", "ray dashboard cluster.yaml",
                 "ray exec cluster.yaml 'ray get-auth-token'", "fedvlp submit sweep heterogeneity --report",
                 "~/fedvlp-results",
                 "ray attach cluster.yaml -p 5000", "-L 5000:127.0.0.1:5000", "ray down cluster.yaml",
                 "Trust model", "SSH"):
        assert step in header, step


def test_no_credentials_or_secrets():
    patterns = [
        r"\b(AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA)[A-Z0-9]{16}\b",   # AWS access key ids
        r"(?i)aws_(secret_access_key|access_key_id|session_token)\s*[:=]",
        r"(?<![A-Za-z0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])",    # 40-char secret keys
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
        r"(?i)\b(password|passwd|secret|token|api[_-]?key)\s*[:=]",
    ]
    for pattern in patterns:
        assert not re.search(pattern, TEXT), pattern
    config = load()
    assert set(config["auth"]) == {"ssh_user"}  # Ray creates and uses its own key pair
    assert "gcp_credentials" not in config["provider"]


# ------------------------------------------------------------------- the commented sketches


def test_gcp_sketch_is_accepted_by_ray():
    config = load()
    config.update(sketch("GCP"))
    prepared = ray_validate(config)
    assert prepared["provider"]["type"] == "gcp"
    head, gpu = node_types(prepared)
    assert gpu["resources"]["GPU"] >= 1


def test_local_sketch_is_accepted_by_ray():
    config = load()
    config.update(sketch("LOCAL"))
    del config["available_node_types"], config["head_node_type"]  # as the sketch says
    prepared = ray_validate(config)
    assert prepared["provider"]["type"] == "local"
    assert prepared["provider"]["head_ip"] and prepared["provider"]["worker_ips"]


# ------------------------------------------------------------- the validation can also fail


def _misspelled_key(c):
    c["setup_comands"] = c.pop("setup_commands")


def _fractional_gpu(c):
    c["available_node_types"]["gpu_worker"]["resources"]["GPU"] = 0.5


def _unknown_node_type_field(c):
    c["available_node_types"]["gpu_worker"]["max_worker"] = 4


def _missing_head_type(c):
    c["head_node_type"] = "no-such-type"


def _min_above_max(c):
    c["available_node_types"]["gpu_worker"]["min_workers"] = c["max_workers"] + 1


@pytest.mark.parametrize("break_it, error", [
    (_misspelled_key, jsonschema.ValidationError),
    (_fractional_gpu, jsonschema.ValidationError),
    (_unknown_node_type_field, jsonschema.ValidationError),
    (_missing_head_type, ValueError),
    (_min_above_max, ValueError),
], ids=lambda v: getattr(v, "__name__", "").lstrip("_"))
def test_ray_rejects_a_broken_copy(break_it, error):
    config = load()
    break_it(config)
    with pytest.raises(error):
        ray_validate(config)
