"""Round checkpoints: `<output_dir>/<run id>/checkpoint.pt`, one torch.save file rewritten every round.

The coordinator holds the tensors, so it encodes the checkpoint (`encode`, `decode`); the driver writes and
reads the bytes (`write_checkpoint`, `read_checkpoint`), because the coordinator may sit on another node and
the run's folder is the driver's. The driver reads back only the plain entries (round, run id, metrics),
without torch: a run's driver never imports torch (2-3 CPU seconds of its start-up).
"""
from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

from fedvlp.errors import FedvlpError

PLAIN = ("round", "run_id", "initial", "final", "virtual_clock_seconds")  # what the driver needs to resume


def encode(checkpoint: dict) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    return buffer.getvalue()


def decode(data: bytes) -> dict:
    """The whole checkpoint, tensors included (weights_only: nothing in it is executed)."""
    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


def write_checkpoint(path: Path, data: bytes) -> None:
    """To a temporary name then renamed, so a crash mid-write leaves the previous round's checkpoint intact."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def read_checkpoint(path: str | Path) -> dict:
    """A checkpoint's plain entries (`PLAIN`), and its bytes under "data" for the coordinator, read without torch."""
    try:
        data = Path(path).read_bytes()
        with zipfile.ZipFile(io.BytesIO(data)) as archive:  # torch.save's format: <name>/data.pkl holds the object
            [pickled] = [name for name in archive.namelist() if name.endswith("/data.pkl")]
            checkpoint = _PlainUnpickler(io.BytesIO(archive.read(pickled))).load()
        plain = {key: checkpoint[key] for key in PLAIN if key in checkpoint}
        if not (isinstance(plain["round"], int) and isinstance(plain["run_id"], str)):
            raise ValueError("no round and run id")
    except FileNotFoundError:
        raise FedvlpError(f"{path}: checkpoint not found") from None
    except Exception as exc:
        raise _unreadable(path, exc) from None
    return {**plain, "data": data}


def load_checkpoint(path: str | Path) -> dict:
    """The whole checkpoint, tensors included (for inspection and tests; a run's driver reads `read_checkpoint`)."""
    try:
        return decode(Path(path).read_bytes())
    except FileNotFoundError:
        raise FedvlpError(f"{path}: checkpoint not found") from None
    except Exception as exc:
        raise _unreadable(path, exc) from None


def _unreadable(path, exc: Exception) -> FedvlpError:
    return FedvlpError(f"{path}: not a readable fedvlp checkpoint ({type(exc).__name__}); expected a file "
                       f"written by a fedvlp run")


class _Opaque(dict):
    """Whatever a checkpoint holds besides plain values (tensors, their storages): a placeholder."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass


class _PlainUnpickler(pickle.Unpickler):
    """Plain values as they are; every class or function the pickle names is `_Opaque`, never imported or called
    (so nothing in the file runs), and tensor storages are None."""

    def find_class(self, module: str, name: str):
        return _Opaque

    def persistent_load(self, pid):
        return None
