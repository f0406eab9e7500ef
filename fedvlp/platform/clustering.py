"""FED-PRIME's server-side constrained clustering of inter-client prompts, as a platform aggregator.

Each client t sends a pool L_t of n_local prompts [n_local, D]. The server fits a set of centroids
C [n_global, D] (initialised to all local prompts, n_global = n_clients * n_local) and a one-to-one
assignment z_t of every client's prompts to distinct centroids, by alternating

* one Adam step on -(l1 + l2) over {C, scale network, popularity network}, where
  l1 = sum_j log N(L_t[j] | C_z(j), diag(s(C_z(j))^2))   (s: D->hidden->ReLU->D->Sigmoid, the std)
  l2 = sum_i log Bernoulli(u_i; pi(C_i))                 (pi: D->hidden->ReLU->1->Sigmoid, popularity;
                                                           u_i = 1 iff client t uses centroid i)
* a new z_t from the Hungarian algorithm (``scipy.optimize.linear_sum_assignment``) on the
  [n_local, n_global] score matrix "log-likelihood + popularity term", maximised, so no two prompts of
  one client share a centroid,

for ``outer_loops`` passes over the clients in order. ``hungarian_cluster`` wraps this as an aggregator
(same keys and shapes in as out) whose new pool is the ``tau`` most used centroids.

Reference: FED-PRIME (hangpt01/FedPrime, algorithm/multimodal/food101/nonparametric_aggregation.py
NonparametricAgg and Server.aggregate in Fed-Prime.py). Written from its semantics, not its code.

Deviations from the reference, all deliberate:

* Fixed pool size. The reference returns every used centroid, so its pool size drifts between tau and
  n_clients * tau from round to round; the platform needs fixed shapes, so the new pool is the tau
  used centroids with the most clients assigned (ties: popularity, then index).
* l2 sums the Bernoulli log-probability over *all* centroids (used: log pi, unused: log(1 - pi)), the
  usual Bernoulli-process prior. The reference weights it by z, so only used centroids enter (each
  n_local times, through a broadcast in its ``Independent(Bernoulli)``), which can only push pi up.
* The popularity term of the assignment score is log pi_i - log(1 - pi_i) for every centroid i: the
  change in l2 when centroid i becomes used, i.e. l2 as a function of the new assignment up to a
  constant. The reference adds n_local * log Bernoulli(u_i; pi_i) with u_i from the *previous*
  assignment: a fixed per-centroid bonus that scores the new assignment with the prior of the old one
  (log pi to centroids the client already used, log(1 - pi) to the others, so among new centroids it
  prefers unpopular ones). On the two-group case of tests/test_clustering.py (5-6 clients, 20 seeds)
  that term never gave one centroid per group (mostly two each); this one did in 19 of 20.
* The std has a floor (``STD_FLOOR``) so the log-likelihood stays finite; log pi and log(1 - pi) are
  computed with logsigmoid.
* Everything random (network initialisation like ``nn.Linear``'s default, the initial random
  one-to-one maps) is drawn from the caller's ``torch.Generator``; the global RNG is never touched,
  so the same inputs and generator seed give the same output. The networks are created afresh on every
  call, as in the reference (it keeps no state between rounds).
* The log-likelihood is evaluated for all centroids at once (a few matrix products per client step)
  instead of one centroid at a time; the result is the same, only faster.

As in the reference, the assignment of client t is solved from the scores computed with the
parameters *before* its Adam step (one forward pass serves both).

Properties inherited from the reference model, worth knowing when reading results:

* The std is a sigmoid, below 1, so only prompts whose spread is well under 1 per coordinate merge
  (FED-PRIME's prompts start in U(+-0.044)); far-apart prompts each keep their own centroid.
* Adam is scale-free: every centroid moves by about ``lr`` per coordinate per step, so after
  ``outer_loops * n_clients`` steps a centroid can sit that far from the prompts it represents.
* Cost: ``outer_loops * n_clients`` steps, each over all ``n_clients * n_local`` centroids (two
  networks of width ``hidden`` on D-dim inputs), so time grows as n_clients^2; the Hungarian solves
  on [n_local, n_global] are a few percent (see benchmarks/aggregation.py). The computation runs on
  the pools' device, in float32; results are returned in the pools' dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment

State = dict[str, torch.Tensor]

STD_FLOOR = 1e-3  # the Gaussian std is STD_FLOOR + (1 - STD_FLOOR) * sigmoid(.), in (STD_FLOOR, 1)
_LOG_2PI = math.log(2.0 * math.pi)


@dataclass(frozen=True, eq=False)
class Clustering:
    """The result of ``cluster_prompts``.

    centroids: [n_global, D], every centroid after the last step (used or not).
    assignment: int64 [n_clients, n_local], the centroid of each local prompt; a row has distinct entries.
    popularity: [n_global], the Bernoulli probability pi(C_i) after the last step.
    """

    centroids: torch.Tensor
    assignment: np.ndarray
    popularity: torch.Tensor

    @property
    def counts(self) -> np.ndarray:
        """[n_global] int64: how many clients assigned a prompt to each centroid."""
        return np.bincount(self.assignment.ravel(), minlength=self.centroids.shape[0])

    @property
    def used(self) -> np.ndarray:
        """Sorted indices of the centroids at least one client assigned a prompt to."""
        return np.flatnonzero(self.counts)

    @property
    def used_centroids(self) -> torch.Tensor:
        """[n_used, D]: the used centroids, in index order (the reference's new global pool)."""
        return self.centroids[torch.from_numpy(self.used)]

    def ranked(self) -> np.ndarray:
        """Used centroid indices by client count (desc), then popularity (desc), then index (asc)."""
        used = self.used
        pop = self.popularity.detach().double().cpu().numpy()[used]
        order = np.lexsort((used, -pop, -self.counts[used]))
        return used[order]


def _uniform(shape: tuple[int, ...], bound: float, generator: torch.Generator) -> torch.Tensor:
    return (torch.rand(shape, generator=generator, dtype=torch.float32) * 2.0 - 1.0) * bound


def _init_mlp(d_in: int, hidden: int, d_out: int, generator: torch.Generator) -> list[torch.Tensor]:
    """[W1, b1, W2, b2] drawn like nn.Linear's default init (U(+-1/sqrt(fan_in)) for weights and biases)."""
    b1, b2 = 1.0 / math.sqrt(d_in), 1.0 / math.sqrt(hidden)
    return [_uniform((hidden, d_in), b1, generator), _uniform((hidden,), b1, generator),
            _uniform((d_out, hidden), b2, generator), _uniform((d_out,), b2, generator)]


def _mlp(x: torch.Tensor, params: Sequence[torch.Tensor]) -> torch.Tensor:
    """Linear -> ReLU -> Linear; the pre-sigmoid output."""
    w1, b1, w2, b2 = params
    return F.linear(F.relu(F.linear(x, w1, b1)), w2, b2)


def _std(pre: torch.Tensor) -> torch.Tensor:
    """The per-coordinate Gaussian *std* (the reference passes its cov_net's sigmoid as Normal's scale),
    floored so that log-likelihoods stay finite."""
    return STD_FLOOR + (1.0 - STD_FLOOR) * torch.sigmoid(pre)


def _loglik_all(x: torch.Tensor, centroids: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """[m, k]: log N(x_j | c_i, diag(std_i^2)) for every prompt j and centroid i, by matrix products.

    sum_d (x - c)^2 / s^2 = x^2 . (1/s^2) - 2 x . (c/s^2) + sum_d c^2/s^2.
    """
    prec = std.pow(-2)
    cp = centroids * prec
    quad = torch.addmm(torch.linalg.vecdot(centroids, cp), x.pow(2), prec.T)
    quad = quad.addmm_(x, cp.T, alpha=-2.0).clamp_min_(0.0)  # >= 0 up to rounding
    norm = std.log().sum(1) + 0.5 * x.shape[1] * _LOG_2PI
    return -0.5 * quad - norm


def _loglik_pairs(x: torch.Tensor, centroids: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """[m]: log N(x_j | c_j, diag(std_j^2)) row by row (exact differences, for the loss)."""
    z = (x - centroids) / std
    return -0.5 * z.pow(2).sum(1) - std.log().sum(1) - 0.5 * x.shape[1] * _LOG_2PI


def cluster_prompts(pools: Sequence[torch.Tensor], generator: torch.Generator, *, outer_loops: int = 5,
                    lr: float = 1e-3, hidden: int = 128) -> Clustering:
    """Cluster the clients' prompt pools (pools[t]: [n_local, D], all alike) under the one-prompt-per-cluster
    constraint; see the module docstring for the model. Deterministic in (pools, generator state)."""
    if not pools:
        raise ValueError("cluster_prompts: no pools")
    shape = tuple(pools[0].shape)
    if len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
        raise ValueError(f"cluster_prompts: each pool must be [n_local, D], got {shape}")
    for t, pool in enumerate(pools):
        if tuple(pool.shape) != shape:
            raise ValueError(f"cluster_prompts: pool {t} has shape {tuple(pool.shape)}, pool 0 has {shape}")
    if outer_loops < 0:
        raise ValueError(f"cluster_prompts: outer_loops must be >= 0, got {outer_loops}")
    out_dtype, device = pools[0].dtype, pools[0].device
    n_clients, (n_local, dim) = len(pools), shape
    n_global = n_clients * n_local

    local = torch.stack([p.detach() for p in pools]).to(device=device, dtype=torch.float32)
    if not bool(torch.isfinite(local).all()):
        raise ValueError("cluster_prompts: the pools hold NaN or infinite values")
    # All random draws come from `generator`, in a fixed order: the networks, then the initial maps.
    scale_params = _init_mlp(dim, hidden, dim, generator)
    pop_params = _init_mlp(dim, hidden, 1, generator)
    assignment = np.stack([torch.randperm(n_global, generator=generator)[:n_local].numpy()
                           for _ in range(n_clients)]).astype(np.int64)

    centroids = local.reshape(n_global, dim).clone().requires_grad_(True)
    params = [p.to(device).requires_grad_(True) for p in scale_params + pop_params]
    scale_params, pop_params = params[:4], params[4:]
    opt = torch.optim.Adam([*params, centroids], lr=lr, fused=True)  # one pass per tensor

    for _ in range(outer_loops):
        for t in range(n_clients):
            x = local[t]
            z = torch.from_numpy(assignment[t]).to(device)
            with torch.no_grad():  # the score of every (prompt, centroid) pair, for the assignment
                loglik = _loglik_all(x, centroids, _std(_mlp(centroids, scale_params)))
            pre_pop = _mlp(centroids, pop_params).squeeze(1)
            log_pi, log_1m_pi = F.logsigmoid(pre_pop), F.logsigmoid(-pre_pop)
            used = torch.zeros(n_global, dtype=torch.bool, device=device)
            used[z] = True
            c = centroids[z]
            l1 = _loglik_pairs(x, c, _std(_mlp(c, scale_params))).sum()
            l2 = torch.where(used, log_pi, log_1m_pi).sum()
            opt.zero_grad(set_to_none=True)
            (-(l1 + l2)).backward()
            opt.step()
            # l2 as a function of the new assignment is const + sum over used i of (log pi_i - log(1 - pi_i)).
            score = loglik + (log_pi - log_1m_pi).detach()
            _, cols = linear_sum_assignment(score.double().cpu().numpy(), maximize=True)
            assignment[t] = cols

    with torch.no_grad():
        popularity = torch.sigmoid(_mlp(centroids, pop_params).squeeze(1))
    return Clustering(centroids=centroids.detach().to(out_dtype), assignment=assignment,
                      popularity=popularity.to(out_dtype))


def hungarian_cluster(states: Sequence[State], num_samples: Sequence[int], *, generator: torch.Generator,
                      outer_loops: int = 5, lr: float = 1e-3, hidden: int = 128) -> State:
    """FED-PRIME's inter-client prompt aggregation: same keys and shapes in as out.

    Every key holds one prompt pool per client, [tau, D] (or [tau, ...], flattened to [tau, D] for the
    clustering and shaped back). The clients' pools are clustered with ``cluster_prompts`` and the new
    pool is the tau used centroids ranked by how many clients assigned a prompt to them (desc), then
    popularity (desc), then index: the pool size stays tau (the reference lets it vary; see the module
    docstring). Each client assigns tau distinct centroids, so at least tau are used.

    ``num_samples`` is accepted for the common aggregator signature and not used: the reference does
    not weight the clustering by client data size. Keys are processed in the order of ``states[0]``,
    all drawing from ``generator``.
    """
    if not states:
        raise ValueError("hungarian_cluster: no states to aggregate")
    if len(num_samples) != len(states):
        raise ValueError(f"hungarian_cluster: {len(states)} states but {len(num_samples)} sample counts")
    out = {}
    for key, first in states[0].items():
        if first.dim() < 1 or first.shape[0] < 1:
            raise ValueError(f"hungarian_cluster: {key!r} is not a pool [tau, ...], got {tuple(first.shape)}")
        tau = first.shape[0]
        pools = [state[key].reshape(tau, -1) for state in states]
        result = cluster_prompts(pools, generator, outer_loops=outer_loops, lr=lr, hidden=hidden)
        keep = torch.from_numpy(result.ranked()[:tau]).to(result.centroids.device)
        out[key] = result.centroids[keep].reshape(first.shape).to(first.dtype)
    return out
