"""Security defaults: nothing from a checkpoint or a config is executed."""
import pytest
import torch

from fedvlp.config import load_spec
from fedvlp.errors import ConfigError, FedvlpError
from fedvlp.platform.records.checkpoint import load_checkpoint


class RunsCodeWhenUnpickled:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))  # unpickling would create the marker file


def test_a_checkpoint_that_would_run_code_is_refused_unexecuted(tmp_path):
    marker, path = tmp_path / "pwned", tmp_path / "checkpoint.pt"
    torch.save({"round": 1, "payload": RunsCodeWhenUnpickled(marker)}, path)
    with pytest.raises(FedvlpError, match=r"checkpoint.pt: not a readable fedvlp checkpoint"):
        load_checkpoint(path)
    assert not marker.exists()


def test_a_config_with_a_python_tag_is_refused_unexecuted(tmp_path):
    marker, config = tmp_path / "pwned", tmp_path / "run.yaml"
    config.write_text(f"seed: !!python/object/apply:os.system ['touch {marker}']\nmethod: {{name: promptfl}}\n")
    with pytest.raises(ConfigError, match=r"run.yaml: not valid YAML"):
        load_spec(config)
    assert not marker.exists()
