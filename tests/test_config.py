"""Config: YAML + --set -> a validated RunSpec; bad input is one line naming the key, before Ray starts.
Every shipped config and search space loads and validates."""
import pytest
from conftest import fedvlp_cli

from fedvlp.config import CONFIGS_DIR, DEFAULT_CONFIG, SPACES_DIR, load_spec, parse_override
from fedvlp.errors import ConfigError

REAL_DATASETS = ("voc2007", "coco2014", "nuswide", "food101", "mmimdb")


@pytest.mark.parametrize("path", sorted(CONFIGS_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_config_loads_and_validates(path, tmp_path):
    """Configs of datasets on disk get a root here (their readers are tested on real layouts elsewhere)."""
    overrides = [f"data.root={tmp_path}"] if any(f"_{d}" in path.stem for d in REAL_DATASETS) else []
    spec = load_spec(path.stem, overrides)  # by its shipped name
    assert spec.to_dict()["method"]["name"] == spec.method.name
    assert load_spec(path, overrides).to_dict() == spec.to_dict()  # by its path too


@pytest.mark.parametrize("path", sorted(SPACES_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_space_loads_validates_and_selects_on_val(path):
    from fedvlp.platform.studies.spaces import load_sweep

    sweep = load_sweep(path.stem)
    assert sweep.swept_keys and sweep.metric.startswith("val_")
    assert len(sweep.seeds) >= 3 or path.stem == "smoke", f"{path.name}: a study needs at least 3 seeds"


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


def test_yaml_exponents_without_a_dot_are_numbers():
    """YAML 1.1 reads 1e-5 as a string; for a number field it is meant as a number."""
    spec = load_spec(None, ["privacy.delta=1e-7", "method.lr=3E-4"])
    assert spec.privacy.delta == 1e-7 and spec.method.params.lr == 3e-4
    with pytest.raises(ConfigError, match=r"method\.lr: expected a number, got 'fast'"):
        load_spec(None, ["method.lr=fast"])


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
    ("data.name=imagenet", r"data\.name: unknown dataset 'imagenet' \(expected one of: coco2014, food101"),
    ("federation.partition=kmeans",
     r"federation\.partition: unknown partitioner 'kmeans' \(expected one of: dirichlet"),
    ("plugins=[no_such_plugin_module]", r"plugins: cannot import 'no_such_plugin_module' \(ModuleNotFoundError"),
    ("data.options={top_k: 3}", r"data\.options: takes no options"),
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


def test_override_order_and_a_method_switch_that_drops_earlier_keys(capsys):
    spec = load_spec(None, ["method.name=fedavg_p", "backbone.name=tiny-vilt", "data.name=synthetic-recipes",
                            "method.lr=0.2"])
    assert spec.method.params.lr == 0.2 and capsys.readouterr().err.strip() == (
        "fedvlp: warning: --set method.name=fedavg_p drops promptfl's settings method.n_ctx, method.ctx_init, "
        "method.lr, method.batch_size, method.local_epochs (fedavg_p's defaults apply); --set a setting after "
        "method.name to keep it")
    spec = load_spec("fedavg_p_recipes", ["method.prox_mu=1", "method.name=fedprox_p"])
    assert spec.method.params.prox_mu == 0.01  # the switch dropped it, and says so in one line
    assert capsys.readouterr().err.strip() == (
        "fedvlp: warning: --set method.name=fedprox_p drops fedavg_p's settings method.prompt_length, "
        "method.prompt_layers, method.lr, method.prompt_lr, method.prompt_attention, method.batch_size, "
        "method.local_epochs, "
        "method.prox_mu (fedprox_p's "
        "defaults apply); method.prox_mu came from an earlier --set: give --set method.name first")
    assert load_spec("fedavg_p_recipes", ["method.name=fedprox_p", "method.prox_mu=1"]).method.params.prox_mu == 1


def test_shipped_configs_resolve_by_name_and_unknown_names_are_one_line():
    assert load_spec("fedmpt_scenes").method.name == "fedmpt"
    with pytest.raises(ConfigError, match=r"^nope: config file not found; expected a YAML file or a shipped config "
                                          r"name \(centralized_p_recipes, "):
        load_spec("nope")


def test_cli_rejects_bad_input_with_one_line_and_no_ray(tmp_path):
    proc = fedvlp_cli(["run", "--set", "federation.heterogeneity=1.5"], cwd=tmp_path)
    assert proc.returncode == 2
    expected = "fedvlp: error: federation.heterogeneity: expected a value <= 1, got 1.5"
    assert proc.stderr.strip().splitlines() == [expected]
    assert not (tmp_path / "mlflow.db").exists()  # rejected before any tracking or cluster work


def test_list_keys_names_every_key_with_its_meaning():
    from fedvlp.config import describe_keys

    keys = {key: (kind, value, meaning) for key, kind, value, meaning in describe_keys(load_spec(None))}
    assert keys["method.lr"] == ("a number", 0.2787, "Adam learning rate [tuned: loguniform [0.0003, 3]]")
    assert keys["federation.heterogeneity"][1] == 0.5 and keys["resources.num_gpus"][0] == "a number"
    assert all(meaning for _, _, meaning in keys.values())


def test_methods_of_one_backbone_family_declare_the_same_ranges_for_the_keys_they_share():
    """`fedvlp tune` gives every method the same budget; it must also search the same space for lr and local epochs,
    or an equal budget favours the method with the kinder range."""
    from fedvlp.methods import METHODS
    from fedvlp.spec import (
        CLIP_EPOCHS_RANGE,
        CLIP_LR_RANGE,
        VILT_EPOCHS_RANGE,
        VILT_LR_RANGE,
        VILT_PROMPT_LR_RANGE,
        tuning_ranges,
    )

    families = {"global": {}, "tokens": {}, "embeddings": {}}
    for name in METHODS.names():
        method = METHODS[name]
        ranges = tuning_ranges(method.Params)
        if "lr" in ranges:
            families[method.feature_kind][name] = (ranges["lr"], ranges["local_epochs"])
    clip = {**families["global"], **families["tokens"]}
    vilt = families["embeddings"]
    assert {"promptfl", "fedmpt", "dualcoop", "fedotp", "fedtpg", "fedlora"} <= set(clip)
    assert {"fedprime", "fedavg_p", "fedlora_vilt"} <= set(vilt)
    assert set(clip.values()) == {(CLIP_LR_RANGE, CLIP_EPOCHS_RANGE)}
    assert set(vilt.values()) == {(VILT_LR_RANGE, VILT_EPOCHS_RANGE)}
    # the ViLT prompt methods' own prompt learning rate: declared, and alike, for every one of them
    prompt_lrs = {name: tuning_ranges(METHODS[name].Params).get("prompt_lr") for name in vilt}
    assert {name for name, r in prompt_lrs.items() if r} == {"fedavg_p", "fedprox_p", "fedprime"}
    assert {r for r in prompt_lrs.values() if r} == {VILT_PROMPT_LR_RANGE}
