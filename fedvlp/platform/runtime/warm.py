"""Warm pools: on a cluster that outlives the run (`RAY_ADDRESS`), a finished run's actors stay placed and started
for the next run of the same shape, so that run starts without starting a process.

A pool is a detached placement group holding the coordinator and the P client workers, and a keeper actor that
lends them to one run at a time. The pool's name is the run's shape: fedvlp's code, the plugins and the resources.
A run that finds its pool idle borrows it and resets the actors (`reset_reused_actor`: the same numbers as new
actors give). A run that finds it lent starts actors of its own, as a run without a pool does. A finished run
gives the actors back; a failed or interrupted one, or one whose driver died, leaves them to be removed. An idle
pool removes itself after `resources.keep_warm_s`, and at once when a run of another shape needs its resources.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import remove_placement_group

NAMESPACE = "fedvlp-warm"


@cache
def code_digest() -> str:
    """sha256 of fedvlp's own source files: a pool started by other code is never lent."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[2]  # the fedvlp package
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def pool_name(spec) -> str:
    """The name of the pool a run of `spec`'s shape borrows from."""
    resources = spec.resources
    shape = [code_digest(), list(spec.plugins), resources.workers, resources.num_cpus, resources.num_gpus,
             resources.coordinator_cpus]
    return "pool-" + hashlib.sha256(json.dumps(shape).encode()).hexdigest()[:16]


@ray.remote(num_cpus=0, max_restarts=0)
class PoolKeeper:
    """Lends one pool's placement group and actors to one run at a time; removes them when idle too long."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.placement: Any = None
        self.workers: list | None = None
        self.coordinator: Any = None
        self.borrower: str | None = None  # the job id of the run that holds the pool
        self.expiry: threading.Timer | None = None

    def borrow(self, job_id: str) -> tuple[bool, Any, Any, Any]:
        """(lent, placement group, workers, coordinator); the last three None when the pool has no actors yet
        (the borrower starts them). Not lent while another live job holds the pool."""
        with self.lock:
            if self.borrower is not None:
                if _job_alive(self.borrower):
                    return False, None, None, None
                self._remove()  # its driver died mid-run: the actors may be mid-round
            self._cancel_expiry()
            self.borrower = job_id
            return True, self.placement, self.workers, self.coordinator

    def give_back(self, placement, workers: list, coordinator, keep_s: float) -> None:
        with self.lock:
            self.placement, self.workers, self.coordinator, self.borrower = placement, workers, coordinator, None
            self._cancel_expiry()
            self.expiry = threading.Timer(keep_s, self.remove_if_idle)
            self.expiry.daemon = True
            self.expiry.start()

    def discard(self, placement=None) -> None:
        """Remove the pool's actors (and `placement`, the borrower's group if it had just reserved one)."""
        with self.lock:
            self.placement = self.placement or placement
            self._remove()

    def remove_if_idle(self) -> bool:
        with self.lock:
            if self.borrower is not None or self.placement is None:
                return False
            self._remove()
            return True

    def _remove(self) -> None:
        self._cancel_expiry()
        if self.placement is not None:
            remove_placement_group(self.placement)  # its actors end with it
        self.placement = self.workers = self.coordinator = self.borrower = None

    def _cancel_expiry(self) -> None:
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None


def _job_alive(job_id: str) -> bool:
    from ray._private.worker import global_worker

    jobs = global_worker.gcs_client.get_all_job_info()  # type: ignore[attr-defined]  # Ray's job table, no dashboard
    return any(key.hex() == job_id and not info.is_dead for key, info in jobs.items())


@dataclass
class Loan:
    """A borrowed pool: what the run starts from, and the keeper to give it back to."""
    keeper: Any
    placement: Any
    workers: list | None
    coordinator: Any


def borrow(spec) -> Loan | None:
    """This run's pool, borrowed; None if another run holds it."""
    job_id = ray.get_runtime_context().get_job_id()
    for _ in range(2):  # a keeper that ended between lookup and call is started again
        keeper = PoolKeeper.options(  # type: ignore[attr-defined]  # a Ray actor class
            name=pool_name(spec), namespace=NAMESPACE, lifetime="detached", get_if_exists=True).remote()
        try:
            lent, placement, workers, coordinator = ray.get(keeper.borrow.remote(job_id))
        except ray.exceptions.RayActorError:
            continue
        return Loan(keeper, placement, workers, coordinator) if lent else None
    return None


def give_way(spec) -> int:
    """Remove the idle pools of other shapes, so a run they would crowd out can be placed; how many were removed."""
    own = pool_name(spec)
    keepers = [ray.get_actor(a["name"], namespace=NAMESPACE) for a in ray.util.list_named_actors(all_namespaces=True)
               if a["namespace"] == NAMESPACE and a["name"] != own]
    return sum(ray.get([keeper.remove_if_idle.remote() for keeper in keepers]))


def enabled(spec, started_ray: bool) -> bool:
    """Pools serve runs outside Tune trials (a trial reuses its own actors) that attached to a running cluster
    themselves: not a Ray the caller initialised, nor a private local Ray that ends with the run."""
    return spec.resources.keep_warm_s > 0 and started_ray and bool(os.environ.get("RAY_ADDRESS"))
