"""The Performance page's tables, rendered from the benchmarks' JSON, so that every figure there traces to a file.

docs/performance.md holds each table between `<!-- performance:NAME -->` and `<!-- /performance:NAME -->`; this
renders them from benchmarks/results/<json>.json (each records the command line, the machine and the time that
produced it):

    python benchmarks/performance.py           # rewrite docs/performance.md's blocks from benchmarks/results/
    python benchmarks/performance.py --check   # list the blocks that differ from the JSON, and measured figures
                                               # typed in the prose outside them; exit 1 if any

A block whose JSON is missing names the command that writes it. A tiny run's JSON (--tiny) is refused.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import _common as common

PAGE = Path(__file__).resolve().parent.parent / "docs" / "performance.md"
BLOCK = re.compile(r"(<!-- performance:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /performance:(?P=name) -->)", re.S)
METHODS = {"promptfl": "PromptFL", "fedmpt": "FedMPT"}
ARM_NAMES = {"fedvlp": "fedvlp (cold)", "fedvlp_warm": "fedvlp (warm cluster)", "bare": "bare loop",
             "flower": "Flower (docs)",
             "flower_cached": "Flower (cached)", "fedvlp_per_client": "fedvlp (warm, a task per client)",
             "pfl": "pfl-research"}


class TinyResults(ValueError):
    """A results file written by a --tiny run: its figures say nothing about the full workload."""


def table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows)]


def verdict(value: float, target: float, at_most: bool = True) -> str:
    return "met" if (value <= target if at_most else value >= target) else "missed"


def caption(record: dict, workload: str = "") -> str:
    m = record["machine"]
    measured = (f"easured by `{record['command']}` on {record['utc'][:10]}, {m['cpu_count']} cores, load average "
                f"{m['load_average_1min']} before the run")
    return f"*{workload}; m{measured}.*" if workload else f"*M{measured}.*"


# ---------------------------------------------------------------- one renderer per block: record -> lines

def round_cpu(arm: str, figures: dict) -> str | float:
    """An arm's median round CPU s; missing where it was not measured: a warm run's actors live under the running
    head, not under the benchmark, and records from before they were counted left them out."""
    if arm == "fedvlp_warm" and not figures.get("cpu_counts_cluster"):
        return "— (the cluster's actors not counted)"
    return figures["median_round_cpu_s"]


def overhead(r: dict) -> list[str]:
    workloads = [(method, length, w) for method, lengths in r["methods"].items() for length, w in lengths.items()]
    arms = list(workloads[0][2]["arms"])
    ours = [arm for arm in arms if arm.startswith("fedvlp")]
    pairs = [(a, o) for a in ours for o in arms if not o.startswith("fedvlp")]
    totals, runs = [], []
    for method, length, w in workloads:
        label = f"{METHODS.get(method, method)}, {length.split('_')[0]} rounds"
        cells = []
        for arm in arms:
            spread = w["totals_s"][arm]
            cells.append(f"{w['arms'][arm]['total_s']:.1f} s"
                         + (f" ({min(spread):.1f}–{max(spread):.1f})" if len(spread) > 1 else ""))
        for arm, other in pairs:
            ratio, goal = w["ratios"][f"{arm}/{other}"]["total"], w["targets"][other]
            paired = w["ratios"][f"{arm}/{other}"].get("total_per_repeat", [ratio])  # older records: one run
            cells.append(f"{ratio:.2f}×" + ("" if goal is None else f" (≤ {goal:g}: "
                                                                   f"{common.against_target(paired, goal)})"))
        work = w["work"]
        cells.append(f"{'yes' if work['same_local_steps'] else 'NO'}, {'yes' if work['same_cohorts'] else 'NO'}")
        gap = work["max_metric_gap_to_fedvlp"].get("bare")
        cells.append("—" if gap is None else "identical" if gap == 0 else f"differ by {gap:.1e}")
        totals.append([label, *cells])
        runs += [[label, ARM_NAMES[arm], a["startup_s"], a["first_round_s"], a["median_round_s"], round_cpu(arm, a),
                  a["local_steps"], f"{a['final']['test_mAP']:.4f}"] for arm, a in w["arms"].items()]
    workload = (f"{r['clients']} clients, {round(r['participation'] * r['clients'])} per round, "
                f"{r['workers']} fedvlp workers = bare-loop processes = Flower actors, each arm's run of median total "
                f"time over {r['repeats']} run(s)" + (", each run in a fresh process" if r.get("fresh_process_per_run")
                                                        else "; measured before each run had a fresh process and the "
                                                        "bare loop scored its evaluation on its processes"))
    skipped = "".join(f" {ARM_NAMES[arm]}: not run ({why})." for arm, why in r["skipped"].items())
    return [*table(["workload", *(ARM_NAMES[a] for a in arms), *(f"{ARM_NAMES[a]} / {ARM_NAMES[o]}" for a, o in pairs),
                    "same local steps, cohorts", "bare's metrics vs fedvlp's"], totals), "",
            *table(["workload", "arm", "start-up s", "round 1 s", "median round s", "median round CPU s",
                    "local steps", "final test mAP"], runs), "", caption(r, workload) + skipped]


def cross_device(r: dict) -> list[str]:
    rows, verdicts = [], []
    for size, w in r["runs"].items():
        per_round = size.split("_")[0]
        for arm, a in w["arms"].items():
            spread, cpu = w["totals_s"][arm], a.get("cpu_to_last_round_s")
            cost = [c for c in w["cost_per_client_ms"][arm] if c is not None]
            rows.append([per_round, ARM_NAMES[arm], f"{a['total_s']:.1f} ({min(spread):.1f}–{max(spread):.1f})",
                         a["startup_s"], f"{a['median_round_s']:.3f}", "missing" if cpu is None else cpu,
                         a["local_steps"], "—" if not cost else f"{common.median(cost):.2f}",
                         f"{a['final']['val_mAP']:.4f}"])
        for pair, ratio in w["ratios"].items():
            ours, theirs = pair.split("/")
            verdicts.append([per_round, f"{ARM_NAMES[ours]} / {ARM_NAMES[theirs]}",
                             " ".join(f"{x:.2f}×" for x in ratio["total_per_repeat"]), f"{ratio['median_round']:.2f}×",
                             f"≤ {ratio['target']:g}: {ratio['verdict']}"])
        if "cost_target" in w:
            costs = " ".join(f"{c:.2f}" for c in w["cost_per_client_ms"]["fedvlp_warm"])
            verdicts.append([per_round, "fedvlp (warm) platform cost per client, ms", costs, "—",
                             f"≤ {w['cost_target']['target_ms']:g}: {w['cost_target']['verdict']}"])
    same = all(w["work"]["same_local_steps"] and w["work"]["same_cohorts"] for w in r["runs"].values())
    workload = (f"PromptFL over the tiny CLIP's cached features, {r['clients']} clients of {r['samples_per_client']} "
                f"images, 1 local epoch at batch 10, {r['rounds']} rounds, {r['processes_per_arm']} processes per arm, "
                f"each arm's run of median total time over {r['repeats']} alternating repeats, each run in a fresh "
                f"process; the same cohorts and local steps in every arm: {'yes' if same else 'NO'}")
    skipped = "".join(f" {ARM_NAMES[arm]}: not run ({why})." for arm, why in r["skipped"].items())
    return [*table(["per round", "arm", "total s (spread)", "start-up s", "median round s", "CPU s", "local steps",
                    "platform cost per client, ms", "final val mAP"], rows), "",
            *table(["per round", "ratio", "total, per repeat", "median round", "target"], verdicts), "",
            caption(r, workload) + skipped]


def placement(r: dict) -> list[str]:
    steps = r["busiest_worker_steps_per_epoch"]
    rows = [[arm, f"{steps[arm]:.2f}", f"{a['median_round_s']:.3f}", f"{a['median_round_cpu_s']:.3f}",
             f"{a['busiest_worker_s']:.3f}"] for arm, a in r["arms"].items()]
    ratio = r["balanced_over_home"]
    rows.append(["balanced / home", f"{steps['balanced'] / steps['home']:.2f}×", f"{ratio['median_round_s']:.2f}×",
                 f"{ratio['median_round_cpu_s']:.2f}×", f"{ratio['busiest_worker_s']:.2f}×"])
    workload = (f"PromptFL, {r['clients']} clients, {round(r['participation'] * r['clients'])} per round, 2 workers, "
                f"{r['rounds']} rounds, medians of {r['repeats']} alternating repeats; an even split would give the "
                f"busiest worker {steps['even']} steps per epoch; final metrics identical in both arms")
    return [*table(["placement", "busiest worker's steps per epoch", "median round s", "median round CPU s",
                    "busiest worker's local updates s"], rows), "", caption(r, workload)]


def feature_cache(r: dict) -> list[str]:
    rnd = r["round"]
    rows = [[label, rnd["round_s"][arm], rnd["steps"][arm], f"{1000 * rnd['round_s'][arm] / rnd['steps'][arm]:.1f}"]
            for arm, label in (("cached", "cached (fedvlp)"), ("encoder", "image encoder every step"))]
    lines = [*table(["features", "s / round", "local steps", "ms / step"], rows), "",
             f"Speed-up ×{rnd['speedup']:.1f} (target ≥ {r['target_speedup']:g}: "
             f"{verdict(rnd['speedup'], r['target_speedup'], at_most=False)})."]
    if "disk_cache_startup" in r:
        s = r["disk_cache_startup"]
        lines[-1] += (f" Start-up, {s['samples']:,} train+test features: disk-cache hit {s['hit_s']:.3f} s, miss "
                      f"(encode in one process and write) {s['miss_s']:.2f} s.")
    workload = f"PromptFL on {rnd['backbone']}, one round of {len(rnd['cohort'])} clients, {rnd['samples']} samples"
    return [*lines, "", caption(r, workload)]


def scale(r: dict) -> list[str]:
    rows = []
    for run in r["runs"]:
        rss = run["rss_mib"]
        rows.append([f"{run['clients']:,}", f"{run['steady_round_s']:.3f}", f"{run['steady_round_cpu_s']:.3f}",
                     f"{run['round_over_client_update']:.2f}", f"{run['round_rest_s']:.3f}",
                     f"{max(rss['driver'].values()):.0f} / {sum(rss.get('coordinator', {}).values()):.0f} / "
                     + " + ".join(f"{v:.0f}" for v in rss.get("workers", {}).values()) + " MiB"])
    goal = r["target_spread"]
    lines = [*table(["clients N", "s / round", "CPU s / round", "round / one client's update", "rest of a round s",
                     "RSS driver / coordinator / workers"], rows), "",
             f"Largest distance from the mean across N: seconds per round {100 * r['steady_round_s_spread']:.0f} %, "
             f"rounds in client updates {100 * r['round_over_client_update_spread']:.0f} % "
             f"(target ±{100 * goal:.0f} %: {verdict(r['steady_round_s_spread'], goal)}, "
             f"{verdict(r['round_over_client_update_spread'], goal)})."]
    if "client_local_state" in r:
        local = r["client_local_state"]
        lines += ["", f"FedOTP with every one of {local['clients']:,} clients holding a local state of "
                      f"{local['state_bytes']:,} bytes:", "",
                  *table(["client states", "held in memory MiB", "spilled files", "spilled MiB", "checkpoint MiB",
                          "checkpoint written s", "checkpoint on disk s", "a cohort's states read s"],
                         [[mode, f"{f['memory_mib']:.1f}", f"{f['spilled_files']:,}", f"{f['disk_mib']:.1f}",
                           f"{f['checkpoint_mib']:.2f}", f"{f['checkpoint_s']:.3f}",
                           f"{f['checkpoint_on_disk_s']:.3f} ({f['checkpoint_filesystem']})",
                           f"{f['cohort_get_s']:.4f}"] for mode, f in local["every_client_has_state"].items()])]
    workload = (f"PromptFL, cohort {r['cohort']}, 2 workers, IID, {r['samples_per_client']} samples per client, "
                f"{r['rounds']} rounds; per round: medians of rounds 2..{r['rounds'] - 1}")
    return [*lines, "", caption(r, workload)]


def checkpoint(r: dict) -> list[str]:
    rows = [[label, f"{r[f'{arm}_save_s']:.3f}", f"{r[f'{arm}_on_disk_s']:.3f}", f"{r[f'{arm}_mib']:.1f}"]
            for arm, label in (("old", "a dict per client (before)"), ("new", "stacked per key (now)"))]
    return [*table(["layout", "save s", "save + fsync s", "MiB"], rows), "",
            f"Old / new save ×{r['old_over_new_save']:.1f}; the new save {verdict(r['new_save_s'], r['target_s'])} "
            f"the target of ≤ {r['target_s']:g} s. Restoring the stacked snapshot: {r['new_restore_s']:.3f} s, "
            "bitwise.",
            "", caption(r, f"{r['clients']:,} clients × 2 KB, median of {r['repeats']}")]


def warm_target(warm: dict) -> str:
    """The warm start-up's target line: a median with a ceiling on every run, or (older records) every run."""
    if "ceiling_s" not in warm:
        return (f"Target ≤ {warm['target_s']:g} s from the shell, every run: "
                f"{common.against_target(warm['shell_s'], warm['target_s'])}.")
    return (f"Target: a median ≤ {warm['target_s']:g} s from the shell, every run ≤ {warm['ceiling_s']:g} s: "
            f"{common.against_median_target(warm['shell_s'], warm['target_s'], warm['ceiling_s'])}.")


def startup(r: dict) -> list[str]:
    alone = r["alone_cpu_s"]
    rows = [["`fedvlp run` from the shell to round 1, median wall s", r["shell_median_s"]],
            ["`run_federated` in-process to the end of round 1, wall s", r["wall_s"]],
            ["… its CPU s (this process and its descendants)", r["cpu_s"]],
            [f"… the least wall time those CPU s allow on {r['machine']['cpu_count']} cores", r["cpu_floor_s"]],
            *([f"CPU s alone in a fresh process: {name}", value] for name, value in alone.items()),
            ["driver + Ray + 2 workers + coordinator, CPU s", r["processes_cpu_s"]]]
    warm = r["warm"]
    logged = warm["logged_startup_s"]
    warm_rows = [["`fedvlp run` from the shell to round 1, median wall s", warm["shell_median_s"]],
                 *([["… of which to the start of round 1 (round 0 printed)", warm["shell_to_round_1_start_s"]]]
                   if "shell_to_round_1_start_s" in warm else []),
                 ["`run_federated` in-process to the end of round 1, wall s", warm["wall_s"]],
                 ["… its CPU s (this process, the head's processes and their actors)",
                  warm["cpu_s"] if warm.get("cpu_counts_cluster") else "— (the cluster's actors not counted)"],
                 *([f"logged by the engine: `{name}`", value] for name, value in logged.items())]
    return [*table(["cold: a private local Ray and new actors", "s"], rows), "",
            f"Target ≤ {r['target_s']:g} s from the shell, every run: "
            f"{common.against_target(r['shell_s'], r['target_s'])}.", "",
            *table(["warm: a running cluster (`ray start --head` and the MLflow server cluster.yaml starts), the "
                    "actors borrowed from its warm pool", "s"], warm_rows), "",
            warm_target(warm),
            "", caption(r, f"Medians of {len(r['runs'])} runs, warm caches")]


def sweep_trials(r: dict) -> list[str]:
    rows = []
    for arm, label in (("new", "new actors per trial"), ("reused", "reused actors")):
        a = r[arm]
        actors = a["median_startup_parts_s"].get("actors")
        rows.append([label, f"{a['median_overhead_s']:.2f}", "—" if actors is None else f"{actors:.2f}",
                     f"{a['sweep_seconds']:.0f}", len(a["trials"])])
    ratio = r["reused_over_new"]
    return [*table(["trials start on", "median overhead per trial s", "of which actors s", "sweep s", "trials"], rows),
            "", f"Reused / new: overhead per trial ×{ratio['overhead']:.2f}, sweep ×{ratio['sweep']:.2f}; target "
                f"≤ {r['target_s']:g} s per trial with reused actors: "
                f"{verdict(r['reused']['median_overhead_s'], r['target_s'])}.",
            "", caption(r, f"The `{r['space']}` space")]


def fedmpt_round(r: dict) -> list[str]:
    rows = [[METHODS[name], m["samples"], m["steps"], f"{m['seconds_per_local_update']:.3f}",
             f"{m['cpu_seconds_per_local_update']:.3f}", f"{m['ms_per_step']:.1f}", f"{m['seconds_to_score']:.3f}"]
            for name, m in r["methods"].items()]
    prefix = r["shared_prefix"]
    return [*table(["method", "samples", "steps", "s / local update", "CPU s / local update", "ms / step",
                    "scoring one worker's test share s"], rows), "",
            f"FedMPT / PromptFL per local update ×{r['fedmpt_over_promptfl']:.1f} "
            f"(CPU ×{r['fedmpt_over_promptfl_cpu']:.1f}). FedMPT's shared prefix ({prefix['prefix_tokens']} of "
            f"{prefix['prompt_tokens']} tokens): local update "
            f"CPU {prefix['old_cpu_s']:.3f} s encoding every prompt whole → {prefix['new_cpu_s']:.3f} s "
            f"(×{prefix['old_over_new']:.2f}), trained states within {prefix['max_state_difference']:.1e}.",
            "", caption(r, f"One client's local update, {r['torch_threads']} torch thread(s), medians")]


def fedotp_round(r: dict) -> list[str]:
    solve, update = r["cpu_ms_per_solve"], r["cpu_s_per_local_update"]
    rows = [[arm, f"{solve[arm]:.2f}", f"{update[arm]:.3f}"] for arm in solve]
    shape = " × ".join(str(d) for d in r["problem_shape"])
    return [*table(["partial transport on", "CPU ms / solve", "CPU s / local update"], rows), "",
            f"Log domain / float64 scalings: solve ×{r['solve_old_over_new']:.2f}, local update "
            f"×{r['update_old_over_new']:.2f}; plans within {r['max_plan_difference']:.1e}, trained states within "
            f"{r['max_state_difference']:.1e}.", "",
            caption(r, f"FedOTP on fedotp_scenes: one minibatch's {shape} problems (ε = {r['epsilon']:g}, "
                       f"{r['max_iter']} iterations at most), one client's local update ({r['samples']} samples, "
                       f"{r['local_epochs']} epochs), {r['torch_threads']} torch thread(s), medians, alternating")]


def soak(r: dict) -> list[str]:
    rows = [[name, f"{r['rss_mb_by_round'][str(r['from_round'])][name]:.0f}",
             f"{r['rss_mb_by_round'][str(r['to_round'])][name]:.0f}", f"{mb:+.1f}", verdict(mb, r["target_mb"])]
            for name, mb in r["growth_mb"].items()]
    return [*table(["process", f"RSS at round {r['from_round']} MB", f"RSS at round {r['to_round']} MB",
                    "growth MB", f"target < {r['target_mb']} MB"], rows), "",
            caption(r, f"{r['rounds']} PromptFL rounds, {r['seconds_per_round']:.2f} s per round")]


def aggregation(r: dict) -> list[str]:
    phases = list(r["runs"][0]["phases_seconds"])
    rows = [[f"{run['clients']:,}", f"{run['n_global']:,}", f"{run['seconds']:.2f} ({run['cpu_seconds']:.2f})",
             *(f"{100 * run['phases_seconds'][p] / run['seconds']:.0f} %" for p in phases)] for run in r["runs"]]
    growth = "; ".join(f"{g['from']} → {g['to']} clients: time ×{g['time_ratio']}, exponent {g['exponent']} "
                       f"(CPU {g['cpu_exponent']})" for g in r["growth"])
    return [*table(["clients", "centroids", "s (CPU s)", *(p.replace("_", " ") for p in phases)], rows), "",
            f"Growth: {growth}.", "",
            caption(r, f"τ = {r['tau']}, D = {r['dim']}, {r['outer_loops']} outer loops, "
                       f"{r['torch_threads']} torch thread(s)")]


def partition(r: dict) -> list[str]:
    low, mid, high = r["client_size_min_median_max"]
    rows = [[f"{r['samples']:,} × {r['classes']}", f"{r['clients']:,}", r["t"], f"{r['partition_seconds']:.2f}",
             f"{r['partition_peak_mib']:.0f}", f"{r['js_seconds']:.2f}", f"{r['js_distance']:.4f}",
             f"{low} / {mid} / {high}"]]
    return [*table(["labels", "clients", "t", "partition s", "peak MiB", "JS s", "JS distance",
                    "client sizes min / median / max"], rows), "", caption(r)]


# block -> (results file, renderer, the full-size command that writes the file)
BLOCKS = {
    "overhead": ("overhead", overhead, "python benchmarks/overhead.py"),
    "placement": ("placement", placement, "python benchmarks/placement.py"),
    "cross_device": ("cross_device", cross_device, "python benchmarks/cross_device.py"),
    "feature_cache": ("feature_cache", feature_cache, "python benchmarks/feature_cache.py"),
    "feature_cache-vit": ("feature_cache-ViT-B-16", feature_cache,
                          "python benchmarks/feature_cache.py --backbone ViT-B-16 --cohort 1 --repeats 1"),
    "scale": ("scale", scale, "python benchmarks/scale.py"),
    "checkpoint": ("checkpoint", checkpoint, "python benchmarks/checkpoint.py"),
    "startup": ("startup", startup, "python benchmarks/startup.py"),
    "sweep_trials": ("sweep_trials", sweep_trials, "python benchmarks/sweep_trials.py"),
    "fedmpt_round": ("fedmpt_round", fedmpt_round, "python benchmarks/fedmpt_round.py"),
    "fedotp_round": ("fedotp_round", fedotp_round, "python benchmarks/fedotp_round.py"),
    "soak": ("soak", soak, "python benchmarks/soak.py"),
    "aggregation": ("aggregation", aggregation, "python benchmarks/aggregation.py"),
    "partition": ("partition", partition, "python benchmarks/partition.py"),
}


def load(results: Path, name: str) -> dict | None:
    path = results / f"{name}.json"
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    if record.get("tiny"):
        raise TinyResults(f"{path}: written by a --tiny run (`{record.get('command')}`); run it at full size")
    return record


def render(block: str, results: Path) -> str:
    """The body of the page's block `block` from the JSON in `results`."""
    name, renderer, command = BLOCKS[block]
    record = load(results, name)
    if record is None:
        return f"*Not measured yet: `{command}` writes `benchmarks/results/{name}.json`.*\n"
    return "\n".join(renderer(record)) + "\n"


def rendered(text: str, results: Path) -> str:
    """`text` (docs/performance.md) with every block rendered afresh; text outside the blocks is untouched."""
    def fill(match: re.Match) -> str:
        if match["name"] not in BLOCKS:
            raise KeyError(f"block performance:{match['name']}: no renderer (known: {', '.join(BLOCKS)})")
        return match.group(1) + render(match["name"], results) + match.group(4)
    return BLOCK.sub(fill, text)


def stale_blocks(text: str, results: Path) -> list[str]:
    """The blocks of `text` whose body differs from what the JSON in `results` renders."""
    return [m["name"] for m in BLOCK.finditer(text) if m["body"] != render(m["name"], results)]


# a measured figure: a number with a unit of time, memory, a ratio or a share; a target ("0.2× target") is not one
MEASURED = re.compile(r"\d[\d.,]*\s?(?:(?:CPU s|ms|s|MiB|MB|GB)\b|×|%)(?! target)")


def typed_figures(text: str) -> list[str]:
    """Measured figures typed by hand in `text`, outside the rendered blocks and code: they cannot follow their JSON."""
    prose = re.sub(r"```.*?```", "", BLOCK.sub("", text), flags=re.S)
    return [m.group(0) for m in MEASURED.finditer(prose)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="list the blocks that differ from the JSON; exit 1 if any")
    parser.add_argument("--results", type=Path, default=common.RESULTS)
    parser.add_argument("--page", type=Path, default=PAGE, help="the Markdown page holding the blocks")
    args = parser.parse_args(argv)
    text = args.page.read_text()
    if args.check:
        stale, typed = stale_blocks(text, args.results), typed_figures(text)
        print("stale: " + ", ".join(stale) if stale else "every block matches its JSON")
        if typed:
            print("typed by hand outside the blocks: " + ", ".join(typed))
        return 1 if stale or typed else 0
    args.page.write_text(rendered(text, args.results))
    print(f"rendered {len(BLOCK.findall(text))} blocks into {args.page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
