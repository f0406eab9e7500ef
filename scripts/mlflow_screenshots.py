"""Check fedvlp's MLflow links in a real headless browser and take the README's screenshots.

    python scripts/mlflow_screenshots.py              # runs `fedvlp sweep smoke --report` into a temporary store first
    python scripts/mlflow_screenshots.py --store sqlite:////tmp/x/mlflow.db   # an existing store with a sweep

It serves the store with `mlflow ui` on 127.0.0.1 (a free port), stores fedvlp's saved views in the sweep's
experiment (`save_ui_views`), opens in headless Chromium the links `ui_link` makes -- (a) the experiment's runs,
(b) the sweep's parent run, (c) the trials grouped by method in the chart view -- checks from each page that it
opened the model-training runs view (not the GenAI overview of traces) with the method names, the metric and,
for the parent run, its summary metrics, and writes the screenshots to docs/images/. The plain experiment link
(`ui_link(experiment_id)`, no saved view) is checked too. It always stops the server it started. Any failed
check ends it with one line and exit status 1.

Not part of the test suite. Needs the Python package `playwright` (`pip install playwright`; its own browser
download is not used) and Chromium at /usr/bin/chromium (`sudo apt-get install chromium`) or --chromium PATH.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _browser import REPO, Failed, add_browser_options, launch, run_checked

# A first visit opens MLflow's Assistant panel over a third of the page, once; start as if it had been closed once.
CLOSED_ASSISTANT = ("localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false');"
                    "localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true');")
GENAI_OVERVIEW = ("/overview", "workflowType=genai")  # where a link without the model-training workflow lands


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", help="tracking URI (or path of a sqlite file) holding a fedvlp sweep; default: "
                                        "run the --space sweep into a new temporary store")
    parser.add_argument("--space", default="smoke", help="the sweep to run without --store: a shipped space name or "
                                                          "a YAML path (default smoke: promptfl vs zeroshot, 2 "
                                                          "heterogeneities, 2 seeds, a few minutes on 2 cores)")
    parser.add_argument("--experiment", help="the sweep's experiment name (default: the newest one with a sweep)")
    add_browser_options(parser, timeout=90.0)
    return run_checked("mlflow_screenshots", parser, run, argv)


def run(args) -> None:
    from fedvlp.platform.records.tracking import save_ui_views

    with tempfile.TemporaryDirectory(prefix="fedvlp-shots-") as tmp:
        uri = store_uri(args.store) if args.store else make_sweep(args.space, Path(tmp))
        experiment_id, parent_id, metric, methods = find_sweep(uri, args.experiment)
        if not save_ui_views(uri, experiment_id, metric):
            raise Failed(f"cannot store the saved views in experiment {experiment_id} of {uri}")
        server = start_ui(uri, Path(tmp) / "mlflow-ui.log")
        try:
            check_pages(args, experiment_id, parent_id, metric, methods, server.port)
        except Exception as exc:
            if isinstance(exc, Failed) or type(exc).__module__.split(".")[0] != "playwright":
                raise
            raise Failed(f"the browser failed: {str(exc).strip().splitlines()[0]}") from None
        finally:
            server.stop()


def store_uri(store: str) -> str:
    if "://" in store:
        return store
    path = Path(store).resolve()
    if path.is_dir():
        path = path / "mlflow.db"
    if not path.is_file():
        raise Failed(f"--store {store}: no such sqlite file")
    return f"sqlite:///{path}"


def make_sweep(space: str, tmp: Path) -> str:
    """`fedvlp sweep SPACE --report` into tmp/mlflow.db (Ray's results and the report in tmp too); the store's URI."""
    if Path(space).is_file():
        space = str(Path(space).resolve())
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri)
    if "FEDVLP_CACHE_DIR" not in env and (REPO / ".fedvlp-cache").is_dir():
        env["FEDVLP_CACHE_DIR"] = str(REPO / ".fedvlp-cache")
    print(f"running fedvlp sweep {space} --report into {uri} (a few minutes)...", flush=True)
    log = tmp / "sweep.log"
    with log.open("w") as out:
        done = subprocess.run([sys.executable, "-m", "fedvlp", "sweep", space, "--report",
                               "--set", f"tracking.uri={uri}"], cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        last = [line for line in log.read_text().splitlines() if line.strip()][-1:] or ["no output"]
        raise Failed(f"the sweep failed (exit {done.returncode}): {last[0]}")
    return uri


def find_sweep(uri: str, name: str | None) -> tuple[str, str, str, list[str]]:
    """(experiment id, parent run id, metric, methods of its trials) of the named sweep, or of the newest
    sweep in the store."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiments = [client.get_experiment_by_name(name)] if name else client.search_experiments()
    parents = [run for e in experiments if e is not None
               for run in client.search_runs([e.experiment_id], "tags.`fedvlp.role` = 'sweep'")]
    if not parents:
        where = f"{uri}, experiment {name}" if name else uri
        raise Failed(f"no fedvlp sweep (a run tagged fedvlp.role=sweep) in {where}")
    parent = max(parents, key=lambda run: run.info.start_time)
    trials = client.search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    methods = sorted({run.data.tags["method"] for run in trials if "method" in run.data.tags})
    if len(methods) < 2:
        raise Failed(f"the sweep {parent.info.run_name} in {uri} has trials of {len(methods)} method(s); "
                     f"grouping by method needs two")
    return parent.info.experiment_id, parent.info.run_id, parent.data.tags.get("metric", "val_mAP"), methods


class UIServer:
    """`mlflow ui` on 127.0.0.1 in its own process group, so that stop() ends it and its workers."""

    def __init__(self, uri: str, log: Path):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.log = log
        self.proc = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
                                      "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
                                     stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                last = [line for line in self.log.read_text().splitlines() if line.strip()][-1:] or ["no output"]
                raise Failed(f"mlflow ui exited ({self.proc.returncode}): {last[0]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1)
        raise Failed(f"mlflow ui did not answer on 127.0.0.1:{self.port} within {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
        print(f"stopped mlflow ui (127.0.0.1:{self.port})")


def start_ui(uri: str, log: Path) -> UIServer:
    server = UIServer(uri, log)
    try:
        server.wait(120)
    except BaseException:
        server.stop()
        raise
    print(f"mlflow ui --backend-store-uri {uri} on http://127.0.0.1:{server.port}")
    return server


def check_pages(args, experiment_id: str, parent_id: str, metric: str, methods: list[str], port: int) -> None:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    from fedvlp.platform.records.tracking import ui_link

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timeout_ms = args.timeout * 1000
    with sync_playwright() as pw:
        browser = launch(pw, args.chromium)
        page = None

        def open_(what: str, url: str, ready: str) -> str:
            """Open `url` as a first visit (a new context: no cookies, no local storage) and wait for `ready`."""
            nonlocal page
            print(f"{what}: {url}", flush=True)
            if page is not None:
                page.context.close()
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            context.add_init_script(CLOSED_ASSISTANT)
            page = context.new_page()
            page.set_default_timeout(timeout_ms)
            page.goto(url)
            try:
                page.wait_for_selector(ready, timeout=timeout_ms)
            except PlaywrightError:
                where = page.url
                if any(mark in where for mark in GENAI_OVERVIEW):
                    raise Failed(f"{what}: the UI opened the GenAI overview ({where}), not the runs") from None
                raise Failed(f"{what}: the page did not show {ready} within {args.timeout:.0f} s ({where})") from None
            time.sleep(3)  # let the grid and the charts finish drawing (the page polls, so never goes network-idle)
            if any(mark in page.url for mark in GENAI_OVERVIEW):
                raise Failed(f"{what}: the UI went on to the GenAI overview ({page.url}), not the runs")
            return page.inner_text("body")

        def expect(what: str, text: str, needles) -> None:
            """The page has each of `needles`, and the side bar is the model-training one."""
            if "Judges" in text.splitlines() or "Model registry" not in text:
                raise Failed(f"{what}: the page is in the UI's GenAI workflow, not the model-training one ({page.url})")
            for needle in needles:
                if needle not in text:
                    raise Failed(f"{what}: {needle!r} is not on the page ({page.url})")

        def columns() -> set[str]:
            ids = "cells => cells.map(c => c.getAttribute('col-id'))"
            return set(page.eval_on_selector_all(".ag-header-cell[col-id]", ids))

        def shot(name: str) -> None:
            path = out / name
            page.screenshot(path=str(path))
            print(f"  ok, screenshot {path}")

        # The plain link (what `ui_link(experiment_id)` gives without saved views): runs, model-training workflow.
        text = open_("plain experiment link", ui_link(experiment_id, port=port), ".ag-header-cell[col-id]")
        expect("plain experiment link", text, ["Runs"])
        print("  ok, runs view")

        # (a) the experiment's runs, fedvlp's saved view: method and metric as columns, best first.
        url = ui_link(experiment_id, metric=metric, port=port)
        text = open_("experiment runs", url, f'.ag-header-cell[col-id="metrics.`{metric}`"]')
        expect("experiment runs", text, [*methods, metric, "Runs", f"fedvlp: runs by {metric}"])
        missing = {"tags.`method`", f"metrics.`{metric}`"} - columns()
        if missing:
            raise Failed(f"experiment runs: no column {sorted(missing)[0]} ({page.url})")
        shot("mlflow-runs.png")

        # (b) the sweep's parent run: its summary metrics per method and swept value.
        text = open_("sweep parent run", ui_link(experiment_id, parent_id, port=port), "text=Child runs")
        summary = [f"{m}/" for m in methods] + [f"{metric}_mean"]
        expect("sweep parent run", text, [*summary, "Metrics"])
        lines = [line for line in text.splitlines() if line.startswith(tuple(methods))
                 and line.endswith(f"{metric}_mean")]
        if not lines:
            raise Failed(f"sweep parent run: no summary metric <method>/.../{metric}_mean on the page ({page.url})")
        shot("mlflow-sweep-parent.png")

        # (c) the trials grouped by method, chart view: mean line and min-max band per method, per round.
        url = ui_link(experiment_id, metric=metric, grouped=True, port=port)
        text = open_("grouped charts", url, f"text={methods[0]} ({metric})")
        expect("grouped charts", text, [f"Group: {m}" for m in methods] + [f"{m} ({metric})" for m in methods]
               + ["Group by: method"])
        page.wait_for_selector(".js-plotly-plot .scatterlayer .trace", timeout=timeout_ms)
        split, _, key = metric.partition("_")
        plotted = {metric, "train_loss", *(f"{s}_{key}" for s in ("val", "test", "personal"))}
        first = next((line.strip() for line in text.split("Model metrics", 1)[-1].splitlines()
                      if line.strip() in plotted), None)
        if first != metric:
            raise Failed(f"grouped charts: the first chart is {first}, not {metric} ({page.url})")
        shot("mlflow-by-method-charts.png")
        browser.close()


if __name__ == "__main__":
    sys.exit(main())
