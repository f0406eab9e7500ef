"""A plugin for the tests, loaded as users load theirs (`plugins: [fedvlp_test_plugin]`): it is imported by the
driver, shipped to the Ray workers and the coordinator, and registers a method whose behaviour the tests can
check by hand.

`ownerecho` keeps LOCAL state per client: a fingerprint of the client's own training data, how many times the
client trained, and one centroid per class, the mean frozen image feature of the client's positives. A client
handed back another client's state reports it (the statistic `wrong_state`, logged as `train_wrong_state`).
Logits are SCALE * cos-like feature . centroid + bias, with one global bias (averaged). The global model holds
the initial (zero) centroids, so it scores every class alike; a client's own model ranks by its own centroids:
global and personal metrics differ in a way a test can compute by hand.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fedvlp.methods.base import LOCAL, ClientData, Method
from fedvlp.methods.registry import register
from fedvlp.spec import log_range, spec_field


@dataclass(frozen=True)
class OwnerEchoParams:
    lr: float = spec_field(0.5, "step of the global bias towards the client's mean logit", gt=0,
                           tune=log_range(0.01, 1.0))
    local_epochs: int = spec_field(1, "unused; read by the virtual clock", ge=1)


SCALE = 10.0


def fingerprint(data: ClientData) -> float:
    return float(data.features.double().sum())


@register
class OwnerEcho(Method):
    name = "ownerecho"
    Params = OwnerEchoParams
    feature_kind = "global"
    server_rules = {"": "fedavg", "owner": LOCAL, "count": LOCAL, "centroids": LOCAL}

    def __init__(self, params, backbone, task, generator=None):
        super().__init__(params, backbone, task)
        self.owner = torch.nn.Parameter(torch.zeros((), dtype=torch.float64), requires_grad=False)
        self.count = torch.nn.Parameter(torch.zeros(()), requires_grad=False)
        self.centroids = torch.nn.Parameter(torch.zeros(len(task.class_names), backbone.embed_dim),
                                            requires_grad=False)
        self.bias = torch.nn.Parameter(torch.zeros(()), requires_grad=False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return SCALE * features @ self.centroids.T + self.bias

    @torch.no_grad()
    def local_update(self, data: ClientData, generator: torch.Generator) -> dict[str, float]:
        mine = fingerprint(data)
        wrong = float(self.count.item() > 0 and abs(self.owner.item() - mine) > 1e-9 * max(1.0, abs(mine)))
        positives = data.labels.clamp(min=0).float()  # [n, C]
        self.centroids.copy_(positives.T @ data.features / positives.sum(0).clamp(min=1).unsqueeze(1))
        self.bias.add_(self.params.lr * (-2.0 - self.bias))
        self.owner.fill_(mine)
        self.count.add_(1)
        return {"loss": 0.0, "steps": 1, "wrong_state": wrong}
