"""A run's driver never imports torch: the actors hold every tensor, the coordinator encodes the checkpoints and
the driver handles plain numbers and bytes (torch's import is 2-3 CPU seconds of the driver's start-up).
`tests/test_packaging.py` checks the imports alone in the fast suite."""
import sys

import pytest
import torch
from conftest import run_in_group

from fedvlp.platform.records.checkpoint import load_checkpoint

SMALL = ["data.num_train=800", "data.num_val=256", "data.num_test=256", "data.num_holdout=200",
         "federation.clients=4", "resources.workers=1"]
TORCH = "print('driver imported torch:', 'torch' in sys.modules)"
FRESH = f"import sys; from fedvlp.cli import main; code = main(sys.argv[1:]); {TORCH}; sys.exit(code)"
RESUMED = ("import sys; from fedvlp.config import load_spec; "
           "from fedvlp.platform.records.checkpoint import read_checkpoint; "
           "from fedvlp.platform.runtime.engine import run_federated; "
           "result = run_federated(load_spec(None, sys.argv[2:]), progress=False, "
           "resume=read_checkpoint(sys.argv[1])); print('rounds', [h['round'] for h in result.history]); "
           f"{TORCH}")


@pytest.mark.slow  # two drivers, each with its own local Ray: about a minute on 2 busy cores
@pytest.mark.usefixtures("tiny_clip")
def test_the_driver_of_a_run_and_of_a_resumed_run_never_imports_torch(tmp_path, tracking_uri):
    settings = [*SMALL, f"tracking.uri={tracking_uri}", f"output_dir={tmp_path / 'runs'}"]
    fresh = run_in_group([sys.executable, "-c", FRESH, "run", "--quiet",
                          *[a for s in [*settings, "federation.rounds=1"] for a in ("--set", s)]], tmp_path)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert "driver imported torch: False" in fresh.stdout, fresh.stdout[-3000:]
    [checkpoint] = (tmp_path / "runs").glob("*/checkpoint.pt")
    assert load_checkpoint(checkpoint)["round"] == 1

    resumed = run_in_group([sys.executable, "-c", RESUMED, str(checkpoint), *settings, "federation.rounds=2"],
                           tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "rounds [2]" in resumed.stdout and "driver imported torch: False" in resumed.stdout, resumed.stdout[-3000:]
    saved = load_checkpoint(checkpoint)  # the coordinator's encoding, the driver's file: round 2, tensors intact
    assert saved["round"] == 2 and saved["run_id"] == checkpoint.parent.name
    assert all(isinstance(t, torch.Tensor) for t in saved["global"].values())
