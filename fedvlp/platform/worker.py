"""ClientWorker: a long-lived actor that trains the virtual clients it owns.

It loads the frozen backbone once, helps encode the frozen image features once (or reads
them from the on-disk cache through the driver), keeps its clients' features and labels for
the whole run, and per round only receives the global state (one object-store reference
shared by all workers) and the cohort's client-local states.
"""
from __future__ import annotations

import os
import time

import numpy as np
import ray
import torch

from fedvlp.backbones import load_clip
from fedvlp.methods.base import ClientData, Task
from fedvlp.seeding import torch_generator


def build_method(spec, backbone, task: Task):
    from fedvlp.methods import METHODS

    generator = torch_generator(spec.seed, "init")
    return METHODS[spec.method.name](spec.method.params, backbone, task, generator)


@ray.remote(max_restarts=0)
class ClientWorker:
    def __init__(self, spec, index: int, task: Task):
        torch.set_num_threads(max(1, int(spec.resources.num_cpus)))
        self.spec, self.index = spec, index
        gpu_ids = ray.get_gpu_ids()
        self.device = torch.device("cuda" if gpu_ids and torch.cuda.is_available() else "cpu")
        self.backbone = load_clip(spec, self.device)
        self.method = build_method(spec, self.backbone, task).to(self.device)
        self.clients: dict[int, ClientData] = {}
        self.test_blocks: list[tuple[int, torch.Tensor]] = []

    def ready(self) -> dict:
        return {"index": self.index, "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "device": str(self.device),
                "transform": self.backbone.transform_id, "feature_kind": self.method.feature_kind}

    def encode(self, images, ranges: list[tuple[int, int]]) -> list[tuple[int, np.ndarray]]:
        """Frozen image features (float16) of the sample ranges this worker was given."""
        size, kind = self.backbone.image_size[0], self.method.feature_kind
        return [(start, self.backbone.encode_images(images.load(range(start, end), size), kind).numpy().astype(np.float16))
                for start, end in ranges]

    def attach(self, train_features: np.ndarray, train_labels: np.ndarray, client_indices: dict[int, np.ndarray],
               test_features: np.ndarray, test_blocks: list[tuple[int, int]]) -> list[int]:
        """Keep the features and labels of this worker's clients and test blocks for the whole run."""
        to_tensor = lambda a: torch.from_numpy(np.asarray(a, dtype=np.float32)).to(self.device)  # noqa: E731
        labels_dtype = np.float32 if train_labels.ndim == 2 else np.int64
        self.clients = {
            cid: ClientData(to_tensor(train_features[idx]),
                            torch.from_numpy(train_labels[idx].astype(labels_dtype)).to(self.device))
            for cid, idx in client_indices.items()
        }
        self.test_blocks = [(start, to_tensor(test_features[start:end])) for start, end in test_blocks]
        return sorted(self.clients)

    def train(self, round_index: int, client_ids: list[int], global_state: dict, client_states: dict) -> list[dict]:
        updates = []
        for cid in client_ids:
            started = time.time()
            self.method.load(_to(global_state, self.device), _to(client_states.get(cid), self.device))
            stats = self.method.local_update(self.clients[cid], torch_generator(self.spec.seed, "client", round_index, cid))
            updates.append({
                "client_id": cid,
                "num_samples": len(self.clients[cid]),
                "global": _to(self.method.global_state(), "cpu"),
                "local": _to(self.method.local_state(), "cpu"),
                "worker": self.index, "started": started, "finished": time.time(), **stats,
            })
        return updates

    def evaluate(self, global_state: dict) -> list[tuple[int, np.ndarray]]:
        """Logits of this worker's test blocks under the global model."""
        self.method.load(_to(global_state, self.device), None)
        return [(start, self.method.score(features).cpu().numpy()) for start, features in self.test_blocks]


def _to(state: dict | None, device) -> dict | None:
    return None if state is None else {k: v.to(device) for k, v in state.items()}
