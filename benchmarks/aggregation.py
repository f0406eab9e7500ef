"""Time FED-PRIME's clustering aggregator (``hungarian_cluster``, one key) as the number of clients grows.

Default: 20, 100 and 500 clients x tau=20 prompts of D=768 (ViLT's width), 5 outer loops. Prints
seconds per aggregation, how it grows (time ratio against client ratio, exponent
log(t2/t1)/log(N2/N1)) and where the time goes (Hungarian solves, the Gaussian log-likelihood of every
prompt under every centroid, the two networks' forward passes incl. the std's sigmoid, the rest =
backward + Adam), then writes
benchmarks/results/aggregation.json.

Per outer loop the networks run once over the N * tau centroids (linear in N) and every client's prompts
are scored against every centroid (N^2 tau^2 D multiply-adds, but as large matrix products), so expect an
exponent between 1 and 2.

``--compare`` also runs the reference's schedule (one Adam step per client, ``per_client_schedule``) on the
same inputs, for the client counts up to ``--compare-max``, and on the two-group case of
tests/test_clustering.py (20 seeds), and prints how far apart the two results are.
Run: python benchmarks/aggregation.py [--clients 20 100 500] [--tau 20] [--dim 768] [--outer-loops 5]
     [--threads T] [--compare [--compare-max 100]]
"""
from __future__ import annotations

import argparse
import math
import os
import time
from collections import defaultdict
from pathlib import Path

import _common as common
import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

import fedvlp.platform.aggregation.prompt_clustering as clustering
from fedvlp.platform.aggregation.hungarian import hungarian_cluster

PHASES = {  # module attribute -> phase name; each call is timed in place during the real run
    "linear_sum_assignment": "hungarian",
    "_loglik_all": "loglik_all_centroids",
    "_mlp": "network_forward",
    "_std": "network_forward",
}


def fedprime_like_pools(n_clients: int, tau: int, dim: int, seed: int) -> list[torch.Tensor]:
    """Prompts like FED-PRIME's init, U(+-v) with v = sqrt(6 / (3*32*32 + 768)), around 4 shared modes."""
    gen = torch.Generator().manual_seed(seed)
    v = math.sqrt(6.0 / (3 * 32 * 32 + 768))
    modes = (torch.rand(4, dim, generator=gen) * 2 - 1) * v
    pick = torch.randint(0, 4, (n_clients, tau), generator=gen)
    noise = (torch.rand(n_clients, tau, dim, generator=gen) * 2 - 1) * (0.2 * v)
    return list(modes[pick] + noise)


def per_client_schedule(pools: list[torch.Tensor], generator: torch.Generator,
                        outer_loops: int = 5) -> clustering.Clustering:
    """The reference's schedule: one Adam step per client, client t's assignment solved from the parameters
    before its step (``cluster_prompts(schedule="per_client")``), from a fresh popularity network."""
    return clustering.cluster_prompts(pools, generator, outer_loops=outer_loops, schedule="per_client")


def rand_index(a: np.ndarray, b: np.ndarray) -> float:
    """The fraction of prompt pairs on which two assignments agree (same centroid in both, or in neither)."""
    a, b = a.ravel(), b.ravel()
    upper = np.triu_indices(len(a), 1)
    return float(((a[:, None] == a[None]) == (b[:, None] == b[None]))[upper].mean())


def compare_schedules(pools: list[torch.Tensor], outer_loops: int, seed: int) -> dict:
    """Reference schedule vs ours from the same generator seed: assignments and the new top-tau pools."""
    tic = time.perf_counter()
    ref = per_client_schedule(pools, torch.Generator().manual_seed(seed), outer_loops)
    ref_seconds = time.perf_counter() - tic
    ours = clustering.cluster_prompts(pools, torch.Generator().manual_seed(seed), outer_loops=outer_loops)
    tau = pools[0].shape[0]
    pool_ref, pool_ours = (r.centroids[torch.from_numpy(r.ranked()[:tau])].double() for r in (ref, ours))
    dist = torch.cdist(pool_ref, pool_ours)
    rows, cols = linear_sum_assignment(dist.numpy())  # order-free: matched pairs of new prompts
    matched = dist[rows, cols]
    spread = torch.stack(pools).reshape(-1, pools[0].shape[-1]).double()
    nearest = torch.cdist(spread[:200], spread).topk(2, largest=False).values[:, 1].mean()
    return {"identical_assignments": round(float((ref.assignment == ours.assignment).mean()), 4),
            "rand_index": round(rand_index(ref.assignment, ours.assignment), 4),
            "used_reference": len(ref.used), "used_ours": len(ours.used),
            "pool_distance_mean": round(float(matched.mean()), 4), "pool_distance_max": round(float(matched.max()), 4),
            "nearest_prompt_distance": round(float(nearest), 4), "reference_seconds": round(ref_seconds, 2)}


def timed_run(pools: list[torch.Tensor], outer_loops: int, seed: int) -> tuple[float, float, dict[str, float]]:
    """(wall seconds, CPU seconds of this process, wall seconds per phase) of one aggregation: on shared cores
    the wall time also counts other jobs' turns."""
    phases: dict[str, float] = defaultdict(float)
    originals = {name: getattr(clustering, name) for name in PHASES}

    def wrap(name: str):
        fn = originals[name]

        def timed(*args, **kwargs):
            tic = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                phases[PHASES[name]] += time.perf_counter() - tic
        return timed

    for name in PHASES:
        setattr(clustering, name, wrap(name))
    try:
        states = [{"inter_pool.prompts": pool} for pool in pools]
        tic, cpu = time.perf_counter(), time.process_time()
        gen = torch.Generator().manual_seed(seed)
        out = hungarian_cluster(states, [1] * len(pools), generator=gen, outer_loops=outer_loops)
        total, cpu = time.perf_counter() - tic, time.process_time() - cpu
    finally:
        for name, fn in originals.items():
            setattr(clustering, name, fn)
    assert out["inter_pool.prompts"].shape == pools[0].shape
    phases["rest_backward_adam"] = total - sum(phases.values())
    return total, cpu, dict(phases)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[20, 100, 500])
    parser.add_argument("--tau", type=int, default=20)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--outer-loops", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compare", action="store_true", help="also compare with the reference's schedule")
    parser.add_argument("--compare-max", type=int, default=100, help="largest client count to compare at")
    args = common.parse_args(parser, argv, __file__,
                             tiny={"clients": [4, 8], "tau": 4, "dim": 32, "outer_loops": 2, "compare_max": 4})
    machine = common.machine()
    with common.torch_threads(args.threads):
        figures = measure(args)
    common.write_results("aggregation", {"machine": machine, **figures}, args)


def measure(args) -> dict:
    """The aggregation's seconds at each client count, how they grow, and (--compare) the reference schedule."""

    # warm-up, not timed: lazy inits and first-call kernel choices (seconds at the first size, on one thread)
    timed_run(fedprime_like_pools(args.clients[0], args.tau, args.dim, args.seed), 1, args.seed)
    runs = []
    for n in args.clients:
        pools = fedprime_like_pools(n, args.tau, args.dim, args.seed)
        seconds, cpu, phases = timed_run(pools, args.outer_loops, args.seed)
        steps = args.outer_loops * n
        runs.append({"clients": n, "n_global": n * args.tau, "seconds": round(seconds, 3),
                     "cpu_seconds": round(cpu, 3), "load_average": os.getloadavg()[0],
                     "ms_per_client_step": round(1000 * seconds / max(steps, 1), 2),
                     "phases_seconds": {k: round(v, 3) for k, v in phases.items()}})
        share = ", ".join(f"{k} {100 * v / seconds:.0f}%" for k, v in phases.items())
        print(f"{n:>5} clients ({n * args.tau:>6} centroids): {seconds:9.2f} s/aggregation ({cpu:.2f} CPU s), "
              f"{runs[-1]['ms_per_client_step']:8.2f} ms/client step  [{share}]", flush=True)

    growth = []
    for a, b in zip(runs, runs[1:]):
        t_ratio, n_ratio = b["seconds"] / a["seconds"], b["clients"] / a["clients"]
        exponent = math.log(t_ratio) / math.log(n_ratio)
        cpu_exponent = math.log(b["cpu_seconds"] / a["cpu_seconds"]) / math.log(n_ratio)
        growth.append({"from": a["clients"], "to": b["clients"], "time_ratio": round(t_ratio, 2),
                       "clients_ratio": round(n_ratio, 2), "exponent": round(exponent, 2),
                       "cpu_exponent": round(cpu_exponent, 2)})
        print(f"{a['clients']:>5} -> {b['clients']:<5} clients x{n_ratio:.1f}: time x{t_ratio:.1f}, "
              f"exponent log(t2/t1)/log(N2/N1) = {exponent:.2f} (CPU time: {cpu_exponent:.2f})")

    comparisons = []
    if args.compare:
        comparisons = compare_all(args)

    return {"tau": args.tau, "dim": args.dim, "outer_loops": args.outer_loops, "hidden": 128,
            "torch_threads": torch.get_num_threads(), "runs": runs, "growth": growth,
            "compare_reference_schedule": comparisons}


def compare_all(args) -> list[dict]:
    """--compare: the benchmark's inputs up to --compare-max clients, then the two-group test case."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_clustering import two_groups

    out = []
    for n in (n for n in args.clients if n <= args.compare_max):
        row = {"case": f"benchmark, {n} clients", **compare_schedules(
            fedprime_like_pools(n, args.tau, args.dim, args.seed), args.outer_loops, args.seed)}
        print(row, flush=True)
        out.append(row)
    merged = {"reference": 0, "ours": 0}
    for seed in range(20):
        pools, groups, _ = two_groups(n_clients=5, dim=32, seed=seed)
        row = {"case": f"two groups, seed {seed}", **compare_schedules(pools, args.outer_loops, seed)}
        for name, result in (("reference", per_client_schedule(pools, torch.Generator().manual_seed(seed))),
                             ("ours", clustering.cluster_prompts(pools, torch.Generator().manual_seed(seed)))):
            a, b = (set(result.assignment[groups == k].tolist()) for k in (0, 1))
            merged[name] += len(a) == 1 and len(b) == 1 and a != b
        out.append(row)
    keys = ("identical_assignments", "rand_index", "pool_distance_max", "nearest_prompt_distance")
    summary = {k: round(float(np.mean([r[k] for r in out[-20:]])), 4) for k in keys}
    print(f"two groups, 20 seeds (means): {summary}; one centroid per group: reference {merged['reference']}/20, "
          f"ours {merged['ours']}/20", flush=True)
    out.append({"case": "two groups, 20 seeds, mean", **summary, "one_centroid_per_group": merged})
    return out


if __name__ == "__main__":
    main()
