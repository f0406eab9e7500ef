"""Coordinator: the actor that holds the global state, the client-local states and the server rules.

Workers are stateless between rounds apart from their cached data, so they are replaceable and the
whole run can be checkpointed from here: the global state, every client's local state, and each server
rule's own state (a server optimiser's moments).

Privacy (`privacy` = {"clip_norm", "noise_multiplier", "secure"}) changes only how the cohort's average of
the averaged parameter groups is taken: DP-FedAvg clips every client's update over all those groups jointly
and adds Gaussian noise to the sum (`fedvlp.platform.aggregation.privacy`); under secure aggregation the
coordinator only receives masked vectors and recovers their sum (`fedvlp.platform.aggregation.secagg`), noised if
DP is on.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import ray

if TYPE_CHECKING:
    import torch

    from fedvlp.platform.runtime.updates import ClientUpdate


@ray.remote(max_restarts=0)
class Coordinator:
    """Started with the workers, so its process starts while they load the backbone; `begin` then hands it the
    global state to start from and the server rules, which a worker's freshly built method gives.

    The driver imports this module for the actor class only: what needs torch is imported in the methods."""

    def __init__(self, seed: int, client_store: tuple[str | None, int], checkpoint: bytes | None = None,
                 plugins: tuple[str, ...] = ()):
        from fedvlp.platform.records import checkpoint as checkpoints
        from fedvlp.platform.runtime.client_states import ClientStateStore
        from fedvlp.plugins import load_plugins
        from fedvlp.seeding import new_process_seed

        new_process_seed()  # remembered before anything reseeds torch (`reset_reused_actor`)
        load_plugins(plugins)  # a plugin's server rule must be registered in this process too
        resumed = checkpoints.decode(checkpoint) if checkpoint is not None else None
        self.seed = seed
        self.rule_states: dict[str, dict] = resumed.get("rule_states", {}) if resumed else {}
        spill_dir, budget_bytes = client_store
        self.client_states = ClientStateStore(spill_dir, budget_bytes, resumed["clients"] if resumed else None)
        self.round = resumed["round"] if resumed else 0
        self.resumed_state = resumed["global"] if resumed else None

    def reset(self, *init_args) -> None:
        """This coordinator for a new run, as a new actor would start it (`reset_reused_actor`)."""
        from fedvlp.seeding import reset_reused_actor

        reset_reused_actor(self, *init_args)

    def spill_to(self, spill_dir: str) -> None:
        """Where client states past the memory budget go: the run's folder, named once its MLflow run is open."""
        self.client_states.spill_dir = Path(spill_dir)

    def begin(self, state: dict[str, torch.Tensor], rules: dict[str, str], rule_options: dict,
              privacy: dict | None = None) -> None:
        # the global state: a resumed checkpoint's, else the method's initial one
        self.state = state if self.resumed_state is None else self.resumed_state
        self.rules = rules  # parameter name -> server rule (global parameters only)
        self.rule_options = rule_options  # rule name -> its options dataclass
        self.privacy = privacy or {"clip_norm": None, "noise_multiplier": None, "secure": False, "weighting": "samples"}

    def global_state(self) -> dict[str, torch.Tensor]:
        return self.state

    def cohort_client_states(self, client_ids: list[int]):
        """The clients' local states as one object each: called with num_returns=len(client_ids), one call a round
        instead of one per client (Ray returns a single object, not a list, when there is one)."""
        states = [self.client_states.get(cid) for cid in client_ids]
        return states if len(states) > 1 else states[0]

    def client_states_of(self, client_ids: list[int]) -> dict[int, dict | None]:
        return {cid: self.client_states.get(cid) for cid in client_ids}

    def aggregate(self, round_index: int, cohort: list[int], *client_updates: ClientUpdate) -> dict:
        """Combine the updates that arrived, in sorted client-id order, into the next global state. `cohort` is
        every client the round trained (secure aggregation recovers the sum without those that dropped out)."""
        from fedvlp.platform.aggregation import RuleInputs, apply_rule, state_nbytes
        from fedvlp.seeding import torch_generator

        updates = sorted(client_updates, key=lambda u: u.client_id)
        sizes = [u.num_samples for u in updates]
        if not updates or sum(sizes) == 0:
            raise RuntimeError(f"round {round_index}: no client update carries data")
        states, average = self._private_inputs(round_index, cohort, updates)
        broadcast_bytes = state_nbytes(self.state)  # what each client of the round was sent
        new_state, diagnostics = {}, {}
        by_rule: dict[str, list[str]] = {}
        for key, rule_name in self.rules.items():
            by_rule.setdefault(rule_name, []).append(key)
        for rule_name, keys in sorted(by_rule.items()):
            inputs = RuleInputs([{k: s[k] for k in keys if k in s} for s in states], sizes,
                                {k: self.state[k] for k in keys}, self.rule_states.get(rule_name, {}),
                                torch_generator(self.seed, "aggregate", round_index), self.rule_options.get(rule_name))
            group_average = None if average is None else (
                lambda group, weights, keys=keys, previous=inputs.previous: average(group, keys, previous))
            # by name: Ray ships this class by value, so it must not capture the driver's registry
            params, self.rule_states[rule_name], metrics = apply_rule(rule_name, inputs, average=group_average)
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
            "bytes_up": sum(u.nbytes_up for u in updates),
            "bytes_down": len(updates) * broadcast_bytes,
            "server": diagnostics,  # what the server rules report about the round (e.g. the clustering's)
            "timings": [(u.client_id, u.worker, u.started, u.finished) for u in updates],
            "client_states_kept": len(self.client_states) > 0,  # else the driver stops asking for them
        }

    def _private_inputs(self, round_index: int, cohort: list[int], updates: list[ClientUpdate]):
        """(each client's global state as the rules see it, the average function of the averaged groups or None).

        DP without secure aggregation: every update is clipped over all averaged groups jointly, and each group's
        average is `private_average` (uniform weights, noise from the round's "privacy" stream, groups in order).
        Secure aggregation: the masked vectors are unmasked to their sum once; each group takes its slice, noised
        if DP is on (the clients clipped before masking), divided by the cohort's weight otherwise."""
        from fedvlp.platform.aggregation import is_average, privacy, secagg
        from fedvlp.seeding import torch_generator

        clip, sigma, secure = self.privacy["clip_norm"], self.privacy["noise_multiplier"], self.privacy["secure"]
        if sigma is None and not secure:
            return [u.global_state for u in updates], None
        generator = torch_generator(self.seed, "privacy", round_index)
        averaged = sorted(k for k, rule in self.rules.items() if is_average(rule))
        previous = {k: self.state[k] for k in averaged}
        if not secure:
            clipped = [privacy.clip_update({k: u.global_state[k] for k in averaged}, previous, clip) for u in updates]
            states = [{**u.global_state, **c} for u, c in zip(updates, clipped)]
            return states, lambda group_states, keys, group_previous: privacy.private_average(
                group_states, group_previous, clip, sigma, generator)
        _, layout = secagg.flatten(previous)
        total = secagg.unmask_sum({u.client_id: u.masked for u in updates}, cohort, self.seed, round_index, layout)
        if sigma is not None:
            mean = privacy.noisy_mean(total, len(updates), clip, sigma, generator)
        else:
            weight = sum(u.num_samples for u in updates) if self.privacy["weighting"] == "samples" else len(updates)
            mean = {k: v / weight for k, v in total.items()}
        return [u.global_state for u in updates], lambda group_states, keys, group_previous: {
            k: mean[k].to(group_previous[k].dtype) for k in keys}

    def snapshot(self) -> dict:
        """Round, global state, server rules' states and client states: everything needed to continue the run."""
        return {"round": self.round, "global": self.state, "rule_states": self.rule_states,
                "clients": self.client_states.snapshot()}

    def checkpoint(self, plain: dict) -> bytes:
        """The round checkpoint, `snapshot` and the driver's `plain` entries, as the bytes the driver writes."""
        from fedvlp.platform.records import checkpoint as checkpoints

        return checkpoints.encode({**self.snapshot(), **plain})
