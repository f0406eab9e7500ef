"""The public path of `fedvlp sweep`'s entry points, which live in `fedvlp.platform.studies.spaces` (the space file)
and `fedvlp.platform.studies.sweep` (running it)."""
from fedvlp.platform.studies.spaces import (
    DISTRIBUTIONS,
    SPACE_KEYS,
    VARIANT_KEY,
    SweepSpec,
    check_selection_metric,
    cut_down,
    load_sweep,
    trial_name,
    trial_spec,
)
from fedvlp.platform.studies.sweep import (
    PARENT_FILE,
    TUNE_STATE_FILES,
    default_ray_temp_dir,
    recover_cut_state,
    run_sweep,
    staged_copies,
    sweep_progress,
    whole_state,
)

__all__ = ["DISTRIBUTIONS", "PARENT_FILE", "SPACE_KEYS", "TUNE_STATE_FILES", "VARIANT_KEY", "SweepSpec",
           "check_selection_metric", "cut_down", "default_ray_temp_dir", "load_sweep", "recover_cut_state",
           "run_sweep", "staged_copies", "sweep_progress", "trial_name", "trial_spec", "whole_state"]
