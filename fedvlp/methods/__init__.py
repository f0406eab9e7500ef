"""The algorithms, one module each, registered by name in METHODS."""
from fedvlp.methods import dualcoop, fedavg_p, fedmpt, fedotp, fedprime, fedtpg, promptfl, zeroshot  # noqa: F401  (registers them)
from fedvlp.methods.registry import METHODS, register

__all__ = ["METHODS", "register"]
