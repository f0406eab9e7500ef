"""The algorithms, one module each, registered by name in METHODS."""
from fedvlp.methods import (  # noqa: F401  (registers them)
    dualcoop,
    fedavg_p,
    fedlora,
    fedmpt,
    fedotp,
    fedprime,
    fedtpg,
    promptfl,
    zeroshot,
)
from fedvlp.methods.registry import METHODS, register

__all__ = ["METHODS", "register"]
