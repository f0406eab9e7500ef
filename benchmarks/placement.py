"""A round's cohort placed on its clients' home workers against balanced placement, in one run, alternating.

Workload: overhead.py's PromptFL (fedvlp/configs/quickstart.yaml at 5 local epochs), 50 clients, 10 per round,
2 workers, 60 rounds. Each repeat runs fedvlp once with `resources.cohort_placement=home` (client k on worker
k mod 2, as every round was placed before) and once with `balanced` (the default), in alternating order, so a
change in the machine's speed reaches both arms alike. Printed per arm (medians over the repeats): the median
round in wall and CPU seconds, the busiest worker's local-update seconds in a round, and the busiest worker's
local steps per round against an even split; with the balanced-to-home ratios. Both arms must end on the same
metrics (a client's update does not depend on where it trains): the script checks it.
Run: python benchmarks/placement.py [--repeats 3] [--rounds 60]   (~5 min on 2 cores)
Writes benchmarks/results/placement.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics

import _common as common
from overhead import run_fedvlp, warm_feature_cache, workload_spec

from fedvlp.data import prepare_data
from fedvlp.platform.runtime.cohorts import balance_cohort, client_costs, sample_cohort

ARMS = ("home", "balanced")


def step_makespans(spec) -> dict[str, float]:
    """Mean over the run's rounds of the busiest worker's local steps per epoch, under each placement, and of
    half the cohort's steps (a perfectly even split)."""
    fed, workers = spec.federation, spec.resources.workers
    cost = client_costs(spec, prepare_data(spec).parts)
    out: dict[str, list[int | float]] = {"home": [], "balanced": [], "even": []}
    for round_index in range(1, fed.rounds + 1):
        cohort = sample_cohort(spec.seed, round_index, fed.clients, fed.participation)
        home = {cid: cid % workers for cid in cohort}
        for arm, placed in (("home", home), ("balanced", balance_cohort(cohort, home, cost, workers))):
            loads = [sum(cost[c] for c in cohort if placed[c] == w) for w in range(workers)]
            out[arm].append(max(loads))
        out["even"].append(sum(cost[c] for c in cohort) / workers)
    return {arm: round(statistics.mean(v), 3) for arm, v in out.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--participation", type=float, default=0.2)
    args = common.parse_args(parser, argv, __file__,
                             tiny={"repeats": 1, "rounds": 2, "clients": 6, "participation": 0.5})
    if args.rounds < 2:
        parser.error("--rounds: at least 2 (round 1 warms up)")
    machine = common.machine()
    workload = argparse.Namespace(clients=args.clients, participation=args.participation, rounds=args.rounds,
                                  workers=2, tiny=args.tiny)
    base = workload_spec("promptfl", workload)
    warm_feature_cache(base)
    steps = step_makespans(base)
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for repeat in range(args.repeats):
        for arm in ARMS if repeat % 2 == 0 else ARMS[::-1]:
            spec = dataclasses.replace(base, resources=dataclasses.replace(base.resources, cohort_placement=arm))
            runs[arm].append(run_fedvlp(spec))
            print(f"  repeat {repeat + 1}, {arm}: median round {runs[arm][-1]['median_round_s']:.3f} s", flush=True)
    finals = {arm: [r["final"] for r in runs[arm]] for arm in ARMS}
    assert all(f == finals["home"][0] for arm in ARMS for f in finals[arm]), "placement changed the metrics"
    figures: dict = {"machine": machine, "clients": args.clients, "participation": args.participation,
                     "rounds": args.rounds, "repeats": args.repeats, "busiest_worker_steps_per_epoch": steps,
                     "arms": {}}
    print(f"\nPromptFL, {args.clients} clients, {base.federation.participation:g} of them per round, 2 workers, "
          f"{args.rounds} rounds, {args.repeats} repeats alternating")
    print(f"busiest worker's local steps per epoch, mean over rounds: home {steps['home']}, balanced "
          f"{steps['balanced']}, an even split {steps['even']}")
    print(f"{'placement':<10} {'median round s':>15} {'round CPU s':>12} {'busiest worker s':>17}")
    for arm in ARMS:
        median = {key: statistics.median(r[key] for r in runs[arm]) for key in ("median_round_s", "median_round_cpu_s")}
        busiest = statistics.median(common.median(r["busiest_worker_compute_s"][1:]) for r in runs[arm])
        figures["arms"][arm] = {**median, "busiest_worker_s": round(busiest, 3), "runs": runs[arm]}
        print(f"{arm:<10} {median['median_round_s']:>15.3f} {median['median_round_cpu_s']:>12.3f} {busiest:>17.3f}")
    new, old = figures["arms"]["balanced"], figures["arms"]["home"]
    ratio = {key: round(new[key] / old[key], 3) for key in ("median_round_s", "median_round_cpu_s", "busiest_worker_s")}
    figures["balanced_over_home"] = ratio
    print(f"balanced / home: median round x{ratio['median_round_s']:.2f}, "
          f"round CPU x{ratio['median_round_cpu_s']:.2f}, busiest worker x{ratio['busiest_worker_s']:.2f}; "
          "final metrics identical")
    common.write_results("placement", figures, args)


if __name__ == "__main__":
    main()
