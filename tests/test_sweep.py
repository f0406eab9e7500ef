"""Sweeps and tuning: space-file validation, a real Ray Tune run tracked as one MLflow experiment, kill + --resume,
ASHA, `fedvlp tune`, and the rule that nothing that selects ever reads a test metric."""
import dataclasses
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import CLI_TIMEOUT_S, fedvlp_cli
from mlflow import MlflowClient

from fedvlp.config import load_spec
from fedvlp.errors import ConfigError, FedvlpError
from fedvlp.platform.runtime.engine import run_federated
from fedvlp.platform.studies.spaces import load_sweep, trial_spec
from fedvlp.platform.studies.sweep import (
    default_ray_temp_dir,
    recover_cut_state,
    staged_copies,
    tune_config,
    whole_state,
)

QUICKSTART = load_spec("quickstart")
SMALL = {"federation.rounds": 2, "federation.clients": 4, "data.num_train": 600, "data.num_val": 256,
         "data.num_test": 256, "data.num_holdout": 100, "method.local_epochs": 2, "resources.workers": 1,
         "resources.num_cpus": 0.5, "resources.coordinator_cpus": 0.25}


def write_space(tmp_path, name="t", **fields) -> Path:
    space = {"base": "quickstart", "name": name, "set": dict(SMALL),
             "space": {"method.name": {"grid": ["promptfl", "zeroshot"]}}, "seeds": [0], "metric": "val_mAP",
             "mode": "max", "max_concurrent_trials": 2, "storage": str(tmp_path / "ray_results"), **fields}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(space))
    return path


def test_trial_spec_applies_values_switches_method_and_names_the_run(tmp_path):
    sweep = load_sweep(write_space(tmp_path, set={**SMALL, "method.lr": 0.01},
                                   space={"method.name": {"grid": ["promptfl", "zeroshot"]},
                                          "federation.heterogeneity": {"grid": [0.1, 1.0]}}))
    promptfl = trial_spec(sweep, {"method.name": "promptfl", "federation.heterogeneity": 0.1, "seed": 3}, "p")
    zeroshot = trial_spec(sweep, {"method.name": "zeroshot", "federation.heterogeneity": 1.0, "seed": 3}, "p")
    assert promptfl.method.params.lr == 0.01 and promptfl.seed == 3
    assert zeroshot.method.name == "zeroshot" and zeroshot.federation.rounds == 2
    assert promptfl.tracking.experiment == "sweep-t" and promptfl.tracking.uri.startswith("sqlite:////")
    assert promptfl.tracking.run_name == "promptfl heterogeneity=0.1 seed 3"


@pytest.mark.parametrize("fields, message", [
    ({"bogus": 1}, r"bogus: unknown key"),
    ({"space": {"federation.heterogeneity": {"grid": [0.1, 1.5]}}},
     r"trial .*federation\.heterogeneity: expected a value <= 1, got 1\.5"),
    ({"space": {"federation.nope": {"grid": [1]}}}, r"federation\.nope: unknown key"),
    ({"space": {"method.lr": {"normal": [0, 1]}}}, r"space\.method\.lr: expected one of \{grid"),
    ({"space": {"method.lr": {"loguniform": [0, 1]}}}, r"space\.method\.lr\.loguniform: expected \[low, high\]"),
    ({"seeds": []}, r"seeds: expected a non-empty list"),
    ({"mode": "maximum"}, r"mode: expected max or min"),
    ({"scheduler": {"type": "hyperband"}}, r"scheduler: expected \{type: none\}"),
    ({"max_concurrent_trials": 0}, r"max_concurrent_trials: expected an integer >= 1"),
    ({"base": "no_such_config"}, r"base: no_such_config not found"),
])
def test_bad_space_files_name_the_key(tmp_path, fields, message):
    with pytest.raises(ConfigError, match=message):
        load_sweep(write_space(tmp_path, **fields))


@pytest.mark.parametrize("metric", ["test_mAP", "personal_mAP", "personal_mAP_std", "shift_mAP", "mAP",
                                    "personal_test_mAP"])
def test_no_selection_path_accepts_a_test_metric(tmp_path, metric):
    """A sweep's best trial and ASHA read the space file's metric, `fedvlp tune` its --metric: each refuses
    anything but a val_* or personal_val_* metric (personal_* is the clients' local test sets), even when the check
    at load time is bypassed."""
    from fedvlp.platform.studies.tune import load_tune, run_tune

    with pytest.raises(ConfigError, match=rf"metric: expected a val_\* metric .* got '{metric}'"):
        load_sweep(write_space(tmp_path, metric=metric))
    sweep = dataclasses.replace(load_sweep(write_space(tmp_path)), metric=metric, scheduler={"type": "asha"})
    with pytest.raises(ConfigError, match=r"expected a val_\* metric"):
        tune_config(sweep)
    with pytest.raises(ConfigError, match=rf"--metric: expected a val_\* metric .* got '{metric}'"):
        load_tune("quickstart", budget=2, metric=metric)
    tune_spec = dataclasses.replace(load_tune("quickstart", budget=2), metric=metric)
    with pytest.raises(ConfigError, match=r"--metric: expected a val_\* metric"):
        run_tune(tune_spec)


def test_a_personalised_method_is_tuned_on_its_clients_local_val_sets(tmp_path):
    """FedOTP declares its clients' own models as what it is tuned on: `fedvlp tune` selects it on
    personal_val_mAP by default (never personal_mAP, the local test sets), and sweeps and --metric accept it."""
    from fedvlp.platform.studies.tune import load_tune

    assert load_tune("fedotp_scenes", budget=2).metric == "personal_val_mAP"
    assert load_tune("quickstart", budget=2).metric == "val_mAP"
    assert load_tune("fedavg_p_recipes", budget=2).metric == "val_accuracy"
    assert load_tune("quickstart", budget=2, metric="personal_val_mAP").metric == "personal_val_mAP"
    assert load_sweep(write_space(tmp_path, metric="personal_val_mAP")).metric == "personal_val_mAP"


def _nested_runs(uri: str, experiment: str):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("fedvlp.role") in ("sweep", "tune")]
    trials = [r for r in runs if r.data.tags.get("fedvlp.role") == "trial"]
    return client, parents, trials


def test_a_reset_actor_starts_as_a_new_process_would():
    import torch

    from fedvlp.seeding import new_process_seed, reset_reused_actor

    class Actor:
        def __init__(self, key: int):
            self.key, self.draw = key, torch.rand(3)  # a draw from torch's global generator

    torch.manual_seed(new_process_seed())
    new = Actor(1)
    reused = Actor(0)
    reused.left_over = "the last run's"
    torch.rand(100)  # the last run moved the global generator on
    reset_reused_actor(reused, 1)
    assert vars(reused).keys() == {"key", "draw"} and reused.key == 1 and torch.equal(reused.draw, new.draw)


@pytest.mark.usefixtures("tiny_clip")
def test_a_trial_on_a_finished_trials_actors_computes_what_new_actors_would(tmp_path, ray_cluster, tracking_uri):
    """Tune reuses a finished trial's process and placement group, and the engine resets the actors it left there
    for the next trial: each trial ends exactly where a run on new actors ends, whatever ran there before."""
    from fedvlp.platform.studies.sweep import run_sweep

    space = write_space(tmp_path, name="reuse", max_concurrent_trials=1,
                        space={"method.name": {"grid": ["fedlora", "fedtpg", "promptfl"]}},
                        set={**SMALL, "tracking.uri": tracking_uri, "output_dir": str(tmp_path / "runs")})
    sweep = load_sweep(space)
    run_sweep(sweep, progress=False)
    client, _, trials = _nested_runs(tracking_uri, "sweep-reuse")
    assert sorted(t.data.tags["actors"] for t in trials) == ["new", "reused", "reused"]
    for trial in trials:
        method = trial.data.tags["swept.method.name"]
        spec = trial_spec(sweep, {"method.name": method, "seed": 0}, "check")
        new = run_federated(dataclasses.replace(spec, tracking=dataclasses.replace(spec.tracking, experiment="new")),
                            progress=False)
        logged = client.get_run(trial.info.run_id).data.metrics
        assert (logged["val_mAP"], logged["test_mAP"]) == (new.final["val_mAP"], new.final["test_mAP"]), method


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_sweep_runs_trials_as_nested_mlflow_runs_and_reports(tmp_path, tracking_uri):
    uri = tracking_uri
    space = write_space(tmp_path, name="nested", seeds=[0, 1], reference="zeroshot",
                        set={**SMALL, "tracking.uri": uri, "output_dir": str(tmp_path / "runs")})
    proc = fedvlp_cli(["sweep", str(space), "--report"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"^sweep nested: 4 trials, \d at a time$", proc.stdout, re.M), proc.stdout[:2000]
    assert re.search(r"sweep: 4/4 trials done, 0 running; \d+m\d\ds elapsed, about 0m00s left; best last-round "
                     r"val_mAP 0\.\d{4} \(method\.name=\w+, seed=\d\)", proc.stdout), proc.stdout[-2000:]
    client, parents, trials = _nested_runs(uri, "sweep-nested")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(trials) == 4 and {t.info.status for t in trials} == {"FINISHED"}
    parent_id = parents[0].info.run_id
    assert sorted(t.info.run_name for t in trials) == ["promptfl seed 0", "promptfl seed 1", "zeroshot seed 0",
                                                       "zeroshot seed 1"]
    for trial in trials:
        tags = trial.data.tags
        assert tags["mlflow.parentRunId"] == parent_id and tags["sweep"] == "nested"
        assert [m.step for m in client.get_metric_history(trial.info.run_id, "val_mAP")] == [0, 1, 2]
    report = tmp_path / "reports" / "sweep-nested"
    assert (report / "summary.md").exists() and (report / "by_method.md").exists()
    assert (report / "val_mAP_vs_round.png").exists() and "](val_mAP_vs_round.png)" in (report / "index.md").read_text()
    assert {a.path for a in client.list_artifacts(parent_id, "report")} >= {"report/summary.csv", "report/by_method.md"}
    summary = client.get_run(parent_id).data.metrics  # the parent run carries the summary
    assert {"promptfl/val_mAP_mean", "promptfl/test_mAP_mean", "promptfl/val_mAP_ci95", "promptfl/val_mAP_diff",
            "zeroshot/test_mAP_mean"} <= set(summary)


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_killed_sweep_resumes_with_one_run_per_trial(tmp_path, ray_cluster, tracking_uri):
    """Kill -9 the sweep's driver while its promptfl trial is mid-run (checked in the store), --resume: every trial
    ends once, none duplicated or left RUNNING, and the resumed one ends where an uninterrupted run ends."""
    ROUNDS = 6  # noqa: N806
    uri = tracking_uri
    space = write_space(tmp_path, name="resume", seeds=[0], max_concurrent_trials=1,  # promptfl runs when killed
                        space={"method.name": {"grid": ["zeroshot", "promptfl"]}},
                        set={**SMALL, "federation.rounds": ROUNDS, "tracking.uri": uri,
                             "output_dir": str(tmp_path / "runs")})
    log = open(tmp_path / "first.log", "w")
    first = subprocess.Popen([sys.executable, "-m", "fedvlp", "sweep", str(space)], cwd=tmp_path, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
    client = MlflowClient(uri)

    def promptfl_rounds() -> list[int]:  # the rounds the promptfl trial has logged so far
        found = client.search_experiments(filter_string="name = 'sweep-resume'")
        runs = client.search_runs([found[0].experiment_id], "tags.`swept.method.name` = 'promptfl'") if found else []
        return [m.step for m in client.get_metric_history(runs[0].info.run_id, "train_loss")] if runs else []

    try:  # kill once promptfl has logged its first round: with ROUNDS - 1 rounds to go, the kill lands mid-trial
        deadline = time.time() + CLI_TIMEOUT_S
        while not promptfl_rounds():
            assert first.poll() is None and time.time() < deadline, (tmp_path / "first.log").read_text()[-2000:]
            time.sleep(0.2)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the driver dies mid-sweep, its local Ray with it
        first.wait()
    (killed,) = client.search_runs([client.get_experiment_by_name("sweep-resume").experiment_id],
                                   "tags.`swept.method.name` = 'promptfl'")
    assert killed.info.status == "RUNNING" and max(promptfl_rounds()) < ROUNDS  # unfinished when the kill landed
    # a kill in Tune's copy of its state to the experiment folder cuts that copy: cut it so, where the staged one is
    # whole (a kill in the staged write leaves the folder's copy whole instead), and --resume must put it back
    (state,) = (tmp_path / "ray_results" / "resume").glob("experiment_state-*.json")
    cut = any(whole_state(copy) for copy in staged_copies(state.parent, state.name, default_ray_temp_dir()))
    if cut:
        state.write_bytes(state.read_bytes()[:100])
    time.sleep(3)
    again = fedvlp_cli(["sweep", str(space), "--resume"], cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert ("was cut off when the driver died" in again.stderr) == cut
    client, parents, trials = _nested_runs(uri, "sweep-resume")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    keys = sorted((t.data.tags["swept.method.name"], t.data.tags["seed"]) for t in trials)
    assert keys == [("promptfl", "0"), ("zeroshot", "0")]  # none duplicated
    assert {t.info.status for t in trials} == {"FINISHED"}  # none left RUNNING
    for trial in trials:
        steps = [m.step for m in client.get_metric_history(trial.info.run_id, "val_mAP")]
        assert sorted(set(steps)) == list(range(ROUNDS + 1))
    again_again = fedvlp_cli(["sweep", str(space)], cwd=tmp_path)
    assert again_again.returncode == 2 and "pass --resume" in again_again.stderr
    # a resumed trial ends exactly where the same run uninterrupted ends (on the session's Ray)
    sweep = load_sweep(space)
    for trial in trials:
        if trial.data.tags["swept.method.name"] == "promptfl":
            spec = trial_spec(sweep, {"method.name": "promptfl", "seed": int(trial.data.tags["seed"])}, "check")
            spec = dataclasses.replace(spec, tracking=dataclasses.replace(spec.tracking, experiment="whole"))
            whole = run_federated(spec, progress=False)
            assert client.get_run(trial.info.run_id).data.metrics["val_mAP"] == whole.final["val_mAP"]


def test_resume_puts_back_a_state_file_cut_off_by_the_kill_from_tunes_staged_copy(tmp_path):
    """Tune's layouts: its experiment folder, and its driver's staging folder under Ray's temp folder."""
    experiment = tmp_path / "ray_results" / "resume"
    experiment.mkdir(parents=True)
    state = '{"trial_data": [], "runner_data": {}}'
    (experiment / "experiment_state-2026-12-06_10-14-30.json").write_text(state[:9])  # the copy the kill cut
    searcher = pickle.dumps({"_finished": False})  # a searcher's state is a pickle, whatever its name ends with
    (experiment / "basic-variant-state-2026-12-06_10-14-30.json").write_bytes(searcher)
    (experiment / "fedvlp_sweep.json").write_text('{"parent_run_id": "x"}')
    temp = tmp_path / "ray"
    for session, text in (("session_2026-12-06_10-14-28_1", state), ("session_2026-12-06_09-00-00_2", "")):
        staging = temp / session / "artifacts" / "2026-12-06_10-14-30" / "resume" / "driver_artifacts"
        staging.mkdir(parents=True)
        (staging / "experiment_state-2026-12-06_10-14-30.json").write_text(text)
    assert recover_cut_state(experiment, temp) == ["experiment_state-2026-12-06_10-14-30.json"]
    assert (experiment / "experiment_state-2026-12-06_10-14-30.json").read_text() == state
    assert (experiment / "basic-variant-state-2026-12-06_10-14-30.json").read_bytes() == searcher
    assert recover_cut_state(experiment, temp) == []  # whole files are left alone
    (experiment / "basic-variant-state-2026-12-06_10-14-30.json").write_bytes(searcher[:-5])  # no staged copy
    with pytest.raises(FedvlpError, match=r"basic-variant-state-2026-12-06_10-14-30\.json was cut off .* remove "):
        recover_cut_state(experiment, temp)


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_asha_stops_weak_trials_on_val_and_leaves_no_run_running(tmp_path, tracking_uri):
    uri = tracking_uri
    space = write_space(tmp_path, name="asha", seeds=[0, 1], max_concurrent_trials=1,
                        scheduler={"type": "asha", "grace_period": 1, "reduction_factor": 2},
                        set={**SMALL, "federation.rounds": 3, "tracking.uri": uri, "output_dir": str(tmp_path / "r")})
    proc = fedvlp_cli(["sweep", str(space)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, parents, trials = _nested_runs(uri, "sweep-asha")
    assert len(trials) == 4 and "RUNNING" not in {t.info.status for t in trials}
    rounds = {t.info.run_id: max(m.step for m in client.get_metric_history(t.info.run_id, "val_mAP")) for t in trials}
    stopped = [t for t in trials if t.data.tags.get("stopped_early") == "true"]
    assert stopped  # ASHA cut some (a trial may log one more round before Tune's stop reaches it)
    assert any(r == 3 for t, r in rounds.items() if t not in {s.info.run_id for s in stopped})


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_tune_searches_the_methods_ranges_on_val_and_writes_a_config_fedvlp_runs(tmp_path, tracking_uri):
    uri = tracking_uri
    out = tmp_path / "tuned.yaml"
    sets = [a for k, v in {**SMALL, "federation.rounds": 1, "tracking.uri": uri,
                           "output_dir": str(tmp_path / "runs")}.items() for a in ("--set", f"{k}={v}")]
    proc = fedvlp_cli(["tune", "quickstart", "--budget", "2", "--seeds", "0", "1", "--out", str(out), *sets],
                      cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, parents, trials = _nested_runs(uri, "tune-quickstart")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED" and len(trials) == 4  # 2 trials x 2 seeds
    best = {k[len("best."):]: v for k, v in parents[0].data.tags.items() if k.startswith("best.")}
    assert set(best) == {"method.lr", "method.local_epochs"}
    assert parents[0].data.tags["guided_trials"] == "1"  # TPE's random start-up is half the budget
    assert {parents[0].data.tags[f"edge.{k}"] for k in best} <= {"no", "low", "high"}
    by_trial = {}
    for trial in trials:
        values = tuple(trial.data.tags[f"tuned.{k}"] for k in sorted(best))
        by_trial.setdefault(values, []).append(trial.data.metrics["val_mAP"])
    objective = parents[0].data.metrics["best_val_mAP"]
    assert objective == pytest.approx(max(sum(v) / len(v) for v in by_trial.values()))  # the mean over seeds
    text = out.read_text()
    assert text.startswith("# Tuned with `fedvlp tune quickstart --budget 2 --seeds 0 1`")
    tuned = yaml.safe_load(text)
    assert tuned["method"]["local_epochs"] == int(best["method.local_epochs"])
    assert tuned["method"]["lr"] == pytest.approx(float(best["method.lr"]), rel=1e-3)
    run = fedvlp_cli(["run", str(out), "--print-config"], cwd=tmp_path)
    assert run.returncode == 0 and f"local_epochs: {tuned['method']['local_epochs']}" in run.stdout


def test_tpe_starts_on_half_the_budget_and_a_winner_at_a_range_edge_is_named():
    from fedvlp.platform.studies.tune import random_trials, range_edges
    from fedvlp.spec import CLIP_EPOCHS_RANGE, CLIP_LR_RANGE, choices

    assert [random_trials(b) for b in (1, 2, 12, 13)] == [1, 1, 6, 6]  # at most half, at least one
    ranges = {"method.local_epochs": CLIP_EPOCHS_RANGE, "method.lr": CLIP_LR_RANGE, "method.x": choices("a", "b")}
    top = int(CLIP_EPOCHS_RANGE.high)
    assert range_edges({"method.local_epochs": top, "method.lr": 0.03, "method.x": "a"}, ranges) == {
        "method.local_epochs": "high"}
    assert range_edges({"method.local_epochs": 1, "method.lr": 2.5}, ranges) == {"method.local_epochs": "low",
                                                                              "method.lr": "high"}
    # within 5 % of the log span of [3e-4, 3] from its floor (3e-4 * 10 ** 0.2 = 4.75e-4), or not
    assert range_edges({"method.local_epochs": 7, "method.lr": 4.7e-4}, ranges) == {"method.lr": "low"}
    assert range_edges({"method.local_epochs": 7, "method.lr": 4.8e-4}, ranges) == {}


def test_the_sweep_console_counts_trials_of_the_total_and_labels_the_last_round(capsys, tmp_path):
    """One line per finished trial: done of the total, running, failed, time elapsed and left, and the best trial by
    its last round's metric (what reports read), the swept keys in full."""
    from types import SimpleNamespace

    from fedvlp.platform.studies.sweep import sweep_progress

    progress = sweep_progress("val_mAP", "max", total=4)
    trial = lambda name, status, last: SimpleNamespace(  # noqa: E731
        config={"method.name": name, "seed": 0}, status=status, last_result={"val_mAP": last})
    first, second = trial("promptfl", "RUNNING", 0.91), trial("fedmpt", "RUNNING", 0.93)
    progress.on_trial_complete(1, [first, second], first)
    first.status = "TERMINATED"
    progress.on_trial_error(1, [first, second], second)
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"sweep: 1/4 trials done, 1 running; 0m0\ds elapsed, about 0m0\ds left; best last-round "
                        r"val_mAP 0\.9100 \(method\.name=promptfl, seed=0\)  "
                        r"\[method\.name=promptfl, seed=0 finished\]", lines[0]), lines[0]
    assert lines[1].startswith("sweep: 1/4 trials done, 0 running, 1 failed;") and "FAILED" in lines[1]
    assert load_sweep(write_space(tmp_path, seeds=[0, 1, 2])).trial_count == 6  # 2 methods x 3 seeds


def test_a_study_is_cut_down_from_the_command_line():
    """--seeds, --methods and --values cut a shipped study without copying its file: the participation study's 70
    trials to 4, its minutes estimated from what a trial took; a cut that names what the space lacks is one line."""
    whole = load_sweep("participation")
    assert whole.trial_count == 70 and whole.minutes_per_trial == 0.66
    cut = load_sweep("participation", seeds=[0], methods=["promptfl", "fedmpt"],
                     grids=["federation.participation=0.1,1.0"])
    assert cut.trial_count == 4 and cut.seeds == (0,)
    assert cut.space["method.name"] == ("grid", ["fedmpt", "promptfl"])  # the space's order
    assert load_sweep("participation", grids=["federation.participation=0.5"]).space["federation.participation"] \
        == ("grid", [0.5])
    variants = load_sweep("fedprime_settings", methods=["fedprime", "fedavg_p"], seeds=[0])
    assert variants.trial_count == 6 and set(variants.variants) == {"fedprime", "fedavg_p"}
    with pytest.raises(ConfigError, match=r"--methods: fedprime not in this space; expected some of fedmpt, "):
        load_sweep("participation", methods=["fedprime"])
    with pytest.raises(ConfigError, match=r"--values federation\.rounds: not a grid key of this space; expected one "
                                          r"of federation\.participation, method\.name"):
        load_sweep("participation", grids=["federation.rounds=1,2"])
    with pytest.raises(ConfigError, match=r"--values: expected KEY=V1,V2,\.\.\., got 'federation\.participation'"):
        load_sweep("participation", grids=["federation.participation"])
    with pytest.raises(ConfigError, match=r"trial .*federation\.participation: expected a value <= 1, got 2"):
        load_sweep("participation", grids=["federation.participation=2"])


def test_named_variants_are_swept_as_one_key(tmp_path):
    sweep = load_sweep(write_space(tmp_path, space={}, variants={"slow": {"method.lr": 0.0001}, "plain": None}))
    assert sweep.swept_keys == ["variant"] and sorted(sweep.space["variant"][1]) == ["plain", "slow"]
    assert trial_spec(sweep, {"variant": "slow", "seed": 0}, "p").method.params.lr == 0.0001
    assert trial_spec(sweep, {"variant": "plain", "seed": 0}, "p").method.params.lr == QUICKSTART.method.params.lr
    with pytest.raises(ConfigError, match=r"trial .*method\.lr: expected a value > 0"):
        load_sweep(write_space(tmp_path, space={}, variants={"bad": {"method.lr": -1}}))
    with pytest.raises(ConfigError, match=r"variants: expected a mapping of names"):
        load_sweep(write_space(tmp_path, variants=["a", "b"]))


def test_method_settings_apply_to_their_method_only(tmp_path):
    sweep = load_sweep(write_space(tmp_path, space={"method.name": {"grid": ["promptfl", "fedmpt"]}},
                                   method_settings={"fedmpt": {"method.lr": 0.02, "method.local_epochs": 5}}))
    fedmpt = trial_spec(sweep, {"method.name": "fedmpt", "seed": 0}, "p").method.params
    promptfl = trial_spec(sweep, {"method.name": "promptfl", "seed": 0}, "p").method.params
    assert (fedmpt.lr, fedmpt.local_epochs) == (0.02, 5)
    assert (promptfl.lr, promptfl.local_epochs) == (QUICKSTART.method.params.lr, SMALL["method.local_epochs"])
    with pytest.raises(ConfigError, match=r"trial .*method\.bogus: unknown key"):
        load_sweep(write_space(tmp_path, space={"method.name": {"grid": ["fedmpt"]}},
                               method_settings={"fedmpt": {"method.bogus": 1}}))


def test_method_settings_from_a_run_config_and_swept_values_win(tmp_path):

    sweep = load_sweep(write_space(tmp_path, space={"method.name": {"grid": ["promptfl", "fedmpt"]},
                                                    "method.local_epochs": {"grid": [1, 2]}},
                                   method_settings={"fedmpt": "fedmpt_scenes"}))
    shipped = load_spec("fedmpt_scenes").method.params
    fedmpt = trial_spec(sweep, {"method.name": "fedmpt", "method.local_epochs": 1, "seed": 0}, "p").method.params
    assert fedmpt == dataclasses.replace(shipped, local_epochs=1)
    with pytest.raises(ConfigError, match=r"method_settings\.fedmpt: expected a run config of method fedmpt"):
        load_sweep(write_space(tmp_path, space={"method.name": {"grid": ["fedmpt"]}},
                               method_settings={"fedmpt": "quickstart"}))


def test_a_sweep_with_a_failed_trial_exits_1(tmp_path, monkeypatch, capsys):
    """Scripts and CI read the exit code: a failed trial must not leave `fedvlp sweep` at 0 (Tune itself does not
    raise for it). Tune's result grid is stood in for: its length and `errors` are all the CLI reads here."""
    from fedvlp import cli
    from fedvlp.platform.studies import sweep as sweep_module

    class Grid(list):
        def __init__(self, errors):
            super().__init__([None, None])
            self.errors = errors

        def get_best_result(self, **_):
            return None

    monkeypatch.setattr(sweep_module, "run_sweep", lambda *a, **k: Grid([RuntimeError("trial 1 failed")]))
    monkeypatch.setattr(cli, "_dashboard", lambda *a, **k: None)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["sweep", "smoke"]) == 1
    assert "1 of 2 trials failed" in capsys.readouterr().err
    monkeypatch.setattr(sweep_module, "run_sweep", lambda *a, **k: Grid([]))
    assert cli.main(["sweep", "smoke"]) == 0
