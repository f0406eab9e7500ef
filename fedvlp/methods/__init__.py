"""The algorithms, one module each, registered by name in METHODS (imported on its first use)."""
from fedvlp.methods.registry import METHODS, register

__all__ = ["METHODS", "register"]
