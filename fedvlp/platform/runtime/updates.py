"""What crosses from a ClientWorker to the Coordinator after one client's local update."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    State = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ClientUpdate:
    client_id: int
    num_samples: int
    global_state: State          # the parameters the server aggregates (every rule but LOCAL)
    local_state: State           # the parameters that stay with this client (kept by the coordinator)
    loss: float                  # mean training loss of the local update
    steps: int                   # optimiser steps taken
    stats: dict[str, float] = field(default_factory=dict)  # the method's own statistics, logged as train_<name>
    worker: int = -1
    started: float = 0.0         # wall-clock time.time() at start and end, for the timeline of a round
    finished: float = 0.0
    masked: Any = None           # secure aggregation: the averaged parameters as a masked uint64 vector (secagg.mask)

    @property
    def nbytes_up(self) -> int:
        """What the client sends: its global state, or its masked vector under secure aggregation."""
        plain = sum(t.numel() * t.element_size() for t in self.global_state.values())
        return plain + (self.masked.nbytes if self.masked is not None else 0)

    @classmethod
    def from_result(cls, client_id: int, num_samples: int, global_state: State, local_state: State, result: dict,
                    **timing) -> ClientUpdate:
        """From `local_update`'s returned dict: "loss" and "steps", and every other number a statistic."""
        if "loss" not in result or "steps" not in result:
            raise ValueError(f"local_update must return 'loss' and 'steps', got keys {sorted(result)}")
        stats = {k: float(v) for k, v in result.items() if k not in ("loss", "steps")}
        return cls(client_id, num_samples, global_state, local_state, float(result["loss"]), int(result["steps"]),
                   stats, **timing)
