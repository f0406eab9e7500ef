"""The public path of `fedvlp tune`'s entry points, which live in `fedvlp.platform.studies.tune`."""
from fedvlp.platform.studies.tune import (
    EDGE_SHARE,
    OBJECTIVE,
    TuneSpec,
    load_tune,
    random_trials,
    range_edges,
    run_tune,
    trial_raw,
    write_tuned_config,
)

__all__ = ["EDGE_SHARE", "OBJECTIVE", "TuneSpec", "load_tune", "random_trials", "range_edges", "run_tune",
           "trial_raw", "write_tuned_config"]
