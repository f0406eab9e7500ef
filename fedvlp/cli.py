"""The `fedvlp` command line."""
from __future__ import annotations

import argparse
import os
import sys

from fedvlp.errors import FedvlpError

HELP = """fedvlp: federated prompt tuning of frozen vision-language models on Ray, tracked in MLflow.

  fedvlp run                       the quickstart: PromptFL on synthetic-scenes with fedvlp's tiny CLIP
  fedvlp run CONFIG --set k=v      any run config, with dotted-key overrides
  fedvlp sweep tune_spaces/X.yaml  a Ray Tune sweep of whole runs (--resume continues an interrupted one)
  fedvlp report EXPERIMENT         tables and plots of a sweep, logged to its MLflow parent run
  fedvlp data stats CONFIG         what each client holds, and the heterogeneity figure
  fedvlp pretrain tiny-clip        pretrain and cache the tiny CLIP (done on first use otherwise)
  fedvlp pretrain tiny-vilt        pretrain and cache the tiny ViLT (done on first use otherwise)
"""


def _add_overrides(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedvlp", description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run one federated experiment and log it to MLflow",
                              description="Run one federated experiment: a Coordinator actor and a pool of "
                                          "ClientWorker actors on Ray, logged as one MLflow run.")
    run.add_argument("config", nargs="?", help="run config YAML (default: configs/quickstart.yaml)")
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
                    "run and one nested run per trial.")
    sweep.add_argument("space", help="search-space YAML, e.g. tune_spaces/smoke.yaml")
    _add_overrides(sweep, "override a dotted key of the base run config for every trial (repeatable)")
    sweep.add_argument("--resume", action="store_true",
                       help="continue an interrupted sweep: finished trials are kept, unfinished ones resume "
                            "from their last round")
    sweep.add_argument("--report", action="store_true", help="write the report (fedvlp report) when done")

    report = commands.add_parser("report", help="tables and plots of a sweep, logged to its parent run",
                                 description="Write Markdown and CSV tables and PNG plots of a sweep's MLflow "
                                             "experiment (final metric vs swept value, metric vs round, mean over "
                                             "the sweep per method) and log them to the sweep's parent run.")
    report.add_argument("experiment", help="MLflow experiment of the sweep, e.g. sweep-smoke")
    report.add_argument("--metric", help="metric to report (default: the sweep's metric)")
    report.add_argument("--out", help="output folder (default: reports/EXPERIMENT)")
    report.add_argument("--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI or ./mlflow.db)")

    data = commands.add_parser("data", help="inspect a run's data: clients, label skew, missing modalities")
    data_commands = data.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")
    stats = data_commands.add_parser(
        "stats", help="per-client sizes, label distributions and the heterogeneity figure",
        description="Print, per client, its size, its most frequent classes and (image+text data) its missing "
                    "pattern, then the mean pairwise Jensen-Shannon distance between client label distributions. "
                    "No Ray, no MLflow.")
    stats.add_argument("config", nargs="?", help="run config YAML (default: configs/quickstart.yaml)")
    _add_overrides(stats, "override a dotted config key (repeatable)")
    stats.add_argument("--plot", metavar="PNG", help="also save a client x class count heatmap")

    pretrain = commands.add_parser("pretrain", help="pretrain and cache a tiny backbone",
                                   description="Pretrain one of fedvlp's tiny backbones (deterministic) and cache it "
                                               "in the user cache dir ($FEDVLP_CACHE_DIR overrides): the tiny "
                                               "CLIP contrastively on synthetic-scenes captions, the tiny ViLT "
                                               "on synthetic-recipes image-text pairs.")
    pretrain.add_argument("backbone", choices=["tiny-clip", "tiny-vilt"],
                          help="tiny-clip: contrastive on synthetic-scenes (about 2 min on 2 cores); tiny-vilt: "
                               "image-text matching and a pair-vs-modality contrastive term on synthetic-recipes "
                               "(about 2 1/2 min)")
    pretrain.add_argument("--force", action="store_true", help="pretrain again even if a cached copy exists")
    return parser


def _run(args) -> None:
    import yaml

    from fedvlp.config import DEFAULT_CONFIG, load_spec
    from fedvlp.paths import default_tracking_uri
    from fedvlp.platform.tracking import check_tracking_store

    resume = None
    if args.resume:
        from fedvlp.platform.tracking import resumable_run

        check_tracking_store(default_tracking_uri(), _tracking_source(None))
        spec, checkpoint_path = resumable_run(args.resume)
        from fedvlp.platform.engine import load_checkpoint  # imports Ray: only once the run is known

        resume = load_checkpoint(checkpoint_path)
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
    from fedvlp.platform.engine import run_federated

    result = run_federated(spec, progress=not args.quiet, resume=resume)
    print()
    print(format_table(result.initial, result.final, spec.federation.rounds))
    print(f"\nMLflow run {result.run_id} in {result.tracking_uri}")
    print(f"open the dashboard:  {ui_command(result.tracking_uri)}")


def _tracking_source(configured: str | None) -> str:
    """Where the tracking URI came from, for error messages."""
    if configured:
        return "tracking.uri"
    return "$MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "the default tracking store"


def ui_command(uri: str) -> str:
    return f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000"


def format_table(initial: dict, final: dict, rounds: int) -> str:
    keys = ["mAP", "CF1", "OF1", "CP", "CR", "OP", "OR", "CF1_top3", "OF1_top3", "accuracy", "macro_f1"]
    rows = [f"{'metric':<10} {'round 0':>9} {f'round {rounds}':>9}", "-" * 30]
    rows += [f"{k:<10} {initial[k]:>9.4f} {final[k]:>9.4f}" for k in keys if k in final]
    return "\n".join(rows)


def _sweep(args) -> None:
    from fedvlp.platform.sweep import load_sweep, run_sweep

    sweep = load_sweep(args.space, args.overrides)
    results = run_sweep(sweep, resume=args.resume)
    best = results.get_best_result(metric=sweep.metric, mode=sweep.mode, scope="all") if len(results) else None
    print(f"\nsweep {sweep.name}: {len(results)} trials, {len(results.errors)} failed; MLflow experiment "
          f"{sweep.experiment}")
    if best is not None and best.metrics:
        print(f"best {sweep.metric} {best.metrics.get(sweep.metric, float('nan')):.4f} with {best.config}")
    if args.report:
        args.experiment, args.metric, args.out, args.tracking_uri = sweep.experiment, None, None, None
        _report(args)
    else:
        print(f"tables and plots:  fedvlp report {sweep.experiment}")


def _report(args) -> None:
    from fedvlp.paths import default_tracking_uri
    from fedvlp.platform.report import make_report
    from fedvlp.platform.tracking import check_tracking_store

    uri = args.tracking_uri or default_tracking_uri()
    check_tracking_store(uri, "--tracking-uri" if args.tracking_uri else _tracking_source(None))
    files = make_report(uri, args.experiment, args.out or f"reports/{args.experiment}", metric=args.metric)
    for name, path in files.items():
        print(f"{name:>24}: {path}")


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
    from fedvlp.backbones import pretrain_clip, pretrain_vilt
    from fedvlp.backbones.pretrain import checkpoint_path

    clip = args.backbone == "tiny-clip"
    recipe = pretrain_clip.TinyClipRecipe() if clip else pretrain_vilt.TinyViltRecipe()
    path = checkpoint_path(recipe)
    if path.exists() and not args.force:
        print(f"{args.backbone} is already pretrained: {path} (use --force to train it again)")
        return
    if clip:
        result = pretrain_clip.pretrain_tiny_clip()
        print(f"zero-shot test mAP: {result['zero_shot_map_untrained']:.4f} untrained -> "
              f"{result['zero_shot_map']:.4f} pretrained\nsaved {result['path']}")
    else:
        result = pretrain_vilt.pretrain_tiny_vilt()
        print(f"pretrained in {result['seconds']:.0f} s; held-out image-text matching accuracy "
              f"{result['itm_accuracy']:.4f} (chance 0.5)\nlinear probe on the pooled feature, synthetic-recipes "
              f"val accuracy, untrained -> pretrained:")
        for setting in pretrain_vilt.PROBE_SETTINGS:
            print(f"  {setting:<14} {result[f'probe_untrained_{setting}']:.4f} -> {result[f'probe_{setting}']:.4f}")
        print(f"saved {result['path']}")


def one_line(error: FedvlpError) -> str:
    """The error's message on one line. One raised inside a Ray actor arrives wrapped in a
    RayTaskError (an instance of the error's class too) whose text is the remote traceback:
    the original is its `cause`."""
    while isinstance(getattr(error, "cause", None), FedvlpError):
        error = error.cause
    return " ".join(str(error).split())


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        {"run": _run, "sweep": _sweep, "report": _report, "data": _data, "pretrain": _pretrain}[args.command](args)
    except FedvlpError as exc:
        print(f"fedvlp: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedvlp: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return 0


if __name__ == "__main__":
    sys.exit(main())
