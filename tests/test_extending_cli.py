"""What a user extending fedvlp from outside the package meets on the command line: `fedvlp list state` (a method's
state keys and the server rule of each, built without Ray), the warning of a `--set method.name` switch, `base:` in
run configs, the message of a plugin that is found but fails to import, and a broken installed entry point, which
names its distribution and is skipped with FEDVLP_NO_ENTRY_POINTS=1."""
import re
from pathlib import Path

import pytest
import ray
import yaml
from conftest import REPO

from fedvlp import plugins
from fedvlp.cli import main
from fedvlp.config import CONFIGS_DIR, build_spec, load_spec, read_config
from fedvlp.errors import ConfigError
from fedvlp.methods import METHODS

EXAMPLES = REPO / "examples"


def state_rows(out: str) -> dict[str, tuple[str, ...]]:
    """`fedvlp list state` output: key -> (shape, numel, kind, state, server rule, prefix)."""
    lines = out.strip().splitlines()
    assert lines[1].split()[:2] == ["key", "shape"]
    return {key: tuple(rest) for key, *rest in (re.split(r"\s{2,}", line.strip()) for line in lines[2:])}


@pytest.fixture
def no_ray(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("fedvlp list state started Ray")
    monkeypatch.setattr(ray, "init", refuse)


# ---------------------------------------------------------------- fedvlp list state

@pytest.mark.usefixtures("tiny_vilt", "no_ray")
def test_list_state_of_a_method_name_builds_it_on_the_tiny_backbone_of_its_kind(capsys):
    assert main(["list", "state", "fedprime", "--set", "method.pool_size=7"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "fedprime on tiny-vilt, synthetic-recipes (16 classes)"
    rows = state_rows(out)
    assert rows["intra_pool.prompts"] == ("7x128", "896", "trainable", "global", "fedavg", "'' (method)")
    assert rows["intra_pool.query.weight"] == ("128x128", "16384", "trainable", "local", "local",
                                               "'intra_pool.query' (method)")
    assert rows["inter_pool.prompts"] == ("7x128", "896", "trainable", "global", "hungarian",
                                          "'inter_pool.prompts' (method)")
    assert rows["inter_pool.selected"] == ("7", "7", "buffer", "global", "hungarian", "'inter_pool.selected' (method)")
    assert rows["classifier.3.weight"] == ("16x256", "4096", "trainable", "global", "fedavg", "'' (method)")
    assert [key for key, row in rows.items() if row[3] == "local"] == ["intra_pool.query.weight",
                                                                        "inter_pool.query.weight"]


@pytest.mark.usefixtures("tiny_clip", "no_ray")
def test_list_state_of_a_config_shows_the_group_a_server_rules_prefix_aims_at(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    assert main(["list", "state", "quickstart", "--set", "plugins=[fedvlp_examples]",
                 "--set", "server.rules={ctx: trimmed_mean}"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "promptfl on tiny-clip, synthetic-scenes (20 classes)"
    assert state_rows(out) == {  # the quickstart's 16 context vectors of the tiny CLIP's width
        "ctx": ("16x128", "2048", "trainable", "global", "trimmed_mean", "'ctx' (server.rules)"),
        "log_scale": ("scalar", "1", "trainable", "global", "fedavg", "'' (method)"),
        "bias": ("scalar", "1", "trainable", "global", "fedavg", "'' (method)")}


def test_list_state_of_neither_a_method_nor_a_config_and_a_target_elsewhere_are_one_line(capsys):
    assert main(["list", "state", "fedmtp"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"fedvlp: error: list state: fedmtp is neither a registered method ({', '.join(METHODS.names())}) nor a run "
        f"config (a YAML path, or a shipped name: fedvlp list configs)"]
    assert {"fedmpt", "promptfl"} <= set(METHODS.names())
    assert main(["list", "rules", "fedotp"]) == 2
    assert capsys.readouterr().err.strip() == ("fedvlp: error: list rules: takes no METHOD|CONFIG (only list state "
                                               "does), got 'fedotp'")


# ---------------------------------------------------------------- --set method.name on another method's config

def test_a_method_switch_names_the_config_settings_it_drops_in_one_line(capsys):
    dropped = [f"method.{key}" for key in yaml.safe_load((CONFIGS_DIR / "fedmpt_scenes.yaml").read_text())["method"]
               if key != "name"]
    spec = load_spec("fedmpt_scenes", ["method.name=promptfl"])
    assert spec.method.params.lr == 0.002  # promptfl's default, not fedmpt_scenes' tuned lr
    assert capsys.readouterr().err.splitlines() == [
        f"fedvlp: warning: --set method.name=promptfl drops fedmpt's settings {', '.join(dropped)} (promptfl's "
        f"defaults apply); --set a setting after method.name to keep it"]
    assert load_spec("fedmpt_scenes", ["method.name=promptfl", "method.lr=0.07881"]).method.params.lr == 0.07881
    load_spec("fedmpt_scenes", ["method.name=fedmpt", "method.lr=0.1"])  # not a switch
    load_spec("fedmpt_scenes", ["method.name=promptfl"] * 2)  # the second finds nothing of fedmpt's left
    assert capsys.readouterr().err.count("warning") == 2
    load_spec(None, ["method.name=promptfl"])  # the quickstart's own method
    assert capsys.readouterr().err == ""
    with pytest.raises(ConfigError, match="unknown method 'nope'"):
        load_spec("fedmpt_scenes", ["method.name=nope"])
    assert capsys.readouterr().err == ""  # an invalid config says its error alone


def test_the_cli_warns_on_stderr_and_still_runs_the_switched_config(capsys, tmp_path):
    assert main(["run", "fedtpg_scenes", "--set", "method.name=promptfl", "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert yaml.safe_load(out)["method"]["name"] == "promptfl"
    assert len(err.splitlines()) == 1 and err.startswith("fedvlp: warning: --set method.name=promptfl drops "
                                                         "fedtpg's settings method.")


# ---------------------------------------------------------------- base: in run configs

def write(path: Path, mapping: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(mapping))
    return path


def test_a_run_config_with_a_base_is_the_base_with_its_sections_merged_over(tmp_path, monkeypatch):
    write(tmp_path / "mine" / "short.yaml", {
        "base": "fedmpt_scenes", "federation": {"rounds": 2}, "method": {"lr": 0.5},
        "server": {"rules": {"adapter.": "mean"}, "options": {"fedadam": {"lr": 0.1}}}})
    write(tmp_path / "mine" / "deeper" / "other.yaml", {
        "base": "../short.yaml", "method": {"name": "promptfl", "n_ctx": 8}, "data": {"num_train": 300}})
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # a relative base is relative to the file that names it
    short = load_spec(tmp_path / "mine" / "short.yaml")
    assert short.to_dict() == load_spec("fedmpt_scenes", [
        "federation.rounds=2", "method.lr=0.5", "server.rules={'adapter.': mean}",
        "server.options={fedadam: {lr: 0.1}}"]).to_dict()
    base_epochs = load_spec("fedmpt_scenes").method.params.local_epochs
    assert short.method.params.local_epochs == base_epochs and short.data.mask_as == "negative"  # the base's
    other = load_spec(tmp_path / "mine" / "deeper" / "other.yaml", ["federation.rounds=3"])
    # another method: the base's fedmpt settings are not carried over; every other section is
    assert other.method.params.lr == 0.002 and other.method.params.n_ctx == 8
    assert (other.federation.rounds, other.data.num_train, other.data.mask_as, other.server.rules) == \
        (3, 300, "negative", {"adapter.": "mean"})
    assert main(["run", str(tmp_path / "mine" / "deeper" / "other.yaml"), "--print-config"]) == 0


def test_a_missing_base_and_a_cycle_are_one_line_errors(tmp_path, capsys):
    missing = write(tmp_path / "missing.yaml", {"base": "no_such_config", "seed": 1})
    assert main(["run", str(missing), "--print-config"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"fedvlp: error: {missing}: base: no_such_config not found; expected a run config file relative to "
        f"{tmp_path} or a shipped config name (fedvlp list configs)"]
    one = write(tmp_path / "one.yaml", {"base": "two.yaml"})
    write(tmp_path / "two.yaml", {"base": "three.yaml"})
    write(tmp_path / "three.yaml", {"base": "one.yaml"})
    assert main(["run", str(one), "--print-config"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"fedvlp: error: {tmp_path / 'three.yaml'}: base: one.yaml makes a cycle (one.yaml -> two.yaml -> "
        f"three.yaml -> one.yaml); expected a chain of bases that ends"]
    with pytest.raises(ConfigError, match=r"itself\.yaml: base: itself\.yaml makes a cycle \(itself\.yaml -> "):
        read_config(write(tmp_path / "itself.yaml", {"base": "itself.yaml"}))
    with pytest.raises(ConfigError, match=r"list\.yaml: base: expected a run config file or a shipped config name, "
                                          r"got \['quickstart'\]"):
        read_config(write(tmp_path / "list.yaml", {"base": ["quickstart"]}))
    with pytest.raises(ConfigError, match=r"^base: 'quickstart' is not resolved here; expected a mapping read by "
                                          r"read_config"):
        build_spec({"base": "quickstart"})


def test_sweeps_and_tuning_resolve_a_run_configs_base(tmp_path):
    from fedvlp.platform.studies.spaces import load_sweep
    from fedvlp.platform.studies.tune import load_tune

    config = write(tmp_path / "mine.yaml", {"base": "fedmpt_scenes", "method": {"lr": 0.123},
                                            "federation": {"rounds": 1}})
    tuned = load_tune(config, budget=1, storage=tmp_path / "ray_results")
    assert tuned.method == "fedmpt" and tuned.raw["method"]["lr"] == 0.123 and "base" not in tuned.raw
    assert tuned.raw["method"]["gate"] == read_config(CONFIGS_DIR / "fedmpt_scenes.yaml")["method"]["gate"]
    space = write(tmp_path / "space.yaml", {"base": "mine.yaml", "space": {"data.label_mask": {"grid": [0.1]}},
                                            "metric": "val_mAP", "method_settings": {"fedmpt": "mine.yaml"}})
    sweep = load_sweep(space)
    assert sweep.base["method"]["name"] == "fedmpt" and sweep.base["method"]["lr"] == 0.123
    assert sweep.base["federation"]["rounds"] == 1 and "base" not in sweep.base


# ---------------------------------------------------------------- a plugin that is found but fails to import

@pytest.mark.parametrize("files, module, line, reason", [
    ({"badimport.py": "import os\n\nfrom fedvlp.methods.base import NoSuchThing\n"}, "badimport.py", 3,
     "ImportError: cannot import name 'NoSuchThing' from 'fedvlp.methods.base'"),
    ({"baddep.py": "import no_such_dependency_xyz\n"}, "baddep.py", 1,
     "ModuleNotFoundError: No module named 'no_such_dependency_xyz'"),
    ({"badpkg/__init__.py": "from badpkg import inner\n", "badpkg/inner.py": "x = 1\nraise RuntimeError('boom')\n"},
     "badpkg/inner.py", 2, "RuntimeError: boom"),
    # raised inside fedvlp: the line is the plugin's call, not fedvlp's registry
    ({"dupe.py": "from fedvlp.platform.aggregation import ServerRule, register_rule\n\n"
                 "register_rule(ServerRule('fedavg', 'average', None))\n"}, "dupe.py", 3,
     "ValueError: server rule 'fedavg' is registered twice; pick another name"),
], ids=["import", "dependency", "package", "registration"])
def test_a_plugin_that_raises_while_importing_says_what_and_where(tmp_path, monkeypatch, capsys, files, module, line,
                                                                   reason):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    name = Path(module).parts[0].removesuffix(".py")
    assert main(["list", "methods", "--set", f"plugins=[{name}]"]) == 2
    (err,) = capsys.readouterr().err.splitlines()
    assert err.startswith(f"fedvlp: error: plugins: {name!r} was found, but importing it failed at "
                          f"{tmp_path / module}:{line} with {reason}")
    assert "expected a module on the Python path" not in err


def test_a_plugin_that_is_not_there_still_says_where_it_was_looked_for(capsys):
    assert main(["list", "methods", "--set", "plugins=[no_such_plugin_xyz]"]) == 2
    assert capsys.readouterr().err.strip() == (
        "fedvlp: error: plugins: cannot import 'no_such_plugin_xyz' (ModuleNotFoundError: No module named "
        "'no_such_plugin_xyz'); expected a module on the Python path (pip install it, or run from its parent "
        "directory)")


# ---------------------------------------------------------------- a broken installed entry point

@pytest.fixture
def broken_distribution(tmp_path, monkeypatch):
    """An installed distribution `brokenplug` 0.3 (its dist-info on sys.path, as site-packages holds it) whose
    fedvlp.plugins entry point raises on import; entry points load again in this process."""
    info = tmp_path / "brokenplug-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenplug\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text("[fedvlp.plugins]\nbroken = brokenplug\n")
    (tmp_path / "brokenplug.py").write_text("raise ImportError('brokenplug needs torch 9')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_entry_points_loaded", False)
    monkeypatch.delenv(plugins.NO_ENTRY_POINTS, raising=False)
    return tmp_path


def test_a_broken_entry_point_names_its_distribution_and_can_be_skipped(broken_distribution, monkeypatch, capsys):
    assert main(["list", "methods"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"fedvlp: error: plugins: the entry point broken = brokenplug (group fedvlp.plugins, from the installed "
        f"distribution brokenplug 0.3) was found, but importing it failed at {broken_distribution / 'brokenplug.py'}:1 "
        f"with ImportError: brokenplug needs torch 9; pip uninstall brokenplug, or set FEDVLP_NO_ENTRY_POINTS=1 to "
        f"skip installed plugins"]
    monkeypatch.setattr(plugins, "_entry_points_loaded", False)
    monkeypatch.setenv("FEDVLP_NO_ENTRY_POINTS", "1")
    assert main(["list", "methods"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "promptfl" in out.split()
    assert main(["run", "--print-config"]) == 0 and capsys.readouterr().err == ""


def test_skipping_entry_points_reaches_the_processes_a_run_starts(monkeypatch):
    """Local Ray workers inherit the driver's environment, a cluster's nodes do not: the runtime env carries it."""
    monkeypatch.delenv(plugins.NO_ENTRY_POINTS, raising=False)
    assert plugins.runtime_env([]) is None and plugins.actor_runtime_env([]) is None
    monkeypatch.setenv(plugins.NO_ENTRY_POINTS, "1")
    assert plugins.runtime_env([]) == plugins.actor_runtime_env([]) == {"env_vars": {"FEDVLP_NO_ENTRY_POINTS": "1"}}
    monkeypatch.setenv(plugins.NO_ENTRY_POINTS, "0")
    assert plugins.runtime_env([]) is None
