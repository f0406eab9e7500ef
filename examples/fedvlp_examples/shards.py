"""A partitioner plugin: label shards (McMahan et al., 2017), the classic pathological non-IID split.

Samples are sorted by their (first) label and cut into `clients * shards_per_client` equal shards; each
client gets `shards_per_client` shards drawn at random, so it sees few classes. Every draw comes from the
run seed's "partition" stream, as the built-in partitioners' do.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedvlp.data.partition import Partitioner, register_partitioner
from fedvlp.seeding import numpy_rng
from fedvlp.spec import spec_field


@dataclass(frozen=True)
class ShardOptions:
    shards_per_client: int = spec_field(2, "shards each client gets (fewer: fewer classes per client)", ge=1)


def shard_split(labels: np.ndarray, num_clients: int, seed: int, federation) -> list[np.ndarray]:
    per_client = federation.partition_options.shards_per_client
    first = labels.argmax(1) if labels.ndim == 2 else labels
    rng = numpy_rng(seed, "partition")
    order = np.lexsort((rng.random(len(first)), first))  # by label, ties in random order
    shards = np.array_split(order, num_clients * per_client)
    dealt = rng.permutation(len(shards)).reshape(num_clients, per_client)
    return [np.sort(np.concatenate([shards[s] for s in row])).astype(np.int64) for row in dealt]


register_partitioner(Partitioner("shards", shard_split, "any", ShardOptions,
                                 doc="label shards per client (McMahan et al., 2017; an example plugin)"))
