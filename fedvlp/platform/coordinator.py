"""Coordinator: the actor that holds the global state, the client-local states and the server rules.

Workers are stateless between rounds apart from their cached data, so they are replaceable and the
whole run can be checkpointed from here: the global state, every client's local state, and each server
rule's own state (a server optimiser's moments).
"""
from __future__ import annotations

import itertools

import ray
import torch

from fedvlp.platform.aggregation import RuleInputs, apply_rule, state_nbytes
from fedvlp.platform.client_states import ClientStateStore
from fedvlp.platform.sampling import sample_cohort
from fedvlp.platform.updates import ClientUpdate
from fedvlp.seeding import torch_generator


@ray.remote(max_restarts=0)
class Coordinator:
    def __init__(self, seed: int, num_clients: int, participation: float,
                 initial_state: dict[str, torch.Tensor], rules: dict[str, str], rule_options: dict,
                 client_store: tuple[str, int], checkpoint: dict | None = None, plugins: tuple[str, ...] = ()):
        from fedvlp.plugins import load_plugins

        load_plugins(plugins)  # a plugin's server rule must be registered in this process too
        self.seed, self.num_clients, self.participation = seed, num_clients, participation
        self.rules = rules  # parameter name -> server rule (global parameters only)
        self.rule_options = rule_options  # rule name -> its options dataclass
        self.state = checkpoint["global"] if checkpoint else initial_state
        self.rule_states: dict[str, dict] = checkpoint.get("rule_states", {}) if checkpoint else {}
        spill_dir, budget_bytes = client_store
        self.client_states = ClientStateStore(spill_dir, budget_bytes, checkpoint["clients"] if checkpoint else None)
        self.round = checkpoint["round"] if checkpoint else 0

    def sample_cohort(self, round_index: int) -> list[int]:
        return sample_cohort(self.seed, round_index, self.num_clients, self.participation)

    def global_state(self) -> dict[str, torch.Tensor]:
        return self.state

    def client_state_of(self, client_id: int) -> dict | None:
        return self.client_states.get(client_id)

    def client_states_of(self, client_ids: list[int]) -> dict[int, dict | None]:
        return {cid: self.client_states.get(cid) for cid in client_ids}

    def aggregate(self, round_index: int, *client_updates: ClientUpdate) -> dict:
        """Combine the updates that arrived, in sorted client-id order, into the next global state."""
        updates = sorted(client_updates, key=lambda u: u.client_id)
        sizes = [u.num_samples for u in updates]
        if not updates or sum(sizes) == 0:
            raise RuntimeError(f"round {round_index}: no client update carries data")
        new_state, diagnostics = {}, {}
        for rule_name, keys in itertools.groupby(sorted(self.rules, key=self.rules.get), key=self.rules.get):
            keys = list(keys)
            inputs = RuleInputs([{k: u.global_state[k] for k in keys} for u in updates], sizes,
                                {k: self.state[k] for k in keys}, self.rule_states.get(rule_name, {}),
                                torch_generator(self.seed, "aggregate", round_index), self.rule_options.get(rule_name))
            # by name: Ray ships this class by value, so it must not capture the driver's registry
            params, self.rule_states[rule_name], metrics = apply_rule(rule_name, inputs)
            new_state.update(params)
            diagnostics.update({f"server/{rule_name}/{name}": value for name, value in metrics.items()})
        self.state = new_state
        for u in updates:
            if u.local_state:
                self.client_states.put(u.client_id, u.local_state, round_index)
        self.round = round_index
        total = sum(sizes)
        stat_names = sorted({name for u in updates for name in u.stats})
        return {
            "clients": [u.client_id for u in updates],
            "train_loss": sum(u.loss * n for u, n in zip(updates, sizes)) / total,
            "local_steps": sum(u.steps for u in updates),
            # the methods' own statistics, weighted by sample counts over the clients that report them
            "stats": {name: sum(u.stats[name] * u.num_samples for u in updates if name in u.stats)
                      / max(1, sum(u.num_samples for u in updates if name in u.stats)) for name in stat_names},
            "bytes_up": sum(state_nbytes(u.global_state) for u in updates),
            "bytes_down": len(updates) * state_nbytes(self.state),
            "server": diagnostics,  # what the server rules report about the round (e.g. the clustering's)
            "timings": [(u.client_id, u.worker, u.started, u.finished) for u in updates],
        }

    def snapshot(self) -> dict:
        """Round, global state, server rules' states and client states: everything needed to continue the run."""
        return {"round": self.round, "global": self.state, "rule_states": self.rule_states,
                "clients": self.client_states.snapshot()}
