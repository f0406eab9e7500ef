"""The benchmarks: every one runs at its tiny size (`--tiny`) and writes the JSON that the Performance page's tables
(docs/performance.md) are rendered from (with the command, machine and time that produced it); the bare loop reaches
fedvlp's metrics exactly; the Performance page's tables are what the JSON in benchmarks/results/ says.

Tiny runs write under $FEDVLP_BENCH_RESULTS (a temporary folder), never over benchmarks/results/. The benchmarks that
start Ray or a sweep are drills (slow); overhead.py runs in its own process, since Flower shuts Ray down when its
simulation ends, and without flwr (CI installs `.[dev]` only) it runs the fedvlp and bare arms and records the
Flower arms as skipped.
"""
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, run_in_group, small_run

BENCH = REPO / "benchmarks"
sys.path.insert(0, str(BENCH))  # the benchmarks import their siblings (_common, overhead) by name

import _common as common  # noqa: E402
import performance  # noqa: E402

SCRIPTS = sorted(p.stem for p in BENCH.glob("[!_]*.py"))
SCRIPT_TIMEOUT_S = 600


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_benchmark_imports(script):
    """A benchmark (and its shared `_common`) still imports after a refactor of what it uses."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{script}", BENCH / f"{script}.py")
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_every_performance_block_has_its_benchmark_and_every_benchmark_a_tiny_test():
    names = {name for name, _, _ in performance.BLOCKS.values()}
    assert {name.split("-")[0] for name in names} <= set(SCRIPTS)
    tested = {name.removeprefix("test_").removesuffix("_at_tiny_size") for name in globals()
              if name.endswith("_at_tiny_size")}
    assert tested == set(SCRIPTS) - {"performance"}


@pytest.fixture
def results(tmp_path, monkeypatch):
    """The folder tiny runs write to."""
    monkeypatch.setenv(common.RESULTS_ENV, str(tmp_path / "results"))
    return tmp_path / "results"


def tiny_run(script: str, results: Path, *args: str) -> dict:
    """`benchmarks/<script>.py --tiny ARGS` in this process; its JSON, checked for what every record holds."""
    threads = torch.get_num_threads()
    importlib.import_module(script).main(["--tiny", *args])
    assert torch.get_num_threads() == threads  # the process as the benchmark found it
    return read_record(results, script, f"python benchmarks/{script}.py --tiny", *args)


def read_record(results: Path, name: str, *command: str) -> dict:
    record = json.loads((results / f"{name}.json").read_text())
    assert record["command"] == " ".join(command) and record["tiny"] is True
    assert record["machine"]["cpu_count"] == os.cpu_count() and record["machine"]["load_average_1min"] >= 0
    assert abs((datetime.now() - datetime.fromisoformat(record["utc"]).replace(tzinfo=None)).days) <= 1
    assert not (common.RESULTS / f"{name}.json").exists() or \
        json.loads((common.RESULTS / f"{name}.json").read_text()).get("tiny") is not True
    return record


def rendered(block: str, record: dict) -> str:
    """The Performance block rendered from `record`: every key the page reads is there."""
    text = "\n".join(performance.BLOCKS[block][1](record))
    assert record["command"] in text
    return text


def test_a_tiny_run_never_writes_the_committed_figures(monkeypatch):
    monkeypatch.delenv(common.RESULTS_ENV, raising=False)
    assert common.results_dir(tiny=False) == common.RESULTS
    assert common.RESULTS not in [common.results_dir(tiny=True), *common.results_dir(tiny=True).parents]


def test_a_write_to_disk_is_timed_to_the_fsync_of_the_file_and_its_folder(tmp_path, monkeypatch):
    synced = []
    fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or fsync(fd))
    path = tmp_path / "checkpoint.pt"
    written = common.timed_write_to_disk(lambda p: p.write_bytes(b"x" * 4096), path)
    assert synced == [str(path), str(tmp_path)]
    assert written["bytes"] == 4096 and 0 < written["write_s"] <= written["on_disk_s"]
    assert written["filesystem"] not in ("", "unknown")


# ---------------------------------------------------------------- no Ray

BURN = ("import os, sys, time; t = time.process_time(); "
        "exec('while time.process_time() - t < float(sys.argv[1]): pass'); "
        "print(os.getpid(), flush=True); time.sleep(float(sys.argv[2]))")


def test_tree_cpu_counts_a_descendant_from_the_meter_on_and_keeps_it_once_gone():
    """A child's CPU before the meter is not counted, a grandchild's after it is, and it stays counted once the
    grandchild has left the tree (a sum over the live tree fell below zero when a used Ray's workers exited)."""
    old = subprocess.Popen([sys.executable, "-c", BURN, "0.6", "60"], stdout=subprocess.PIPE, text=True)
    try:
        old.stdout.readline()  # it has burnt 0.6 CPU s
        cpu = common.TreeCpu()
        subprocess.run([sys.executable, "-c", BURN, "0.1", "0"], check=True, stdout=subprocess.DEVNULL)  # unseen
        middle = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run(sys.argv[1:])",
                                   sys.executable, "-c", BURN, "0.5", "60"], stdout=subprocess.PIPE, text=True)
        grandchild = int(middle.stdout.readline())
        alive = cpu()
        assert 0.5 <= alive < 1.0  # the grandchild's 0.5 s and two start-ups; none of the old child's 0.6 s
        middle.kill(), middle.wait()  # the grandchild is orphaned: it leaves this process's tree
        assert alive <= cpu() < alive + 0.2  # it keeps its last reading
        os.kill(grandchild, 9)
    finally:
        old.kill()


HEAD_PROCESS = ("import os, subprocess, sys, time\n"  # argv: the head's dir (in its command line), a go file, burn s
                "if os.fork(): sys.exit(0)\n"  # the head's process is left to init, as `ray start` leaves them
                "while not os.path.exists(sys.argv[2]): time.sleep(0.05)\n"
                "child = subprocess.Popen([sys.executable, '-c', " + repr(BURN) + ", sys.argv[3], '60'], "
                "stdout=subprocess.PIPE, text=True)\n"
                "done = child.stdout.readline()\n"  # its pid, once it has burnt
                "open(sys.argv[2] + '.done', 'w').write(f'{os.getpid()} {done}')\n"
                "child.wait()")


@pytest.mark.parametrize("inside_the_head", [True, False])
def test_tree_cpu_counts_a_running_heads_processes_and_their_children(inside_the_head, tmp_path, monkeypatch):
    """A warm run's actors are children of the head's raylet, not of the benchmark: inside `ray_head` they count
    (the warm arm read 0.02 CPU s a round where the same work read 0.4 elsewhere); outside it, another cluster's do
    not."""
    head, go = tmp_path / "rh_head", tmp_path / "go"
    head.mkdir()
    monkeypatch.setattr(common, "RUNNING_HEAD", str(head) if inside_the_head else None)
    subprocess.run([sys.executable, "-c", HEAD_PROCESS, str(head), str(go), "0.5"], check=True)  # exits at once
    done = go.with_name("go.done")
    cpu = common.TreeCpu()
    go.touch()
    deadline = time.monotonic() + 60
    while not done.exists() or not done.read_text().endswith("\n"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    try:
        if inside_the_head:
            assert 0.5 <= cpu() < 1.5  # the child's 0.5 s burn and its start-up
        else:
            assert cpu() < 0.3  # this test's own polling
    finally:
        for pid in done.read_text().split():
            os.kill(int(pid), 9)


def test_a_target_is_met_only_when_every_repeat_meets_it_and_missed_only_when_none_does():
    """A close target read from one run printed "met" at 1.02 against 1.15 on a machine that drifts 20-30 %."""
    assert common.against_target([1.02, 1.10, 1.15], 1.15) == "met"
    assert common.against_target([1.16, 1.30], 1.15) == "missed"
    assert common.against_target([1.02, 1.20, 1.10], 1.15) == "within noise (1.02-1.20 over 3 runs)"


def test_a_median_target_with_a_ceiling_is_met_only_when_both_hold():
    """Warm start-up: a median of at most 2 s over the runs, and no run over 2.5 s."""
    assert common.against_median_target([1.8, 1.9, 2.0, 2.2, 2.4], 2.0, 2.5) == "met"
    assert common.against_median_target([1.8, 1.9, 2.0, 2.1, 2.6], 2.0, 2.5) == "missed"  # one run over the ceiling
    assert common.against_median_target([2.1, 2.2, 2.3], 2.0, 2.5) == "missed"  # no run meets the median's goal
    assert common.against_median_target([1.9, 2.1, 2.2], 2.0, 2.5) == "within noise (1.90-2.20 over 3 runs)"


def test_checkpoint_at_tiny_size(results):
    r = tiny_run("checkpoint", results)
    assert r["clients"] == 200 and r["new_mib"] > 0.35  # 200 x 2 KB, stacked
    for layout in ("old", "new"):
        assert 0 < r[f"{layout}_save_s"] <= r[f"{layout}_on_disk_s"]  # on disk = the save and then the fsync
    rendered("checkpoint", r)


def test_partition_at_tiny_size(results):
    r = tiny_run("partition", results, "--clients", "40")
    low, mid, high = r["client_size_min_median_max"]
    assert r["samples"] == 20_000 and r["clients"] == 40 and 0 < low <= mid <= high
    assert 0 < r["js_distance"] < 1
    rendered("partition", r)


def test_aggregation_at_tiny_size(results):
    r = tiny_run("aggregation", results)
    assert [run["clients"] for run in r["runs"]] == [4, 8] and r["growth"][0]["clients_ratio"] == 2
    assert all(run["seconds"] > 0 and run["n_global"] == 4 * run["clients"] for run in r["runs"])
    rendered("aggregation", r)


@pytest.mark.usefixtures("tiny_clip")
def test_fedmpt_round_at_tiny_size(results):
    r = tiny_run("fedmpt_round", results)
    assert set(r["methods"]) == {"fedmpt", "promptfl"} and r["torch_threads"] == 1
    assert all(m["steps"] >= 1 and m["seconds_per_local_update"] > 0 for m in r["methods"].values())
    assert r["shared_prefix"]["max_state_difference"] < 1e-5
    rendered("fedmpt_round", r)


@pytest.mark.usefixtures("tiny_clip")
def test_fedotp_round_at_tiny_size(results):
    r = tiny_run("fedotp_round", results)
    assert set(r["cpu_ms_per_solve"]) == set(r["cpu_s_per_local_update"]) == {"log domain", "float64 scalings"}
    assert r["problem_shape"][-2:] == [16, 2] and r["torch_threads"] == 1
    assert r["max_plan_difference"] < 1e-5 and r["max_state_difference"] < 1e-5
    rendered("fedotp_round", r)


@pytest.mark.usefixtures("tiny_clip")
def test_feature_cache_at_tiny_size(results):
    r = tiny_run("feature_cache", results)
    rnd = r["round"]
    assert len(rnd["cohort"]) == 2 and rnd["steps"]["cached"] == rnd["steps"]["encoder"] >= 2
    assert abs(rnd["mean_loss"]["cached"] - rnd["mean_loss"]["encoder"]) < 1e-2  # the same minibatches
    assert r["disk_cache_startup"]["samples"] > 0
    rendered("feature_cache", r)


@pytest.mark.usefixtures("tiny_vilt")
def test_fedavg_p_recipes_at_tiny_size(results):
    r = tiny_run("fedavg_p_recipes", results)
    assert len(r["val_accuracy"]) == 1 and 0 <= r["val_accuracy"][0] <= 1 and r["num_train"] == 60


@pytest.mark.usefixtures("tiny_clip")
def test_convergence_at_tiny_size(results):
    r = tiny_run("convergence", results)
    curve = r["curves"]["quickstart"]
    assert len(curve["per_seed"]) == 1 and len(curve["mean"]) == 2  # rounds 0 and 1 on val
    assert curve["gain_after_study"] == [0.0] and r["study_rounds"] == 1


@pytest.mark.usefixtures("tiny_clip")
def test_scenes_world_at_tiny_size(results):
    r = tiny_run("scenes_world", results)
    assert set(r["val_map"]) == set(importlib.import_module("scenes_world").ARMS)
    assert all(len(v) == 2 for v in r["val_map"].values())
    assert 0 < r["zero_shot_val"]["pooled"] <= 1
    diagnostics = r["diagnostics"]
    assert len(diagnostics) == 6 and all(isinstance(d["holds"], bool) for d in diagnostics.values())
    gain = diagnostics["central PromptFL - zero-shot"]
    assert gain["mean"] == pytest.approx(np.mean(r["val_map"]["central PromptFL"]) - r["zero_shot_val"]["pooled"])


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_vilt")
def test_recipes_world_at_tiny_size(results, ray_cluster):
    r = tiny_run("recipes_world", results)
    assert set(r["val_accuracy"]) == set(importlib.import_module("recipes_world").ARMS)
    assert all(len(v) == 2 for v in r["val_accuracy"].values())
    cost = r["diagnostics"]["Centralized-P - FedAvg-P"]
    assert cost["per_seed"] == pytest.approx(np.subtract(r["val_accuracy"]["Centralized-P"],
                                                         r["val_accuracy"]["FedAvg-P"]).tolist())
    assert set(r["diagnostics"]) == {"Centralized-P - no prompts", "Centralized-P - FedAvg-P"}
    # each arm's val curve: round 0, then the evaluated rounds, ending at the final score; the other readout beside it
    for name, curves in r["val_curves"].items():
        assert [list(c)[:1] for c in curves] == [["0"], ["0"]]
        assert [c[max(c, key=int)] for c in curves] == r["val_accuracy"][name]
        assert [np.mean([c[k] for k in sorted(c, key=int)[1:][-3:]]) for c in curves] == \
            pytest.approx(r["val_accuracy_mean_last3"][name])


def test_a_runs_readout_is_its_last_evaluation_or_the_mean_of_its_last_three():
    readouts = importlib.import_module("recipes_world").readouts
    assert readouts({0: 0.1, 2: 0.5, 4: 0.4, 6: 0.6, 8: 0.2}) == {"last": 0.2, "mean_last3": pytest.approx(0.4)}
    assert readouts({0: 0.1, 2: 0.5}) == {"last": 0.5, "mean_last3": 0.5}  # round 0 (untrained) never counts


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_vilt")
def test_recipes_noise_at_tiny_size(results, ray_cluster):
    r = tiny_run("recipes_noise", results)
    assert r["seeds"] == [100, 101] and r["val_sizes"] == [64, 128]  # tuning seeds only
    assert set(r["spread"]) == {f"val {n}, {k}" for n in (64, 128) for k in ("last", "mean_last3")}
    row = r["spread"]["val 128, last"]
    finals = {name: [c[max(c, key=int)] for c in curves] for name, curves in r["val_curves"]["128"].items()}
    assert row["FedAvg-P"]["sd"] == pytest.approx(np.std(finals["FedAvg-P"], ddof=1))
    assert row["Centralized-P - FedAvg-P"]["mean"] == pytest.approx(
        np.mean(finals["Centralized-P"]) - np.mean(finals["FedAvg-P"]))
    with pytest.raises(SystemExit):  # an evaluation seed never chooses the protocol
        importlib.import_module("recipes_noise").main(["--tiny", "--seeds", "0", "1"])


# ---------------------------------------------------------------- the bare loop against fedvlp

@pytest.mark.usefixtures("tiny_clip")
# fedmpt: its Sinkhorn's scores depend on the evaluation block; fedotp: a global model without the local prompts,
# and personal metrics with the clients' local states
@pytest.mark.parametrize("config", ["fedmpt_scenes", "fedotp_scenes"])
def test_the_bare_loop_reaches_every_metric_of_fedvlp_exactly(config, ray_cluster, tracking_uri, tmp_path):
    from fedvlp.platform.runtime.engine import run_federated

    # 300 test samples: two evaluation blocks, one on each of the 2 workers
    spec = small_run(tracking_uri, tmp_path, "data.num_train=240", "data.num_val=64", "data.num_holdout=48",
                     "data.num_test=300", "federation.participation=0.5", "method.local_epochs=1", config=config)
    fedvlp = run_federated(spec, progress=False)
    assert {"val_mAP", "test_mAP", "personal_mAP", "personal_mAP_std"} <= set(fedvlp.final)
    # in one process, and as the benchmarks run it: training and evaluation shared by 2 worker processes
    for bare in (common.run_bare(spec), common.run_bare(spec, processes=2)):
        np.testing.assert_equal(bare.initial, fedvlp.initial)
        np.testing.assert_equal(bare.final, fedvlp.final)
        assert bare.cohorts == [sorted(cid for cid, *_ in h["timings"]) for h in fedvlp.history]


# ---------------------------------------------------------------- drills: Ray, sweeps, many processes

def run_script(script: str, results: Path, *args: str) -> subprocess.CompletedProcess:
    """`python benchmarks/<script>.py ARGS`, its output in `stdout`, writing its JSON to `results`."""
    proc = run_in_group([sys.executable, BENCH / f"{script}.py", *args], REPO, {common.RESULTS_ENV: str(results)},
                        SCRIPT_TIMEOUT_S, stderr=subprocess.STDOUT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return proc


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_overhead_at_tiny_size(results):
    out = run_script("overhead", results, "--tiny").stdout
    r = read_record(results, "overhead", "python benchmarks/overhead.py --tiny")
    w = r["methods"]["promptfl"]["2_rounds"]
    flower = importlib.util.find_spec("flwr") is not None
    arms = ["fedvlp", "fedvlp_warm", "bare", *(["flower", "flower_cached"] if flower else [])]
    assert list(w["arms"]) == arms and set(r["skipped"]) == (set() if flower else {"flower", "flower_cached"})
    # every arm did the same work: the same cohorts and local optimizer steps, the same evaluation sets
    assert w["work"]["same_local_steps"] and w["work"]["same_cohorts"] and w["arms"]["fedvlp"]["local_steps"] > 0
    assert all(set(a["final"]) == set(w["arms"]["fedvlp"]["final"]) for a in w["arms"].values())
    assert w["ratios"]["bare_matches_fedvlp"] and "bare vs fedvlp final metrics: identical" in out
    # the warm arm borrowed its actors from the running cluster's pool, and computed what the cold arm did
    assert (w["arms"]["fedvlp"]["actors"], w["arms"]["fedvlp_warm"]["actors"]) == ("new", "warm")
    assert w["arms"]["fedvlp_warm"]["final"] == w["arms"]["fedvlp"]["final"]
    # ... and its round's CPU counts the cluster's actors, which do the round's work (without them it read a
    # twentieth of the cold arm's)
    warm, cold = (w["arms"][arm]["median_round_cpu_s"] for arm in ("fedvlp_warm", "fedvlp"))
    assert w["arms"]["fedvlp_warm"]["cpu_counts_cluster"] and 0.5 * cold < warm < 2 * cold, (warm, cold)
    assert {"fedvlp/bare", "fedvlp_warm/bare"} <= set(w["ratios"])
    assert all(len(w["ratios"][pair]["total_per_repeat"]) == r["repeats"]
               for pair in ("fedvlp/bare", "fedvlp_warm/bare"))
    assert all(gap < 1e-3 for gap in w["work"]["max_metric_gap_to_fedvlp"].values())  # Flower: numpy's FedAvg
    rendered("overhead", r)


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_cross_device_at_tiny_size(results):
    """The fedvlp arms (cold, warm, warm with a task per client) and the bare loop, each run in a fresh process:
    the same work and the same final metrics in all four, and every fedvlp arm's platform cost per client."""
    out = run_script("cross_device", results, "--tiny").stdout
    r = read_record(results, "cross_device", "python benchmarks/cross_device.py --tiny")
    w = r["runs"]["4_per_round"]
    assert list(w["arms"]) == ["fedvlp", "fedvlp_warm", "fedvlp_per_client", "bare"]
    assert w["work"]["same_local_steps"] and w["work"]["same_cohorts"] and w["arms"]["bare"]["local_steps"] > 0
    assert len({json.dumps(a["final"]["val_mAP"]) for a in w["arms"].values()}) == 1  # bitwise, whatever dispatches
    assert (w["arms"]["fedvlp_warm"]["actors"], w["arms"]["fedvlp_per_client"]["actors"]) == ("warm", "warm")
    assert all(c is not None and c > 0 for arm in ("fedvlp", "fedvlp_warm", "fedvlp_per_client")
               for c in w["cost_per_client_ms"][arm])
    assert w["cost_per_client_ms"]["bare"] == [None]  # the bare loop does not time its workers' compute
    warm_over_bare = w["ratios"]["fedvlp_warm/bare"]
    assert warm_over_bare["target"] == 1.2 and len(warm_over_bare["total_per_repeat"]) == 1
    assert "fedvlp_warm/bare: total x" in out
    rendered("cross_device", r)


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_placement_at_tiny_size(results, ray_cluster):
    r = tiny_run("placement", results)
    steps = r["busiest_worker_steps_per_epoch"]
    assert steps["even"] <= steps["balanced"] <= steps["home"]
    assert all(len(a["runs"]) == 1 and a["median_round_s"] > 0 for a in r["arms"].values())
    rendered("placement", r)


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_scale_at_tiny_size(results, ray_cluster):
    r = tiny_run("scale", results)
    assert [run["clients"] for run in r["runs"]] == [10, 20]
    assert all(len(run["rss_mib"]["workers"]) == 2 and run["steady_round_s"] > 0 for run in r["runs"])
    local = r["client_local_state"]
    assert local["clients"] == 20 and local["state_bytes"] > 0
    spilled = local["every_client_has_state"]["spilled (budget 0)"]
    assert spilled["spilled_files"] == 20 and spilled["memory_mib"] == 0
    for f in local["every_client_has_state"].values():  # the checkpoint, timed to the disk
        # at the tiny size a checkpoint can take under the 1 ms the JSON rounds to
        assert f["checkpoint_mib"] > 0 and 0 <= f["checkpoint_s"] <= f["checkpoint_on_disk_s"]
        assert f["checkpoint_filesystem"] not in ("", "unknown")
    rendered("scale", r)


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_soak_at_tiny_size(results, ray_cluster):
    r = tiny_run("soak", results)
    assert r["from_round"] == 1 and r["to_round"] == 2
    assert {"driver", "coordinator", "worker 0", "worker 1"} <= set(r["growth_mb"])
    rendered("soak", r)


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_startup_at_tiny_size(results, ray_cluster):
    r = tiny_run("startup", results)
    assert len(r["runs"]) == 1 and r["shell_median_s"] > 0 and r["cpu_s"] > 0
    assert set(r["alone_cpu_s"]) == {"driver imports", "client worker", "coordinator", "ray.init"}
    warm = r["warm"]  # the shell runs attached to a head started for the benchmark and borrowed its warm pool
    assert len(warm["shell_s"]) == 1 and 0 < warm["logged_startup_s"]["startup_seconds"] < warm["shell_median_s"]
    assert 0 < warm["shell_to_round_1_start_s"] < warm["shell_median_s"]  # round 0 printed before round 1
    assert warm["logged_startup_s"]["startup_actors_seconds"] > 0
    assert (warm["target_s"], warm["ceiling_s"]) == (2.0, 2.5)  # a median of 2 s, no run over 2.5 s
    rendered("startup", r)


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_clip")
def test_sweep_trials_at_tiny_size(results, ray_cluster):
    r = tiny_run("sweep_trials", results)
    for arm in ("new", "reused"):
        assert len(r[arm]["trials"]) == 2 and all(t["rounds_s"] > 0 for t in r[arm]["trials"])
    rendered("sweep_trials", r)


# ---------------------------------------------------------------- the Performance page (docs/performance.md)

def test_the_performance_page_tables_are_what_the_json_says():
    assert performance.PAGE == REPO / "docs" / "performance.md"
    text = performance.PAGE.read_text()
    assert sorted(m["name"] for m in performance.BLOCK.finditer(text)) == sorted(performance.BLOCKS)
    assert performance.stale_blocks(text, common.RESULTS) == [], "run: python benchmarks/performance.py"
    assert not performance.BLOCK.search((REPO / "README.md").read_text())  # one copy of each table, on the page
    assert performance.typed_figures(text) == [], "a measured figure typed in the prose: render it or remove it"


def test_the_page_check_catches_a_measured_figure_typed_in_the_prose():
    page = ("Cold runs take 7.3 s, 1.20× the bare loop (the 1.15× target), 23 ms a round, 60 % in Sinkhorn.\n"
            "<!-- performance:checkpoint -->\n| 0.102 s |\n<!-- /performance:checkpoint -->\n"
            "```bash\nsleep 2s\n```\n5 local epochs, 16 patches, ε = 0.01, to 1e-5.\n")
    assert performance.typed_figures(page) == ["7.3 s", "1.20×", "23 ms", "60 %"]


def test_the_page_check_catches_a_figure_that_differs_from_its_json(results):
    importlib.import_module("checkpoint").main(["--clients", "50", "--repeats", "1"])  # a full-size record
    page = "before\n<!-- performance:checkpoint -->\nhand-typed\n<!-- /performance:checkpoint -->\nafter\n"
    assert performance.stale_blocks(page, results) == ["checkpoint"]
    fresh = performance.rendered(page, results)
    assert fresh.startswith("before\n") and fresh.endswith("after\n") and performance.stale_blocks(fresh, results) == []
    record = json.loads((results / "checkpoint.json").read_text())
    assert f"| {record['new_save_s']:.3f} |" in fresh
    record["new_save_s"] += 1.0
    (results / "checkpoint.json").write_text(json.dumps(record))
    assert performance.stale_blocks(fresh, results) == ["checkpoint"]
    record["tiny"] = True
    (results / "checkpoint.json").write_text(json.dumps(record))
    with pytest.raises(performance.TinyResults):
        performance.stale_blocks(fresh, results)


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_vilt")
def test_recipes_levers_at_tiny_size(results, ray_cluster):
    r = tiny_run("recipes_levers", results)
    assert r["seeds"] == [100, 101] and r["levers"] == {"prompt lr x10": ["method.prompt_lr=0.7617"]}
    assert set(r["val_accuracy"]) == {"Centralized-P", "Centralized, no prompts", "Centralized-P, prompt lr x10"}
    lever = r["headroom"]["Centralized-P, prompt lr x10"]
    assert lever["mean"] == pytest.approx(np.mean(r["val_accuracy"]["Centralized-P, prompt lr x10"])
                                          - np.mean(r["val_accuracy"]["Centralized, no prompts"]))
    with pytest.raises(SystemExit):
        importlib.import_module("recipes_levers").main(["--tiny", "--lever", "no value"])


@pytest.mark.usefixtures("tiny_vilt")
def test_prompt_attention_at_tiny_size(results):
    r = tiny_run("prompt_attention", results)
    shares = r["prompt_share"]
    assert set(shares) == {"reference", "normal", "sampled tokens", "minus the mean token", "minus sampled tokens"}
    assert all(len(s) == 2 and all(0 < x < 1 for x in s) for s in shares.values())  # the tiny ViLT's 2 prompted layers
    # 32 accumulated prompts take more of the attention than 16 do, whatever their start
    assert all(s[1] > s[0] for s in shares.values()), shares


def test_gpu_check_at_tiny_size(results, capsys):
    """benchmarks/gpu_check.py is the one command a GPU machine runs (it has no smaller size: one round, two small
    arms); on a machine without CUDA, as CI's, it does nothing but say so, and exits 0."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the check itself runs (python benchmarks/gpu_check.py)")
    assert importlib.import_module("gpu_check").main([]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("gpu_check: no CUDA device")
    assert not (results / "gpu_check.json").exists()


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster", "tiny_clip")
def test_chaos_soak_at_tiny_size(results, capsys):
    """Every planned fault lands, and the soaked run still ends as the clean one, bitwise, each MLflow step once
    (with hung clients dropped instead of retried, its final state would differ)."""
    r = tiny_run("chaos_soak", results)
    assert r["injected"] == {"kill": 3, "raise": 3, "hang": 1, "driver": 1}
    assert r["failed_updates"] >= 7 and r["replaced_workers"] >= 4  # 3 killed workers and the hung one
    assert r["status"] == "FINISHED" and r["finished_rounds"] == r["rounds"] == 16
    assert r["final_equal"] and r["global_state_equal"] and r["history_equal"] and r["history_steps_once"]
    assert r["rounds_lost"] == 0  # killed after a checkpoint: nothing to train again
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("chaos soak:")]
    assert "8 faults injected" in line and " survived" in line
