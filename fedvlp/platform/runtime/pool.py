"""The worker pool: P ClientWorker actors, the home worker of every virtual client, the placement of a
round's cohort, and replacement.

Client k's home is worker k mod P for the whole run: that worker keeps its training data and local test
set. A round's cohort rarely divides evenly over the homes (10 of 50 clients on 2 workers: the busier home
holds 6.6 local steps per epoch on average, an even split 5.2), and a round lasts as long as its busiest
worker, so `balance_cohort` moves clients
from the busiest worker to the idlest while that shortens the round (`resources.cohort_placement:
balanced`, the default). A visiting client's features are read from the training set every worker
holds zero-copy in the object store; its result does not depend on where it trains (its randomness is
keyed by seed, round and client). A worker that dies (killed, its process crashed, or hung past the
round timeout) is replaced by a new actor in the same placement-group bundle, which loads the same
backbone and the same clients' data and test blocks: its virtual clients move to the replacement
unchanged.
"""
from __future__ import annotations

import numpy as np
import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from fedvlp.errors import RoundTimeoutError
from fedvlp.platform.runtime.cohorts import balance_cohort, client_costs
from fedvlp.platform.runtime.worker import ClientWorker

EVAL_BLOCK = 256  # test samples per block; blocks are spread over workers, fixed so scores never depend on P


def wait_all(refs, what: str, timeout: float, knob: str = "resources.round_timeout_s", fetch: bool = True):
    """Wait for all refs within the timeout, or fail loudly naming what is late."""
    done, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    if pending:
        raise RoundTimeoutError(
            f"{what}: {len(pending)} of {len(refs)} tasks unfinished after {knob}={timeout:g} s "
            f"(a hung client, or actors that cannot be placed: available {ray.available_resources()})"
        )
    return ray.get(refs) if fetch else None


class WorkerPool:
    def __init__(self, spec, task, placement, bundle_offset: int, runtime_env: dict | None = None,
                 lifetime: str | None = None):
        self.spec, self.task, self.placement, self.bundle_offset = spec, task, placement, bundle_offset
        self.name = "fedvlp"  # the run's prefix of its actors' names (`ray list actors`), set once the run has an id
        self.runtime_env = runtime_env  # ships the spec's plugins (fedvlp.plugins.actor_runtime_env)
        self.lifetime = lifetime  # "detached": a warm pool's workers, replacements included, outlive the driver
        self.replacements = 0  # over the whole run
        self._data: list[tuple] = []  # per worker: the arguments of its `attach`
        self.home: dict[int, int] = {}
        self.cost: list[int] = []  # per client: local steps per epoch, what `balance_cohort` weighs
        self.local_clients: set[int] = set()  # the clients with a local test or val set
        self.client_states_kept = True  # until an aggregation says the coordinator holds none (`_collect_updates`)
        self.actors: list = []

    def start(self) -> None:
        self.actors = [self._start(w) for w in range(self.spec.resources.workers)]

    def reuse(self, actors: list) -> None:
        """The workers a finished run left (in a Tune trial's placement group or a warm pool), started afresh in
        their processes."""
        wait_all([actor.reset.remote(self.spec, w, self.task) for w, actor in enumerate(actors)],
                 "reset of the reused client workers", self.spec.resources.startup_timeout_s,
                 "resources.startup_timeout_s")
        self.actors = list(actors)

    def _start(self, index: int):
        """Worker `index` in its own bundle; named (`ray list actors`) so drills and tests can reach it (a worker
        reused by a later Tune trial keeps this run's name)."""
        generation = f"-{self.replacements}" if self.replacements else ""  # a dead actor's name may linger
        return ClientWorker.options(  # type: ignore[attr-defined]  # a Ray actor class
            num_cpus=self.spec.resources.num_cpus, num_gpus=self.spec.resources.num_gpus,
            name=f"{self.name}-worker-{index}{generation}", runtime_env=self.runtime_env, lifetime=self.lifetime,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.placement, placement_group_bundle_index=self.bundle_offset + 1 + index),
        ).remote(self.spec, index, self.task)

    def ready(self, actors=None) -> list[dict]:
        return wait_all([a.ready.remote() for a in actors or self.actors], "start-up of the client workers",
                        self.spec.resources.startup_timeout_s, "resources.startup_timeout_s")

    def attach(self, train_ref, holdout_ref, parts: list, local_sets: dict[str, list], eval_ref,
               eval_size: int) -> None:
        """Give every worker its clients' training data and local sets (`local_sets`: "personal" / "personal_val"
        -> each client's held-out-pool indices), and its share of the evaluation blocks (blocks of EVAL_BLOCK
        samples of every evaluation set, dealt round-robin over the workers)."""
        count = len(self.actors)
        self.home = {cid: cid % count for cid in range(len(parts))}
        self.cost = client_costs(self.spec, parts)
        parts_ref = ray.put(list(parts))  # every client's training indices: any worker can train a visiting client
        blocks = [(s, s + EVAL_BLOCK) for s in range(0, eval_size, EVAL_BLOCK)]
        self._data = [(train_ref, holdout_ref,
                       {c: (parts[c], {name: sets[c] for name, sets in local_sets.items()})
                        for c in self.home if self.home[c] == w},
                       eval_ref, blocks[w::count], parts_ref) for w in range(count)]
        wait_all([actor.attach.remote(*self._data[w]) for w, actor in enumerate(self.actors)],
                 "loading client data", self.spec.resources.startup_timeout_s, "resources.startup_timeout_s")
        self.local_clients = {c for c in self.home if any(len(sets[c]) for sets in local_sets.values())}

    def place(self, cohort: list[int]) -> dict[int, int]:
        """The worker index each client of the cohort trains on this round (`resources.cohort_placement`)."""
        if self.spec.resources.cohort_placement == "home":
            return {cid: self.home[cid] for cid in cohort}
        return balance_cohort(cohort, self.home, self.cost, len(self.actors))

    def submit(self, round_index: int, client_ids: list[int], worker: int, state_ref, client_state_refs: list,
               deadline: float | None, secure: dict | None = None):
        """(status ref, the clients' update refs, the actor it went to) of one task on worker `worker` that trains
        `client_ids` one after another (`ClientWorker.train_clients`)."""
        actor = self.actors[worker]
        status, *updates = actor.train_clients.options(num_returns=1 + len(client_ids)).remote(
            round_index, client_ids, state_ref, *client_state_refs, deadline=deadline, secure=secure)
        return status, updates, actor

    def replace(self, index: int, dead_actor) -> bool:
        """Replace worker `index` if `dead_actor` is still the one in place; True if it was replaced now."""
        if self.actors[index] is not dead_actor:
            return False  # another of its clients' failures already replaced it
        ray.kill(dead_actor)  # a hung actor is alive; make sure it is gone
        self.replacements += 1
        self.actors[index] = self._start(index)
        self.ready([self.actors[index]])
        wait_all([self.actors[index].attach.remote(*self._data[index])], f"loading client data on replacement "
                 f"worker {index}", self.spec.resources.startup_timeout_s, "resources.startup_timeout_s")
        return True

    def evaluate(self, state_ref) -> list[dict]:
        """Every worker's logits for its evaluation blocks; a worker found dead is replaced and asked again."""
        return self._on_every_worker(lambda actor: actor.evaluate.remote(state_ref), "evaluation")

    def evaluate_clients(self, state_ref, local_states_ref) -> dict[str, dict[int, np.ndarray]]:
        """Each client's logits on its local sets ({"personal": {client: logits}, "personal_val": ...}), with the
        global state and its own local state."""
        per_worker = self._on_every_worker(lambda actor: actor.evaluate_clients.remote(state_ref, local_states_ref),
                                           "evaluation of the clients' local sets")
        return {name: {cid: logits for scores in per_worker for cid, logits in scores[name].items()}
                for name in per_worker[0]}

    def _on_every_worker(self, call, what: str) -> list:
        actors = list(self.actors)
        try:
            return wait_all([call(a) for a in actors], what, self.spec.resources.round_timeout_s)
        except ray.exceptions.RayActorError:
            for index, actor in enumerate(actors):
                if not _alive(actor):
                    self.replace(index, actor)
            return wait_all([call(a) for a in self.actors], what, self.spec.resources.round_timeout_s)


def _alive(actor) -> bool:
    try:
        ray.get(actor.ready.remote(), timeout=30)
        return True
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return False
