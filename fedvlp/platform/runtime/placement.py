"""Where a run's actors go: the local Ray or the cluster's, the run's resource bundles and whether they fit, its
placement group (a Tune trial's, a warm pool's, or its own), and the actors a finished run leaves parked for the
next run in the same place."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group

from fedvlp.errors import ResourceError
from fedvlp.platform.runtime import warm

if TYPE_CHECKING:
    from fedvlp.platform.runtime.pool import WorkerPool


def ensure_ray(plugins=()) -> bool:
    """Connect to the cluster in RAY_ADDRESS, or start a private local one (no dashboard); True if started here.

    The job's runtime environment ships the `plugins` that are not installed on the nodes, to every actor
    and Tune trial of the job; in a Ray the caller initialised, `run_federated` ships them to its own actors
    (`fedvlp.plugins.actor_runtime_env`)."""
    from fedvlp.plugins import runtime_env

    if ray.is_initialized():
        return False
    quiet = os.environ.get("FEDVLP_RAY_LOGS") != "1"
    common: dict[str, Any] = {"log_to_driver": not quiet, "logging_level": "ERROR" if quiet else "INFO",
                              "runtime_env": runtime_env(plugins)}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], **common)
    else:
        # address="local": never attach to a stray cluster left by `ray start` on this machine
        ray.init(address="local", num_cpus=os.cpu_count() or 1, num_gpus=local_gpus(),
                 include_dashboard=False, **common)
    return True


def local_gpus() -> int:
    """The GPUs of this machine as Ray detects them (CUDA_VISIBLE_DEVICES, else NVML), without importing torch."""
    from ray._private.accelerators import get_accelerator_manager_for_resource

    manager = get_accelerator_manager_for_resource("GPU")
    return manager.get_current_node_num_accelerators() if manager is not None else 0


def _worker_bundle(resources) -> dict[str, float]:
    bundle = {"CPU": resources.num_cpus}
    if resources.num_gpus > 0:
        bundle["GPU"] = resources.num_gpus
    return bundle


def run_bundles(spec) -> list[dict[str, float]]:
    """The run's resources: one coordinator bundle, then one bundle per worker."""
    return [{"CPU": spec.resources.coordinator_cpus}] + [_worker_bundle(spec.resources)] * spec.resources.workers


def check_fits(spec, totals: dict[str, float], where: str) -> None:
    """Fail with the numbers if the run's bundles need more CPUs or GPUs than `totals` holds."""
    for resource in ("CPU", "GPU"):
        need = sum(b.get(resource, 0) for b in run_bundles(spec))
        if need > totals.get(resource, 0) + 1e-9:
            raise ResourceError(
                f"resources: the run needs {need:g} {resource} (coordinator {spec.resources.coordinator_cpus:g} CPU + "
                f"{spec.resources.workers} workers x {_worker_bundle(spec.resources)}) but {where} has "
                f"{totals.get(resource, 0):g}; lower resources.workers, num_cpus or num_gpus"
            )


def reserve(spec, started_ray: bool):
    """(placement group, index of its first run bundle, warm pool loan): the Tune trial's group; a warm pool's,
    borrowed on a running cluster (`fedvlp.platform.runtime.warm`); or one reserved here."""
    current = ray.util.get_current_placement_group()
    if current is not None:  # inside a Tune trial: bundle 0 is the trainable's own
        return current, 1, None
    loan = warm.borrow(spec) if warm.enabled(spec, started_ray) else None
    if loan is not None and loan.placement is not None:
        return loan.placement, 0, loan
    bundles = run_bundles(spec)
    check_fits(spec, ray.cluster_resources(), "the cluster")
    if os.environ.get("RAY_ADDRESS") and not _fits(bundles, ray.available_resources()):
        warm.give_way(spec)  # idle pools of other shapes hold what this run needs
    group = placement_group(bundles, strategy="PACK", lifetime="detached" if loan is not None else None)
    ready, _ = ray.wait([group.ready()], timeout=spec.resources.placement_timeout_s)
    if not ready:
        remove_placement_group(group)
        if loan is not None:
            ray.get(loan.keeper.discard.remote())
        raise ResourceError(
            f"resources: could not place {len(bundles)} bundles {bundles[:2]}... within "
            f"{spec.resources.placement_timeout_s:g} s (available now: {ray.available_resources()})"
        )
    return group, 0, loan


def _fits(bundles: list[dict[str, float]], available: dict[str, float]) -> bool:
    return all(sum(b.get(r, 0) for b in bundles) <= available.get(r, 0) + 1e-9 for r in ("CPU", "GPU"))


# Inside a Tune trial, the actors of a finished run stay in the trial's placement group for the next run there
# (Tune reuses the trial's process and placement group: `reuse_actors`): starting an actor costs seconds of
# imports, resetting one a fraction of it. Placement group id -> (plugins, workers, coordinator).
PARKED: dict[str, tuple[tuple[str, ...], list, Any]] = {}


def take_parked(placement, spec) -> tuple[list, Any] | None:
    """(workers, coordinator) a finished run left in this placement group, if they serve `spec` (the same
    plugins); otherwise they are killed and new ones start."""
    parked = PARKED.pop(placement.id.hex(), None)
    if parked is None:
        return None
    plugins, workers, coordinator = parked
    if plugins == tuple(spec.plugins) and len(workers) == spec.resources.workers:
        return workers, coordinator
    kill_actors(workers, coordinator)
    return None


def return_loan(loan: warm.Loan, placement, pool: WorkerPool | None, coordinator, keep_s: float | None) -> None:
    """Give a warm pool back for `keep_s` seconds, or (None: the run did not finish) remove its actors."""
    if keep_s is not None and pool is not None and coordinator is not None:
        call = loan.keeper.give_back.remote(placement, pool.actors, coordinator, keep_s)
    else:
        call = loan.keeper.discard.remote(placement)
    ray.wait([call], timeout=2)  # delivered before this driver may exit, without holding its exit up


def kill_actors(workers: list, coordinator) -> None:
    for actor in [*workers, *([coordinator] if coordinator is not None else [])]:
        ray.kill(actor)
