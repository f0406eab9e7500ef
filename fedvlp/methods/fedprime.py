"""FED-PRIME: federated prompt tuning of a frozen ViLT with two prompt pools (ICCV 2025).

Every client holds an intra-client pool and an inter-client pool of one-token prompts
(`PromptPool`). For each sample, the query (max over its frozen [text; image] embeddings,
through a projection that stays on the client) retrieves the top-k prompts of each pool; the
selected prompts are prepended to the input of the frozen transformer, a pooler on the first
token and a classifier score the classes. Loss: cross-entropy minus `retrieval_weight` times
the cosine between the query and the selected keys (the paper's regulariser, which pulls the
selected prompts towards their inputs).

Server (the platform's rules): intra prompts, pooler and classifier by FedAvg weighted by data
size; inter prompts by the constrained clustering with Hungarian matching and a popularity
network (`fedvlp.platform.aggregation.hungarian`, rule "hungarian"); the query projections are
LOCAL.

Fed-Inter and Fed-Intra are the same method with one pool (`pools: inter` / `pools: intra`).

Deviations from the reference code (hangpt01/FedPrime), each deliberate:
* selection is per sample by default (the paper); `selection: batch` is the reference's
  batch-wise majority vote;
* the regulariser pulls (the paper, and L2P); the reference adds +0.01 * similarity;
* the pooler starts from the backbone's pretrained pooler (the reference re-initialises it);
* the clustered inter pool keeps its size (the platform needs fixed shapes; see clustering.py).

Two levers on the prompts' own training, declared alike on FedAvg-P and FedProx-P (the reference's when unset):
`prompt_lr`, the pools' own SGD learning rate, and `prompt_attention: as_one`, under which the 2k retrieved prompts
start weighing as one token in the attention.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from fedvlp.methods import declarations
from fedvlp.methods.base import ClientData, Method, TokenInputs
from fedvlp.methods.params import FedPrimeParams
from fedvlp.methods.prompts import PromptPool
from fedvlp.methods.registry import register


def vilt_classifier(dim: int, num_classes: int, generator: torch.Generator) -> torch.nn.Sequential:
    """The reference's head: Linear(D, 2D), LayerNorm, GELU, Linear(2D, C); linear weights N(0, 0.02)."""
    head = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.LayerNorm(2 * dim), torch.nn.GELU(),
                               torch.nn.Linear(2 * dim, num_classes))
    with torch.no_grad():
        for layer in (module for module in head if isinstance(module, torch.nn.Linear)):
            layer.weight.normal_(0.0, 0.02, generator=generator)
            layer.bias.zero_()
    return head


def trainable_pooler(backbone) -> torch.nn.Module:
    """A trainable copy of the frozen backbone's pretrained pooler (dense + tanh on token 0)."""
    pooler = copy.deepcopy(backbone.pooler)
    pooler.requires_grad_(True)
    return pooler


def token_inputs(features: torch.Tensor, missing: torch.Tensor | None) -> TokenInputs:
    """Cached ViLT embeddings (padding tokens stored as zeros) -> TokenInputs with the token mask."""
    if missing is None:
        missing = torch.zeros(len(features), dtype=torch.long, device=features.device)
    return TokenInputs(features, features.abs().amax(-1) > 0, missing)


def prompt_sgd(trainable: list[torch.nn.Parameter], prompts: list[torch.nn.Parameter], lr: float,
               prompt_lr: float | None) -> torch.optim.SGD:
    """Plain SGD at `lr`, the prompts at `prompt_lr` where one is given (the ViLT prompt methods' method.prompt_lr)."""
    if prompt_lr is None:
        return torch.optim.SGD(trainable, lr=lr)
    ids = {id(p) for p in prompts}
    groups: list[dict] = [{"params": [p for p in trainable if id(p) in ids], "lr": prompt_lr},
                          {"params": [p for p in trainable if id(p) not in ids]}]
    return torch.optim.SGD(groups, lr=lr)


@register
class FedPrime(declarations.FedPrime, Method):
    global_evaluation = "initial"  # the reference's server model keeps the query projections at their seeded start
    make_inputs = staticmethod(token_inputs)

    def __init__(self, params: FedPrimeParams, backbone, task, generator=None):
        super().__init__(params, backbone, task)
        dim, batchwise = backbone.hidden_size, params.selection == "batch"
        pool = lambda inter: PromptPool(params.pool_size, dim, params.top_k, batchwise, generator,  # noqa: E731
                                        track_selection=inter)
        self.intra_pool = pool(False) if params.pools in ("both", "intra") else None
        self.inter_pool = pool(True) if params.pools in ("both", "inter") else None
        self.pooler = trainable_pooler(backbone)
        self.classifier = vilt_classifier(dim, len(task.class_names), generator)

    def server_options(self) -> dict[str, dict]:
        p = self.params
        return {"hungarian": {"outer_loops": p.outer_loops, "lr": p.cluster_lr, "prompts": p.cluster_prompts,
                              "keep": p.keep_centroids, "pool_size": p.pool_size, "max_pool": p.max_pool,
                              "schedule": p.cluster_schedule}}

    def load(self, global_state, local_state) -> None:
        """The inter pool takes the size of the global state's (the server keeps every used centroid)."""
        if self.inter_pool is not None and "inter_pool.prompts" in global_state:
            self.inter_pool.resize(len(global_state["inter_pool.prompts"]))
        super().load(global_state, local_state)

    def scores(self, inputs: TokenInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, C], the retrieval similarity summed over the pools)."""
        x, mask = inputs.embeddings, inputs.mask
        query = x.masked_fill(~mask.unsqueeze(-1), float("-inf")).amax(1)  # max over the real tokens
        selected, similarity = [], x.new_zeros(())
        for pool in (self.intra_pool, self.inter_pool):
            if pool is not None:
                prompts, sim = pool(query)
                selected.append(prompts)
                similarity = similarity + sim
        prompts = torch.cat(selected, dim=1)  # prepended at the input, in front of the first layer
        hidden = self.backbone.encode(x, mask, {0: prompts},
                                      prompts_as_one=self.params.prompt_attention == "as_one")
        return self.classifier(self.pooler(hidden)), similarity

    def forward(self, inputs: TokenInputs) -> torch.Tensor:
        return self.scores(inputs)[0]

    def prompt_parameters(self) -> list[torch.nn.Parameter]:
        """What `method.prompt_lr` trains at its own rate: both pools (prompts and query projections)."""
        return [p for pool in (self.intra_pool, self.inter_pool) if pool is not None for p in pool.parameters()]

    def local_update(self, data: ClientData, generator: torch.Generator) -> dict[str, float]:
        def batch_loss(inputs: TokenInputs, labels: torch.Tensor) -> torch.Tensor:
            logits, similarity = self.scores(inputs)
            return F.cross_entropy(logits, labels) - self.params.retrieval_weight * similarity

        if self.inter_pool is not None:
            self.inter_pool.reset_selection()  # what this client retrieves in this round
        optimizer = prompt_sgd(self.trainable_parameters(), self.prompt_parameters(), self.params.lr,
                               self.params.prompt_lr)
        return self.train_epochs(data, generator, optimizer, batch_loss)
