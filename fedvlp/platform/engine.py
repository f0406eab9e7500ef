"""The public path of `run_federated` and `RunResult`, which live in `fedvlp.platform.runtime.engine`."""
from fedvlp.platform.runtime.engine import RunResult, run_federated

__all__ = ["RunResult", "run_federated"]
