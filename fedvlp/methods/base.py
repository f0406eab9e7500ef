"""The method contract (docs/architecture.md, "The method contract").

A method is one module, registered by name with `@register` (built-ins live in `fedvlp/methods/`,
plugins anywhere). Its class says which backbone it needs (`backbone_kind`), which frozen inputs it
reads (`feature_kind`), what hyper-parameters it takes (`Params`, a frozen dataclass of `spec_field`s,
with the ranges `fedvlp tune` searches), how its trainable modules are built (`__init__(params,
backbone, task, generator)`), which parameters are global and how the server combines each group
(`server_rules`), the local update (`local_update`) and how it scores a batch (`forward`). The engine
knows nothing else about it. Registration checks all of this (`fedvlp.methods.registry`). The built-ins declare
their name, Params, kinds and server rules in `fedvlp.methods.declarations`, which a run's driver reads without torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F

from fedvlp.methods.declarations import MethodDeclaration, Task  # noqa: F401  (Task: what the run asks for)
from fedvlp.methods.numerics import asymmetric_loss
from fedvlp.platform.aggregation import LOCAL  # noqa: F401  (the rule of parameters that stay on their client)

State = dict[str, torch.Tensor]


@dataclass
class TokenInputs:
    """A batch for a ViLT-family method: the frozen embedding-layer outputs [n, L, D] (text tokens,
    then image tokens), which tokens are real [n, L], and each sample's missing-modality code [n]
    (fedvlp.data.missing: 0 full, 1 text missing, 2 image missing). Indexes like a tensor."""
    embeddings: torch.Tensor
    mask: torch.Tensor
    missing: torch.Tensor

    def __len__(self) -> int:
        return len(self.embeddings)

    def __getitem__(self, index) -> TokenInputs:
        return TokenInputs(self.embeddings[index], self.mask[index], self.missing[index])


@dataclass
class ClientData:
    """One client's training data as the method sees it: frozen inputs (features, or TokenInputs)
    and labels (-1 = unknown)."""
    features: torch.Tensor | TokenInputs
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)


class Method(MethodDeclaration, torch.nn.Module):
    # name, Params, backbone_kind, feature_kind and server_rules: see MethodDeclaration
    # What the global model (val_*, test_*) is for a method with LOCAL parameters; the clients' own models
    # (personal_*) are always the global state with each client's local state:
    #   "global": the global parameters alone: `forward` leaves the local ones out while `global_only` is set
    #   "initial": the global state with the initial local state, when that is the reference's server model
    #              (the same seeded start on every client, e.g. FED-PRIME's query projections)
    global_evaluation: ClassVar[Literal["global", "initial"]] = "initial"
    global_only = False  # set by `load_global`, cleared by `load`
    backbone: Any  # the frozen backbone (fedvlp.backbones), shared by every method object of a worker
    _initial_local: State

    def __init__(self, params, backbone, task: Task, generator: torch.Generator | None = None):
        super().__init__()
        self.params = params
        self.task = task
        object.__setattr__(self, "backbone", backbone)  # shared and frozen: not part of the state dict

    # --- what a method implements
    def local_update(self, data: ClientData, generator: torch.Generator) -> dict[str, float]:
        """Train on one client's data; return {"loss": mean training loss, "steps": optimiser steps, ...}.

        The contract:
        * When it starts, the module already holds the round's global state and this client's own local
          state (its initial one in the client's first round): the worker called `load` before it.
        * One method object serves all of a worker's clients, one after another: keep nothing about a
          client on `self` between calls. What must survive to the client's next round is its local
          state (the parameters whose server rule is LOCAL), which the coordinator keeps and hands back.
        * Every random draw comes from `generator`, the (seed, round, client) stream, so the result does
          not depend on the worker or on the order clients run in.
        * Any other number in the returned dict (e.g. "retrieval_similarity") is a statistic of the
          method's own: the coordinator averages it over the cohort weighted by sample counts and logs
          it every round as `train_<name>`.
        """
        raise NotImplementedError

    def forward(self, features: Any) -> torch.Tensor:
        """Logits [B, C] for a batch of frozen inputs of `feature_kind` (what `make_inputs` builds).

        Used for training inside `local_update` and, under `torch.no_grad()` and `eval()`, for every
        evaluation: the global model on the val and test sets (`load_global`: see `global_evaluation`),
        and each client's model (global state plus its own local state) on its local test set."""
        raise NotImplementedError

    def server_options(self) -> dict[str, dict]:
        """Options per server rule that follow from the method's params, e.g. {"hungarian": {"outer_loops": 5}};
        the config's `server.options` override them."""
        return {}

    @staticmethod
    def make_inputs(features: torch.Tensor, missing: torch.Tensor | None) -> torch.Tensor | TokenInputs:
        """What `forward` takes, from the cached frozen features of `feature_kind` (and, for
        image+text data, each sample's missing code)."""
        return features

    # --- provided
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def rule_of(self, key: str) -> str:
        prefix = max((p for p in self.server_rules if key.startswith(p)), key=len)
        return self.server_rules[prefix]

    def global_state(self) -> State:
        return {k: v.detach().clone() for k, v in self.state_dict().items() if self.rule_of(k) != LOCAL}

    def local_state(self) -> State:
        return {k: v.detach().clone() for k, v in self.state_dict().items() if self.rule_of(k) == LOCAL}

    def load(self, global_state: State, local_state: State | None) -> None:
        """Load the server's global state and a client's own state (None: the client's first round)."""
        if not hasattr(self, "_initial_local"):
            object.__setattr__(self, "_initial_local", self.local_state())
        self.load_state_dict({**global_state, **(local_state if local_state is not None else self._initial_local)})
        self.global_only = False

    def load_global(self, global_state: State) -> None:
        """Load the global model, the one the val and test sets score (`global_evaluation`)."""
        self.load(global_state, None)
        self.global_only = self.global_evaluation == "global"

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The training loss. Default: BCE over known labels (multi-label) or cross-entropy."""
        return masked_bce(logits, labels) if self.task.multilabel else F.cross_entropy(logits, labels)

    def asl(self, logits: torch.Tensor, labels: torch.Tensor, gamma_neg: float, gamma_pos: float,
            clip: float) -> torch.Tensor:
        """Asymmetric loss averaged over the known labels, as `masked_bce` is (cross-entropy if single-label).

        Every multi-label loss is normalised the same way, so the gradient's scale does not depend on how
        many labels the label mask hides (the references sum over classes and average over the batch,
        which shrinks the gradient with the mask and confounds a label-mask study)."""
        if not self.task.multilabel:
            return F.cross_entropy(logits, labels)
        known = (labels >= 0).sum().clamp(min=1)
        return asymmetric_loss(logits, labels, gamma_neg, gamma_pos, clip, reduction="sum") / known

    def train_epochs(self, data: ClientData, generator: torch.Generator, optimizer,
                     batch_loss=None) -> dict[str, float]:
        """The local loop every method shares: `batch_loss(inputs, labels)` (default `self.loss` of the
        logits) over shuffled minibatches for `local_epochs` epochs."""
        batch_loss = batch_loss or (lambda inputs, labels: self.loss(self(inputs), labels))
        self.train()
        losses = []
        for batch in minibatches(len(data), self.params.batch_size, self.params.local_epochs, generator):
            loss = batch_loss(data.features[batch], data.labels[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return {"loss": sum(losses) / max(1, len(losses)), "steps": len(losses)}

    @torch.no_grad()
    def score(self, features: torch.Tensor | TokenInputs, chunk: int = 1024) -> torch.Tensor:
        self.eval()
        return torch.cat([self(features[i : i + chunk]) for i in range(0, len(features), chunk)])


def masked_bce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy averaged over known labels; -1 (unknown) entries are ignored."""
    known = (labels >= 0).float()
    loss = F.binary_cross_entropy_with_logits(logits, labels.clamp(min=0).float(), weight=known, reduction="sum")
    return loss / known.sum().clamp(min=1)


def minibatches(num_samples: int, batch_size: int, epochs: int, generator: torch.Generator):
    """Index batches for `epochs` passes, shuffled by the client's own generator."""
    for _ in range(epochs):
        order = torch.randperm(num_samples, generator=generator)
        yield from order.split(batch_size)
