"""ClientWorker: a long-lived actor that trains the virtual clients it owns.

It loads the frozen backbone once, helps encode the frozen features once (or reads them from
the on-disk cache through the driver), keeps its clients' features and labels (training data and
local test set) for the whole run, and per round only receives the global state (one object-store
reference shared by all workers) and the cohort's client-local states.
"""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import ray

from fedvlp.backbones.loaders import load_backbone
from fedvlp.data.missing import apply_missing
from fedvlp.errors import first_line
from fedvlp.platform.metrics import LOCAL_SETS
from fedvlp.platform.runtime.updates import ClientUpdate
from fedvlp.seeding import torch_generator

if TYPE_CHECKING:
    from fedvlp.methods.base import ClientData, Task


def build_method(spec, backbone, task: Task):
    from fedvlp.methods import METHODS

    generator = torch_generator(spec.seed, "init")
    return METHODS[spec.method.name](spec.method.params, backbone, task, generator)


def server_rules(method, spec) -> tuple[dict[str, str], dict]:
    """(parameter name -> server rule, rule name -> options) of a built method under the spec: the method's
    own rules with `server.rules` overriding them per prefix (the longest prefix wins), and each used rule's
    options from the method (`server_options`) overridden by `server.options`."""
    from fedvlp.platform.aggregation import LOCAL, RULES
    from fedvlp.spec import build_dataclass

    prefixes = {**method.server_rules, **spec.server.rules}
    rules = {}
    for key in method.state_dict():
        rule = prefixes[max((p for p in prefixes if key.startswith(p)), key=len)]
        if rule != LOCAL:
            rules[key] = rule
    options = {}
    for name in sorted(set(rules.values())):
        rule = RULES.get(name)
        if rule.options is not None:
            raw = {**method.server_options().get(name, {}), **spec.server.options.get(name, {})}
            options[name] = build_dataclass(rule.options, raw, f"server.options.{name}.")
    return rules, options


@ray.remote(max_restarts=0)
class ClientWorker:
    def __init__(self, spec, index: int, task: Task):
        import torch  # imported in the actor only: the driver imports this module for the actor class

        from fedvlp.plugins import load_plugins
        from fedvlp.seeding import new_process_seed

        new_process_seed()  # remembered before anything reseeds torch (`reset_reused_actor`)
        load_plugins(spec.plugins)  # a plugin method is registered here too, not only in the driver
        torch.set_num_threads(max(1, int(spec.resources.num_cpus)))
        self.spec, self.index = spec, index
        gpu_ids = ray.get_gpu_ids()
        self.device = torch.device("cuda" if gpu_ids and torch.cuda.is_available() else "cpu")
        self.backbone: Any = load_backbone(spec, self.device)  # CLIP or ViLT, as the method's feature_kind says
        self.method = build_method(spec, self.backbone, task).to(self.device)
        self.clients: dict[int, ClientData] = {}  # the clients whose home this worker is
        # The whole training set (zero-copy from the object store) and every client's indices: the data of a client
        # that a balanced round sends here from a busier worker.
        self.train: tuple = ()
        self.parts: list[np.ndarray] = []
        self.local_sets: dict[str, dict[int, ClientData]] = {}  # "personal" / "personal_val" -> client -> its set
        self.eval_blocks: dict[str, list[tuple[int, object]]] = {}
        self.faults: dict[tuple[int, int], tuple] = {}  # (round, client) -> injected fault (`inject_fault`)

    def reset(self, spec, index: int, task: Task) -> None:
        """This worker for a new run, as a new actor would start it (`reset_reused_actor`)."""
        from fedvlp.seeding import reset_reused_actor

        reset_reused_actor(self, spec, index, task)

    def ready(self) -> dict:
        return {"index": self.index, "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "device": str(self.device),
                "transform": self.backbone.transform_id, "feature_kind": self.method.feature_kind}

    def peak_memory(self) -> dict:
        """This actor's peak memory so far, in MiB: the device's allocations on a GPU (what
        `resources.gpus_per_worker` must hold), and the process's resident set on the host."""
        import resource

        import torch

        peak = {"device": str(self.device), "host_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        if self.device.type == "cuda":
            peak["gpu_peak_mib"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        return peak

    @ray.method(num_returns=2)
    def initial_method(self) -> tuple[dict, dict]:
        """What the coordinator and the driver need of the method, from this worker's copy before any training:
        (its initial global state, for the coordinator; its server rules and their options, its number of
        trainable parameters and its state's size, plain values the driver reads without torch)."""
        from fedvlp.platform.aggregation import state_nbytes

        rules, options = server_rules(self.method, self.spec)
        state = _to(self.method.global_state(), "cpu")
        return state, {"rules": rules, "rule_options": options, "state_nbytes": state_nbytes(state),
                       "trainable_params": sum(p.numel() for p in self.method.parameters() if p.requires_grad)}

    def encode(self, source: tuple, ranges: list[tuple[int, int]]) -> list[tuple[int, np.ndarray]]:
        """Frozen features (float16) of the sample ranges this worker was given.

        `source` is (images, texts, missing table). CLIP: image features of `feature_kind`.
        ViLT: the embedding layers' outputs under the missing table, padding tokens zeroed
        (so the cached array alone gives the token mask back: `make_inputs`).
        """
        images, texts, table = source
        size, kind = self.backbone.image_size[0], self.method.feature_kind
        out = []
        for start, end in ranges:
            pixels = images.load(range(start, end), size)
            if kind == "embeddings":
                kept_texts, image_missing = apply_missing(texts[start:end], table[start:end])
                embeddings, mask = self.backbone.embed(pixels, kept_texts, image_missing)
                features = embeddings * mask.unsqueeze(-1)
            else:
                features = self.backbone.encode_images(pixels, kind)
            out.append((start, features.cpu().numpy().astype(np.float16)))
        return out

    def _inputs(self, features: np.ndarray, missing: np.ndarray | None):
        import torch

        to_tensor = lambda a: torch.from_numpy(np.asarray(a)).to(self.device)  # noqa: E731
        return self.method.make_inputs(to_tensor(features.astype(np.float32)),
                                       None if missing is None else to_tensor(missing.astype(np.int64)))

    def _client_data(self, split: tuple, indices: np.ndarray) -> ClientData:
        import torch

        from fedvlp.methods.base import ClientData

        features, labels, missing = split
        dtype = np.float32 if labels.ndim == 2 else np.int64
        return ClientData(self._inputs(features[indices], None if missing is None else missing[indices]),
                          torch.from_numpy(labels[indices].astype(dtype)).to(self.device))

    def attach(self, train: tuple, holdout: tuple, clients: dict[int, tuple[np.ndarray, dict[str, np.ndarray]]],
               eval_sets: dict[str, tuple], eval_blocks: list[tuple[int, int]], parts: list[np.ndarray]) -> list[int]:
        """Keep this worker's clients' training data and local sets, and its blocks of every evaluation set.

        `train` and `holdout` are (features, labels, missing table or None); `clients` maps each of this
        worker's clients to (its training indices, {"personal": its local test set's held-out-pool indices,
        "personal_val": its local val set's}); `eval_sets` maps each
        evaluation set ("val", "test", "test_full", ...) to (features, missing table or None); `parts` holds
        every client's training indices, so that a visiting client's data can be read from `train`.
        """
        self.clients = {cid: self._client_data(train, idx) for cid, (idx, _) in clients.items()}
        self.train, self.parts = train, parts
        self.local_sets = {name: {cid: self._client_data(holdout, local[name]) for cid, (_, local) in clients.items()
                                  if len(local[name])} for name in LOCAL_SETS}
        self.eval_blocks = {
            name: [(start, self._inputs(f[start:end], None if m is None else m[start:end]))
                   for start, end in eval_blocks if start < len(f)]
            for name, (f, m) in eval_sets.items()
        }
        return sorted(self.clients)

    def train_clients(self, round_index: int, client_ids: list[int], global_state: dict, *client_states: dict | None,
                      deadline: float | None = None, secure: dict | None = None) -> tuple:
        """Local updates of `client_ids`, one after another (`client_states` in the same order): (a small status
        per client for the driver, then each client's update for the coordinator), as many returns as
        `1 + len(client_ids)` (the caller sets `num_returns`). A client is one of this worker's own or a visitor
        from a busier worker (`balance_cohort`), whose data is read from the shared training set for this update
        only. A client that raises fails alone: its status carries the error, its update is None, the next goes on.

        A client whose turn comes after the round's wall-clock deadline is skipped: its update
        would be left out anyway. Under secure aggregation (`secure`: the round's cohort, the weight
        kind, and the DP clip norm or None) the client clips its update if DP asks, then sends its
        averaged parameters only as a masked vector (`fedvlp.platform.aggregation.secagg.mask`).
        """
        global_state = _to(global_state, self.device)
        statuses: list[dict] = []
        updates: list[ClientUpdate | None] = []
        for client_id, client_state in zip(client_ids, client_states):
            late = deadline is not None and time.time() > deadline
            status: dict[str, Any] = {"client_id": client_id, "late": late, "error": None}
            update = None
            if not late:
                try:
                    update = self._train_client(round_index, client_id, global_state, client_state, secure)
                except Exception as exc:  # the client fails, not the worker: the driver retries or drops it alone
                    status["error"] = first_line(exc)
            statuses.append(status)
            updates.append(update)
        return (statuses, *updates)

    def _train_client(self, round_index: int, client_id: int, global_state: dict, client_state: dict | None,
                      secure: dict | None) -> ClientUpdate:
        self._injected_fault(round_index, client_id)
        started = time.time()
        self.method.load(global_state, _to_optional(client_state, self.device))
        data = (self.clients[client_id] if client_id in self.clients  # its home, or a visitor's data for this update
                else self._client_data(self.train, self.parts[client_id]))
        result = self.method.local_update(data, torch_generator(self.spec.seed, "client", round_index, client_id))
        state = _to(self.method.global_state(), "cpu")
        masked = None
        if secure is not None:
            from fedvlp.platform.aggregation import privacy, secagg

            if secure["clip_norm"] is not None:
                state = privacy.clip_update(state, _to(global_state, "cpu"), secure["clip_norm"])
            weight = len(data) if secure["weighting"] == "samples" else 1.0
            masked = secagg.mask(state, weight, client_id, secure["cohort"], self.spec.seed, round_index)
            state = {}
        return ClientUpdate.from_result(client_id, len(data), state, _to(self.method.local_state(), "cpu"),
                                        result, worker=self.index, started=started, finished=time.time(),
                                        masked=masked)

    def inject_fault(self, round_index: int, client_id: int, kind: str, seconds: float = 1e6) -> None:
        """Fault drills: this client's next update in that round raises, kills this worker's process
        ("exit"), or hangs for `seconds` ("hang") before it goes on; once."""
        if kind not in ("raise", "exit", "hang"):
            raise ValueError(f"inject_fault: kind must be raise, exit or hang, got {kind!r}")
        self.faults[(round_index, client_id)] = (kind, seconds)

    def _injected_fault(self, round_index: int, client_id: int) -> None:
        kind, seconds = self.faults.pop((round_index, client_id), (None, 0))
        if kind == "raise":
            raise RuntimeError(f"injected fault in client {client_id}, round {round_index}")
        if kind == "exit":
            os._exit(1)
        if kind == "hang":
            time.sleep(seconds)

    def evaluate(self, global_state: dict) -> dict[str, list[tuple[int, np.ndarray]]]:
        """Logits of this worker's blocks of every evaluation set under the global model (`Method.load_global`)."""
        self.method.load_global(_to(global_state, self.device))
        return {name: [(start, self.method.score(inputs).cpu().numpy()) for start, inputs in blocks]
                for name, blocks in self.eval_blocks.items()}

    def evaluate_clients(self, global_state: dict, local_states: dict[int, dict | None]
                         ) -> dict[str, dict[int, np.ndarray]]:
        """Logits of each of this worker's clients on its local test and val sets ({"personal": {client: logits},
        "personal_val": ...}), under the model that client would use: the global state with its own local state."""
        global_state = _to(global_state, self.device)
        out: dict[str, dict[int, np.ndarray]] = {name: {} for name in LOCAL_SETS}
        for cid in sorted(set().union(*self.local_sets.values())):
            self.method.load(global_state, _to_optional(local_states.get(cid), self.device))
            for name, sets in self.local_sets.items():
                if cid in sets:
                    out[name][cid] = self.method.score(sets[cid].features).cpu().numpy()
        return out


def _to(state: dict, device) -> dict:
    return {k: v.to(device) for k, v in state.items()}


def _to_optional(state: dict | None, device) -> dict | None:
    return None if state is None else _to(state, device)
