"""A simulated device clock, in the style of FedScale's virtual clock: stragglers without waiting.

Each client owns one simulated device, drawn once from its own seeded stream: a compute speed
and an uplink bandwidth, log-normal around the median device. Its simulated round time is its
local compute (samples x local epochs x seconds per sample / speed) plus the upload of its
update. A round lasts until its slowest on-time client, or until the deadline when some miss it.
"""
from __future__ import annotations

import math

from fedvlp.seeding import numpy_rng


class VirtualClock:
    def __init__(self, settings, seed: int, client_sizes: list[int], local_epochs: int, update_bytes: int,
                 elapsed: float = 0.0):
        self.settings, self.seed = settings, seed
        self.client_sizes, self.local_epochs, self.update_bytes = client_sizes, local_epochs, update_bytes
        self.elapsed = elapsed  # simulated seconds since the run began (restored on resume)

    def device(self, client_id: int) -> tuple[float, float]:
        """(compute speed relative to the median device, uplink in megabits per second)."""
        z_compute, z_network = numpy_rng(self.seed, "devices", client_id).standard_normal(2)
        spread = self.settings.speed_spread
        return math.exp(spread * z_compute), self.settings.uplink_mbps * math.exp(spread * z_network)

    def client_seconds(self, client_id: int) -> float:
        speed, mbps = self.device(client_id)
        compute = self.client_sizes[client_id] * self.local_epochs * self.settings.seconds_per_sample / speed
        return compute + self.update_bytes * 8 / (mbps * 1e6)

    def run_round(self, cohort: list[int], deadline: float | None) -> tuple[list[int], list[int], float]:
        """(on-time clients, late clients, the round's simulated seconds); advances the clock."""
        seconds = {cid: self.client_seconds(cid) for cid in cohort}
        on_time = [cid for cid in cohort if deadline is None or seconds[cid] <= deadline]
        late = [cid for cid in cohort if cid not in on_time]
        duration = max(seconds.values(), default=0.0) if deadline is None or not late else deadline
        self.elapsed += duration
        return on_time, late, duration
