"""Named, independent random streams derived from one run seed (docs/architecture.md, "Seed streams").

Every consumer of randomness asks for its own stream by name plus the keys that make it
unique (round, client id, ...), so adding a draw in one place never shifts another, and the
numbers do not depend on which process or worker draws them.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

STREAMS = {
    "data": 1,        # synthetic dataset generation
    "partition": 2,   # client partition
    "label_mask": 3,  # hidden annotations
    "sampling": 4,    # per-round cohort
    "client": 5,      # per-(round, client) local training
    "pretrain": 6,    # backbone pretraining
    "init": 7,        # trainable-module initialisation
    "missing": 8,     # missing modalities
    "aggregate": 9,   # per-round server aggregation that draws (Hungarian clustering)
    "devices": 10,    # per-client device speed of the virtual clock
    "split": 11,      # val and held-out pool split off a real dataset's training data
    "privacy": 12,    # per-round noise of client-level differential privacy
    "secagg": 13,     # pairwise masks of the simulated secure aggregation
    "tune": 14,       # the search algorithm of `fedvlp tune`
}


def seed_sequence(seed: int, stream: str, *keys: int) -> np.random.SeedSequence:
    return np.random.SeedSequence([int(seed), STREAMS[stream], *(int(k) for k in keys)])


def numpy_rng(seed: int, stream: str, *keys: int) -> np.random.Generator:
    return np.random.default_rng(seed_sequence(seed, stream, *keys))


def torch_seed(seed: int, stream: str, *keys: int) -> int:
    return int(seed_sequence(seed, stream, *keys).generate_state(1, np.uint64)[0] >> 1)


def torch_generator(seed: int, stream: str, *keys: int) -> torch.Generator:
    import torch  # here, not at the top: a run's driver uses the numpy streams only and never imports torch

    return torch.Generator().manual_seed(torch_seed(seed, stream, *keys))


@functools.cache
def new_process_seed() -> int:
    """What torch seeded this process with: the actors ask first thing in `__init__`, before anything reseeds it."""
    import torch

    return torch.initial_seed()


def reset_reused_actor(actor, *init_args) -> None:
    """Start a Ray actor afresh in its running process: its attributes cleared, torch's global generators as a
    new process has them, then its `__init__` again. A run on a reused actor (a Tune trial after another in the
    same placement group) so computes exactly what it would on a new one; only the process start is saved."""
    import torch

    actor.__dict__.clear()
    torch.manual_seed(new_process_seed())
    type(actor).__init__(actor, *init_args)
