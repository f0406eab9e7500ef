"""Client-local states held by the coordinator: in memory up to a budget, the rest spilled to disk.

With thousands of clients, per-client state (a personal prompt, a query projection) need not fit
in one process: past `resources.client_state_memory_mb`, states go to safetensors files under
the run's output directory. A spilled file is named by client and round, so the checkpoint of a
round (which records the index client -> round) stays valid while the next round writes new
files; a superseded file is removed one round later, once a newer checkpoint exists.
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def _nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


class ClientStateStore:
    def __init__(self, spill_dir: str | Path, budget_bytes: int, snapshot: dict | None = None):
        self.spill_dir, self.budget_bytes = Path(spill_dir), budget_bytes
        self.in_memory: dict[int, dict] = dict(snapshot["in_memory"]) if snapshot else {}
        self.on_disk: dict[int, int] = dict(snapshot["on_disk"]) if snapshot else {}  # client -> round of its file
        self.memory_bytes = sum(_nbytes(s) for s in self.in_memory.values())
        self._superseded: list[tuple[int, Path]] = []  # (round superseded, file)
        if snapshot:  # files a crashed round wrote after this checkpoint, or not yet removed
            kept = {self._file(cid, r) for cid, r in self.on_disk.items()}
            for path in self.spill_dir.glob("*.safetensors"):
                if path not in kept:
                    path.unlink()

    def _file(self, client_id: int, round_index: int) -> Path:
        return self.spill_dir / f"client{client_id}-round{round_index}.safetensors"

    def get(self, client_id: int) -> dict | None:
        if client_id in self.in_memory:
            return self.in_memory[client_id]
        if client_id in self.on_disk:
            return load_file(self._file(client_id, self.on_disk[client_id]))
        return None

    def put(self, client_id: int, state: dict[str, torch.Tensor], round_index: int) -> None:
        for superseded_in, path in [item for item in self._superseded if item[0] < round_index]:
            path.unlink(missing_ok=True)  # the checkpoint of `superseded_in` no longer needs it
            self._superseded.remove((superseded_in, path))
        size = _nbytes(state)
        held = _nbytes(self.in_memory[client_id]) if client_id in self.in_memory else None
        if held is not None or self.memory_bytes + size <= self.budget_bytes:
            self.memory_bytes += size - (held or 0)
            self.in_memory[client_id] = state
            return
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        path = self._file(client_id, round_index)
        save_file({k: v.contiguous() for k, v in state.items()}, str(path.with_suffix(".tmp")))
        path.with_suffix(".tmp").replace(path)
        if client_id in self.on_disk and self.on_disk[client_id] != round_index:
            self._superseded.append((round_index, self._file(client_id, self.on_disk[client_id])))
        self.on_disk[client_id] = round_index

    def snapshot(self) -> dict:
        """What a checkpoint keeps: the states in memory and the index of the spilled ones."""
        return {"in_memory": dict(self.in_memory), "on_disk": dict(self.on_disk)}
