"""Time FED-PRIME's clustering aggregator (``hungarian_cluster``, one key) as the number of clients grows.

Default: 20, 100 and 500 clients x tau=20 prompts of D=768 (ViLT's width), 5 outer loops. Prints
seconds per aggregation, how it grows (time ratio against client ratio, exponent
log(t2/t1)/log(N2/N1)) and where the time goes (Hungarian solves, the Gaussian log-likelihood of every
prompt under every centroid, the two networks' forward passes incl. the std's sigmoid, the rest =
backward + Adam), then writes
benchmarks/results/aggregation.json.

The work is outer_loops * N client steps, each over all N * tau centroids, so expect t ~ N^2.
Run: python benchmarks/aggregation.py [--clients 20 100 500] [--tau 20] [--dim 768] [--outer-loops 5]
     [--threads T]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from collections import defaultdict
from pathlib import Path

import torch

import fedvlp.platform.clustering as clustering

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


def timed_run(pools: list[torch.Tensor], outer_loops: int, seed: int) -> tuple[float, dict[str, float]]:
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
        tic = time.perf_counter()
        gen = torch.Generator().manual_seed(seed)
        out = clustering.hungarian_cluster(states, [1] * len(pools), generator=gen, outer_loops=outer_loops)
        total = time.perf_counter() - tic
    finally:
        for name, fn in originals.items():
            setattr(clustering, name, fn)
    assert out["inter_pool.prompts"].shape == pools[0].shape
    phases["rest_backward_adam"] = total - sum(phases.values())
    return total, dict(phases)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[20, 100, 500])
    parser.add_argument("--tau", type=int, default=20)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--outer-loops", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    timed_run(fedprime_like_pools(2, 2, args.dim, args.seed), 1, args.seed)  # warm-up: lazy inits, not timed
    runs = []
    for n in args.clients:
        pools = fedprime_like_pools(n, args.tau, args.dim, args.seed)
        seconds, phases = timed_run(pools, args.outer_loops, args.seed)
        steps = args.outer_loops * n
        runs.append({"clients": n, "n_global": n * args.tau, "seconds": round(seconds, 3),
                     "ms_per_client_step": round(1000 * seconds / max(steps, 1), 2),
                     "phases_seconds": {k: round(v, 3) for k, v in phases.items()}})
        share = ", ".join(f"{k} {100 * v / seconds:.0f}%" for k, v in phases.items())
        print(f"{n:>5} clients ({n * args.tau:>6} centroids): {seconds:9.2f} s/aggregation, "
              f"{runs[-1]['ms_per_client_step']:8.2f} ms/client step  [{share}]", flush=True)

    growth = []
    for a, b in zip(runs, runs[1:]):
        t_ratio, n_ratio = b["seconds"] / a["seconds"], b["clients"] / a["clients"]
        exponent = math.log(t_ratio) / math.log(n_ratio)
        growth.append({"from": a["clients"], "to": b["clients"], "time_ratio": round(t_ratio, 2),
                       "clients_ratio": round(n_ratio, 2), "exponent": round(exponent, 2)})
        print(f"{a['clients']:>5} -> {b['clients']:<5} clients x{n_ratio:.1f}: time x{t_ratio:.1f}, "
              f"exponent log(t2/t1)/log(N2/N1) = {exponent:.2f}")

    figures = {"tau": args.tau, "dim": args.dim, "outer_loops": args.outer_loops, "hidden": 128,
               "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
               "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
               "runs": runs, "growth": growth}
    out = Path(__file__).parent / "results" / "aggregation.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
