"""The report's plots (PNG, matplotlib without a display): the final metric against a swept value, the paired
difference to the reference, the metric against the privacy spent and against the round, with 95 % intervals
clipped to the metric's range; one colour per method in every plot of every report."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedvlp.platform.studies.report.labels import (
    key_label,
    metric_label,
    score_bounds,
    show_value,
    sorted_values,
    value_order,
)
from fedvlp.platform.studies.report.statistics import epsilon_lines

if TYPE_CHECKING:
    from fedvlp.platform.studies.report.runs import Row

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
    labels = sorted_values(set(labels))
    taken = {METHOD_COLOURS[m] for m in labels if m in METHOD_COLOURS}
    free = iter([c for c in (*METHOD_COLOURS.values(), *SPARE_COLOURS) if c not in taken])
    return {m: METHOD_COLOURS.get(m) or next(free, "#000000") for m in labels}


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
    categories = sorted_values(x for xs, *_ in curves_.values() for x in xs)
    return categories, not all(isinstance(x, float) for x in categories)


def _set_categories(ax, categories: list) -> None:
    long = max(len(show_value(c)) for c in categories) > 6  # long names would run into each other
    ax.set_xticks(range(len(categories)), [show_value(c) for c in categories],
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
    methods = sorted_values(c["method"] for c in cells if "diff" in c)
    categories = sorted_values(c[key] for c in cells if "diff" in c)
    categorical = not all(isinstance(x, float) for x in categories)
    colours = method_colours(methods)
    for i, method in enumerate(methods):
        mine = sorted((c for c in cells if c["method"] == method and "diff" in c), key=lambda c: value_order(c[key]))
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
