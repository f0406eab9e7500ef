"""`make_report`: every stage of one sweep's report in turn (runs -> statistics -> tables and plots -> the page),
its files logged on the sweep's parent run with the summary as the parent run's own metrics; and
`log_sweep_summary`, the summary alone, which a sweep logs when it ends."""
from __future__ import annotations

import math
import time
from pathlib import Path

from fedvlp.errors import FedvlpError
from fedvlp.platform.studies.report.labels import key_label, metric_label, show_value, sorted_values, test_metric_of
from fedvlp.platform.studies.report.pages import PAGE, write_pages
from fedvlp.platform.studies.report.plots import plot_differences, plot_vs_epsilon, plot_vs_key, plot_vs_round
from fedvlp.platform.studies.report.runs import Row, collect, find_sweep, swept_columns, swept_value
from fedvlp.platform.studies.report.statistics import (
    MIN_SEEDS,
    by_method,
    counted,
    curves_vs_key,
    curves_vs_round,
    summarise,
)
from fedvlp.platform.studies.report.tables import (
    delta,
    fmt,
    fmt_bytes,
    markdown_table,
    mean_ci,
    summary_metrics,
    write_changes,
    write_csv,
)


def make_report(tracking_uri: str, experiment: str, out_dir: str | Path, metric: str | None = None,
                reference: str | None = None, change: str | None = None) -> dict[str, Path]:
    """Write summary/by_method tables (CSV + Markdown) and plots for one sweep, and with `change`
    ("KEY=FROM:TO") the change table of that swept key; log them and the summary on its parent run."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    experiment_id, parent = find_sweep(client, experiment, tracking_uri)
    tags = parent.data.tags
    swept = swept_columns(tags)
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
                          f"{', '.join(sorted_values(r['method'] for r in used))}")
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
        line = [cell["method"], *(show_value(cell[k]) for k in swept), mean_ci(cell["mean"], cell["ci95"])]
        if score != metric:
            line.append(mean_ci(match["mean"], match["ci95"]) if match else "n/a")
        if reference:
            line += [delta(cell)] + ([delta(match) if match else "—"] if score != metric else [])
        lines.append(line + [str(cell["n"])])
    metric_columns = [metric_label(metric)] + ([metric_label(score)] if score != metric else [])
    diff_columns = [f"Δ {metric_label(m)} vs {reference}" for m in reported] if reference else []
    files["summary.csv"] = write_csv([{"metric": m, **c} for m in reported for c in summaries[m]], out / "summary.csv")
    files["summary.md"] = out / "summary.md"
    files["summary.md"].write_text(markdown_table(header, columns + metric_columns + diff_columns + ["n seeds"], lines))

    tables = {m: by_method(rows, m, swept, reference) for m in reported}
    best = (max if tags.get("mode", "max") == "max" else min)(t["mean"] for t in tables[metric])
    lines = []
    for t in tables[metric]:
        s = next(x for x in tables[score] if x["method"] == t["method"]) if score != metric else t
        cells = [t["method"], ("**{}**" if t["mean"] == best else "{}").format(mean_ci(t["mean"], t["ci95"]))]
        if score != metric:
            cells.append(mean_ci(s["mean"], s["ci95"]))
        if reference:
            cells += [delta(t)] + ([delta(s)] if score != metric else [])
        params = f"{t['trainable_params']:,.0f}" if not math.isnan(t["trainable_params"]) else "n/a"
        cells += [str(t["n_seeds"]), params,
                  fmt_bytes(t["bytes_up_per_client_round"]) if not math.isnan(t["bytes_up_per_client_round"])
                  else "n/a",
                  fmt(t["seconds_per_round"], 2)]
        lines.append(cells)
    files["by_method.csv"] = write_csv([{"metric": m, **t} for m in reported for t in tables[m]],
                                        out / "by_method.csv")
    files["by_method.md"] = out / "by_method.md"
    files["by_method.md"].write_text(markdown_table(
        header + "\n\nMean over the sweep's cells (best selection metric in bold); cost columns as in FedMPT Table 5.",
        ["method"] + [f"{c} (mean over sweep)" for c in metric_columns] + diff_columns
        + ["n seeds", "trainable params", "bytes up / client / round", "s / round"], lines))

    if moved:
        files.update(write_changes(rows, reported, swept, moved, reference, header, out))

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
    ran = sorted_values(r["swept"][key] for r in used)
    start, end = swept_value(start_text), swept_value(end_text)
    if start not in ran or end not in ran or start == end:
        raise FedvlpError(f"--change {change}: expected two different values of {key} that trials ran, from "
                          f"{', '.join(map(show_value, ran))}")
    return key, start, end


def _log_summary(client, parent_id: str, summaries: dict[str, list[dict]], swept: list[str]) -> None:
    from mlflow.entities import Metric

    items = list(summary_metrics(summaries, swept).items())
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
    swept = swept_columns(tags)
    metric = tags.get("metric") or "val_mAP"
    reported = list(dict.fromkeys([metric, test_metric_of(metric)]))
    rows = collect(client, experiment_id, parent.info.run_id, reported, swept)
    _log_summary(client, parent.info.run_id, {m: summarise(rows, m, swept, tags.get("reference")) for m in reported},
                 swept)
