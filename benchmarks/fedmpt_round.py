"""Time one FedMPT local update (one client's share of a round) against PromptFL's, without Ray.

Both run the way a ClientWorker runs them, in one process with one torch thread: the spec
(the shipped fedmpt_scenes config, and quickstart for PromptFL on the same data),
`prepare_data`, `load_backbone`, `build_method`, the frozen features as a worker encodes and
hands them over (backbone.encode_images of the method's feature kind, through float16), then
`method.local_update(ClientData, generator)` on num_train / clients samples with the config's
local epochs and batch size. Each repeat starts from the same initial state and generator.

Prints seconds per local update (median of the repeats; wall clock and this process's CPU time,
which other jobs on shared cores disturb less) for each method and the FedMPT / PromptFL ratio,
and the seconds to score one worker's share of the test split (num_test / resources.workers), the
other per-round cost. With --profile also the top ops by self CPU time (torch.profiler) of one
more FedMPT update. Writes benchmarks/results/fedmpt_round.json.

Run: python benchmarks/fedmpt_round.py [--repeats 5] [--threads 1] [--profile] [--top 15]
"""
from __future__ import annotations

import argparse
import statistics
import time

import _common as common
import numpy as np
import torch

from fedvlp.backbones.loaders import load_backbone, prepare_backbone
from fedvlp.data import prepare_data
from fedvlp.methods.base import ClientData, Task
from fedvlp.platform.runtime.worker import build_method
from fedvlp.seeding import torch_generator

CONFIGS = {"fedmpt": "fedmpt_scenes", "promptfl": "quickstart"}


def client_setup(config: str, tiny: bool):
    """(method, one client's ClientData, one worker's test features, spec), as a worker holds them."""
    spec = common.bench_spec(config, [], tiny)
    prepare_backbone(spec)
    data = prepare_data(spec)
    backbone = load_backbone(spec, "cpu")
    task = Task(data.dataset.class_names, data.dataset.multilabel)
    method = build_method(spec, backbone, task)

    def frozen(split, indices):  # the worker ships float16 features; the client gets float32 back
        images = split.images.load(indices, backbone.image_size[0])
        features = backbone.encode_images(images, method.feature_kind).numpy().astype(np.float16)
        return torch.from_numpy(features.astype(np.float32))

    size = spec.data.num_train // spec.federation.clients
    indices = np.sort(np.concatenate(data.parts)[:size])  # client 0's samples first, topped up to the mean size
    client = ClientData(frozen(data.dataset.train, indices),
                        torch.from_numpy(data.train_labels[indices].astype(np.float32)))
    test = frozen(data.dataset.test, np.arange(spec.data.num_test // spec.resources.workers))
    return method, client, test, spec


def time_local_updates(method, client: ClientData, seed: int, repeats: int) -> tuple[list[float], list[float]]:
    """(wall seconds, CPU seconds) of `repeats` local updates, each from the same state and generator."""
    initial = method.global_state()
    wall, cpu = [], []
    for _ in range(repeats):
        method.load(initial, None)
        tic, cpu_tic = time.perf_counter(), time.process_time()
        method.local_update(client, torch_generator(seed, "client", 0, 0))
        wall.append(time.perf_counter() - tic)
        cpu.append(time.process_time() - cpu_tic)
    method.load(initial, None)
    return wall, cpu


def time_scoring(method, test: torch.Tensor, repeats: int) -> float:
    seconds = []
    for _ in range(repeats):
        tic = time.perf_counter()
        method.score(test)
        seconds.append(time.perf_counter() - tic)
    return statistics.median(seconds)


def compare_shared_prefix(method, client: ClientData, seed: int, repeats: int) -> dict:
    """FedMPT's local update with every prompt encoded whole (old) against each condition's shared prefix
    encoded once (new), alternating in this process; the trained states must agree to 1e-5."""
    template, shared = method.template, method.template.shared
    arms = {"old": 0, "new": shared}  # shared = 0 sends every prompt through the encoder whole
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    for _ in range(repeats):
        for arm, prefix in arms.items():
            template.shared = prefix
            times[arm].append(time_local_updates(method, client, seed, 1)[1][0])
    initial, states = method.global_state(), {}
    for arm, prefix in arms.items():
        template.shared = prefix
        method.load(initial, None)
        method.local_update(client, torch_generator(seed, "client", 0, 0))
        states[arm] = method.global_state()
    template.shared = shared
    method.load(initial, None)
    gap = max(float((states["old"][k] - states["new"][k]).abs().max()) for k in states["old"])
    old, new = statistics.median(times["old"]), statistics.median(times["new"])
    print(f"shared prefix ({shared} of {template.frozen.shape[2]} tokens): local update CPU {old:.3f} s old -> "
          f"{new:.3f} s new, x{old / new:.2f}; trained states differ by at most {gap:.1e}", flush=True)
    return {"prefix_tokens": shared, "prompt_tokens": template.frozen.shape[2], "old_cpu_s": round(old, 3),
            "new_cpu_s": round(new, 3), "old_over_new": round(old / new, 2), "max_state_difference": gap}


def profile_local_update(method, client: ClientData, seed: int, top: int) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        method.local_update(client, torch_generator(seed, "client", 0, 0))
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))
    return [{"op": e.key, "calls": e.count, "self_cpu_s": round(e.self_cpu_time_total / 1e6, 3),
             "self_cpu_share": round(e.self_cpu_time_total / total, 3)} for e in events[:top]]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="timed local updates per method (median reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (a worker's num_cpus)")
    parser.add_argument("--profile", action="store_true", help="profile one more FedMPT update, top ops by self CPU")
    parser.add_argument("--top", type=int, default=15, help="ops listed under --profile")
    args = common.parse_args(parser, argv, __file__, tiny={"repeats": 1})
    machine = common.machine()
    with common.torch_threads(args.threads):
        figures = {"machine": machine, **measure(args)}
    common.write_results("fedmpt_round", figures, args)


def measure(args) -> dict:
    figures: dict = {"torch_threads": torch.get_num_threads(), "methods": {}}
    setups = {}
    for name, config in CONFIGS.items():
        method, client, test, spec = client_setup(config, args.tiny)
        setups[name] = (method, client, spec)
        p = method.params
        time_local_updates(method, client, spec.seed, 1)  # warm-up: lazy inits, allocator, not timed
        wall, cpu = time_local_updates(method, client, spec.seed, args.repeats)
        steps = p.local_epochs * -(-len(client) // p.batch_size)
        median, cpu_median = statistics.median(wall), statistics.median(cpu)
        score_seconds = time_scoring(method, test, args.repeats)
        figures["methods"][name] = {"config": config, "samples": len(client), "batch_size": p.batch_size,
                                    "local_epochs": p.local_epochs, "steps": steps,
                                    "feature_shape": list(client.features.shape[1:]),
                                    "seconds_per_local_update": round(median, 3),
                                    "cpu_seconds_per_local_update": round(cpu_median, 3),
                                    "ms_per_step": round(1000 * median / steps, 2),
                                    "repeats_seconds": [round(t, 3) for t in wall],
                                    "test_samples_scored": len(test), "seconds_to_score": round(score_seconds, 3)}
        print(f"{name:>9}: {median:7.3f} s/local update (CPU {cpu_median:.3f} s; {len(client)} samples, {steps} "
              f"steps of {p.batch_size}, {1000 * median / steps:6.1f} ms/step; repeats "
              f"{', '.join(f'{t:.3f}' for t in wall)}); scoring {len(test)} test samples {score_seconds:.3f} s",
              flush=True)
    fedmpt, promptfl = figures["methods"]["fedmpt"], figures["methods"]["promptfl"]
    ratio = fedmpt["seconds_per_local_update"] / promptfl["seconds_per_local_update"]
    cpu_ratio = fedmpt["cpu_seconds_per_local_update"] / promptfl["cpu_seconds_per_local_update"]
    figures["fedmpt_over_promptfl"] = round(ratio, 2)
    figures["fedmpt_over_promptfl_cpu"] = round(cpu_ratio, 2)
    print(f"fedmpt / promptfl: x{ratio:.1f} per local update (CPU time x{cpu_ratio:.1f})")

    method, client, spec = setups["fedmpt"]
    figures["shared_prefix"] = compare_shared_prefix(method, client, spec.seed, args.repeats)

    if args.profile:
        method, client, spec = setups["fedmpt"]
        figures["fedmpt_profile_top_ops"] = profile_local_update(method, client, spec.seed, args.top)
    return figures


if __name__ == "__main__":
    main()
