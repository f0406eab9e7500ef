"""Config: YAML + --set -> a validated RunSpec; bad input is one line naming the key, before Ray starts."""
import subprocess
import sys

import pytest

from fedvlp.config import DEFAULT_CONFIG, load_spec, parse_override
from fedvlp.errors import ConfigError


def test_quickstart_is_the_default_and_overrides_apply():
    spec = load_spec(None, ["federation.rounds=3", "method.lr=0.01", "resources.num_gpus=0.25"])
    assert DEFAULT_CONFIG.name == "quickstart.yaml"
    assert spec.method.name == "promptfl"
    assert spec.federation.rounds == 3
    assert spec.method.params.lr == 0.01
    assert spec.resources.num_gpus == 0.25
    assert spec.flat()["federation.rounds"] == 3 and spec.flat()["method.name"] == "promptfl"


def test_override_values_are_read_as_yaml():
    assert parse_override("a.b=0.5") == ("a.b", 0.5)
    assert parse_override("a.b=true") == ("a.b", True)
    assert parse_override("a.b=null") == ("a.b", None)
    assert parse_override("a.b=hello world") == ("a.b", "hello world")


def test_int_is_accepted_for_a_float_but_not_the_reverse():
    assert load_spec(None, ["federation.participation=1"]).federation.participation == 1.0
    with pytest.raises(ConfigError, match=r"^federation\.rounds: expected an integer, got 2\.5$"):
        load_spec(None, ["federation.rounds=2.5"])


@pytest.mark.parametrize("override, message", [
    ("federation.heterogeneity=1.5", r"federation\.heterogeneity: expected a value <= 1, got 1\.5"),
    ("federation.participation=0", r"federation\.participation: expected a value > 0"),
    ("resources.num_gpus=-1", r"resources\.num_gpus: expected a value >= 0"),
    ("federation.clients=0", r"federation\.clients: expected a value >= 1"),
    ("federation.bogus=1", r"federation\.bogus: unknown key"),
    ("bogus=1", r"bogus: unknown key"),
    ("method.bogus=1", r"method\.bogus: unknown key"),
    ("method.name=nope", r"method\.name: unknown method 'nope'"),
    ("method.lr=fast", r"method\.lr: expected a number, got 'fast'"),
    ("federation=3", r"federation: expected a mapping"),
    ("method.template=no placeholder", r"method\.template: unknown key"),
    ("data.name=imagenet", r"data\.name: expected one of 'synthetic-scenes'"),
    ("noequals", r"--set noequals: expected KEY=VALUE"),
])
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_spec(None, [override])


def test_method_params_are_validated_by_the_method():
    spec = load_spec(None, ["method.name=zeroshot", "method.template=a picture of {}."])
    assert spec.method.params.template == "a picture of {}."
    with pytest.raises(ConfigError, match=r"method\.template: expected a '\{\}' placeholder"):
        load_spec(None, ["method.name=zeroshot", "method.template=no placeholder"])


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_spec(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not valid YAML at line"):
        load_spec(bad)
    code = tmp_path / "code.yaml"
    code.write_text("method: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_spec(code)  # safe_load: nothing in a config is evaluated as code


def test_cli_rejects_bad_input_with_one_line_and_no_ray(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "fedvlp", "run", "--set", "federation.heterogeneity=1.5"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["fedvlp: error: federation.heterogeneity: expected a value <= 1, got 1.5"]
    assert not (tmp_path / "mlflow.db").exists()  # rejected before any tracking or cluster work


def test_list_keys_names_every_key_with_its_meaning():
    from fedvlp.config import describe_keys

    keys = {key: (kind, value, meaning) for key, kind, value, meaning in describe_keys(load_spec(None))}
    assert keys["method.lr"] == ("a number", 0.002, "Adam learning rate")
    assert keys["federation.heterogeneity"][1] == 0.5 and keys["resources.num_gpus"][0] == "a number"
    assert all(meaning for _, _, meaning in keys.values())
