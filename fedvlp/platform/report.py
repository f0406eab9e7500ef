"""`fedvlp report`: one sweep's MLflow experiment -> comparison tables and plots.

The flow is collect (MLflow -> plain rows, one per trial) -> summarise / by_method / paired differences /
curves (pure numpy on rows) -> write CSV, Markdown and PNG -> log them on the sweep's parent run, with
the summary as the parent run's own metrics. Only FINISHED trials that were not stopped early count: a
trial cut short by ASHA or a failed one would compare a method at fewer rounds than the others.

Statistics, over seeds: the mean with a 95 % confidence interval from Student's t (n - 1 degrees of
freedom; half-width t_{0.975, n-1} * s / sqrt(n)); and, for every method, the paired difference
against the reference method (the space file's `reference`) over the seeds both ran, with its own
95 % interval. A difference whose interval contains 0 is marked "n.s." (not significant) in the
tables and drawn hollow in the plots. With one seed no interval can be measured ("n/a").
The selection metric (val_*) is reported beside its test counterpart: val is what the sweep selected
on, test is the score.

Last, the folder's page, index.md (`write_study_page`), is built from the folder's own files only: the
hand-written about.md as its intro, then every Markdown table, every PNG with a caption taken from its
file name, the other data files, and each subfolder's tables and plots as a section. A re-run study thus
updates its page; `fedvlp report --page DIR` rebuilds the page of a committed folder without MLflow.
"""
from __future__ import annotations

import csv
import math
import re
import time
from collections import defaultdict
from pathlib import Path
from urllib.parse import quote

import numpy as np

from fedvlp.errors import FedvlpError
from fedvlp.platform.metrics import split_metric
from fedvlp.platform.sampling import cohort_size
from fedvlp.platform.sweep import VARIANT_KEY

METHOD_KEY = "method.name"
KEY_LABELS = {"federation.heterogeneity": "heterogeneity t", "federation.participation": "participation rate ρ",
              "data.label_mask": "label mask m", "data.missing_rate": "missing rate η",
              "data.missing_type": "missing modality", "federation.clients": "clients N",
              "federation.rounds": "rounds R"}
Row = dict  # one trial: run_id, status, method, seed, swept{key: value}, stopped_early, final{metric}, history, costs


def key_label(key: str) -> str:
    return KEY_LABELS.get(key, key)


def metric_label(metric: str, unit: bool = False) -> str:
    # Every fedvlp score is a fraction (in [0, 1], or [-1, 1] for a gap between two), not a percentage.
    split, name = split_metric(metric)
    text = f"{split.replace('_', ' ')} {name.replace('_', ' ')}" if split else metric.replace("_", " ")
    bounds = score_bounds(metric) if unit else None
    return text + (f" ({bounds[0]:g}–{bounds[1]:g})" if bounds else "")


def test_metric_of(metric: str) -> str:
    """The test counterpart of a selection metric: val_mAP -> test_mAP, a client's local val set's
    personal_val_mAP -> personal_mAP (its local test set)."""
    split, name = split_metric(metric)
    return {"val": f"test_{name}", "personal_val": f"personal_{name}"}.get(split, metric)


def _value(text: str | None) -> float | str | None:
    """A swept value as logged (str) -> float when numeric, so "0.5" and "0.50" are one group."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return text


def _order(value) -> tuple:
    """Numbers before text, numbers numerically: a sort key that never compares float with str."""
    return (0, value, "") if isinstance(value, float) else (1, 0.0, str(value))


def _sorted(values) -> list:
    return sorted(set(values), key=_order)


def _show(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


MIN_SEEDS = 3  # the protocol's least number of evaluation seeds; a report over fewer says its intervals cannot decide


def interval(values) -> tuple[float, float, int]:
    """(mean, half-width of the 95 % Student-t interval, n); the half-width is nan for fewer than 2 values."""
    from scipy import stats

    xs = np.asarray([v for v in values if not math.isnan(v)], dtype=np.float64)
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, 0
    if n < 2:
        return float(xs.mean()), math.nan, 1
    half = float(stats.t.ppf(0.975, n - 1) * xs.std(ddof=1) / math.sqrt(n))
    return float(xs.mean()), half, n


def significant(mean: float, half: float) -> bool | None:
    """True when the 95 % interval excludes 0; None when it cannot be measured."""
    if math.isnan(half):
        return None
    return abs(mean) > half


def find_sweep(client, experiment: str, tracking_uri: str):
    """(experiment id, newest parent run tagged fedvlp.role=sweep); FedvlpError when either is missing."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None or exp.lifecycle_stage != "active":
        raise FedvlpError(f"experiment {experiment!r} not found in {tracking_uri}; "
                          f"expected the MLflow experiment of a `fedvlp sweep`")
    parents = client.search_runs([exp.experiment_id], "tags.`fedvlp.role` = 'sweep'",
                                 order_by=["attributes.start_time DESC"], max_results=1)
    if not parents:
        raise FedvlpError(f"experiment {experiment!r} has no sweep parent run; "
                          f"expected a run tagged fedvlp.role=sweep written by `fedvlp sweep`")
    return exp.experiment_id, parents[0]


def _history(client, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)}


def collect(client, experiment_id: str, parent_id: str, metrics: list[str], swept_keys: list[str]) -> list[Row]:
    """One plain row per trial of the parent run; histories are fetched only for trials that count."""
    runs, token = [], None
    while True:  # search_runs pages at 1000
        page = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'",
                                  max_results=1000, page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            break
    rows = []
    for run in runs:
        tags, params = run.data.tags, run.data.params
        row = {"run_id": run.info.run_id, "status": run.info.status,
               # a named variant (e.g. fed_inter, a setting of fedprime) is reported as a method of its own
               "method": tags.get(f"swept.{VARIANT_KEY}") or tags.get("method") or params.get(METHOD_KEY, "?"),
               "seed": tags.get("seed") or params.get("seed") or run.info.run_id,
               "swept": {k: _value(tags.get(f"swept.{k}", params.get(k))) for k in swept_keys},
               "stopped_early": tags.get("stopped_early", "").lower() == "true",
               "final": {}, "history": {}}
        if row["status"] == "FINISHED" and not row["stopped_early"]:
            for metric in metrics:
                history = _history(client, run.info.run_id, metric)
                row["history"][metric] = history
                # "Final" = the last logged step: with eval_every > 1 that is still round R.
                if history:
                    row["final"][metric] = history[max(history)]
            per_round = cohort_size(int(params.get("federation.clients", 1)),
                                    float(params.get("federation.participation", 1.0)))
            bytes_up = list(_history(client, run.info.run_id, "bytes_up").values())
            seconds = list(_history(client, run.info.run_id, "round_seconds").values())
            trainable = list(_history(client, run.info.run_id, "trainable_params").values())
            row["bytes_up_per_client"] = float(np.mean(bytes_up)) / per_round if bytes_up else math.nan
            row["round_seconds"] = float(np.mean(seconds)) if seconds else math.nan
            row["trainable_params"] = trainable[0] if trainable else math.nan
            spent = _history(client, run.info.run_id, "privacy_epsilon")
            row["epsilon"] = spent[max(spent)] if spent else math.nan
        rows.append(row)
    return rows


def _swept_keys(tags: dict) -> list[str]:
    """The swept keys a table has columns for: not the method, nor the variant (a variant is a method's row)."""
    return [k for k in tags.get("swept_keys", "").split(",") if k and k not in (METHOD_KEY, VARIANT_KEY)]


def counted(rows: list[Row], metric: str) -> list[Row]:
    return [r for r in rows if metric in r["final"]]


def _cell(row: Row, keys: list[str]) -> tuple:
    return tuple(row["swept"][k] for k in keys)


def _per_seed(rows: list[Row], metric: str, keys: list[str]) -> dict[tuple, dict[str, float]]:
    """(method, cell) -> {seed: final metric} (a repeated seed counts once, as its mean)."""
    acc: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in counted(rows, metric):
        acc[(r["method"], _cell(r, keys))][r["seed"]].append(r["final"][metric])
    return {group: {seed: float(np.mean(v)) for seed, v in by_seed.items()} for group, by_seed in acc.items()}


def _paired(mine: dict[str, float], theirs: dict[str, float]) -> tuple[float, float, int]:
    shared = sorted(set(mine) & set(theirs))
    return interval([mine[s] - theirs[s] for s in shared])


def summarise(rows: list[Row], metric: str, keys: list[str], reference: str | None = None) -> list[dict]:
    """Per (method, swept values except method.name): mean and 95 % interval of the final metric over seeds,
    and the paired difference against `reference` over the seeds both ran."""
    groups = _per_seed(rows, metric, keys)
    out = []
    for (method, cell), by_seed in groups.items():
        mean, half, n = interval(by_seed.values())
        entry = {"method": method, **dict(zip(keys, cell)), "mean": mean, "ci95": half, "n": n}
        if reference is not None and (reference, cell) in groups and method != reference:
            diff, diff_half, pairs = _paired(by_seed, groups[(reference, cell)])
            entry.update(diff=diff, diff_ci95=diff_half, diff_n=pairs, significant=significant(diff, diff_half))
        out.append(entry)
    return sorted(out, key=lambda d: (d["method"], [_order(d[k]) for k in keys]))


def by_method(rows: list[Row], metric: str, keys: list[str], reference: str | None = None) -> list[dict]:
    """Per method: the mean over the sweep's cells of the per-seed final metric, its interval over seeds, the
    paired difference against `reference` (per-seed sweep means), and the cost columns."""
    groups = _per_seed(rows, metric, keys)
    sweep_means: dict[str, dict[str, float]] = {}
    for method in _sorted(m for m, _ in groups):
        by_seed = defaultdict(list)
        for (m, _), seeds in groups.items():
            if m == method:
                for seed, value in seeds.items():
                    by_seed[seed].append(value)
        sweep_means[method] = {seed: float(np.mean(v)) for seed, v in by_seed.items()}
    out = []
    for method, seeds in sweep_means.items():
        mine = [r for r in counted(rows, metric) if r["method"] == method]
        mean, half, n = interval(seeds.values())
        entry = {"method": method, "mean": mean, "ci95": half, "n_seeds": n, "n_trials": len(mine),
                 "trainable_params": float(np.nanmean([r["trainable_params"] for r in mine])),
                 "bytes_up_per_client_round": float(np.nanmean([r["bytes_up_per_client"] for r in mine])),
                 "seconds_per_round": float(np.nanmean([r["round_seconds"] for r in mine]))}
        if reference in sweep_means and method != reference:
            diff, diff_half, pairs = _paired(seeds, sweep_means[reference])
            entry.update(diff=diff, diff_ci95=diff_half, diff_n=pairs, significant=significant(diff, diff_half))
        out.append(entry)
    return out


def changes(rows: list[Row], metric: str, keys: list[str], key: str, start, end,
            reference: str | None = None) -> list[dict]:
    """Per method and cell of the other swept keys: the metric at key = start and at key = end, the change
    end - start paired over seeds, and (`diff`) the method's change minus the reference's, paired again: how much
    less a method loses than the reference when negative for a loss the reference resists."""
    groups = _per_seed(rows, metric, keys)
    at = keys.index(key)

    def moved(cell: tuple) -> tuple:
        return (*cell[:at], end, *cell[at + 1:])

    def change(method: str, cell: tuple) -> dict[str, float]:
        first, last = groups[(method, cell)], groups.get((method, moved(cell)), {})
        return {seed: last[seed] - first[seed] for seed in first if seed in last}

    out = []
    for (method, cell), by_seed in groups.items():
        if cell[at] != start or (method, moved(cell)) not in groups:
            continue
        mine = change(method, cell)
        (start_mean, start_half, _), (end_mean, end_half, _) = (interval(by_seed.values()),
                                                                interval(groups[(method, moved(cell))].values()))
        entry = {"method": method, **{k: v for k, v in zip(keys, cell) if k != key}, "start_mean": start_mean,
                 "start_ci95": start_half, "end_mean": end_mean, "end_ci95": end_half}
        entry["change"], entry["change_ci95"], entry["n"] = interval(mine.values())
        if reference is not None and method != reference and (reference, moved(cell)) in groups \
                and (reference, cell) in groups:
            diff, diff_half, pairs = _paired(mine, change(reference, cell))
            entry.update(diff=diff, diff_ci95=diff_half, diff_n=pairs, significant=significant(diff, diff_half))
        out.append(entry)
    return sorted(out, key=lambda d: (d["method"], [_order(d[k]) for k in keys if k != key]))


def curves(rows: list[Row], metric: str, x_of) -> dict[str, tuple[list, np.ndarray, np.ndarray]]:
    """{method: (xs, mean over seeds, 95 % half-width)} of `metric` against x_of(row, step) (the swept value,
    or the round), averaging each seed over the rest of the sweep first."""
    acc = defaultdict(list)
    for r in counted(rows, metric):
        for x, value in x_of(r):
            acc[(r["method"], r["seed"], x)].append(value)
    out = {}
    for method in _sorted(m for m, _, _ in acc):
        xs = _sorted(x for m, _, x in acc if m == method)
        stats = [interval([float(np.mean(v)) for (m, _, x2), v in acc.items() if m == method and x2 == x]) for x in xs]
        out[method] = (xs, np.array([s[0] for s in stats]), np.array([s[1] for s in stats]))
    return out


def curves_vs_key(rows: list[Row], metric: str, key: str) -> dict:
    return curves(rows, metric, lambda r: [(r["swept"][key], r["final"][metric])])


def curves_vs_round(rows: list[Row], metric: str) -> dict:
    return curves(rows, metric, lambda r: [(float(step), v) for step, v in r["history"][metric].items()])


# ---------------------------------------------------------------- plots

# One colour per method (or variant) label in every plot of every report, so a reader can follow a method from plot
# to plot and from study to study: every label the shipped studies use has its own of tab20's colours (the main
# methods the darker ones). A label not listed (a plugin's) takes the first colour its report leaves free.
METHOD_COLOURS = {
    "promptfl": "#1f77b4", "dualcoop": "#ff7f0e", "fedtpg": "#2ca02c", "fedmpt": "#d62728", "fedotp": "#9467bd",
    "fedlora": "#8c564b", "fedprime": "#e377c2", "zeroshot": "#7f7f7f", "fedavg_p": "#bcbd22", "fedprox_p": "#17becf",
    "centralized_p": "#c7c7c7", "fedlora_vilt": "#c49c94", "fed_inter": "#dbdb8d", "fed_intra": "#9edae5",
    "full": "#ff9896", "full_pooled": "#f7b6d2", "cps_only": "#ffbb78", "adapters_only": "#98df8a",
    "cps_adapters": "#c5b0d5", "cps_adapters_ot": "#aec7e8",
}
SPARE_COLOURS = ("#000000", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d")
TITLE_WIDTH = 62  # characters a title line may take above the axes of a 7.5-inch figure with its legend beside


def method_colours(labels) -> dict[str, str]:
    """{label: colour} for one plot's labels: METHOD_COLOURS where listed, else the first colour the others leave."""
    labels = _sorted(set(labels))
    taken = {METHOD_COLOURS[m] for m in labels if m in METHOD_COLOURS}
    free = iter([c for c in (*METHOD_COLOURS.values(), *SPARE_COLOURS) if c not in taken])
    return {m: METHOD_COLOURS.get(m) or next(free, "#000000") for m in labels}


SIGNED_SCORES = {"hallucination_gap"}  # a difference of two mean scores, so in [-1, 1]


def score_bounds(metric: str, difference: bool = False) -> tuple[float, float] | None:
    """The range a metric's value cannot leave: a score lies in [0, 1], a signed score (a gap between two scores)
    in [-1, 1], and a difference of two values in the range's width either side of 0; a loss has no upper bound
    (None: its intervals are drawn as computed)."""
    name = split_metric(metric)[1]
    if "loss" in name:
        return None
    low, high = (-1.0, 1.0) if name in SIGNED_SCORES else (0.0, 1.0)
    return (low - high, high - low) if difference else (low, high)


def clipped_errors(mean, half, bounds: tuple[float, float] | None) -> np.ndarray:
    """[below, above] error lengths of mean ± half (nan half: none), the interval clipped to `bounds`: the t
    interval is computed as usual and only its drawing stops at the metric's range, so a band never claims a score
    the metric cannot take."""
    mean, half = np.asarray(mean, dtype=float), np.nan_to_num(np.asarray(half, dtype=float))
    low, high = mean - half, mean + half
    if bounds is not None:
        low, high = np.clip(low, *bounds), np.clip(high, *bounds)
    return np.array([mean - low, high - mean])


def _clip_note(metric: str) -> str:
    return "" if score_bounds(metric) is None else ", clipped to the metric's range"


def _figure(title: str, xlabel: str, ylabel: str):
    import textwrap

    import matplotlib
    matplotlib.use("Agg")  # no display on cluster nodes
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5), layout="constrained")
    ax.set_title("\n".join(textwrap.fill(line, TITLE_WIDTH) for line in title.split("\n")), fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return plt, fig, ax


def _save(plt, fig, path: Path, legend_title: str = "method") -> Path:
    # Legend outside on the right: it never hides a line, and constrained layout makes room for it (the axes' own
    # legend, anchored beside them, keeps its title clear of the first entry).
    ax = fig.axes[0]
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: labels[i].startswith("n.s."))  # the key's note goes last
    ax.legend([handles[i] for i in order], [labels[i] for i in order], loc="upper left", bbox_to_anchor=(1.02, 1.0),
              borderaxespad=0.0, title=legend_title, frameon=False, alignment="left")
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def _positions(curves_: dict) -> tuple[list, bool]:
    categories = _sorted(x for xs, *_ in curves_.values() for x in xs)
    return categories, not all(isinstance(x, float) for x in categories)


def _set_categories(ax, categories: list) -> None:
    long = max(len(_show(c)) for c in categories) > 6  # long names would run into each other
    ax.set_xticks(range(len(categories)), [_show(c) for c in categories],
                  rotation=30 if long else 0, ha="right" if long else "center")


def plot_vs_key(curves_: dict, key: str, metric: str, subtitle: str, path: Path) -> Path:
    """Final metric vs one swept value, one line per method with 95 % interval bars; str values as categories."""
    plt, fig, ax = _figure(f"{metric_label(metric)} vs {key_label(key)}\n{subtitle}{_clip_note(metric)}",
                           key_label(key),
                           f"final {metric_label(metric, unit=True)}")
    categories, categorical = _positions(curves_)
    colours = method_colours(curves_)
    for i, (method, (xs, mean, half)) in enumerate(curves_.items()):
        # Categories are dodged a little per method so error bars do not sit on top of each other.
        pos = [categories.index(x) + 0.08 * (i - (len(curves_) - 1) / 2) for x in xs] if categorical else xs
        ax.errorbar(pos, mean, yerr=clipped_errors(mean, half, score_bounds(metric)), marker="o", capsize=4,
                    label=method, color=colours[method], linestyle="none" if categorical else "-")
    if categorical:
        _set_categories(ax, categories)
    return _save(plt, fig, path)


def plot_differences(cells: list[dict], key: str, metric: str, reference: str, subtitle: str, path: Path) -> Path:
    """Paired difference to the reference vs one swept value, per method, with 95 % intervals; a difference
    whose interval contains 0 is drawn hollow (not significant)."""
    plt, fig, ax = _figure(f"{metric_label(metric)}: paired difference to {reference} vs {key_label(key)}\n"
                           f"{subtitle}{_clip_note(metric)}",
                           key_label(key), f"{metric_label(metric)} − {reference}")
    ax.axhline(0.0, color="black", linewidth=0.8)
    methods = _sorted(c["method"] for c in cells if "diff" in c)
    categories = _sorted(c[key] for c in cells if "diff" in c)
    categorical = not all(isinstance(x, float) for x in categories)
    colours = method_colours(methods)
    for i, method in enumerate(methods):
        mine = sorted((c for c in cells if c["method"] == method and "diff" in c), key=lambda c: _order(c[key]))
        xs = [categories.index(c[key]) + 0.08 * (i - (len(methods) - 1) / 2) if categorical else c[key] for c in mine]
        diffs = [c["diff"] for c in mine]
        colour = colours[method]
        ax.errorbar(xs, diffs, yerr=clipped_errors(diffs, [c["diff_ci95"] for c in mine], score_bounds(metric, True)),
                    marker="none", capsize=4, label=method, color=colour, linestyle="none" if categorical else "-")
        for x, c in zip(xs, mine):
            ax.plot([x], [c["diff"]], marker="o", markersize=7, color=colour,
                    markerfacecolor=colour if c["significant"] else "white")
    if categorical and categories:
        _set_categories(ax, categories)
    ax.plot([], [], marker="o", color="grey", markerfacecolor="white", linestyle="none", label="n.s. (CI holds 0)")
    return _save(plt, fig, path)


def epsilon_lines(rows: list[Row], metric: str, keys: list[str]) -> dict[str, list[tuple[float, float, float]]]:
    """{line label: [(epsilon, mean metric, 95 % half-width)] by epsilon}: one line per method and per value of the
    swept keys that do not set the noise (e.g. participation); a point per cell, its epsilon the mean over seeds."""
    others = [k for k in keys if "noise" not in k and "epsilon" not in k]
    lines: dict = defaultdict(lambda: defaultdict(list))
    for r in counted(rows, metric):
        if not math.isnan(r["epsilon"]) and r["epsilon"] > 0:
            label = " ".join([r["method"], *(f"{k.rsplit('.', 1)[-1]}={_show(r['swept'][k])}" for k in others)])
            lines[label][_cell(r, keys)].append((r["epsilon"], r["final"][metric]))
    return {label: sorted((float(np.mean([e for e, _ in v])), *interval([m for _, m in v])[:2]) for v in cells.values())
            for label, cells in sorted(lines.items())}


def plot_vs_epsilon(rows: list[Row], metric: str, keys: list[str], subtitle: str, path: Path) -> Path:
    """Final metric against the privacy spent (epsilon at the last round), per `epsilon_lines`, log-x."""
    plt, fig, ax = _figure(f"{metric_label(metric)} vs privacy spent\n{subtitle}{_clip_note(metric)}",
                           "epsilon (delta fixed; log scale)",
                           f"final {metric_label(metric, unit=True)}")
    lines = epsilon_lines(rows, metric, keys)
    colours = method_colours(label.split(" ")[0] for label in lines)
    settings: dict[str, int] = defaultdict(int)  # a method's lines share its colour and differ in style
    for label, points in lines.items():
        method = label.split(" ")[0]
        style = ("-", "--", ":", "-.")[settings[method] % 4]
        settings[method] += 1
        means = [p[1] for p in points]
        ax.errorbar([p[0] for p in points], means, yerr=clipped_errors(means, [p[2] for p in points],
                                                                         score_bounds(metric)),
                    marker="o", capsize=4, label=label, color=colours[method], linestyle=style)
    ax.set_xscale("log")
    return _save(plt, fig, path, legend_title="method, setting")


def plot_vs_round(curves_: dict, metric: str, subtitle: str, path: Path) -> Path:
    """Metric vs round per method: mean over seeds (of the mean over swept values), 95 % interval band."""
    plt, fig, ax = _figure(f"{metric_label(metric)} vs round\n{subtitle}{_clip_note(metric)}",
                           "round (0 = before training)",
                           metric_label(metric, unit=True))
    colours = method_colours(curves_)
    for method, (xs, mean, half) in curves_.items():
        ax.plot(xs, mean, marker="o", markersize=3, label=method, color=colours[method])
        below, above = clipped_errors(mean, half, score_bounds(metric))
        ax.fill_between(xs, mean - below, mean + above, color=colours[method], alpha=0.2)
    ax.xaxis.get_major_locator().set_params(integer=True)
    return _save(plt, fig, path)


# ---------------------------------------------------------------- tables

def _fmt(x, digits: int = 4) -> str:
    return "n/a" if isinstance(x, float) and math.isnan(x) else f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def _mean_ci(mean: float, half: float) -> str:
    return f"{_fmt(mean)} ± {_fmt(half)}"


def _diff(entry: dict) -> str:
    if "diff" not in entry:
        return "—"
    mark = {True: "", False: " (n.s.)", None: " (n/a)"}[entry["significant"]]
    return f"{entry['diff']:+.4f} ± {_fmt(entry['diff_ci95'])}{mark}"


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def _write_csv(rows: list[dict], path: Path) -> Path:
    fields = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def _markdown(header: str, columns: list[str], lines: list[list[str]]) -> str:
    table = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return header + "\n\n" + "\n".join(table + ["| " + " | ".join(c) + " |" for c in lines]) + "\n"


def _summary_metrics(summaries: dict[str, list[dict]], keys: list[str]) -> dict[str, float]:
    """The report's numbers as metrics of the sweep's parent run: <method>/<key>_<value>.../<metric>_mean (_ci95,
    _diff, _diff_ci95), so the parent row of the runs table and its chart view carry the summary."""
    out = {}
    for metric, cells in summaries.items():
        for c in cells:
            where = "/".join([c["method"], *(f"{k.rsplit('.', 1)[-1]}_{_show(c[k])}" for k in keys)])
            for stat in ("mean", "ci95", "diff", "diff_ci95"):
                if stat in c and not math.isnan(c[stat]):
                    out[f"{where}/{metric}_{stat}"] = c[stat]
    return out


def make_report(tracking_uri: str, experiment: str, out_dir: str | Path, metric: str | None = None,
                reference: str | None = None, change: str | None = None) -> dict[str, Path]:
    """Write summary/by_method tables (CSV + Markdown) and plots for one sweep, and with `change`
    ("KEY=FROM:TO") the change table of that swept key; log them and the summary on its parent run."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    experiment_id, parent = find_sweep(client, experiment, tracking_uri)
    tags = parent.data.tags
    swept = _swept_keys(tags)
    metric = metric or tags.get("metric") or "val_mAP"
    reference = reference or tags.get("reference")
    score = test_metric_of(metric)
    reported = list(dict.fromkeys([metric, score]))
    rows = collect(client, experiment_id, parent.info.run_id, reported, swept)
    used = counted(rows, metric)
    if not used:
        raise FedvlpError(f"experiment {experiment!r}: none of its {len(rows)} trials is FINISHED with "
                          f"{metric!r} logged; expected at least one finished trial")
    if reference is not None and reference not in {r["method"] for r in used}:
        raise FedvlpError(f"reference: {reference!r} ran no counted trial in {experiment!r}; expected one of "
                          f"{', '.join(_sorted(r['method'] for r in used))}")
    moved = _change_of(change, swept, used) if change else None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    seeds = len({r["seed"] for r in used})
    failed = sum(r["status"] == "FAILED" for r in rows)
    early = sum(r["stopped_early"] for r in rows)
    other = len(rows) - len(used) - failed - early
    header = (f"# {experiment}\n\nSweep over {', '.join(swept) or 'methods only'}; selected on {metric} "
              f"(mode {tags.get('mode', 'max')}), scored on {score}. {len(used)} of {len(rows)} trials counted; "
              f"skipped: {failed} FAILED, {early} stopped early (ASHA), {other} other (not finished or no {metric}). "
              f"Final = the metric at the last logged round, over {seeds} seed(s); ± is the half-width of the 95 % "
              f"Student-t interval over seeds" + (f"; Δ is the paired difference to {reference} over the same seeds, "
                                                 f"n.s. where its interval contains 0" if reference else "") + "."
              + (f"\n\n**{seeds} seed(s): these intervals cannot decide anything.** With fewer than {MIN_SEEDS} "
                 f"seeds a 95 % interval is undefined (one seed) or spans about ±9 of the seeds' standard "
                 f"deviations (two: t = 12.7); run at least {MIN_SEEDS} (`seeds:` in the space file)."
                 if seeds < MIN_SEEDS else ""))
    files: dict[str, Path] = {}
    summaries = {m: summarise(rows, m, swept, reference) for m in reported}
    columns = ["method", *map(key_label, swept)]
    lines = []
    for cell in summaries[metric]:
        match = next((c for c in summaries.get(score, []) if all(c.get(k) == cell.get(k) for k in ["method", *swept])),
                     None)
        line = [cell["method"], *(_show(cell[k]) for k in swept), _mean_ci(cell["mean"], cell["ci95"])]
        if score != metric:
            line.append(_mean_ci(match["mean"], match["ci95"]) if match else "n/a")
        if reference:
            line += [_diff(cell)] + ([_diff(match) if match else "—"] if score != metric else [])
        lines.append(line + [str(cell["n"])])
    metric_columns = [metric_label(metric)] + ([metric_label(score)] if score != metric else [])
    diff_columns = [f"Δ {metric_label(m)} vs {reference}" for m in reported] if reference else []
    files["summary.csv"] = _write_csv([{"metric": m, **c} for m in reported for c in summaries[m]], out / "summary.csv")
    files["summary.md"] = out / "summary.md"
    files["summary.md"].write_text(_markdown(header, columns + metric_columns + diff_columns + ["n seeds"], lines))

    tables = {m: by_method(rows, m, swept, reference) for m in reported}
    best = (max if tags.get("mode", "max") == "max" else min)(t["mean"] for t in tables[metric])
    lines = []
    for t in tables[metric]:
        s = next(x for x in tables[score] if x["method"] == t["method"]) if score != metric else t
        cells = [t["method"], ("**{}**" if t["mean"] == best else "{}").format(_mean_ci(t["mean"], t["ci95"]))]
        if score != metric:
            cells.append(_mean_ci(s["mean"], s["ci95"]))
        if reference:
            cells += [_diff(t)] + ([_diff(s)] if score != metric else [])
        params = f"{t['trainable_params']:,.0f}" if not math.isnan(t["trainable_params"]) else "n/a"
        cells += [str(t["n_seeds"]), params,
                  _bytes(t["bytes_up_per_client_round"]) if not math.isnan(t["bytes_up_per_client_round"]) else "n/a",
                  _fmt(t["seconds_per_round"], 2)]
        lines.append(cells)
    files["by_method.csv"] = _write_csv([{"metric": m, **t} for m in reported for t in tables[m]],
                                        out / "by_method.csv")
    files["by_method.md"] = out / "by_method.md"
    files["by_method.md"].write_text(_markdown(
        header + "\n\nMean over the sweep's cells (best selection metric in bold); cost columns as in FedMPT Table 5.",
        ["method"] + [f"{c} (mean over sweep)" for c in metric_columns] + diff_columns
        + ["n seeds", "trainable params", "bytes up / client / round", "s / round"], lines))

    if moved:
        files.update(_write_changes(rows, reported, swept, moved, reference, header, out))

    for key in swept:
        others = [k for k in swept if k != key]
        subtitle = f"{experiment}: mean ± 95 % CI over {seeds} seed(s)" + (
            f", averaged over {', '.join(map(key_label, others))}" if others else "")
        for m in reported:
            name = f"{m}_vs_{key}.png"
            files[name] = plot_vs_key(curves_vs_key(rows, m, key), key, m, subtitle, out / name)
            if reference and not others:
                name = f"{m}_difference_vs_{key}.png"
                files[name] = plot_differences(summaries[m], key, m, reference, subtitle, out / name)
    if any(not math.isnan(r.get("epsilon", math.nan)) for r in used):
        for m in reported:
            name = f"{m}_vs_epsilon.png"
            files[name] = plot_vs_epsilon(rows, m, swept, f"{experiment}: mean ± 95 % CI over {seeds} seed(s)",
                                          out / name)
    name = f"{metric}_vs_round.png"
    files[name] = plot_vs_round(curves_vs_round(rows, metric), metric, f"{experiment}: mean over swept values, "
                                f"95 % CI over {seeds} seed(s); flat at the end = converged", out / name)

    files[PAGE] = write_pages(out)
    for path in files.values():
        client.log_artifact(parent.info.run_id, str(path), "report")
    _log_summary(client, parent.info.run_id, summaries, swept)
    return files


def _change_of(change: str, swept: list[str], used: list[Row]) -> tuple:
    """"KEY=FROM:TO" -> (key, from, to), both values among those the counted trials ran."""
    key, _, ends = change.partition("=")
    start_text, _, end_text = ends.partition(":")
    if key not in swept:
        raise FedvlpError(f"--change: {key!r} is not a swept key of this sweep; expected KEY=FROM:TO with KEY one of "
                          f"{', '.join(swept) or '(none: only methods are swept)'}")
    ran = _sorted(r["swept"][key] for r in used)
    start, end = _value(start_text), _value(end_text)
    if start not in ran or end not in ran or start == end:
        raise FedvlpError(f"--change {change}: expected two different values of {key} that trials ran, from "
                          f"{', '.join(map(_show, ran))}")
    return key, start, end


def _write_changes(rows: list[Row], reported: list[str], swept: list[str], moved: tuple, reference: str | None,
                   header: str, out: Path) -> dict[str, Path]:
    """change_<key>.md/.csv: each method's change from one value of a swept key to another, and against the
    reference's change."""
    key, start, end = moved
    tables = {m: changes(rows, m, swept, key, start, end, reference) for m in reported}
    others = [k for k in swept if k != key]
    where = f"{key_label(key)} = {_show(start)} → {_show(end)}"
    columns = ["method", *map(key_label, others)]
    for m in reported:
        columns += [f"{metric_label(m)} at {_show(start)}", f"at {_show(end)}", f"change, {m} (paired)"]
        columns += [f"Δ change vs {reference}"] if reference else []
    lines = []
    for first in tables[reported[0]]:
        line = [first["method"], *(_show(first[k]) for k in others)]
        for m in reported:
            entry = next((e for e in tables[m] if all(e[k] == first[k] for k in ["method", *others])), None)
            if entry is None:
                line += ["n/a"] * (4 if reference else 3)
                continue
            line += [_mean_ci(entry["start_mean"], entry["start_ci95"]), _mean_ci(entry["end_mean"], entry["end_ci95"]),
                     f"{entry['change']:+.4f} ± {_fmt(entry['change_ci95'])}"] + ([_diff(entry)] if reference else [])
        lines.append(line)
    stem = f"change_{key}"
    text = (f"{header}\n\nThe change from {where}, per method: the final metric at each value, the change paired "
            f"over seeds" + (f", and Δ = the method's change minus {reference}'s, paired again (negative: the method "
                             f"gains less or loses more than {reference})" if reference else "") + ".")
    (out / f"{stem}.md").write_text(_markdown(text, columns, lines))
    flat = [{"metric": m, **e} for m in reported for e in tables[m]]
    return {f"{stem}.md": out / f"{stem}.md", f"{stem}.csv": _write_csv(flat, out / f"{stem}.csv")}


def _log_summary(client, parent_id: str, summaries: dict[str, list[dict]], swept: list[str]) -> None:
    from mlflow.entities import Metric

    items = list(_summary_metrics(summaries, swept).items())
    now = int(time.time() * 1000)
    for i in range(0, len(items), 500):  # MLflow takes at most 1000 metrics per batch
        client.log_batch(parent_id, metrics=[Metric(k, v, now, 0) for k, v in items[i:i + 500]])


def log_sweep_summary(tracking_uri: str, experiment: str) -> None:
    """Log the sweep's summary (final val and test metric per method and swept value, mean and 95 % interval,
    paired differences) as its parent run's metrics, without writing the report's files."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    experiment_id, parent = find_sweep(client, experiment, tracking_uri)
    tags = parent.data.tags
    swept = _swept_keys(tags)
    metric = tags.get("metric") or "val_mAP"
    reported = list(dict.fromkeys([metric, test_metric_of(metric)]))
    rows = collect(client, experiment_id, parent.info.run_id, reported, swept)
    _log_summary(client, parent.info.run_id, {m: summarise(rows, m, swept, tags.get("reference")) for m in reported},
                 swept)


# ---------------------------------------------------------------- the study's page

PAGE, ABOUT = "index.md", "about.md"
NOT_TABLES = (PAGE, ABOUT, "README.md")  # the page itself, its hand-written intro, a folder's readme
FIRST_TABLES = ("summary.md", "by_method.md")
MARK = "<!-- generated by `fedvlp report`"
GENERATED = f"{MARK} from this folder's files (fedvlp report --page DIR rebuilds it); do not edit; edit {ABOUT} -->"


def plot_caption(name: str) -> str:
    """A plot's caption from its file name, e.g. val_mAP_difference_vs_federation.heterogeneity.png ->
    "paired difference in val mAP to the reference vs heterogeneity t"."""
    stem = name.rsplit(".", 1)[0]
    metric, vs, key = stem.partition("_vs_")
    if not vs:
        return stem.replace("_", " ")
    against = "privacy spent ε" if key == "epsilon" else key_label(key)
    if metric.endswith("_difference"):
        return f"paired difference in {metric_label(metric.removesuffix('_difference'))} to the reference vs {against}"
    return f"{metric_label(metric)} vs {against}"


def _split_title(text: str) -> tuple[str | None, str]:
    """(the text's opening `# ` heading, the rest verbatim); (None, text) when it opens with none."""
    head, _, rest = text.lstrip("\n").partition("\n")
    if head.startswith("# "):
        return head[2:].strip(), rest.strip("\n")
    return None, text.strip("\n")


def _demote(text: str, levels: int) -> str:
    """Every heading `levels` deeper (at most ######), fenced code left alone: a table's headings sit under its
    section of the page."""
    lines, fenced = [], False
    for line in text.split("\n"):
        if line.startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            hashes = len(line) - len(line.lstrip("#"))
            line = "#" * min(6, hashes + levels) + line[hashes:]
        lines.append(line)
    return "\n".join(lines)


def _is_table(path: Path) -> bool:
    return path.suffix == ".md" and path.name not in NOT_TABLES


def _is_plot(path: Path) -> bool:
    return path.suffix.lower() == ".png"


def _about(folder: Path, page: bool = False) -> tuple[str, list[str]]:
    """(the folder's title: about.md's heading, else, for the page's own folder, the study's name that heads its
    summary table, else the folder's name, which names a subfolder's part of the study; about.md's text without
    it, if any)."""
    about, summary = folder / ABOUT, folder / FIRST_TABLES[0]
    title, text = _split_title(about.read_text()) if about.is_file() else (None, "")
    study = _split_title(summary.read_text())[0] if page and summary.is_file() else None
    return title or study or folder.resolve().name, [text] if text else []


def _sections(folder: Path, prefix: str, level: int) -> list[str]:
    """The Markdown blocks of one folder: tables, plots, data files, then its subfolders one level deeper; headings
    at `level`, links relative to the page (prefix = this folder's path from the page's folder)."""
    entries = sorted((p for p in folder.iterdir() if not p.name.startswith(".")), key=lambda p: p.name)
    files = [p for p in entries if p.is_file()]
    tables = sorted((p for p in files if _is_table(p)),
                    key=lambda p: (FIRST_TABLES.index(p.name) if p.name in FIRST_TABLES else len(FIRST_TABLES), p.name))
    plots = [p for p in files if _is_plot(p)]
    data = [p for p in files if p.suffix != ".md" and not _is_plot(p)]
    hashes = "#" * min(level, 6)
    blocks = []
    for table in tables:
        heading, body = _split_title(table.read_text())
        section = table.stem.replace("_", " ").capitalize() + (f": {heading}" if heading else "")
        blocks += [f"{hashes} {section}", _demote(body, level)]
    if plots:
        blocks.append(f"{hashes} Plots")
    for plot in plots:
        caption = plot_caption(plot.name)
        blocks += [f"![{caption}]({quote(prefix + plot.name)})", f"*{caption}* (`{plot.name}`)"]
    if data:
        blocks += [f"{hashes} Data files", "\n".join(f"- [{p.name}]({quote(prefix + p.name)})" for p in data)]
    for sub in entries:
        if sub.is_dir() and any(_is_table(p) or _is_plot(p) for p in sub.rglob("*") if p.is_file()):
            title, about = _about(sub)
            blocks += [f"{hashes} {title}", *about, *_sections(sub, f"{prefix}{sub.name}/", level + 1)]
    return blocks


def write_study_page(folder: str | Path) -> Path:
    """Write folder/index.md, a study's page built only from the folder's own files (sorted, so the same files give
    the same bytes): title, about.md verbatim, the tables (summary, by_method, then the others), the plots with
    captions, the other files as links, and the subfolders that hold tables or plots as sections."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FedvlpError(f"{folder} is not a folder; expected a report folder holding summary.md, by_method.md and "
                          f"plots (fedvlp report --out)")
    title, about = _about(folder, page=True)
    page = folder / PAGE
    page.write_text("\n\n".join([GENERATED, f"# {title}", *about, *_sections(folder, "", 2)]) + "\n")
    return page


def write_pages(folder: str | Path) -> Path:
    """write_study_page(folder), and the page of the folder above when fedvlp wrote it: a report written into a
    study's subfolder (heterogeneity/hallucination_gap) is a section of the study's page."""
    page = write_study_page(folder)
    above = page.resolve().parent.parent / PAGE
    if above.is_file() and above.read_text().startswith(MARK):
        write_study_page(above.parent)
    return page
