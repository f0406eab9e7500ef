"""Time FedOTP's partial transport on float64 scalings (now) against the log domain (before), side by side.

FedOTP matches every image's patches to its two prompts, per class, by entropic partial OT at the reference's
eps = 0.01, 100 iterations (`numerics.partial_transport`). The same iterations run on logsumexps of log u, log v
(`partial_transport_log`, float32: the kernel exp(-C/eps) underflows float32) or on u, v themselves in float64
(two small batched matmuls per iteration). Both arms run in this process, alternating, on the shipped
fedotp_scenes config's data as a ClientWorker holds it (`fedmpt_round.client_setup`), with the same threads:

1. the solver alone, on one minibatch's cost (batch_size images x classes problems of patches x 2 prompts);
2. one client's local update (the config's local epochs), from the same state and generator; the trained states
   must agree (the plans agree to ~1e-7).

Prints milliseconds per solve and seconds per local update (medians of CPU time), their ratios and the largest
difference between the arms' plans and trained states. Writes benchmarks/results/fedotp_round.json.

Run: python benchmarks/fedotp_round.py [--repeats 5] [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import time

import _common as common
import torch
from fedmpt_round import client_setup, time_local_updates

import fedvlp.methods.fedotp as fedotp
from fedvlp.methods.numerics import partial_transport, partial_transport_log


def log_domain(cost, a, b, epsilon, max_iter, tol):
    """The solver before: every iteration on log u and log v, in cost's dtype."""
    return partial_transport_log(-cost / epsilon, a, b, max_iter, tol)


ARMS = {"log domain": log_domain, "float64 scalings": partial_transport}


def one_batch_cost(method, client, batch_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The cost 1 - cos [B, C, M, 2] and marginals of FedOTP's first minibatch (its initial prompts)."""
    with torch.no_grad():
        patches = client.features[:batch_size, 1:]
        text = torch.stack([method.template.encode(ctx) for ctx in (method.global_ctx, method.local_ctx)])
        sim = torch.einsum("bmd,ncd->bcmn", patches, text)
    m, n = sim.shape[-2:]
    return 1 - sim, torch.full((m,), 1.0 / m), torch.full((n,), method.params.top_percent / n)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="timed solves and local updates per arm (medians)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (a worker's num_cpus)")
    args = common.parse_args(parser, argv, __file__, tiny={"repeats": 1})
    machine = common.machine()
    with common.torch_threads(args.threads):
        figures = {"machine": machine, **measure(args)}
    common.write_results("fedotp_round", figures, args)


def measure(args) -> dict:
    method, client, _, spec = client_setup("fedotp_scenes", args.tiny)
    p = method.params
    cost, a, b = one_batch_cost(method, client, p.batch_size)
    solve_ms: dict[str, list[float]] = {arm: [] for arm in ARMS}
    update_s: dict[str, list[float]] = {arm: [] for arm in ARMS}
    plans, states = {}, {}
    initial = method.global_state()
    try:
        for arm, solver in ARMS.items():  # warm-up, and each arm's plan and trained state
            plans[arm] = solver(cost, a, b, p.epsilon, p.ot_max_iter, p.ot_tol)
            fedotp.partial_transport = solver
            time_local_updates(method, client, spec.seed, 1)
            states[arm] = method.global_state()
            method.load(initial, None)
        for _ in range(args.repeats):
            for arm, solver in ARMS.items():
                tic = time.process_time()
                solver(cost, a, b, p.epsilon, p.ot_max_iter, p.ot_tol)
                solve_ms[arm].append(1000 * (time.process_time() - tic))
                fedotp.partial_transport = solver
                update_s[arm].append(time_local_updates(method, client, spec.seed, 1)[1][0])
    finally:
        fedotp.partial_transport = partial_transport
    old, new = ARMS
    plan_gap = float((plans[old].double() - plans[new].double()).abs().max())
    state_gap = max(float((states[old][k] - states[new][k]).abs().max()) for k in states[old])
    solve = {arm: round(statistics.median(t), 2) for arm, t in solve_ms.items()}
    update = {arm: round(statistics.median(t), 3) for arm, t in update_s.items()}
    figures = {"torch_threads": torch.get_num_threads(), "problem_shape": list(cost.shape),
               "epsilon": p.epsilon, "max_iter": p.ot_max_iter, "samples": len(client),
               "local_epochs": p.local_epochs, "batch_size": p.batch_size,
               "cpu_ms_per_solve": solve, "cpu_s_per_local_update": update,
               "solve_old_over_new": round(solve[old] / solve[new], 2),
               "update_old_over_new": round(update[old] / update[new], 2),
               "max_plan_difference": plan_gap, "max_state_difference": state_gap}
    print(f"partial transport {list(cost.shape)}: CPU {solve[old]:.2f} ms ({old}) -> {solve[new]:.2f} ms ({new}), "
          f"x{figures['solve_old_over_new']:.2f}; plans differ by at most {plan_gap:.1e}", flush=True)
    print(f"local update ({len(client)} samples, {p.local_epochs} epochs): CPU {update[old]:.3f} s -> "
          f"{update[new]:.3f} s, x{figures['update_old_over_new']:.2f}; trained states differ by at most "
          f"{state_gap:.1e}", flush=True)
    return figures


if __name__ == "__main__":
    main()
