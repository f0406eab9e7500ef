"""Coordinator: the actor that holds the global state, the client-local states and the server rule.

Workers are stateless between rounds apart from their cached data, so they are replaceable and
the whole run can be checkpointed from here.
"""
from __future__ import annotations

import itertools
import ray
import torch

from fedvlp.platform.aggregation import AGGREGATORS, state_nbytes
from fedvlp.platform.client_states import ClientStateStore
from fedvlp.platform.sampling import sample_cohort
from fedvlp.seeding import torch_generator


@ray.remote(max_restarts=0)
class Coordinator:
    def __init__(self, seed: int, num_clients: int, participation: float,
                 initial_state: dict[str, torch.Tensor], rules: dict[str, str],
                 rule_options: dict[str, dict] | None, client_store: tuple[str, int], checkpoint: dict | None = None):
        self.seed, self.num_clients, self.participation = seed, num_clients, participation
        self.rules = rules  # parameter name -> aggregation rule (global parameters only)
        self.rule_options = rule_options or {}
        self.state = checkpoint["global"] if checkpoint else initial_state
        spill_dir, budget_bytes = client_store
        self.client_states = ClientStateStore(spill_dir, budget_bytes, checkpoint["clients"] if checkpoint else None)
        self.round = checkpoint["round"] if checkpoint else 0

    def sample_cohort(self, round_index: int) -> list[int]:
        return sample_cohort(self.seed, round_index, self.num_clients, self.participation)

    def global_state(self) -> dict[str, torch.Tensor]:
        return self.state

    def client_state_of(self, client_id: int) -> dict | None:
        return self.client_states.get(client_id)

    def aggregate(self, round_index: int, *client_updates: dict) -> dict:
        """Combine the updates that arrived, in sorted client-id order, into the next global state."""
        updates = sorted(client_updates, key=lambda u: u["client_id"])
        sizes = [u["num_samples"] for u in updates]
        if not updates or sum(sizes) == 0:
            raise RuntimeError(f"round {round_index}: no client update carries data")
        new_state = {}
        for rule, keys in itertools.groupby(sorted(self.rules, key=self.rules.get), key=self.rules.get):
            keys = list(keys)
            new_state.update(AGGREGATORS[rule]([{k: u["global"][k] for k in keys} for u in updates], sizes,
                                               generator=torch_generator(self.seed, "aggregate", round_index),
                                               **self.rule_options.get(rule, {})))
        self.state = new_state
        for u in updates:
            if u["local"]:
                self.client_states.put(u["client_id"], u["local"], round_index)
        self.round = round_index
        total = sum(sizes)
        return {
            "clients": [u["client_id"] for u in updates],
            "train_loss": sum(u["loss"] * n for u, n in zip(updates, sizes)) / total,
            "local_steps": sum(u["steps"] for u in updates),
            "bytes_up": sum(state_nbytes(u["global"]) for u in updates),
            "bytes_down": len(updates) * state_nbytes(self.state),
            "timings": [(u["client_id"], u["worker"], u["started"], u["finished"]) for u in updates],
        }

    def snapshot(self) -> dict:
        """Round, global state and client states: everything needed to continue the run."""
        return {"round": self.round, "global": self.state, "clients": self.client_states.snapshot()}
