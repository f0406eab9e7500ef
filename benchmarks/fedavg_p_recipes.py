"""Does FedAvg-P learn on synthetic-recipes with the tiny ViLT within a few rounds? An in-process FedAvg, scored on val.

The setting of fedvlp/configs/fedavg_p_recipes.yaml (10 clients, Dirichlet 0.5, eta 0.7 missing both, missing-client
skew 0.5, prompt length 4 on 2 layers), with the train split cut to --num-train pairs: every client runs
`method.local_update` from the global state each round (full participation, per-(round, client)
generators), FedAvg weighted by data size (`weighted_average`), then the val split, both modalities
(the "full" table), is scored. No Ray, no MLflow; the frozen embeddings are computed once. Val, never test:
this is what chooses lr and local epochs.

Run: python benchmarks/fedavg_p_recipes.py [--rounds 10] [--num-train 1000] [--lr 0.1] [--local-epochs 3]
     [--seed 0]
Prints the val accuracy after every round and writes benchmarks/results/fedavg_p_recipes.json.
"""
from __future__ import annotations

import argparse
import os
import time

import _common as common
import numpy as np
import torch

from fedvlp.backbones.loaders import load_backbone, prepare_backbone
from fedvlp.data.missing import FULL, apply_missing, client_missing_tables
from fedvlp.data.partition import partition_dirichlet
from fedvlp.data.recipes import generate_recipes
from fedvlp.methods.base import ClientData, Task
from fedvlp.platform.aggregation import weighted_average
from fedvlp.platform.metrics import single_label_metrics
from fedvlp.platform.runtime.worker import build_method
from fedvlp.seeding import torch_generator


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--num-train", type=int, default=1000)
    parser.add_argument("--num-val", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--local-epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = common.parse_args(parser, argv, __file__,
                             tiny={"rounds": 1, "num_train": 60, "num_val": 40, "local_epochs": 1})
    machine = common.machine()
    with common.torch_threads(1):  # what a worker uses; the model is tiny
        figures = measure(args)
    common.write_results("fedavg_p_recipes", {"machine": machine, **figures}, args)


def measure(args) -> dict:
    spec = common.bench_spec("fedavg_p_recipes", [f"seed={args.seed}", f"method.lr={args.lr}",
                                                  f"method.local_epochs={args.local_epochs}"])
    data, fed = spec.data, spec.federation
    prepare_backbone(spec)
    backbone = load_backbone(spec)
    train = generate_recipes(args.num_train, "train", args.seed)
    val = generate_recipes(args.num_val, "val", args.seed)
    parts = partition_dirichlet(train.labels, fed.clients, fed.dirichlet_alpha, args.seed)
    table = client_missing_tables(parts, len(train), data.missing_rate, data.missing_type,
                                  data.missing_client_skew, args.seed)
    method = build_method(spec, backbone, Task(train.class_names, multilabel=False))

    def inputs(split, codes):
        texts, image_missing = apply_missing(split.texts, codes)
        embeddings, mask = backbone.embed(split.images, texts, image_missing)
        return method.make_inputs(embeddings * mask.unsqueeze(-1), torch.as_tensor(codes, dtype=torch.long))

    tic, cpu = time.perf_counter(), time.process_time()
    train_inputs, labels = inputs(train, table), torch.as_tensor(train.labels)
    val_inputs = inputs(val, np.full(len(val), FULL, np.int8))
    state, accuracy = method.global_state(), []
    for round_index in range(args.rounds):
        updates = []
        for client, part in enumerate(parts):
            if len(part):
                method.load(state, None)
                index = torch.as_tensor(part)
                method.local_update(ClientData(train_inputs[index], labels[index]),
                                    torch_generator(args.seed, "client", round_index, client))
                updates.append(method.global_state())
        state = weighted_average(updates, [len(p) for p in parts if len(p)])
        method.load(state, None)
        accuracy.append(single_label_metrics(method.score(val_inputs).numpy(), val.labels)["accuracy"])
        print(f"round {round_index + 1:>2}: val accuracy {accuracy[-1]:.3f}", flush=True)
    return {"seed": args.seed, "num_train": args.num_train, "num_val": args.num_val, "clients": fed.clients,
            "dirichlet_alpha": fed.dirichlet_alpha, "missing_rate": data.missing_rate,
            "missing_type": data.missing_type, "missing_client_skew": data.missing_client_skew,
            "method": {k: getattr(spec.method.params, k) for k in ("prompt_length", "prompt_layers", "lr",
                                                                    "batch_size", "local_epochs")},
            "val_accuracy": [round(a, 4) for a in accuracy], "seconds": round(time.perf_counter() - tic, 1),
            "cpu_seconds": round(time.process_time() - cpu, 1), "load_average": os.getloadavg()[0]}


if __name__ == "__main__":
    main()
