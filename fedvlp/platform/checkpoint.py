"""The public path of the round checkpoints, which live in `fedvlp.platform.records.checkpoint`."""
from fedvlp.platform.records.checkpoint import PLAIN, decode, encode, load_checkpoint, read_checkpoint, write_checkpoint

__all__ = ["PLAIN", "decode", "encode", "load_checkpoint", "read_checkpoint", "write_checkpoint"]
