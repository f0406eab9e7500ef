"""The report's statistics over seeds, pure numpy and scipy on the rows (`runs.Row`): the mean with a 95 %
Student-t interval, paired differences against the reference method, changes between two values of a swept key,
and curves against a swept value, the round or the privacy spent."""
from __future__ import annotations

import math
from collections import defaultdict
from typing import TYPE_CHECKING

import numpy as np

from fedvlp.platform.studies.report.labels import show_value, sorted_values, value_order

if TYPE_CHECKING:
    from fedvlp.platform.studies.report.runs import Row

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
    return sorted(out, key=lambda d: (d["method"], [value_order(d[k]) for k in keys]))


def by_method(rows: list[Row], metric: str, keys: list[str], reference: str | None = None) -> list[dict]:
    """Per method: the mean over the sweep's cells of the per-seed final metric, its interval over seeds, the
    paired difference against `reference` (per-seed sweep means), and the cost columns."""
    groups = _per_seed(rows, metric, keys)
    sweep_means: dict[str, dict[str, float]] = {}
    for method in sorted_values(m for m, _ in groups):
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
    return sorted(out, key=lambda d: (d["method"], [value_order(d[k]) for k in keys if k != key]))


def curves(rows: list[Row], metric: str, x_of) -> dict[str, tuple[list, np.ndarray, np.ndarray]]:
    """{method: (xs, mean over seeds, 95 % half-width)} of `metric` against x_of(row, step) (the swept value,
    or the round), averaging each seed over the rest of the sweep first."""
    acc = defaultdict(list)
    for r in counted(rows, metric):
        for x, value in x_of(r):
            acc[(r["method"], r["seed"], x)].append(value)
    out = {}
    for method in sorted_values(m for m, _, _ in acc):
        xs = sorted_values(x for m, _, x in acc if m == method)
        stats = [interval([float(np.mean(v)) for (m, _, x2), v in acc.items() if m == method and x2 == x]) for x in xs]
        out[method] = (xs, np.array([s[0] for s in stats]), np.array([s[1] for s in stats]))
    return out


def curves_vs_key(rows: list[Row], metric: str, key: str) -> dict:
    return curves(rows, metric, lambda r: [(r["swept"][key], r["final"][metric])])


def curves_vs_round(rows: list[Row], metric: str) -> dict:
    return curves(rows, metric, lambda r: [(float(step), v) for step, v in r["history"][metric].items()])


def epsilon_lines(rows: list[Row], metric: str, keys: list[str]) -> dict[str, list[tuple[float, float, float]]]:
    """{line label: [(epsilon, mean metric, 95 % half-width)] by epsilon}: one line per method and per value of the
    swept keys that do not set the noise (e.g. participation); a point per cell, its epsilon the mean over seeds."""
    others = [k for k in keys if "noise" not in k and "epsilon" not in k]
    lines: dict = defaultdict(lambda: defaultdict(list))
    for r in counted(rows, metric):
        if not math.isnan(r["epsilon"]) and r["epsilon"] > 0:
            label = " ".join([r["method"], *(f"{k.rsplit('.', 1)[-1]}={show_value(r['swept'][k])}" for k in others)])
            lines[label][_cell(r, keys)].append((r["epsilon"], r["final"][metric]))
    return {label: sorted((float(np.mean([e for e, _ in v])), *interval([m for _, m in v])[:2]) for v in cells.values())
            for label, cells in sorted(lines.items())}
