"""The `fedvlp` command line."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from fedvlp.errors import ConfigError, FedvlpError

HELP = """fedvlp: federated prompt tuning of frozen vision-language models on Ray, tracked in MLflow.

  fedvlp run                       the quickstart: PromptFL on synthetic-scenes with fedvlp's tiny CLIP
  fedvlp run CONFIG --set k=v      any run config (a shipped name such as fedmpt_scenes, or a YAML path)
  fedvlp sweep SPACE               a Ray Tune sweep of whole runs (a shipped name such as smoke, or a path)
  fedvlp tune CONFIG --budget N    tune a method's hyper-parameters on val; writes a config you can run
  fedvlp submit sweep SPACE        the same as a Ray job on a running cluster (its token, directory, MLflow)
  fedvlp report EXPERIMENT         tables, plots and page (index.md) of a sweep, logged to its MLflow parent run
  fedvlp report --page DIR         rebuild the page of a report folder from its files (no MLflow)
  fedvlp data stats CONFIG         what each client holds, and the heterogeneity figure
  fedvlp list KIND                 shipped configs and spaces; registered methods, datasets, partitioners, rules
  fedvlp list state METHOD|CONFIG  a method's state keys: shapes, global or local, the server rule of each
  fedvlp pretrain tiny-clip        regenerate the tiny CLIP that ships in the package
  fedvlp pretrain tiny-vilt        regenerate the tiny ViLT that ships in the package

plugins (docs/extending.md): a config's `plugins: [module]`, $FEDVLP_PLUGINS=module,module, and the
`fedvlp.plugins` entry points of installed distributions; FEDVLP_NO_ENTRY_POINTS=1 skips the entry points
(a broken installed plugin then blocks nothing; its error names the distribution to uninstall).
"""


def _add_overrides(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedvlp", description=HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run one federated experiment and log it to MLflow",
                              description="Run one federated experiment: a Coordinator actor and a pool of "
                                          "ClientWorker actors on Ray, logged as one MLflow run.")
    run.add_argument("config", nargs="?", help="run config: a shipped name (fedvlp list configs) or a YAML path "
                                               "(default: quickstart)")
    _add_overrides(run, "override a dotted config key, e.g. --set federation.rounds=3 (repeatable)")
    run.add_argument("--resume", metavar="RUN_ID",
                     help="continue MLflow run RUN_ID from its last round checkpoint, with its own config "
                          "(CONFIG and --set are then ignored); ends identical to an uninterrupted run")
    run.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    run.add_argument("--list-keys", action="store_true",
                     help="list every config key (the chosen method's included) with its type, value and meaning")
    run.add_argument("--quiet", action="store_true", help="no per-round progress lines")

    sweep = commands.add_parser(
        "sweep", help="a Ray Tune sweep of whole federated runs, tracked as one MLflow experiment",
        description="Run a search space (tune_spaces/*.yaml): every trial is one whole federated run with its own "
                    "placement group, reporting and checkpointing every round; one MLflow experiment with a parent "
                    "run and one nested run per trial. Exits 1 when any trial failed (--resume retries them).")
    sweep.add_argument("space", help="search space: a shipped name (fedvlp list spaces), e.g. smoke, or a YAML path")
    _add_overrides(sweep, "override a dotted key of the base run config for every trial (repeatable)")
    sweep.add_argument("--seeds", type=int, nargs="+", help="run these seeds instead of the space's")
    sweep.add_argument("--methods", nargs="+", help="run only these of the space's methods (its method.name grid or "
                                                    "its named variants)")
    sweep.add_argument("--values", action="append", metavar="KEY=V1,V2",
                       help="sweep KEY over these values instead of the space's grid (repeatable)")
    sweep.add_argument("--resume", action="store_true",
                       help="continue an interrupted sweep: finished trials are kept, unfinished ones resume "
                            "from their last round")
    sweep.add_argument("--report", action="store_true",
                       help="write the report (fedvlp report: tables, plots and the page index.md) when done")

    submit = commands.add_parser(
        "submit", help="run a fedvlp command as a Ray job on a running cluster (token, directory, MLflow carried)",
        description="Submit `fedvlp COMMAND ...` as a Ray job to a running cluster's job API and follow its logs. "
                    "It sends the cluster's token (Ray 2.60 heads ask for one): $RAY_AUTH_TOKEN, else "
                    "$RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token. The job runs in --results, else in this "
                    "directory when the head has it (a head on this machine), else in ~/fedvlp-results on the head; "
                    "its outputs land there (the default store ./mlflow.db, reports/, fedvlp-runs/, ray_results/), "
                    "so `fedvlp report` run here finds a local head's sweep. $MLFLOW_TRACKING_URI, $HF_HUB_OFFLINE, "
                    "$FEDVLP_PLUGINS and $FEDVLP_NO_ENTRY_POINTS go with the job when set here. Exits with 0 when "
                    "the job succeeded.")
    submit.add_argument("--address", help="the cluster's job API (default $RAY_API_SERVER_ADDRESS, else "
                                          "http://127.0.0.1:8265: a local head, or `ray dashboard cluster.yaml`)")
    submit.add_argument("--results", metavar="DIR", help="directory on the head the job runs in and writes to "
                                                         "(made if need be; ~ is the head's home)")
    submit.add_argument("--no-wait", action="store_true", help="print the job id and how to follow it, and return")
    submit.add_argument("fedvlp_command", nargs=argparse.REMAINDER, metavar="COMMAND ...",
                        help="the fedvlp command and its arguments, e.g. sweep participation --seeds 0 1 2 --report")

    tune = commands.add_parser(
        "tune", help="tune a method's hyper-parameters on the val split (Ray Tune + Optuna); writes a config",
        description="Tune the hyper-parameters the config's method declares (fedvlp list methods shows them) with the "
                    "same protocol for every method: BUDGET Ray Tune trials drawn by Optuna's TPE (half of them "
                    "random, then guided), each run once per seed, selected on the mean over the seeds of a val_* "
                    "metric, or of personal_val_* for a personalised method (never a test one). Logged to MLflow "
                    "as one experiment (tune-CONFIG) with a parent run and a nested run per trial and seed; the best "
                    "values are written into a copy of the config that fedvlp run and space files accept as a base.")
    tune.add_argument("config", help="run config: a shipped name or a YAML path")
    tune.add_argument("--budget", type=int, required=True, help="number of trials (every method gets the same)")
    tune.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="seeds each trial runs (default: 0 1)")
    tune.add_argument("--metric", help="val_* or personal_val_* metric to select on (default: val_mAP, "
                                       "val_accuracy for single-label data, personal_val_* for a method that "
                                       "declares its clients' own models, as fedotp does)")
    tune.add_argument("--asha", action="store_true", help="stop weak trials early with ASHA (on the val metric)")
    tune.add_argument("--concurrent", type=int, default=1, help="trials at a time (default 1)")
    tune.add_argument("--out", help="where to write the tuned config (default CONFIG-tuned.yaml)")
    _add_overrides(tune, "override a dotted key of the config for every trial (repeatable)")

    report = commands.add_parser("report", help="tables, plots and page of a sweep, logged to its parent run",
                                 description="Write Markdown and CSV tables and PNG plots of a sweep's MLflow "
                                             "experiment (final metric vs swept value, metric vs round, mean over "
                                             "the sweep per method) and log them to the sweep's parent run; then "
                                             "the folder's page, index.md: the hand-written about.md, every table, "
                                             "every plot with a caption and each subfolder's tables, built from "
                                             "the folder's files only (do not edit it; edit about.md). --page DIR "
                                             "rebuilds only the page of a folder already written, e.g. a committed "
                                             "study under docs/results, without MLflow.")
    report.add_argument("experiment", nargs="?", help="MLflow experiment of the sweep, e.g. sweep-smoke")
    report.add_argument("--page", nargs="+", metavar="DIR",
                        help="only rebuild DIR/index.md from the tables, plots and about.md in DIR (several at once: "
                             "--page docs/results/*/); no EXPERIMENT, no MLflow, no other option")
    report.add_argument("--metric", help="selection metric to report beside its test counterpart (default: the "
                                         "sweep's metric, e.g. val_mAP)")
    report.add_argument("--reference", help="method the paired differences are taken against (default: the space "
                                            "file's reference)")
    report.add_argument("--change", metavar="KEY=FROM:TO",
                        help="also write change_KEY.md/.csv: each method's change in the metric from one value of a "
                             "swept key to another, paired over seeds, and its difference to the reference's change "
                             "(e.g. federation.participation=1.0:0.1, who loses least)")
    report.add_argument("--out", help="output folder (default: reports/EXPERIMENT)")
    report.add_argument("--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI or ./mlflow.db)")

    data = commands.add_parser("data", help="inspect a run's data: clients, label skew, missing modalities")
    data_commands = data.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")
    stats = data_commands.add_parser(
        "stats", help="per-client sizes, label distributions and the heterogeneity figure",
        description="Print, per client, its size, its most frequent classes and (image+text data) its missing "
                    "pattern, then the mean pairwise Jensen-Shannon distance between client label distributions. "
                    "No Ray, no MLflow.")
    stats.add_argument("config", nargs="?", help="run config: a shipped name or a YAML path (default: quickstart)")
    _add_overrides(stats, "override a dotted config key (repeatable)")
    stats.add_argument("--plot", metavar="PNG", help="also save a client x class count heatmap")

    listing = commands.add_parser("list", help="what can be named: configs, spaces, methods, datasets, partitioners, "
                                               "rules; a method's state keys",
                                  description="List the shipped configs and search spaces, or the registered methods "
                                              "(with their tunable hyper-parameters), datasets (with their options), "
                                              "partitioners and server rules, plugins included. `list state` builds a "
                                              "method as a run would (no Ray) and lists its state keys: shape, size, "
                                              "global or local, and the server rule of each with the prefix that "
                                              "chose it, to aim a server.rules prefix at one parameter group.")
    listing.add_argument("kind", choices=LIST_KINDS)
    listing.add_argument("target", nargs="?", metavar="METHOD|CONFIG",
                         help="list state only: a method name (its defaults on the tiny backbone of its kind and "
                              "its synthetic dataset) or a run config (a shipped name or a YAML path; default: "
                              "quickstart)")
    listing.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                         help="e.g. --set plugins=[my_plugin] to list what a plugin registers; list state takes any "
                              "config key, e.g. --set \"server.rules={'adapter.': mean}\"")

    pretrain = commands.add_parser("pretrain", help="regenerate a tiny backbone's shipped weights",
                                   description="Regenerate one of the tiny backbones that ship in the package "
                                               "(deterministic): pretrain it in float32 (cached in the user cache "
                                               "dir; $FEDVLP_CACHE_DIR overrides), then write its float16 weights and "
                                               "their manifest entry (checksum, recipe, figures) into the package's "
                                               "fedvlp/backbones/weights/, or --out. Runs never need this: the "
                                               "weights ship with fedvlp.")
    pretrain.add_argument("backbone", choices=["tiny-clip", "tiny-vilt"],
                          help="tiny-clip: contrastive on web-like captions plus region-phrase contrast on the "
                               "patches, synthetic-scenes' source domain; tiny-vilt: image-text matching and a "
                               "pair-vs-modality contrastive term on synthetic-recipes")
    pretrain.add_argument("--force", action="store_true", help="pretrain again even if this recipe's float32 result "
                                                               "is cached")
    pretrain.add_argument("--out", metavar="DIR", help="write the weights and manifest here instead of the package")
    return parser


LIST_KINDS = ("configs", "spaces", "methods", "datasets", "partitioners", "rules", "state")
TINY = {"clip": ("tiny-clip", "synthetic-scenes"), "vilt": ("tiny-vilt", "synthetic-recipes")}  # list state METHOD


def _list(args) -> None:
    import dataclasses

    from fedvlp.config import CONFIGS_DIR, SPACES_DIR, apply_overrides
    from fedvlp.plugins import env_plugins, load_plugins

    if args.target and args.kind != "state":
        raise ConfigError(f"list {args.kind}: takes no METHOD|CONFIG (only list state does), got {args.target!r}")
    if args.kind in ("configs", "spaces"):
        for path in sorted((CONFIGS_DIR if args.kind == "configs" else SPACES_DIR).glob("*.yaml")):
            first = path.read_text().splitlines()[0].lstrip("# ") if path.read_text() else ""
            print(f"{path.stem:<26} {first}")
        return
    load_plugins([*env_plugins(), *apply_overrides({}, args.overrides).get("plugins", [])])
    if args.kind == "state":
        _list_state(args.target, args.overrides)
    elif args.kind == "methods":
        from fedvlp.methods import METHODS
        from fedvlp.spec import tuning_ranges

        for name, cls in METHODS.items():
            tuned = ", ".join(f"{k} {r.describe()}" for k, r in tuning_ranges(cls.Params).items()) or "nothing to tune"
            print(f"{name:<14} {cls.backbone_kind:<5} {cls.feature_kind:<11} tunes: {tuned}")
    elif args.kind == "datasets":
        from fedvlp.data.catalogue import datasets

        for name, reader in datasets().items():
            options = ", ".join(f.name for f in dataclasses.fields(reader.options)) if reader.options else "-"
            print(f"{name:<18} {'root needed' if reader.needs_root else 'generated':<12} options: {options:<10} "
                  f"{reader.doc}")
    elif args.kind == "partitioners":
        from fedvlp.data.partition import PARTITIONERS

        for name, partitioner in PARTITIONERS.items():
            print(f"{name:<14} {partitioner.labels:<10} {partitioner.doc}")
    else:
        from fedvlp.platform.aggregation import RULES

        rule_options = {name: ", ".join(f.name for f in dataclasses.fields(rule.options)) if rule.options else "-"
                        for name, rule in RULES.items()}
        width = max(map(len, rule_options.values()))  # the columns line up whatever the longest option list
        for name, rule in RULES.items():
            print(f"{name:<12} {rule.kind:<8} options: {rule_options[name]:<{width}} {rule.doc}")


def _list_state(target: str | None, overrides: list[str]) -> None:
    """The state keys of a method built as a run's workers build it: shape, size, what kind of tensor, global or
    local, and the server rule of each with the prefix (the method's or the config's) that chose it."""
    from fedvlp.backbones.loaders import load_backbone
    from fedvlp.config import CONFIGS_DIR, apply_overrides, build_spec, load_spec, resolve_file
    from fedvlp.data import load_dataset
    from fedvlp.methods import METHODS
    from fedvlp.methods.base import LOCAL, Task
    from fedvlp.platform.runtime.worker import build_method, server_rules

    if target is not None and target in METHODS:
        backbone, data = TINY[METHODS[target].backbone_kind]
        raw = {"method": {"name": target}, "backbone": {"name": backbone}, "data": {"name": data}}
        spec = build_spec(apply_overrides(raw, overrides))
    else:
        try:
            path = resolve_file(target, CONFIGS_DIR, "config") if target else None
        except ConfigError:
            raise ConfigError(f"list state: {target} is neither a registered method ({', '.join(METHODS.names())}) "
                              f"nor a run config (a YAML path, or a shipped name: fedvlp list configs)") from None
        spec = load_spec(path, overrides)
    dataset = load_dataset(spec)
    method = build_method(spec, load_backbone(spec), Task(dataset.class_names, dataset.multilabel))
    rules, _ = server_rules(method, spec)  # exactly what the coordinator is given
    prefixes = {**method.server_rules, **spec.server.rules}
    parameters = dict(method.named_parameters())
    state = method.state_dict()
    width = max(len(key) for key in state) if state else 3
    print(f"{spec.method.name} on {spec.backbone.name}, {dataset.name} ({len(dataset.class_names)} classes)")
    print(f"{'key':<{width}}  {'shape':<14}  {'numel':>9}  {'kind':<9}  {'state':<6}  {'server rule':<12}  prefix")
    for key, value in state.items():
        prefix = max((p for p in prefixes if key.startswith(p)), key=len)
        rule = rules.get(key, LOCAL)
        kind = "buffer" if key not in parameters else "trainable" if parameters[key].requires_grad else "frozen"
        where = "local" if rule == LOCAL else "global"
        source = "server.rules" if prefix in spec.server.rules else "method"
        print(f"{key:<{width}}  {'x'.join(map(str, value.shape)) or 'scalar':<14}  {value.numel():>9}  {kind:<9}  "
              f"{where:<6}  {rule:<12}  {prefix!r} ({source})")


def _run(args) -> None:
    import yaml

    from fedvlp.config import DEFAULT_CONFIG, load_spec
    from fedvlp.paths import default_tracking_uri
    from fedvlp.platform.records.tracking import check_tracking_store

    resume = None
    if args.resume:
        from fedvlp.platform.records.tracking import resumable_run

        check_tracking_store(default_tracking_uri(), _tracking_source(None))
        spec, checkpoint_path = resumable_run(args.resume)
        from fedvlp.platform.records.checkpoint import read_checkpoint

        resume = read_checkpoint(checkpoint_path)
    else:
        spec = load_spec(args.config or DEFAULT_CONFIG, args.overrides)
    if args.print_config:
        print(yaml.safe_dump(spec.to_dict(), sort_keys=False), end="")
        return
    if args.list_keys:
        from fedvlp.config import describe_keys

        for key, kind, value, meaning in describe_keys(spec):
            print(f"{key:<32} {kind:<22} {value!s:<18} {meaning}")
        return
    # Before the data, the backbone and the cluster: MLflow would retry an unreachable server for minutes.
    check_tracking_store(spec.tracking.uri or default_tracking_uri(), _tracking_source(spec.tracking.uri))
    from fedvlp.platform.runtime.engine import run_federated

    result = run_federated(spec, progress=not args.quiet, resume=resume)
    print()
    print(format_table(result.initial, result.final, spec.federation.rounds))
    print(f"\nMLflow run {result.run_id} in {result.tracking_uri}")
    _dashboard(result.tracking_uri, spec.tracking.experiment, result.run_id)


def _tracking_source(configured: str | None) -> str:
    """Where the tracking URI came from, for error messages."""
    if configured:
        return "tracking.uri"
    return "$MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "the default tracking store"


def _dashboard(uri: str, experiment: str, run_id: str | None = None, metric: str | None = None) -> None:
    """The lines that open this run, or this experiment's runs, in MLflow's UI. For an experiment with a
    headline `metric`, fedvlp's saved views are stored first and linked: the runs by that metric, and the
    trials grouped by method (mean and range per round in the chart view)."""
    from mlflow import MlflowClient

    from fedvlp.platform.records.tracking import save_ui_views, ui_command, ui_link

    client = MlflowClient(tracking_uri=uri)
    try:
        found = client.get_experiment_by_name(experiment)
    except Exception:
        found = None
    print(f"open the dashboard:  {ui_command(uri)}")
    if found is None:
        return
    if run_id is None and metric and save_ui_views(client, found.experiment_id, metric):
        print(f"then browse to:      {ui_link(found.experiment_id, metric=metric)}")
        print(f"grouped by method:   {ui_link(found.experiment_id, metric=metric, grouped=True)}")
    else:
        print(f"then browse to:      {ui_link(found.experiment_id, run_id)}")


TABLE_KEYS = ("mAP", "CF1", "OF1", "hallucination_gap", "accuracy", "macro_f1")  # the rest are in MLflow


def format_table(initial: dict, final: dict, rounds: int) -> str:
    """The run's headline metrics on val, test, a shifted split where the dataset has one and the clients' own test
    sets, before and after training."""
    from fedvlp.platform.metrics import EVALUATION_SETS

    rows = [f"{'metric':<18} {'split':<12} {'round 0':>9} {f'round {rounds}':>9}", "-" * 51]
    for key in TABLE_KEYS:
        for split in EVALUATION_SETS:
            name = f"{split}_{key}"
            if name in final:
                rows.append(f"{key:<18} {split:<12} {initial.get(name, float('nan')):>9.4f} {final[name]:>9.4f}")
    return "\n".join(rows)


def _sweep(args) -> int:
    from fedvlp.platform.studies.spaces import load_sweep
    from fedvlp.platform.studies.sweep import run_sweep

    cuts = {"seeds": args.seeds, "methods": args.methods, "grids": args.values}
    if args.resume and any(v is not None for v in cuts.values()):
        raise ConfigError("--resume: continues the sweep as it was started; expected no --seeds, --methods or "
                          "--values with it")
    sweep = load_sweep(args.space, args.overrides, **cuts)
    estimate = "" if sweep.minutes_per_trial is None else \
        f", about {sweep.trial_count * sweep.minutes_per_trial:.0f} min on 2 cores ({sweep.minutes_per_trial:g} " \
        f"min a trial, as measured)"
    print(f"sweep {sweep.name}: {sweep.trial_count} trials, {sweep.max_concurrent_trials} at a time{estimate}",
          flush=True)
    results = run_sweep(sweep, resume=args.resume)
    best = results.get_best_result(metric=sweep.metric, mode=sweep.mode, scope="last") if len(results) else None
    print(f"\nsweep {sweep.name}: {len(results)} trials, {len(results.errors)} failed; MLflow experiment "
          f"{sweep.experiment}")
    if best is not None and best.metrics:
        print(f"best {sweep.metric} {best.metrics.get(sweep.metric, float('nan')):.4f} with {best.config}")
    if args.report:
        args.experiment, args.metric, args.out, args.tracking_uri, args.reference, args.change, args.page = \
            sweep.experiment, None, None, sweep.base["tracking"]["uri"], None, None, None
        _report(args)
    else:
        print(f"tables and plots:  fedvlp report {sweep.experiment}")
        _dashboard(sweep.base["tracking"]["uri"], sweep.experiment, metric=sweep.metric)
    if results.errors:  # a sweep with failed trials is not a success: scripts and CI must see it
        print(f"fedvlp: {len(results.errors)} of {len(results)} trials failed; each trial's error.txt under "
              f"{sweep.storage} says why", file=sys.stderr)
        return 1
    return 0


def _tune(args) -> None:
    from fedvlp.paths import default_tracking_uri
    from fedvlp.platform.records.tracking import check_tracking_store
    from fedvlp.platform.studies.tune import load_tune, run_tune

    tune_spec = load_tune(args.config, args.budget, tuple(args.seeds), args.metric, asha=args.asha,
                          max_concurrent=args.concurrent, overrides=args.overrides)
    check_tracking_store(tune_spec.base["tracking"]["uri"] or default_tracking_uri(), _tracking_source(None))
    result = run_tune(tune_spec, out=args.out)
    print(f"tuned config: {result['config']}  (fedvlp run {result['config']})")


def _report(args) -> None:
    from fedvlp.paths import default_tracking_uri
    from fedvlp.platform.records.tracking import check_tracking_store
    from fedvlp.platform.studies.report import make_report, write_pages

    if args.page:
        if args.experiment or args.metric or args.reference or args.change or args.out or args.tracking_uri:
            raise FedvlpError("report --page DIR rebuilds a page from DIR's files alone; expected no EXPERIMENT, "
                              "--metric, --reference, --change, --out or --tracking-uri with it")
        for folder in args.page:
            print(f"page: {write_pages(folder)}")
        return
    if not args.experiment:
        raise FedvlpError("report: no EXPERIMENT; expected a sweep's MLflow experiment (e.g. sweep-smoke), or "
                          "--page DIR to rebuild a report folder's page")
    uri = args.tracking_uri or default_tracking_uri()
    source = "--tracking-uri" if args.tracking_uri else _tracking_source(None)
    check_tracking_store(uri, source)
    store = Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None
    if store is not None and not store.is_file():  # MLflow would create an empty store there: a report reads, only
        raise FedvlpError(f"{source}: {uri}: no MLflow store at {store}; expected the store the sweep logged to "
                          f"(fedvlp sweep prints it)")
    files = make_report(uri, args.experiment, args.out or f"reports/{args.experiment}", metric=args.metric,
                        reference=args.reference, change=args.change)
    for name, path in files.items():
        print(f"{name:>24}: {path}")
    _dashboard(uri, args.experiment, metric=args.metric or _selection_metric(uri, args.experiment))


def _selection_metric(uri: str, experiment: str) -> str:
    """The metric a sweep selected on (its parent run's tag)."""
    from mlflow import MlflowClient

    from fedvlp.platform.studies.report import find_sweep

    return find_sweep(MlflowClient(tracking_uri=uri), experiment, uri)[1].data.tags.get("metric") or "val_mAP"


def _data(args) -> None:
    from fedvlp.config import DEFAULT_CONFIG, load_spec
    from fedvlp.data import prepare_data
    from fedvlp.data.stats import format_stats, plot_counts

    data = prepare_data(load_spec(args.config or DEFAULT_CONFIG, args.overrides))
    print(format_stats(data))
    if args.plot:
        plot_counts(data, args.plot)
        print(f"saved {args.plot}")


def _pretrain(args) -> None:
    from fedvlp.backbones import pretrain_clip as clip
    from fedvlp.backbones import pretrain_vilt as vilt
    from fedvlp.backbones.shipped import SHIPPED_DIR, regenerate

    how: dict[str, tuple[Any, Any, Any]] = {  # backbone: (recipe, pretrain, measure)
        "tiny-clip": (clip.TinyClipRecipe(), clip.pretrain_tiny_clip, clip.measure_tiny_clip),
        "tiny-vilt": (vilt.TinyViltRecipe(), vilt.pretrain_tiny_vilt, vilt.measure_tiny_vilt)}
    recipe, pretrain, measure = how[args.backbone]
    entry = regenerate(recipe, pretrain, measure, force=args.force,
                       directory=Path(args.out) if args.out else SHIPPED_DIR)
    figures = ", ".join(f"{k} {v:.4f}" for k, v in entry["figures"].items())
    print(f"{args.backbone}: {entry['bytes'] / 2**20:.1f} MiB float16, sha256 {entry['sha256'][:16]}..., "
          f"code key {entry['code_key']}\nmeasured on the float16 weights: {figures}")


def _submit(args: argparse.Namespace) -> int:
    from fedvlp.platform.runtime.submit import submit

    return submit(args.fedvlp_command, address=args.address, results=args.results, wait=not args.no_wait)


def one_line(error: FedvlpError) -> str:
    """The error's message on one line. One raised inside a Ray actor arrives wrapped in a
    RayTaskError (an instance of the error's class too) whose text is the remote traceback:
    the original is its `cause`."""
    cause = getattr(error, "cause", None)
    while isinstance(cause, FedvlpError):
        error, cause = cause, getattr(cause, "cause", None)
    return " ".join(str(error).split())


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        code = {"run": _run, "sweep": _sweep, "tune": _tune, "report": _report, "data": _data, "pretrain": _pretrain,
                "list": _list, "submit": _submit}[args.command](args)
    except FedvlpError as exc:
        print(f"fedvlp: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedvlp: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
