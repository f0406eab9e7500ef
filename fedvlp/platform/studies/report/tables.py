"""The report's tables: cells as text (a mean with its interval, a paired difference, bytes), CSV and Markdown
files, the change table of one swept key, and the summary as metrics of the sweep's parent run."""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import TYPE_CHECKING

from fedvlp.platform.studies.report.labels import key_label, metric_label, show_value
from fedvlp.platform.studies.report.statistics import changes

if TYPE_CHECKING:
    from fedvlp.platform.studies.report.runs import Row


def fmt(x, digits: int = 4) -> str:
    return "n/a" if isinstance(x, float) and math.isnan(x) else f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def mean_ci(mean: float, half: float) -> str:
    return f"{fmt(mean)} ± {fmt(half)}"


def delta(entry: dict) -> str:
    if "diff" not in entry:
        return "—"
    mark = {True: "", False: " (n.s.)", None: " (n/a)"}[entry["significant"]]
    return f"{entry['diff']:+.4f} ± {fmt(entry['diff_ci95'])}{mark}"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def write_csv(rows: list[dict], path: Path) -> Path:
    fields = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def markdown_table(header: str, columns: list[str], lines: list[list[str]]) -> str:
    table = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return header + "\n\n" + "\n".join(table + ["| " + " | ".join(c) + " |" for c in lines]) + "\n"


def summary_metrics(summaries: dict[str, list[dict]], keys: list[str]) -> dict[str, float]:
    """The report's numbers as metrics of the sweep's parent run: <method>/<key>_<value>.../<metric>_mean (_ci95,
    _diff, _diff_ci95), so the parent row of the runs table and its chart view carry the summary."""
    out = {}
    for metric, cells in summaries.items():
        for c in cells:
            where = "/".join([c["method"], *(f"{k.rsplit('.', 1)[-1]}_{show_value(c[k])}" for k in keys)])
            for stat in ("mean", "ci95", "diff", "diff_ci95"):
                if stat in c and not math.isnan(c[stat]):
                    out[f"{where}/{metric}_{stat}"] = c[stat]
    return out


def write_changes(rows: list[Row], reported: list[str], swept: list[str], moved: tuple, reference: str | None,
                   header: str, out: Path) -> dict[str, Path]:
    """change_<key>.md/.csv: each method's change from one value of a swept key to another, and against the
    reference's change."""
    key, start, end = moved
    tables = {m: changes(rows, m, swept, key, start, end, reference) for m in reported}
    others = [k for k in swept if k != key]
    where = f"{key_label(key)} = {show_value(start)} → {show_value(end)}"
    columns = ["method", *map(key_label, others)]
    for m in reported:
        columns += [f"{metric_label(m)} at {show_value(start)}", f"at {show_value(end)}", f"change, {m} (paired)"]
        columns += [f"Δ change vs {reference}"] if reference else []
    lines = []
    for first in tables[reported[0]]:
        line = [first["method"], *(show_value(first[k]) for k in others)]
        for m in reported:
            entry = next((e for e in tables[m] if all(e[k] == first[k] for k in ["method", *others])), None)
            if entry is None:
                line += ["n/a"] * (4 if reference else 3)
                continue
            line += [mean_ci(entry["start_mean"], entry["start_ci95"]), mean_ci(entry["end_mean"], entry["end_ci95"]),
                     f"{entry['change']:+.4f} ± {fmt(entry['change_ci95'])}"] + ([delta(entry)] if reference else [])
        lines.append(line)
    stem = f"change_{key}"
    text = (f"{header}\n\nThe change from {where}, per method: the final metric at each value, the change paired "
            f"over seeds" + (f", and Δ = the method's change minus {reference}'s, paired again (negative: the method "
                             f"gains less or loses more than {reference})" if reference else "") + ".")
    (out / f"{stem}.md").write_text(markdown_table(text, columns, lines))
    flat = [{"metric": m, **e} for m in reported for e in tables[m]]
    return {f"{stem}.md": out / f"{stem}.md", f"{stem}.csv": write_csv(flat, out / f"{stem}.csv")}
