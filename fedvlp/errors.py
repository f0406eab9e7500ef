"""Errors that end a command with one clear line (the CLI prints them without a traceback)."""


class FedvlpError(Exception):
    """Base: the message is one line that names the field or file and what was expected."""


class ConfigError(FedvlpError):
    """A config, override or space file is invalid."""


class BackboneError(FedvlpError):
    """A backbone or its weights cannot be had."""


class DataError(FedvlpError):
    """A dataset file is missing or malformed."""


class ResourceError(FedvlpError):
    """The run's actors cannot be placed on the cluster."""


class RoundTimeoutError(FedvlpError):
    """A round did not finish within its timeout."""


class RoundFailedError(FedvlpError):
    """Fewer client updates arrived in a round than federation.min_clients_per_round."""


class TrackingError(FedvlpError):
    """The MLflow tracking store cannot be reached or opened."""


def first_line(exc: BaseException) -> str:
    """`Type: first line of the message`, what a failure's printed line and MLflow tag say of its cause."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]
