"""`run_federated`: the one entry point of a federated run, used by `fedvlp run` and every Tune trial.

It reads like the flow of a round (docs/architecture.md, "The round flow"):

    prepare (dataset, partition, backbone weights)                   -- all bad input fails here
    place the Coordinator and P ClientWorkers (MLflow opens meanwhile) -- or fail within the timeout
    the workers build the method: its initial state goes to the coordinator; round 0 is evaluated
    the MLflow run is open: its id names the run's folder; round 0 is logged
    for round r: cohort -> broadcast global state -> local updates -> aggregate -> evaluate -> log

Every evaluation scores the global model on val (what selection reads) and test, and each client's
own model (global state plus its local state) on its local test set (`personal_*`, mean and spread
over the clients).

Where the actors go is `placement`'s, the frozen features `features`' and the scoring `evaluation`'s.
"""
from __future__ import annotations

import functools
import os
import sys
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from fedvlp.backbones.loaders import prepare_backbone
from fedvlp.data import prepare_data
from fedvlp.errors import ConfigError, RoundFailedError, first_line
from fedvlp.methods.declarations import Task
from fedvlp.methods.registry import declaration
from fedvlp.platform.metrics import cooccurring_pairs
from fedvlp.platform.records.checkpoint import decode, write_checkpoint
from fedvlp.platform.records.tracking import RunTracker
from fedvlp.platform.runtime.clock import VirtualClock
from fedvlp.platform.runtime.cohorts import sample_cohort
from fedvlp.platform.runtime.coordinator import Coordinator
from fedvlp.platform.runtime.evaluation import evaluate_models, headline, round_line
from fedvlp.platform.runtime.features import attach_data
from fedvlp.platform.runtime.placement import (
    PARKED,
    check_fits,
    ensure_ray,
    kill_actors,
    local_gpus,
    reserve,
    return_loan,
    take_parked,
)
from fedvlp.platform.runtime.pool import WorkerPool, wait_all


@dataclass
class RunResult:
    run_id: str
    tracking_uri: str
    final: dict[str, float]       # val_*, test_*, personal_* metrics after the last round
    initial: dict[str, float]     # the same before training (round 0)
    history: list[dict] = field(default_factory=list)
    workers: list[dict] = field(default_factory=list)
    checkpoint: bytes | None = None  # the last round's, as written
    feature_cache: dict = field(default_factory=dict)

    @cached_property
    def final_state(self) -> dict:
        """The global state after the last round, decoded from its checkpoint on first use (imports torch)."""
        assert self.checkpoint is not None
        return decode(self.checkpoint)["global"]


def run_federated(spec, *, progress: bool = True, on_round=None, tags: dict | None = None,
                  resume: dict | None = None) -> RunResult:
    """Run one federated experiment end to end and return its metrics.

    `on_round(round, metrics, checkpoint_path)` is called after each round, once its metrics are sent and its
    checkpoint written (Tune reports through it; without it, a round's logging overlaps the next round).
    `resume` is a round checkpoint (`read_checkpoint`): the run continues after its round, in the same MLflow run,
    and ends bitwise identical to an uninterrupted one.
    """
    say = print if progress else (lambda *a, **k: None)
    started = time.perf_counter()
    startup: dict[str, float] = {}

    def phase(name: str, since: float) -> float:
        now = time.perf_counter()
        startup[f"startup_{name}_seconds"] = now - since
        return now

    # 1. Everything that depends only on the inputs, before any cluster work: bad input fails here.
    if not ray.is_initialized() and not os.environ.get("RAY_ADDRESS"):  # the local Ray will get this machine
        check_fits(spec, {"CPU": os.cpu_count() or 1, "GPU": local_gpus()}, "this machine")
    tic = time.perf_counter()
    data = prepare_data(spec)
    if declaration(spec.method.name).feature_kind == "embeddings" and data.train_missing is None:
        raise ConfigError(f"data.name: {spec.method.name} needs image+text data (synthetic-recipes, food101, mmimdb); "
                          f"{data.dataset.name} has no text")
    task = Task(data.dataset.class_names, multilabel=data.dataset.multilabel)
    tic = phase("data", tic)
    prepare_backbone(spec)  # its weights on this machine (a tiny one ships in the package)
    tic = phase("backbone", tic)
    privacy = _privacy(spec)
    cooccurring = cooccurring_pairs(data.dataset.train.labels) if task.multilabel else None
    history: list[dict] = []
    started_ray = finished = False
    placement, bundle_offset, loan = None, 0, None
    coordinator = pool = tracker = None
    opening = _open_tracker(spec, tags, resume, startup)  # the MLflow run opens while Ray starts
    try:
        # 2. Start Ray and the actors: the workers load the backbone and build the method, the coordinator starts
        # beside them; then the coordinator gets the method's initial state and the workers their clients' data.
        from fedvlp.plugins import actor_runtime_env

        started_ray = ensure_ray(spec.plugins)
        placement, bundle_offset, loan = reserve(spec, started_ray)
        tic = phase("ray", tic)
        plugin_env = actor_runtime_env(spec.plugins)
        if loan is not None:  # a warm pool's actors, if it has any yet
            parked = (loan.workers, loan.coordinator) if loan.workers else None
        else:
            parked = take_parked(placement, spec) if bundle_offset else None
        lifetime = "detached" if loan is not None else None  # a warm pool's actors outlive this driver
        pool = WorkerPool(spec, task, placement, bundle_offset, runtime_env=plugin_env, lifetime=lifetime)
        # a new run's folder is named by its MLflow run: the coordinator learns it once the run is open (below)
        spill_dir = str(_run_dir(spec, resume["run_id"]) / "client_states") if resume else None
        coordinator_args = (spec.seed, (spill_dir, int(spec.resources.client_state_memory_mb * 2**20)),
                            resume["data"] if resume else None, tuple(spec.plugins))
        if parked:  # reset while the MLflow run opens: a warm start waits for it only to log round 0
            coordinator = parked[1]
            coordinator_reset = coordinator.reset.remote(*coordinator_args)
            pool.reuse(parked[0])
            ray.get(coordinator_reset)
        else:  # new actors are named by the run (`ray list actors`)
            pool.name = f"fedvlp-{opening.result().run_id}"
            pool.start()
            coordinator = Coordinator.options(  # type: ignore[attr-defined]  # a Ray actor class
                num_cpus=spec.resources.coordinator_cpus, name=f"{pool.name}-coordinator",
                runtime_env=plugin_env, lifetime=lifetime,
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement,
                                                                     placement_group_bundle_index=bundle_offset),
            ).remote(*coordinator_args)
        worker_info = pool.ready()
        initial_state, method_ref = pool.actors[0].initial_method.remote()  # the state goes worker -> coordinator
        method = ray.get(method_ref)
        privacy["weighting"] = _weighting(privacy, method["rules"])
        ray.get(coordinator.begin.remote(initial_state, method["rules"], method["rule_options"], privacy))
        clock = _virtual_clock(spec, data, method["state_nbytes"], resume)
        tic = phase("actors", tic)
        cache_status = attach_data(spec, data, pool, worker_info[0], say)
        tic = phase("features", tic)
        evaluate = lambda: evaluate_models(pool, coordinator, data, task, cooccurring)  # noqa: E731
        if not resume:
            initial = final = evaluate()  # round 0, while the MLflow run may still be opening
            tic = phase("evaluation", tic)

        # The MLflow run's id names the run's folder (its checkpoint and spilled client states) and its actors.
        tracker = opening.result()
        phase("tracking_wait", tic)
        pool.name = f"fedvlp-{tracker.run_id}"
        run_dir = _run_dir(spec, tracker.run_id)
        coordinator.spill_to.remote(str(run_dir / "client_states"))  # before any aggregation: the actor's order
        checkpoint = run_dir / "checkpoint.pt"
        nodes = sorted({w["node_id"] for w in worker_info})
        actors = ("warm" if loan is not None else "reused") if parked else "new"
        tracker.set_tags({**cache_status, "nodes": ",".join(nodes), "actors": actors, "checkpoint": str(checkpoint)})
        say(f"fedvlp: {len(pool.actors)} workers ready on {len(nodes)} node(s); "
            f"{spec.federation.clients} clients, MLflow run {tracker.run_id}")

        # 3. Rounds: cohort -> broadcast -> local updates -> aggregate -> evaluate -> log -> checkpoint.
        saved = resume["data"] if resume else None
        if resume:
            first_round, initial, final = resume["round"] + 1, resume["initial"], resume["final"]
            say(f"fedvlp: resuming after round {resume['round']}")
        else:
            first_round = 1
            tracker.log_metrics(0, {"startup_seconds": time.perf_counter() - started, **startup, **initial,
                                    "trainable_params": method["trainable_params"], **_privacy_metrics(privacy, 0)})
            say(f"round 0/{spec.federation.rounds}  " + headline(initial) + "  (before training)")
        def checkpoint_call(final: dict):
            return coordinator.checkpoint.remote({"run_id": tracker.run_id, "initial": initial, "final": final,
                                                  "virtual_clock_seconds": clock.elapsed if clock else 0.0})

        for round_index in range(first_round, spec.federation.rounds + 1):
            tic = time.perf_counter()
            evaluated = round_index % spec.federation.eval_every == 0 or round_index == spec.federation.rounds
            # a round without evaluation asks for its checkpoint with its aggregation: one wait, not two
            then = None if evaluated else functools.partial(checkpoint_call, final)
            metrics, failures, saved_ref = _train_round(spec, round_index, coordinator, pool, clock, privacy, then)
            metrics.update(_privacy_metrics(privacy, round_index))
            if failures:
                tracker.set_tags({f"failure.round{round_index}.client{cid}": cause[:5000] for cid, cause in failures})
            if evaluated:
                final = evaluate()
                metrics.update(final)
                saved_ref = checkpoint_call(final)
            saved = ray.get(saved_ref)
            metrics["round_seconds"] = time.perf_counter() - tic
            timings = metrics.pop("timings")
            tracker.log_metrics(round_index, metrics)
            # The checkpoint is written once the round's metrics are sent, and the round's line printed after it: a run
            # killed at any moment resumes from a round MLflow has, and from the last round it printed.
            tracker.then(functools.partial(write_checkpoint, checkpoint, saved))
            tracker.then(functools.partial(say, round_line(round_index, spec.federation.rounds, metrics)))
            history.append({"round": round_index, **metrics, "timings": timings})
            if on_round is not None:  # the latest metrics every round, so schedulers always see them
                tracker.flush()  # and the checkpoint on disk (a sweep's trial hands it to Tune)
                on_round(round_index, {**final, **metrics}, checkpoint)
        for info, peak in zip(worker_info, wait_all([w.peak_memory.remote() for w in pool.actors],
                                                       "the workers' peak memory", spec.resources.startup_timeout_s,
                                                       "resources.startup_timeout_s")):
            info.update(peak)
        tracker.log_metrics(spec.federation.rounds, {f"worker{i}_{k}": v for i, info in enumerate(worker_info)
                                                     for k, v in info.items() if k.endswith("_peak_mib")})
        tracker.log_json({"initial": initial, "final": final, "rounds": spec.federation.rounds}, "final_metrics.json")
        tracker.end("FINISHED")
        finished = True
        return RunResult(tracker.run_id, tracker.uri, final, initial, history, worker_info, saved, cache_status)
    except KeyboardInterrupt:
        _end_run(tracker or _opened(opening), "KILLED")
        raise
    except SystemExit as exc:
        if exc.code not in (0, None):
            _end_run(tracker or _opened(opening), "FAILED")
            raise
        # Tune stops a trial (ASHA) with sys.exit(0) inside its report: a finished run, maybe cut short
        if tracker is not None and (not history or history[-1]["round"] < spec.federation.rounds):
            tracker.set_tags({"stopped_early": "true"})
        _end_run(tracker or _opened(opening), "FINISHED")
        raise
    except BaseException as exc:
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:5000]
        _end_run(tracker or _opened(opening), "FAILED", {"error": error})
        raise
    finally:
        if loan is not None:  # a finished run gives the warm pool back; any other leaves nothing to reuse
            return_loan(loan, placement, pool, coordinator, spec.resources.keep_warm_s if finished else None)
        elif finished and bundle_offset and placement is not None and pool is not None:
            # a Tune trial's actors: the next run in its placement group resets them
            PARKED[placement.id.hex()] = (tuple(spec.plugins), pool.actors, coordinator)
        else:
            kill_actors(pool.actors if pool else [], coordinator)
        if placement is not None and bundle_offset == 0 and loan is None and ray.is_initialized():
            remove_placement_group(placement)
        if started_ray:
            ray.shutdown()


def _run_dir(spec, run_id: str) -> Path:
    """The run's folder: its checkpoint and spilled client states."""
    return Path(spec.output_dir).resolve() / run_id


def _open_tracker(spec, tags: dict | None, resume: dict | None, startup: dict[str, float]):
    """A future of the run's RunTracker, opened in a thread: MLflow's import and store take about a second,
    while starting Ray mostly waits on other processes."""
    from concurrent.futures import ThreadPoolExecutor

    def open_run() -> RunTracker:
        tic = time.perf_counter()
        tracker = RunTracker(spec, tags=tags, run_id=resume["run_id"] if resume else None)
        startup["startup_mlflow_seconds"] = time.perf_counter() - tic
        return tracker

    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedvlp-mlflow")
    opening = executor.submit(open_run)
    executor.shutdown(wait=False)  # the submitted call still runs to its end
    return opening


def _opened(opening) -> RunTracker | None:
    """The tracker once its run is open; None if opening it failed (that error is the one raised)."""
    try:
        return opening.result()
    except Exception:
        return None


def _end_run(tracker: RunTracker | None, status: str, tags: dict | None = None) -> None:
    if tracker is not None:
        if tags:
            tracker.set_tags(tags)
        tracker.end(status)


def _train_round(spec, round_index: int, coordinator, pool: WorkerPool, clock: VirtualClock | None,
                 privacy: dict, then=None):
    """One round of local updates on the cohort, aggregated by the coordinator: (its metrics, its failures, the
    ref of `then()`, a coordinator call made right after the aggregation and awaited with it, or None)."""
    federation = spec.federation
    sampled = sample_cohort(spec.seed, round_index, federation.clients, federation.participation)
    cohort, late, metrics = sampled, list[int](), dict[str, Any]()
    if clock is not None:  # stragglers are known from the simulated clock before any work: they are not trained
        cohort, late, simulated = clock.run_round(sampled, federation.round_deadline_s)
        metrics.update(virtual_round_seconds=simulated, virtual_clock_seconds=clock.elapsed)
    secure = None if not privacy["secure"] else {
        "cohort": cohort, "weighting": privacy["weighting"],
        "clip_norm": privacy["clip_norm"] if privacy["noise_multiplier"] is not None else None}
    arrived, failures, late_now, replaced, tasks = _collect_updates(spec, round_index, cohort, coordinator, pool,
                                                                    secure)
    late += late_now
    if len(arrived) < federation.min_clients_per_round:
        why = "; ".join(f"client {cid}: {cause}" for cid, cause in failures[:3])
        raise RoundFailedError(
            f"round {round_index}: {len(arrived)} of {len(sampled)} client updates arrived "
            f"({len(failures)} failed, {len(late)} late), below federation.min_clients_per_round="
            f"{federation.min_clients_per_round}" + (f" ({why})" if why else ""))
    calls = [coordinator.aggregate.remote(round_index, cohort, *arrived)]
    calls += [then()] if then is not None else []  # the actor runs its calls in order: after the aggregation
    wait_all(calls, f"round {round_index} aggregation", spec.resources.round_timeout_s, fetch=False)
    summary = ray.get(calls[0])
    pool.client_states_kept = summary["client_states_kept"]
    metrics.update(train_loss=summary["train_loss"], local_steps=summary["local_steps"],
                   bytes_up=summary["bytes_up"], bytes_down=summary["bytes_down"],
                   clients=len(summary["clients"]), failed_clients=len(failures), late_clients=len(late),
                   replaced_workers=replaced, client_tasks=tasks, timings=summary["timings"], **summary["server"],
                   **{f"train_{name}": value for name, value in summary["stats"].items()})
    return metrics, failures, calls[1] if then is not None else None


def _collect_updates(spec, round_index: int, cohort: list[int], coordinator, pool: WorkerPool,
                     secure: dict | None = None):
    """Run the cohort's local updates on the workers `pool.place` gives them: one task per worker that trains its
    share one client after another (`resources.client_dispatch: per_worker`), or one task per client.

    Returns (the update refs that arrived, in client order; failures as (client, cause); late
    clients; workers replaced; tasks sent). A failed update (it raised, its worker died, or it was still out at
    `round_timeout_s`: hung) is dropped or retried alone per `federation.on_client_failure`; a dead or hung
    worker is replaced first, and a retried update gets a timeout of its own. Updates still out at the
    wall-clock `round_deadline_s` are late and left out: each client is then a task of its own, so that
    every update that ended in time arrives.
    """
    federation = spec.federation
    state_ref = coordinator.global_state.remote()  # put once; every worker resolves the same ref
    start = time.time()
    give_up = start + spec.resources.round_timeout_s
    deadline = None
    if federation.round_deadline_s is not None and not federation.virtual_clock.enabled:
        deadline = min(start + federation.round_deadline_s, give_up)
    pending, attempts, placed, tasks = {}, {cid: 0 for cid in cohort}, pool.place(cohort), 0
    if pool.client_states_kept:
        state_refs = coordinator.cohort_client_states.options(num_returns=len(cohort)).remote(cohort)
        client_states = dict(zip(cohort, state_refs if len(cohort) > 1 else [state_refs]))
    else:  # the method keeps no client-local state: nothing to fetch
        client_states = dict.fromkeys(cohort)

    def submit(cids: list[int]) -> None:
        """One task for clients that share a worker."""
        nonlocal tasks
        tasks += 1
        status, updates, actor = pool.submit(round_index, cids, placed[cids[0]], state_ref,
                                             [client_states[cid] for cid in cids], deadline, secure)
        pending[status] = (cids, updates, actor)

    if spec.resources.client_dispatch == "per_worker" and deadline is None:
        for worker in sorted(set(placed.values())):
            submit([cid for cid in cohort if placed[cid] == worker])
    else:
        for cid in cohort:
            submit([cid])
    arrived: dict[int, Any] = {}
    failures: list[tuple[int, str]] = []
    late: list[int] = []
    replaced = 0

    def failed(cid: int, cause: str) -> bool:
        """Say so and count it; True if the client is to be retried."""
        retry = federation.on_client_failure == "retry" and attempts[cid] < federation.client_retries
        _warn(f"fedvlp: round {round_index}: client {cid} failed: {cause}; " + ("retrying" if retry else "dropped"))
        failures.append((cid, cause))
        attempts[cid] += retry
        return retry

    while pending:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, (deadline or give_up) - time.time()))
        if not done:
            if deadline is not None and deadline < give_up:  # the deadline passed first: late, the workers go on
                late += [cid for cids, _, _ in pending.values() for cid in cids]
                break
            hung = list(pending.values())
            pending.clear()
            cause = f"no update within resources.round_timeout_s={spec.resources.round_timeout_s:g} s"
            retried = [cid for cids, _, _ in hung for cid in cids if failed(cid, cause)]
            if retried or len(arrived) >= federation.min_clients_per_round:  # else the round fails: no use replacing
                for cids, _, actor in hung:
                    replaced += pool.replace(placed[cids[0]], actor)
            give_up = time.time() + spec.resources.round_timeout_s  # the retried updates' own timeout
            for cid in retried:
                submit([cid])
            continue
        cids, updates, actor = pending.pop(done[0])
        try:
            statuses = ray.get(done[0])
        except ray.exceptions.RayActorError as exc:  # the worker died: every client of the task failed with it
            replaced += pool.replace(placed[cids[0]], actor)
            statuses = [{"error": f"worker {placed[cids[0]]} died ({first_line(exc)})"}] * len(cids)
        except ray.exceptions.RayError as exc:
            statuses = [{"error": first_line(getattr(exc, "cause", None) or exc)}] * len(cids)
        for cid, status, update in zip(cids, statuses, updates):
            if status["error"] is not None:
                if failed(cid, status["error"]):
                    submit([cid])
            elif status["late"]:
                late.append(cid)
            else:
                arrived[cid] = update
    return [arrived[cid] for cid in sorted(arrived)], failures, late, replaced, tasks


def _privacy(spec) -> dict:
    """What the coordinator and workers need of `privacy.*`: the clip norm, the noise multiplier (computed from
    target_epsilon for the run's rounds and cohorts; that takes a few seconds), secure aggregation, and what the
    per-round epsilon is computed from. The weights of the masked sum come with the method (`_weighting`)."""
    from fedvlp.platform.runtime.cohorts import cohort_size

    p, fed = spec.privacy, spec.federation
    sigma = p.noise_multiplier
    cohort = cohort_size(fed.clients, fed.participation)
    if p.target_epsilon is not None:
        from fedvlp.platform.aggregation.privacy import noise_for_epsilon

        try:
            sigma = noise_for_epsilon(p.target_epsilon, fed.clients, cohort, fed.rounds, p.delta)
        except ValueError as exc:
            raise ConfigError(f"privacy.target_epsilon: {exc}") from None
    return {"clip_norm": p.clip_norm if sigma is not None else None, "noise_multiplier": sigma,
            "secure": p.secure_aggregation, "accounting": (fed.clients, cohort, p.delta)}


def _weighting(privacy: dict, rules: dict[str, str]) -> str:
    """The weights of secure aggregation's masked sum: uniform under DP, else the method's rules' own."""
    from fedvlp.platform.aggregation import RULES

    if privacy["noise_multiplier"] is not None:
        return "uniform"
    return min({RULES.get(r).weighting for r in rules.values()}, default="samples")


def _privacy_metrics(privacy: dict, round_index: int) -> dict[str, float]:
    """The noise multiplier, and the epsilon spent after `round_index` rounds (Google's RDP accountant)."""
    if privacy["noise_multiplier"] is None:
        return {}
    from fedvlp.platform.aggregation.privacy import epsilon

    clients, cohort, delta = privacy["accounting"]
    spent = epsilon(privacy["noise_multiplier"], clients, cohort, round_index, delta) if round_index else 0.0
    return {"privacy_epsilon": spent, "privacy_noise_multiplier": privacy["noise_multiplier"]}


def _warn(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _virtual_clock(spec, data, state_nbytes: int, resume: dict | None) -> VirtualClock | None:
    if not spec.federation.virtual_clock.enabled:
        return None
    return VirtualClock(spec.federation.virtual_clock, spec.seed, [len(p) for p in data.parts],
                        getattr(spec.method.params, "local_epochs", 0), state_nbytes,
                        elapsed=resume.get("virtual_clock_seconds", 0.0) if resume else 0.0)
