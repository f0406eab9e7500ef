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

By stage: `runs` (MLflow -> rows), `labels`, `statistics`, `tables`, `plots`, `pages` (the study's page), and
`build` (`make_report`: all of them in turn).
"""
from fedvlp.platform.studies.report.build import log_sweep_summary, make_report
from fedvlp.platform.studies.report.labels import (
    KEY_LABELS,
    SIGNED_SCORES,
    key_label,
    metric_label,
    score_bounds,
    test_metric_of,
)
from fedvlp.platform.studies.report.pages import (
    ABOUT,
    FIRST_TABLES,
    GENERATED,
    MARK,
    NOT_TABLES,
    PAGE,
    plot_caption,
    write_pages,
    write_study_page,
)
from fedvlp.platform.studies.report.plots import (
    METHOD_COLOURS,
    SPARE_COLOURS,
    TITLE_WIDTH,
    clipped_errors,
    method_colours,
    plot_differences,
    plot_vs_epsilon,
    plot_vs_key,
    plot_vs_round,
)
from fedvlp.platform.studies.report.runs import METHOD_KEY, Row, collect, find_sweep
from fedvlp.platform.studies.report.statistics import (
    MIN_SEEDS,
    by_method,
    changes,
    counted,
    curves,
    curves_vs_key,
    curves_vs_round,
    epsilon_lines,
    interval,
    significant,
    summarise,
)

__all__ = ["ABOUT", "FIRST_TABLES", "GENERATED", "KEY_LABELS", "MARK", "METHOD_COLOURS", "METHOD_KEY", "MIN_SEEDS",
           "NOT_TABLES", "PAGE", "SIGNED_SCORES", "SPARE_COLOURS", "TITLE_WIDTH", "Row", "by_method", "changes",
           "clipped_errors", "collect", "counted", "curves", "curves_vs_key", "curves_vs_round", "epsilon_lines",
           "find_sweep", "interval", "key_label", "log_sweep_summary", "make_report", "method_colours",
           "metric_label", "plot_caption", "plot_differences", "plot_vs_epsilon", "plot_vs_key", "plot_vs_round",
           "score_bounds", "significant", "summarise", "test_metric_of", "write_pages", "write_study_page"]
