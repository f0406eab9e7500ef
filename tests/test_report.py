"""`fedvlp report` on a real sqlite MLflow store holding a small hand-made sweep with hand-checkable numbers;
intervals checked against scipy.stats."""
import csv
import math
import time

import numpy as np
import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from scipy import stats

from fedvlp.errors import FedvlpError
from fedvlp.platform.studies.report import curves_vs_key, curves_vs_round, interval, make_report, plot_vs_key, summarise

T2 = stats.t.ppf(0.975, 1)  # Student t, 2 seeds: the 95 % half-width of a, b is T2 * |a - b| / 2
# final val_mAP per (method, heterogeneity): (seed 0, seed 1); test_mAP is 0.01 lower throughout
FINAL = {
    ("promptfl", 0.0): (0.60, 0.64), ("promptfl", 0.5): (0.50, 0.52), ("promptfl", 1.0): (0.40, 0.40),
    ("fedmpt", 0.0): (0.70, 0.72), ("fedmpt", 0.5): (0.66, 0.70), ("fedmpt", 1.0): (0.60, 0.66),
}
# 10 clients at participation 0.5 -> 5 clients per round; bytes_up is the round's total over them
BYTES_UP = {"promptfl": [10000, 10280, 10560], "fedmpt": [20000, 20000, 20000]}
SECONDS = {("promptfl", 0): [1, 2, 3], ("promptfl", 1): [2, 3, 4], ("fedmpt", 0): [4, 4, 4], ("fedmpt", 1): [6, 6, 6]}
TRAINABLE = {"promptfl": 514, "fedmpt": 1000}


def _trial(client, exp_id, parent_id, method, h, seed, final, rounds=3, status="FINISHED", tags=()):
    run = client.create_run(exp_id, run_name=f"{method}-h{h}-s{seed}", tags={
        "mlflow.parentRunId": parent_id, "fedvlp.role": "trial", "method": method, "dataset": "synthetic-scenes",
        "sweep": "sweep-heterogeneity", "seed": str(seed), "swept.federation.heterogeneity": str(h),
        "swept.method.name": method, **dict(tags)})
    rid = run.info.run_id
    params = {"federation.heterogeneity": h, "federation.rounds": rounds, "federation.clients": 10,
              "federation.participation": 0.5, "seed": seed, "method.name": method}
    now = int(time.time() * 1000)
    curve = [0.3, final - 0.1, final - 0.05, final][: rounds + 1]
    curve[-1] = final
    metrics = [Metric("val_mAP", v, now, step) for step, v in enumerate(curve)]
    metrics += [Metric("test_mAP", v - 0.01, now, step) for step, v in enumerate(curve)]
    metrics += [Metric("trainable_params", TRAINABLE[method], now, 0), Metric("startup_seconds", 7.0, now, 0)]
    for step in range(1, rounds + 1):
        metrics += [Metric("bytes_up", BYTES_UP[method][step - 1], now, step),
                    Metric("bytes_down", BYTES_UP[method][step - 1], now, step),
                    Metric("round_seconds", SECONDS.get((method, seed), [9, 9, 9])[step - 1], now, step),
                    Metric("train_loss", 1.0 / step, now, step)]
    client.log_batch(rid, metrics=metrics, params=[Param(k, str(v)) for k, v in params.items()])
    client.set_terminated(rid, status)


@pytest.fixture
def sweep(tracking_uri):
    client = MlflowClient(tracking_uri)
    exp_id = client.create_experiment("sweep-heterogeneity")
    parent = client.create_run(exp_id, run_name="sweep", tags={
        "fedvlp.role": "sweep", "sweep": "sweep-heterogeneity", "metric": "val_mAP", "mode": "max",
        "reference": "promptfl", "swept_keys": "federation.heterogeneity,method.name"}).info.run_id
    for (method, h), finals in FINAL.items():
        for seed, final in enumerate(finals):
            _trial(client, exp_id, parent, method, h, seed, final)
    # would pull promptfl @ h=0 up and fedmpt @ h=0.5 down if they were counted
    _trial(client, exp_id, parent, "promptfl", 0.0, 2, 0.99, status="FAILED")
    _trial(client, exp_id, parent, "fedmpt", 0.5, 2, 0.01, rounds=1, tags={"stopped_early": "true"})
    client.set_terminated(parent, "FINISHED")
    return client, parent


def _csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_change_table_pairs_each_method_over_seeds_and_against_the_reference(sweep, tracking_uri, tmp_path):
    files = make_report(tracking_uri, "sweep-heterogeneity", tmp_path / "report", change="federation.heterogeneity=0:1")
    rows = {(r["metric"], r["method"]): r for r in _csv(files["change_federation.heterogeneity.csv"])}
    assert set(rows) == {(m, k) for m in ("val_mAP", "test_mAP") for k in ("promptfl", "fedmpt")}
    for metric in ("val_mAP", "test_mAP"):  # test is val - 0.01 everywhere: the same changes
        promptfl, fedmpt = rows[(metric, "promptfl")], rows[(metric, "fedmpt")]
        # promptfl: 0.40 - 0.60, 0.40 - 0.64; fedmpt: 0.60 - 0.70, 0.66 - 0.72
        assert float(promptfl["change"]) == pytest.approx(-0.22) and float(fedmpt["change"]) == pytest.approx(-0.08)
        assert float(promptfl["change_ci95"]) == pytest.approx(T2 * 0.04 / 2)
        assert float(fedmpt["start_mean"]) == pytest.approx(0.71 - (metric == "test_mAP") * 0.01)
        # fedmpt's change minus the reference's, per seed: +0.10, +0.18
        assert float(fedmpt["diff"]) == pytest.approx(0.14) and float(fedmpt["diff_ci95"]) == pytest.approx(T2 * 0.04)
        assert "diff" not in promptfl or promptfl["diff"] == ""
    md = files["change_federation.heterogeneity.md"].read_text()
    assert "heterogeneity t = 0 → 1" in md and "| fedmpt | 0.7100 ± " in md and "+0.1400 ± " in md
    assert "## Change federation.heterogeneity" in files["index.md"].read_text()
    for change, expected in (("data.label_mask=0.1:0.9", "not a swept key"),
                             ("federation.heterogeneity=0:0.7", "0, 0.5, 1"),
                             ("federation.heterogeneity=1:1", "two different values")):
        with pytest.raises(FedvlpError, match=expected):
            make_report(tracking_uri, "sweep-heterogeneity", tmp_path / "bad", change=change)
    assert not (tmp_path / "bad").exists()  # refused before anything is written


def test_intervals_match_scipy():
    rng = __import__("numpy").random.default_rng(0)
    for n in (2, 3, 5, 10):
        xs = rng.normal(0.5, 0.1, n)
        low, high = stats.t.interval(0.95, n - 1, loc=xs.mean(), scale=stats.sem(xs))
        mean, half, count = interval(xs)
        assert count == n and mean == pytest.approx(xs.mean()) and half == pytest.approx((high - low) / 2, rel=1e-12)
    assert math.isnan(interval([0.3])[1]) and interval([0.3])[0] == 0.3  # one seed: no interval


def test_report_tables_plots_and_artifacts(sweep, tracking_uri, tmp_path):
    client, parent = sweep
    files = make_report(tracking_uri, "sweep-heterogeneity", tmp_path / "report")
    assert set(files) == {"summary.csv", "summary.md", "by_method.csv", "by_method.md", "val_mAP_vs_round.png",
                          "val_mAP_vs_federation.heterogeneity.png", "test_mAP_vs_federation.heterogeneity.png",
                          "val_mAP_difference_vs_federation.heterogeneity.png",
                          "test_mAP_difference_vs_federation.heterogeneity.png", "index.md"}
    page = files["index.md"].read_text()  # the study's page: every table and plot the report wrote
    assert "\n# sweep-heterogeneity\n" in page  # headed by the study, not by the folder ("report")
    assert "**2 seed(s): these intervals cannot decide anything.**" in page  # seeds 0 and 1 counted
    assert files["summary.md"].read_text().split("\n\n", 1)[1] in page
    assert all(f"]({name})" in page for name in files if name.endswith(".png"))

    rows = _csv(files["summary.csv"])
    summary = {(r["method"], float(r["federation.heterogeneity"])): r for r in rows if r["metric"] == "val_mAP"}
    tests = {(r["method"], float(r["federation.heterogeneity"])): r for r in rows if r["metric"] == "test_mAP"}
    assert set(summary) == set(FINAL) == set(tests)
    for cell, (a, b) in FINAL.items():
        assert float(summary[cell]["mean"]) == pytest.approx((a + b) / 2)
        assert float(tests[cell]["mean"]) == pytest.approx((a + b) / 2 - 0.01)
        assert float(summary[cell]["ci95"]) == pytest.approx(T2 * abs(a - b) / 2, abs=1e-12) if a != b else True
        assert summary[cell]["n"] == "2"  # the FAILED and the stopped-early seed 2 are not counted
    # paired differences against promptfl, over the same seeds: fedmpt - promptfl per seed
    for h in (0.0, 0.5, 1.0):
        (m0, m1), (p0, p1) = FINAL[("fedmpt", h)], FINAL[("promptfl", h)]
        mean, half, _ = interval([m0 - p0, m1 - p1])
        assert float(summary[("fedmpt", h)]["diff"]) == pytest.approx(mean)
        assert float(summary[("fedmpt", h)]["diff_ci95"]) == pytest.approx(half)
        assert summary[("fedmpt", h)]["significant"] == str(abs(mean) > half)
    # h = 0: +0.10, +0.08: with two seeds t = 12.7, so 0.09 +- 0.127 holds 0 (n.s.); h = 0.5: +0.16, +0.18
    assert summary[("fedmpt", 0.0)]["significant"] == "False" and summary[("fedmpt", 0.5)]["significant"] == "True"

    table = {r["method"]: r for r in _csv(files["by_method.csv"]) if r["metric"] == "val_mAP"}
    # promptfl cell means 0.62, 0.51, 0.40; per-seed sweep means 0.50 and 0.52
    assert float(table["promptfl"]["mean"]) == pytest.approx(0.51)
    assert float(table["promptfl"]["ci95"]) == pytest.approx(T2 * 0.02 / 2)
    # fedmpt cell means 0.71, 0.68, 0.63; per-seed sweep means 1.96/3 and 2.08/3
    assert float(table["fedmpt"]["mean"]) == pytest.approx(2.02 / 3)
    assert float(table["fedmpt"]["ci95"]) == pytest.approx(T2 * 0.12 / 3 / 2)
    assert float(table["promptfl"]["trainable_params"]) == 514 and float(table["fedmpt"]["trainable_params"]) == 1000
    assert float(table["promptfl"]["bytes_up_per_client_round"]) == pytest.approx(10280 / 5)
    assert float(table["fedmpt"]["bytes_up_per_client_round"]) == pytest.approx(4000)
    assert float(table["promptfl"]["seconds_per_round"]) == pytest.approx(2.5)
    assert float(table["fedmpt"]["seconds_per_round"]) == pytest.approx(5.0)
    assert table["promptfl"]["n_seeds"] == "2"

    md = files["summary.md"].read_text()
    assert "12 of 14 trials counted" in md and "1 FAILED" in md and "1 stopped early" in md
    assert f"0.6200 ± {T2 * 0.02:.4f}" in md and "heterogeneity t" in md and "selected on val_mAP" in md
    assert "(n.s.)" in md.split("| fedmpt | 0 |")[1].splitlines()[0]
    assert "(n.s.)" not in md.split("| fedmpt | 0.5 |")[1].splitlines()[0]
    by_md = files["by_method.md"].read_text()
    assert f"**0.6733 ± {T2 * 0.02:.4f}**" in by_md and "2.0 KB" in by_md and "514" in by_md

    for name in files:
        if name.endswith(".png"):
            data = files[name].read_bytes()
            assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000

    logged = {a.path for a in client.list_artifacts(parent, "report")}
    assert logged == {f"report/{name}" for name in files}
    metrics = client.get_run(parent).data.metrics  # the parent run carries the summary
    assert metrics["fedmpt/heterogeneity_0.5/val_mAP_mean"] == pytest.approx(0.68)
    assert metrics["fedmpt/heterogeneity_0.5/test_mAP_diff"] == pytest.approx(0.17)


def test_a_difference_whose_interval_holds_zero_is_not_significant():
    rows = [{"method": m, "seed": str(s), "swept": {}, "final": {"val_mAP": v}, "history": {}}
            for m, values in (("ref", (0.50, 0.60, 0.55)), ("a", (0.52, 0.58, 0.57)), ("b", (0.60, 0.70, 0.66)))
            for s, v in enumerate(values)]
    cells = {c["method"]: c for c in summarise(rows, "val_mAP", [], reference="ref")}
    assert cells["a"]["significant"] is False and cells["b"]["significant"] is True  # +0.02 +-: ns; +0.1 +- small
    assert "diff" not in cells["ref"]


def test_round_curve_averages_sweep_then_seeds(sweep, tracking_uri):
    from fedvlp.platform.studies.report import collect, find_sweep

    client, parent = sweep
    exp_id, _ = find_sweep(client, "sweep-heterogeneity", tracking_uri)
    rows = collect(client, exp_id, parent, ["val_mAP"], ["federation.heterogeneity"])
    xs, mean, half = curves_vs_round(rows, "val_mAP")["promptfl"]
    assert xs == [0.0, 1.0, 2.0, 3.0]
    assert mean[0] == pytest.approx(0.3) and half[0] == pytest.approx(0.0, abs=1e-12)
    assert mean[3] == pytest.approx(0.51) and half[3] == pytest.approx(T2 * 0.02 / 2)
    assert mean[1] == pytest.approx(0.41)


def test_categorical_swept_value_plots_as_categories(tmp_path):
    rows = [{"method": m, "seed": str(s), "swept": {"data.missing_type": t},
             "final": {"val_accuracy": 0.5 + 0.1 * i + 0.01 * s}, "history": {}}
            for i, t in enumerate(["text", "image", "both"]) for m in ("a", "b") for s in (0, 1)]
    cells = summarise(rows, "val_accuracy", ["data.missing_type"])
    assert [c["data.missing_type"] for c in cells[:3]] == ["both", "image", "text"]
    path = plot_vs_key(curves_vs_key(rows, "val_accuracy", "data.missing_type"), "data.missing_type",
                       "val_accuracy", "categorical", tmp_path / "cat.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_plots_keep_one_colour_per_method_and_clip_intervals_to_the_metrics_range(tmp_path, monkeypatch):
    from matplotlib.colors import to_hex

    from fedvlp.platform.studies import report
    from fedvlp.platform.studies.report import plots

    figures = []
    monkeypatch.setattr(plots, "_save", lambda plt, fig, path, legend_title="method": figures.append(fig) or path)
    wide = np.array([0.9, 0.8])  # a 2-seed t interval this wide runs past 0 and 1 before clipping
    curves = {"zeroshot": ([0.0, 1.0], np.array([0.7, 0.7]), np.array([0.0, 0.0])),
              "promptfl": ([0.0, 1.0], np.array([0.3, 0.95]), wide),
              "myplugin": ([0.0, 1.0], np.array([0.2, 0.5]), wide)}
    report.plot_vs_round(curves, "val_mAP", "study", tmp_path / "a.png")
    report.plot_vs_round({"promptfl": curves["promptfl"]}, "val_mAP", "study", tmp_path / "b.png")
    report.plot_vs_round({"myplugin": curves["myplugin"]}, "val_loss", "study", tmp_path / "c.png")
    lines = [{ln.get_label(): to_hex(ln.get_color()) for ln in fig.axes[0].get_lines()} for fig in figures]
    assert lines[0]["promptfl"] == lines[1]["promptfl"] == report.METHOD_COLOURS["promptfl"]  # one colour everywhere
    assert lines[0]["zeroshot"] == report.METHOD_COLOURS["zeroshot"] and len(set(lines[0].values())) == 3
    band = figures[0].axes[0].collections[1].get_paths()[0].vertices[:, 1]  # promptfl's band
    assert band.min() == pytest.approx(0.0) and band.max() == pytest.approx(1.0)  # clipped, not -0.6 .. 1.75
    loss_band = figures[2].axes[0].collections[0].get_paths()[0].vertices[:, 1]
    assert loss_band.min() == pytest.approx(-0.7)  # a loss has no range to clip to
    assert "clipped to the metric's range" in figures[0].axes[0].get_title()
    assert "clipped" not in figures[2].axes[0].get_title()
    assert np.allclose(report.clipped_errors([0.95, -0.9], [0.2, 0.3], (-1.0, 1.0)), [[0.2, 0.1], [0.05, 0.3]])
    # a gap between two scores is signed: its interval is clipped to [-1, 1], never to a score's [0, 1]
    assert report.score_bounds("shift_hallucination_gap") == (-1.0, 1.0)
    assert report.score_bounds("shift_hallucination_gap", difference=True) == (-2.0, 2.0)
    assert report.score_bounds("val_mAP", difference=True) == (-1.0, 1.0)
    assert report.metric_label("shift_hallucination_gap", unit=True) == "shift hallucination gap (-1–1)"
    assert report.metric_label("val_mAP", unit=True) == "val mAP (0–1)"
    assert report.metric_label("val_loss", unit=True) == "val loss"
    report.plot_vs_round({"promptfl": ([0.0, 1.0], np.array([-0.03, -0.02]), np.array([0.01, 0.01]))},
                         "shift_hallucination_gap", "study", tmp_path / "d.png")
    gap_band = figures[3].axes[0].collections[0].get_paths()[0].vertices[:, 1]
    assert gap_band.min() == pytest.approx(-0.04)  # drawn as computed, below 0


def test_missing_experiment_or_parent_is_one_line_error(tracking_uri, tmp_path):
    with pytest.raises(FedvlpError, match="'nope' not found") as err:
        make_report(tracking_uri, "nope", tmp_path)
    assert "\n" not in str(err.value)
    MlflowClient(tracking_uri).create_experiment("no-parent")
    with pytest.raises(FedvlpError, match="no sweep parent run") as err:
        make_report(tracking_uri, "no-parent", tmp_path)
    assert "\n" not in str(err.value)


def test_accuracy_against_privacy_spent_has_one_line_per_method_and_participation(tmp_path):
    from fedvlp.platform.studies.report import epsilon_lines, plot_vs_epsilon

    keys = ["privacy.noise_multiplier", "federation.participation"]
    rows = [{"method": m, "seed": str(s), "swept": {keys[0]: sigma, keys[1]: rho}, "epsilon": 10 / sigma * rho + s,
             "final": {"val_mAP": 0.6 - 0.05 / sigma + 0.01 * s}, "history": {}}
            for m in ("a", "b") for sigma in (0.5, 1.0, 2.0) for rho in (0.25, 1.0) for s in (0, 1)]
    lines = epsilon_lines(rows, "val_mAP", keys)
    assert sorted(lines) == ["a participation=0.25", "a participation=1", "b participation=0.25", "b participation=1"]
    # more noise, less epsilon: the points run from sigma 2 to sigma 0.5; epsilon is the mean over the two seeds
    assert [p[0] for p in lines["a participation=1"]] == [5.5, 10.5, 20.5]
    assert [round(p[1], 4) for p in lines["a participation=1"]] == [0.58, 0.555, 0.505]
    assert plot_vs_epsilon(rows, "val_mAP", keys, "test", tmp_path / "eps.png").read_bytes()[:4] == b"\x89PNG"


def test_named_variants_are_reported_as_methods_with_paired_differences(tracking_uri, tmp_path):
    """A variant sweep (Fed-Inter is a setting of fedprime; FedAvg-P another method): each variant is a row of its
    own, swept values stay columns, and the reference may be a variant."""
    client = MlflowClient(tracking_uri)
    exp_id = client.create_experiment("sweep-settings")
    parent = client.create_run(exp_id, run_name="sweep", tags={
        "fedvlp.role": "sweep", "sweep": "sweep-settings", "metric": "val_mAP", "mode": "max",
        "reference": "fedavg_p", "swept_keys": "federation.heterogeneity,variant"}).info.run_id
    finals = {("fedprime", "fedprime"): (0.60, 0.64), ("fedprime", "fed_inter"): (0.50, 0.56),
              ("promptfl", "fedavg_p"): (0.40, 0.42)}  # (method tag, variant): seeds 0, 1
    for (method, variant), values in finals.items():
        for seed, final in enumerate(values):
            _trial(client, exp_id, parent, method if method != "fedprime" else "fedmpt", 0.5, seed, final,
                   tags={"swept.variant": variant})
    client.set_terminated(parent, "FINISHED")
    files = make_report(tracking_uri, "sweep-settings", tmp_path / "report")
    rows = {r["method"]: r for r in _csv(files["summary.csv"]) if r["metric"] == "val_mAP"}
    assert set(rows) == {"fedprime", "fed_inter", "fedavg_p"} and "variant" not in rows["fedprime"]
    assert float(rows["fed_inter"]["diff"]) == pytest.approx(0.53 - 0.41)
    assert float(rows["fed_inter"]["diff_ci95"]) == pytest.approx(T2 * abs(0.10 - 0.14) / 2)
    assert rows["fedavg_p"]["diff"] == ""


def test_report_links_fedvlp_saved_views_of_the_sweep(sweep, tracking_uri, tmp_path, capsys, monkeypatch):
    """`fedvlp report` stores the two saved views (runs by the metric; grouped by method with per-round charts)
    and prints links that open them in the model-training workflow; an existing view is never overwritten."""
    import json
    from urllib.parse import parse_qs, urlsplit

    from fedvlp import cli

    client, parent = sweep
    exp_id = client.get_experiment_by_name("sweep-heterogeneity").experiment_id
    cli.main(["report", "sweep-heterogeneity", "--tracking-uri", tracking_uri, "--out", str(tmp_path / "r")])
    lines = capsys.readouterr().out.splitlines()
    links = {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in lines
             if line.startswith(("then browse to", "grouped by method"))}
    assert set(links) == {"then browse to", "grouped by method"}
    runs, grouped = (parse_qs(urlsplit(links[k]).fragment.partition("?")[2]) for k in links)
    assert runs == {"viewStateShareKey": ["fedvlp.val_mAP"], "workflowType": ["machine_learning"]}
    assert grouped["viewStateShareKey"] == ["fedvlp.val_mAP.by-method"] and grouped["compareRunsMode"] == ["CHART"]
    tags = client.get_experiment(exp_id).tags
    view = json.loads(json.loads(tags["mlflow.sharedViewState.fedvlp.val_mAP.by-method"])["state"])
    assert view["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "method"}]
    assert view["orderByKey"] == "metrics.`val_mAP`" and "metrics.`test_mAP`" in view["selectedColumns"]
    charts = [c["metricKey"] for c in view["compareRunCharts"]]
    assert charts == ["val_mAP", "test_mAP", "shift_mAP", "personal_mAP", "personal_val_mAP", "train_loss"]
    client.set_experiment_tag(exp_id, "mlflow.sharedViewState.fedvlp.val_mAP", "edited in the UI")
    cli.main(["report", "sweep-heterogeneity", "--tracking-uri", tracking_uri, "--out", str(tmp_path / "r")])
    assert client.get_experiment(exp_id).tags["mlflow.sharedViewState.fedvlp.val_mAP"] == "edited in the UI"
