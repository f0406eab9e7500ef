"""`fedvlp report`: one sweep's MLflow experiment -> comparison tables and plots (DESIGN §6).

The flow is collect (MLflow -> plain rows, one per trial) -> summarise / by_method / curves
(pure numpy on rows) -> write CSV, Markdown and PNG -> log them on the sweep's parent run.
Only FINISHED trials that were not stopped early count: a trial cut short by ASHA or a failed
one would compare a method at fewer rounds than the others. Std is over seeds, ddof=1.
"""
from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from fedvlp.errors import FedvlpError
from fedvlp.platform.sampling import cohort_size

METHOD_KEY = "method.name"
KEY_LABELS = {"federation.heterogeneity": "heterogeneity t", "federation.participation": "participation rate ρ",
              "data.label_mask": "label mask m", "data.missing_rate": "missing rate η",
              "data.missing_type": "missing modality", "federation.clients": "clients N",
              "federation.rounds": "rounds R"}
METRIC_LABELS = {"test_mAP": "test mAP", "test_CF1": "test CF1", "test_OF1": "test OF1",
                 "test_accuracy": "test accuracy", "test_macro_f1": "test macro-F1"}
Row = dict  # one trial: run_id, status, method, seed, swept{key: value}, stopped_early, final, history, costs


def key_label(key: str) -> str:
    return KEY_LABELS.get(key, key)


def metric_label(metric: str, unit: bool = False) -> str:
    # Every fedvlp test metric is a fraction in [0, 1], not a percentage.
    return METRIC_LABELS.get(metric, metric.replace("_", " ")) + (" (0–1)" if unit else "")


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


def _std(xs) -> float:
    """Sample std over seeds; nan with one seed (a spread cannot be measured from one run)."""
    return float(np.std(xs, ddof=1)) if len(xs) > 1 else math.nan


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


def collect(client, experiment_id: str, parent_id: str, metric: str, swept_keys: list[str]) -> list[Row]:
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
               "method": tags.get("method") or params.get(METHOD_KEY, "?"),
               "seed": tags.get("seed") or params.get("seed") or run.info.run_id,
               "swept": {k: _value(tags.get(f"swept.{k}", params.get(k))) for k in swept_keys},
               "stopped_early": tags.get("stopped_early", "").lower() == "true",
               "final": None, "history": {}}
        if row["status"] == "FINISHED" and not row["stopped_early"]:
            row["history"] = _history(client, run.info.run_id, metric)
            # "Final" = the last logged step: with eval_every > 1 that is still round R.
            row["final"] = row["history"][max(row["history"])] if row["history"] else None
            per_round = cohort_size(int(params.get("federation.clients", 1)),
                                    float(params.get("federation.participation", 1.0)))
            bytes_up = list(_history(client, run.info.run_id, "bytes_up").values())
            seconds = list(_history(client, run.info.run_id, "round_seconds").values())
            trainable = list(_history(client, run.info.run_id, "trainable_params").values())
            row["bytes_up_per_client"] = float(np.mean(bytes_up)) / per_round if bytes_up else math.nan
            row["round_seconds"] = float(np.mean(seconds)) if seconds else math.nan
            row["trainable_params"] = trainable[0] if trainable else math.nan
        rows.append(row)
    return rows


def counted(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r["final"] is not None]


def _cell(row: Row, keys: list[str]) -> tuple:
    return tuple(row["swept"][k] for k in keys)


def summarise(rows: list[Row], keys: list[str]) -> list[dict]:
    """Per (method, swept values except method.name): mean ± std of the final metric over seeds."""
    groups = defaultdict(lambda: defaultdict(list))
    for r in counted(rows):
        groups[(r["method"], _cell(r, keys))][r["seed"]].append(r["final"])
    out = []
    for (method, cell), by_seed in groups.items():
        finals = [float(np.mean(v)) for v in by_seed.values()]  # a repeated seed counts once
        out.append({"method": method, **dict(zip(keys, cell)), "mean": float(np.mean(finals)),
                    "std": _std(finals), "n": len(finals)})
    return sorted(out, key=lambda d: (d["method"], [_order(d[k]) for k in keys]))


def by_method(rows: list[Row], keys: list[str]) -> list[dict]:
    """Per method: mean over swept values of the seed-mean, std over seeds of the per-seed sweep mean, costs."""
    cells = summarise(rows, keys)
    out = []
    for method in _sorted(r["method"] for r in counted(rows)):
        mine = [r for r in counted(rows) if r["method"] == method]
        per_seed = defaultdict(list)
        for r in mine:
            per_seed[r["seed"]].append(r["final"])
        out.append({"method": method,
                    "mean": float(np.mean([c["mean"] for c in cells if c["method"] == method])),
                    "std": _std([float(np.mean(v)) for v in per_seed.values()]),
                    "n_seeds": len(per_seed), "n_trials": len(mine),
                    "trainable_params": float(np.nanmean([r["trainable_params"] for r in mine])),
                    "bytes_up_per_client_round": float(np.nanmean([r["bytes_up_per_client"] for r in mine])),
                    "seconds_per_round": float(np.nanmean([r["round_seconds"] for r in mine]))})
    return out


def _seed_curves(samples) -> dict[str, tuple[list, np.ndarray, np.ndarray]]:
    """(method, seed, x, value) -> {method: (xs, mean over seeds, std over seeds)}, averaging the rest first."""
    acc = defaultdict(list)
    for method, seed, x, value in samples:
        acc[(method, seed, x)].append(value)
    curves = {}
    for method in _sorted(m for m, _, _ in acc):
        xs = _sorted(x for m, _, x in acc if m == method)
        stats = [[float(np.mean(v)) for (m, s, x2), v in acc.items() if m == method and x2 == x] for x in xs]
        curves[method] = (xs, np.array([np.mean(s) for s in stats]), np.array([_std(s) for s in stats]))
    return curves


def curves_vs_key(rows: list[Row], key: str) -> dict:
    return _seed_curves((r["method"], r["seed"], r["swept"][key], r["final"]) for r in counted(rows))


def curves_vs_round(rows: list[Row]) -> dict:
    return _seed_curves((r["method"], r["seed"], float(step), v)
                        for r in counted(rows) for step, v in r["history"].items())


def _figure(title: str, xlabel: str, ylabel: str):
    import matplotlib
    matplotlib.use("Agg")  # no display on cluster nodes
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5), layout="constrained")
    ax.set_title(title, fontsize=11)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return plt, fig, ax


def _save(plt, fig, path: Path) -> Path:
    # Legend outside on the right: it never hides a line, and constrained layout makes room for it.
    fig.legend(loc="outside right upper", title="method", frameon=False)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def plot_vs_key(curves: dict, key: str, metric: str, subtitle: str, path: Path) -> Path:
    """Final metric vs one swept value, one line per method with ±std error bars; str values as categories."""
    plt, fig, ax = _figure(f"{metric_label(metric)} vs {key_label(key)}\n{subtitle}", key_label(key),
                           f"final {metric_label(metric, unit=True)}")
    categories = _sorted(x for xs, _, _ in curves.values() for x in xs)
    categorical = not all(isinstance(x, float) for x in categories)
    for i, (method, (xs, mean, std)) in enumerate(curves.items()):
        # Categories are dodged a little per method so error bars do not sit on top of each other.
        pos = [categories.index(x) + 0.08 * (i - (len(curves) - 1) / 2) for x in xs] if categorical else xs
        # Categories have no order, so no line joins them; markers and error bars only.
        ax.errorbar(pos, mean, yerr=np.nan_to_num(std), marker="o", capsize=4, label=method,
                    linestyle="none" if categorical else "-")
    if categorical:
        long = max(len(_show(c)) for c in categories) > 6  # long names would run into each other
        ax.set_xticks(range(len(categories)), [_show(c) for c in categories],
                      rotation=30 if long else 0, ha="right" if long else "center")
    return _save(plt, fig, path)


def plot_vs_round(curves: dict, metric: str, subtitle: str, path: Path) -> Path:
    """Metric vs round per method: mean over seeds (of the mean over swept values), ±std band."""
    plt, fig, ax = _figure(f"{metric_label(metric)} vs round\n{subtitle}", "round (0 = before training)",
                           metric_label(metric, unit=True))
    for method, (xs, mean, std) in curves.items():
        line, = ax.plot(xs, mean, marker="o", markersize=3, label=method)
        ax.fill_between(xs, mean - np.nan_to_num(std), mean + np.nan_to_num(std), color=line.get_color(), alpha=0.2)
    ax.xaxis.get_major_locator().set_params(integer=True)
    return _save(plt, fig, path)


def _fmt(x, digits: int = 4) -> str:
    return "n/a" if isinstance(x, float) and math.isnan(x) else f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _write_csv(rows: list[dict], path: Path) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _markdown(header: str, columns: list[str], lines: list[list[str]]) -> str:
    table = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return header + "\n\n" + "\n".join(table + ["| " + " | ".join(c) + " |" for c in lines]) + "\n"


def make_report(tracking_uri: str, experiment: str, out_dir: str | Path, metric: str | None = None) -> dict[str, Path]:
    """Write summary/by_method tables (CSV + Markdown) and plots for one sweep; log them on its parent run."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    experiment_id, parent = find_sweep(client, experiment, tracking_uri)
    tags = parent.data.tags
    swept = [k for k in tags.get("swept_keys", "").split(",") if k and k != METHOD_KEY]
    if metric is None:
        metric = tags.get("metric")
    if metric is None:  # an old parent without the tag: the headline metric of the task
        trial = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
                                   max_results=1)
        metric = "test_mAP" if not trial or "test_mAP" in trial[0].data.metrics else "test_accuracy"
    rows = collect(client, experiment_id, parent.info.run_id, metric, swept)
    used = counted(rows)
    if not used:
        raise FedvlpError(f"experiment {experiment!r}: none of its {len(rows)} trials is FINISHED with "
                          f"{metric!r} logged; expected at least one finished trial")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    seeds = len({r["seed"] for r in used})
    failed = sum(r["status"] == "FAILED" for r in rows)
    early = sum(r["stopped_early"] for r in rows)
    other = len(rows) - len(used) - failed - early
    header = (f"# {experiment}: {metric}\n\nSweep over {', '.join(swept) or 'methods only'}; mode "
              f"{tags.get('mode', 'max')}. {len(used)} of {len(rows)} trials counted; skipped: {failed} FAILED, "
              f"{early} stopped early (ASHA), {other} other (not finished or no {metric}). "
              f"Final = {metric} at the last logged round; ± is the sample std over seeds (ddof=1).")
    files: dict[str, Path] = {}

    summary = summarise(rows, swept)
    files["summary.csv"] = _write_csv(summary, out / "summary.csv")
    files["summary.md"] = out / "summary.md"
    files["summary.md"].write_text(_markdown(
        header, ["method", *map(key_label, swept), f"final {metric_label(metric)}", "n seeds"],
        [[s["method"], *(_show(s[k]) for k in swept), f"{_fmt(s['mean'])} ± {_fmt(s['std'])}", str(s["n"])]
         for s in summary]))

    table = by_method(rows, swept)
    best = (max if tags.get("mode", "max") == "max" else min)(t["mean"] for t in table)
    files["by_method.csv"] = _write_csv(table, out / "by_method.csv")
    files["by_method.md"] = out / "by_method.md"
    files["by_method.md"].write_text(_markdown(
        header + "\n\nMean over the sweep (best in bold); cost columns as in FedMPT Table 5.",
        ["method", f"{metric_label(metric)} (mean over sweep)", "n seeds", "trainable params",
         "bytes up / client / round", "s / round"],
        [[t["method"], ("**{}**" if t["mean"] == best else "{}").format(f"{_fmt(t['mean'])} ± {_fmt(t['std'])}"),
          str(t["n_seeds"]), f"{t['trainable_params']:,.0f}" if not math.isnan(t["trainable_params"]) else "n/a",
          _bytes(t["bytes_up_per_client_round"]) if not math.isnan(t["bytes_up_per_client_round"]) else "n/a",
          _fmt(t["seconds_per_round"], 2)] for t in table]))

    for key in swept:
        others = [k for k in swept if k != key]
        subtitle = f"{experiment}: mean ± std over {seeds} seed(s)" + (
            f", averaged over {', '.join(map(key_label, others))}" if others else "")
        name = f"{metric}_vs_{key}.png"
        files[name] = plot_vs_key(curves_vs_key(rows, key), key, metric, subtitle, out / name)
    name = f"{metric}_vs_round.png"
    files[name] = plot_vs_round(curves_vs_round(rows), metric, f"{experiment}: mean over swept values, "
                                f"± std over {seeds} seed(s)", out / name)

    for path in files.values():
        client.log_artifact(parent.info.run_id, str(path), "report")
    return files
