"""Client-local states held by the coordinator: in memory up to a budget, the rest spilled to disk.

With thousands of clients, per-client state (a personal prompt, a query projection) need not fit
in one process: past `resources.client_state_memory_mb`, states go to safetensors files under
the run's output directory. A spilled file is named by client and round, so the checkpoint of a
round (which records the index client -> round) stays valid while the next round writes new
files; a superseded file is removed one round later, once a newer checkpoint exists.

A snapshot stacks the in-memory states per layout (the same keys, shapes and dtypes): one tensor per key
over all the clients that share it. Ten thousand 2 KB states then cross from the coordinator to the
driver and into the checkpoint as a few large tensors, which costs milliseconds, where ten thousand
small dicts of tensors cost seconds (pickling and one archive record per tensor).
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def _nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


class ClientStateStore:
    def __init__(self, spill_dir: str | Path | None, budget_bytes: int, snapshot: dict | None = None):
        """`spill_dir` may come later (before the first state past the budget): a new run's folder is named by
        its MLflow run, which opens while the run starts."""
        self.spill_dir, self.budget_bytes = Path(spill_dir) if spill_dir else None, budget_bytes
        self.in_memory: dict[int, dict] = _unstack(snapshot["stacked"]) if snapshot else {}
        self.on_disk: dict[int, int] = dict(snapshot["on_disk"].tolist()) if snapshot else {}  # client -> file's round
        self.memory_bytes = sum(_nbytes(s) for s in self.in_memory.values())
        self._superseded: list[tuple[int, Path]] = []  # (round superseded, file)
        if snapshot and self.spill_dir:  # files a crashed round wrote after this checkpoint, or not yet removed
            kept = {self._file(cid, r) for cid, r in self.on_disk.items()}
            for path in self.spill_dir.glob("*.safetensors"):
                if path not in kept:
                    path.unlink()

    def _file(self, client_id: int, round_index: int) -> Path:
        assert self.spill_dir is not None, "the coordinator's spill_to comes before the first aggregation"
        return self.spill_dir / f"client{client_id}-round{round_index}.safetensors"

    def __len__(self) -> int:
        return len(self.in_memory.keys() | self.on_disk.keys())

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
        path = self._file(client_id, round_index)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in state.items()}, str(path.with_suffix(".tmp")))
        path.with_suffix(".tmp").replace(path)
        if client_id in self.on_disk and self.on_disk[client_id] != round_index:
            self._superseded.append((round_index, self._file(client_id, self.on_disk[client_id])))
        self.on_disk[client_id] = round_index

    def snapshot(self) -> dict:
        """What a checkpoint keeps: the states in memory, stacked per layout, and the index of the spilled ones
        ([n, 2]: client, round of its file). `ClientStateStore(..., snapshot=...)` restores them exactly."""
        by_layout: dict[tuple, list[int]] = defaultdict(list)
        for cid in sorted(self.in_memory):
            by_layout[tuple((k, v.shape, v.dtype) for k, v in self.in_memory[cid].items())].append(cid)
        stacked = [{"clients": torch.tensor(cids, dtype=torch.int64),
                    "states": {key: torch.stack([self.in_memory[c][key] for c in cids]) for key, _, _ in layout}}
                   for layout, cids in by_layout.items()]
        on_disk = torch.tensor(sorted(self.on_disk.items()), dtype=torch.int64).reshape(-1, 2)
        return {"stacked": stacked, "on_disk": on_disk}


def _unstack(stacked: list[dict]) -> dict[int, dict]:
    """Each client's own tensors back (clones: a view would carry the whole stack wherever Ray sends it)."""
    return {cid: {key: t[row].clone() for key, t in group["states"].items()}
            for group in stacked for row, cid in enumerate(group["clients"].tolist())}
