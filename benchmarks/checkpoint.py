"""The cost of a round's checkpoint of client-local states at large populations, old layout against new.

Every round the coordinator's ClientStateStore goes into the checkpoint. Before, its snapshot was one small
dict of tensors per client (10,000 clients x one 2 KB FedOTP local prompt = 10,000 pickled dicts and 10,000
archive records); now it stacks the states per layout into one tensor per key. Both arms serialise the same
states with torch.save to a file in the same process, alternating, timed to the page cache (what a round waits
for: fedvlp does not fsync its checkpoint) and to the disk (the file fsynced), and the new arm also restores them
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

import _common as common
import torch

from fedvlp.platform.runtime.client_states import ClientStateStore

TARGET_S = 0.2


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = common.parse_args(parser, argv, __file__, tiny={"clients": 200, "repeats": 1})
    machine = common.machine()  # before the run: the load it found

    with tempfile.TemporaryDirectory() as tmp:
        store = ClientStateStore(Path(tmp) / "spill", budget_bytes=2**40)
        generator = torch.Generator().manual_seed(0)
        for cid in range(args.clients):  # FedOTP's local prompt on the tiny CLIP: 4 x 128 float32 = 2 KB
            store.put(cid, {"local_ctx": torch.randn(4, 128, generator=generator)}, round_index=1)
        old_layout = {"in_memory": dict(store.in_memory), "on_disk": dict(store.on_disk)}
        path = Path(tmp) / "checkpoint.pt"
        old, new, restore = [], [], []
        for _ in range(args.repeats):
            old.append(common.timed_write_to_disk(lambda p: torch.save({"clients": old_layout}, p), path))
            new.append(common.timed_write_to_disk(lambda p: torch.save({"clients": store.snapshot()}, p), path))
            tic = time.perf_counter()
            restored = ClientStateStore(Path(tmp) / "spill", 2**40, torch.load(path, weights_only=True)["clients"])
            restore.append(time.perf_counter() - tic)
            assert all(torch.equal(restored.in_memory[c]["local_ctx"], s["local_ctx"])
                       for c, s in store.in_memory.items())

    result = {"machine": machine, "clients": args.clients, "repeats": args.repeats, "target_s": TARGET_S,
              "new_restore_s": round(statistics.median(restore), 4)}
    for name, runs in (("old", old), ("new", new)):
        result.update({f"{name}_save_s": round(statistics.median(r["write_s"] for r in runs), 4),
                       f"{name}_on_disk_s": round(statistics.median(r["on_disk_s"] for r in runs), 4),
                       f"{name}_mib": round(runs[-1]["bytes"] / common.MiB, 2)})
    result["old_over_new_save"] = round(result["old_save_s"] / result["new_save_s"], 2)
    print(f"{args.clients:,} clients x 2 KB, median of {args.repeats} (save: torch.save returns; on disk: fsynced):")
    for name, label in (("old", "old layout (a dict per client):"), ("new", "new layout (stacked per key):")):
        print(f"  {label:<31} save {result[f'{name}_save_s']:.3f} s, on disk {result[f'{name}_on_disk_s']:.3f} s, "
              f"{result[f'{name}_mib']:.1f} MiB")
    print(f"  new layout restored in {result['new_restore_s']:.3f} s (bitwise); old / new save: "
          f"{result['old_over_new_save']:.1f}x  (target: new <= {TARGET_S} s)")
    common.write_results("checkpoint", result, args)


if __name__ == "__main__":
    main()
