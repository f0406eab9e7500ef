"""The cost of a round's checkpoint of client-local states at large populations, old layout against new.

Every round the coordinator's ClientStateStore goes into the checkpoint. Before, its snapshot was one small
dict of tensors per client (10,000 clients x one 2 KB FedOTP local prompt = 10,000 pickled dicts and 10,000
archive records); now it stacks the states per layout into one tensor per key. Both arms serialise the same
states with torch.save to a file in the same process, alternating, and the new arm also restores them
(torch.load(weights_only=True) and ClientStateStore(snapshot=...)) and checks every state bitwise.

Run: python benchmarks/checkpoint.py [--clients 10000] [--repeats 5]   (target: new save <= 0.2 s at 10,000)
Writes benchmarks/results/checkpoint.json.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _common import write_results

from fedvlp.platform.client_states import ClientStateStore


def timed(fn) -> float:
    tic = time.perf_counter()
    fn()
    return time.perf_counter() - tic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        store = ClientStateStore(Path(tmp) / "spill", budget_bytes=2**40)
        generator = torch.Generator().manual_seed(0)
        for cid in range(args.clients):  # FedOTP's local prompt on the tiny CLIP: 4 x 128 float32 = 2 KB
            store.put(cid, {"local_ctx": torch.randn(4, 128, generator=generator)}, round_index=1)
        old_layout = {"in_memory": dict(store.in_memory), "on_disk": dict(store.on_disk)}
        path = Path(tmp) / "checkpoint.pt"
        old, new, restore = [], [], []
        for _ in range(args.repeats):
            old.append(timed(lambda: torch.save({"clients": old_layout}, path)))
            old_mib = path.stat().st_size / 2**20
            new.append(timed(lambda: torch.save({"clients": store.snapshot()}, path)))
            new_mib = path.stat().st_size / 2**20
            tic = time.perf_counter()
            restored = ClientStateStore(Path(tmp) / "spill", 2**40, torch.load(path, weights_only=True)["clients"])
            restore.append(time.perf_counter() - tic)
            assert all(torch.equal(restored.in_memory[c]["local_ctx"], s["local_ctx"])
                       for c, s in store.in_memory.items())

    result = {"clients": args.clients, "old_save_s": statistics.median(old), "new_save_s": statistics.median(new),
              "new_restore_s": statistics.median(restore), "old_mib": old_mib, "new_mib": new_mib}
    print(f"{args.clients:,} clients x 2 KB, median of {args.repeats}:")
    print(f"  old layout (a dict per client): save {result['old_save_s']:.3f} s, {old_mib:.1f} MiB")
    print(f"  new layout (stacked per key):   save {result['new_save_s']:.3f} s, {new_mib:.1f} MiB, "
          f"restore {result['new_restore_s']:.3f} s (bitwise)")
    print(f"  old / new save: {result['old_save_s'] / result['new_save_s']:.1f}x  (target: new <= 0.2 s)")
    write_results("checkpoint", result)


if __name__ == "__main__":
    main()
