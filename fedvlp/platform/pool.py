"""The worker pool: P ClientWorker actors, the home worker of every virtual client, and replacement.

Client k lives on worker k mod P for the whole run, so its data never moves. A worker that dies
(killed, its process crashed, or hung past the round timeout) is replaced by a new actor in the
same placement-group bundle, which loads the same backbone and the same clients' data and test
blocks: its virtual clients move to the replacement unchanged.
"""
from __future__ import annotations

import numpy as np
import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from fedvlp.errors import RoundTimeoutError
from fedvlp.platform.worker import ClientWorker

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
    def __init__(self, spec, task, placement, bundle_offset: int, name: str, runtime_env: dict | None = None,
                 reuse: list | None = None):
        self.spec, self.task, self.placement, self.bundle_offset, self.name = spec, task, placement, bundle_offset, name
        self.runtime_env = runtime_env  # ships the spec's plugins (fedvlp.plugins.actor_runtime_env)
        self.replacements = 0  # over the whole run
        self._data: list[tuple] = []  # per worker: the arguments of its `attach`
        self.home: dict[int, int] = {}
        self.local_test_clients: set[int] = set()
        if reuse:  # the workers a finished run left in this placement group, started afresh in their processes
            wait_all([actor.reset.remote(spec, w, task) for w, actor in enumerate(reuse)], "reset of the reused client "
                     "workers", spec.resources.startup_timeout_s, "resources.startup_timeout_s")
            self.actors = list(reuse)
        else:
            self.actors = [self._start(w) for w in range(spec.resources.workers)]

    def _start(self, index: int):
        """Worker `index` in its own bundle; named (`ray list actors`) so drills and tests can reach it (a worker
        reused by a later Tune trial keeps this run's name)."""
        generation = f"-{self.replacements}" if self.replacements else ""  # a dead actor's name may linger
        return ClientWorker.options(  # type: ignore[attr-defined]  # a Ray actor class
            num_cpus=self.spec.resources.num_cpus, num_gpus=self.spec.resources.num_gpus,
            name=f"{self.name}-worker-{index}{generation}", runtime_env=self.runtime_env,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.placement, placement_group_bundle_index=self.bundle_offset + 1 + index),
        ).remote(self.spec, index, self.task)

    def ready(self, actors=None) -> list[dict]:
        return wait_all([a.ready.remote() for a in actors or self.actors], "start-up of the client workers",
                        self.spec.resources.startup_timeout_s, "resources.startup_timeout_s")

    def attach(self, train_ref, holdout_ref, parts: list, local_tests: list, eval_ref, eval_size: int) -> None:
        """Give every worker its clients' training data and local test sets, and its share of the evaluation
        blocks (blocks of EVAL_BLOCK samples of every evaluation set, dealt round-robin over the workers)."""
        count = len(self.actors)
        self.home = {cid: cid % count for cid in range(len(parts))}
        blocks = [(s, s + EVAL_BLOCK) for s in range(0, eval_size, EVAL_BLOCK)]
        self._data = [(train_ref, holdout_ref,
                       {c: (parts[c], local_tests[c]) for c in self.home if self.home[c] == w},
                       eval_ref, blocks[w::count]) for w in range(count)]
        wait_all([actor.attach.remote(*self._data[w]) for w, actor in enumerate(self.actors)],
                 "loading client data", self.spec.resources.startup_timeout_s, "resources.startup_timeout_s")
        self.local_test_clients = {c for c in self.home if len(local_tests[c])}

    def submit(self, round_index: int, client_id: int, state_ref, client_state_ref, deadline: float | None,
               secure: dict | None = None):
        """(status ref, update ref, the actor it went to) of one client's local update on its home worker."""
        actor = self.actors[self.home[client_id]]
        status, update = actor.train_client.remote(round_index, client_id, state_ref, client_state_ref, deadline,
                                                   secure)
        return status, update, actor

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

    def evaluate_clients(self, state_ref, local_states_ref) -> dict[int, np.ndarray]:
        """Each client's logits on its local test set, with the global state and its own local state."""
        per_worker = self._on_every_worker(lambda actor: actor.evaluate_clients.remote(state_ref, local_states_ref),
                                           "evaluation of the clients' local test sets")
        return {cid: logits for scores in per_worker for cid, logits in scores.items()}

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
