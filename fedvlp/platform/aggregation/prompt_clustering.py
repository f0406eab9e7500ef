"""FED-PRIME's server-side constrained clustering of inter-client prompts, as a platform aggregator.

Each client t sends a pool L_t of n_local prompts [n_local, D]. The server fits a set of centroids
C [n_global, D] (initialised to all local prompts, n_global = n_clients * n_local) and a one-to-one
assignment z_t of every client's prompts to distinct centroids, by alternating, ``outer_loops`` times,

* the two networks, evaluated over all centroids: the scale network s (D->hidden->ReLU->D->Sigmoid,
  the std) and the popularity network pi (D->hidden->ReLU->1->Sigmoid);
* a new z_t from the Hungarian algorithm (``scipy.optimize.linear_sum_assignment``) on the
  [n_local, n_global] score matrix "log-likelihood + popularity term", maximised, so no two prompts
  of one client share a centroid;
* an Adam step on -(l1 + l2) over {C, scale network, popularity network}, where
  l1 = sum_t sum_j log N(L_t[j] | C_z(j), diag(s(C_z(j))^2))
  l2 = sum_{used i} sum_t log Bernoulli(u_ti; pi(C_i))   (u_ti = 1 iff client t uses centroid i;
                                                          used: some client uses it).

``schedule='per_client'`` is the reference's: client by client, its new z_t and one Adam step on its
own terms, ``outer_loops * n_clients`` steps a round. ``'batched'`` (the default): per outer loop every
client's z_t from the same parameters and one step on the sum, ``outer_loops`` steps a round.

The popularity network and its Adam moments are carried from round to round (``popularity=``,
``Clustering.popularity_state``; the rule "hungarian" keeps them in its checkpointed state), so pi is
learned over the run; the centroids and assignments start afresh from each round's prompts, and so
does the scale network.

``cluster_pool`` wraps this for one pool, with the reference's choices as options: which prompts are
clustered (the ones the clients selected this round, or all) and which centroids make the new pool
(every used one, so its size varies, or the top tau); it returns diagnostics to log every round
(``pool_diagnostics``). ``hungarian_cluster`` (in ``fedvlp.platform.aggregation.hungarian``, beside the rule
"hungarian") is the platform aggregator for one round (same keys in as out; by default also the same shapes)
and ``hungarian_cluster_report`` the same with the diagnostics.

Reference: FED-PRIME (hangpt01/FedPrime, algorithm/multimodal/food101/nonparametric_aggregation.py
NonparametricAgg and Server.aggregate in Fed-Prime.py). Written from its semantics, not its code.

Deviations from the reference, all deliberate:

* The popularity network is carried between rounds; the reference draws both networks afresh every
  round. At lr 1e-3, 5 Adam steps (batched) or 5 per client leave a fresh pi near its random start.
  Measured on the planted case of tests/test_clustering.py (12 clients, 10 holding prompts near 3
  shared modes, 2 loners; 5 seeds), as min pi of the modes' centroids minus max pi of the loners':
  batched, after 24 rounds, carried 0.075 to 0.12, fresh -0.04 to 0.00 (and the modes' clusters split);
  per_client, after 8 rounds, carried 0.14-0.23, fresh 0.10-0.17; the cost is unchanged. Training a
  fresh network to convergence every round instead takes hundreds of steps (pi reaches count/n_clients
  after 300-1000 with the assignment held fixed), while the scale network shrinks towards its floor and
  the clusters fall apart (5 x 100 steps: the three largest clusters hold 1-6 of the 10 clients of a
  mode) at about 50 times the time. The scale network is not carried: its log-normaliser sums over D
  coordinates, so a learned pattern of std pulls prompts to the same few centroids whatever their mode
  (carried, batched, on benchmarks/aggregation.py's FED-PRIME-like pools: every prompt merged into tau
  centroids 0.8 from their prompts, about as far as the modes are apart, within two rounds).
* Schedule. ``per_client`` evaluates both networks over all centroids at each of its
  ``outer_loops * n_clients`` steps, so its time grows as n_clients^2 (1.4 CPU s at 20 clients, 34 at
  100; tau 20, D 768, one thread); ``batched`` evaluates them once per outer loop (0.2 / 1.5 CPU s),
  and a centroid moves at most about ``outer_loops * lr`` per coordinate (Adam is scale-free) instead of
  ``outer_loops * n_clients * lr``: its new prompts stay near the clients' (0.1 from the modes on the
  planted case, against 0.4 per_client). On the two-group case of tests/test_clustering.py (5 clients,
  20 seeds) per_client gives one centroid per group in 20, batched in 18.
* Selected prompts. With ``prompts='selected'`` (the default of ``cluster_pool``) the clustered rows are
  the union over the round's clients of the prompts they selected, taken from every client, as the
  reference's ``union_prompts_checklist`` does; rows no client selected are dropped from the new pool
  (``keep='used'``) or carried over (``keep='top'``).
* Pool size. ``keep='used'`` (the reference's and ``cluster_pool``'s default) returns every used
  centroid, between m (the clustered rows) and n_clients * m of them, but at most ``max_pool``
  (default ``MAX_POOL_FACTOR * tau``, the most-assigned ones): unbounded, the pool could grow by a factor
  n_clients a round. ``hungarian_cluster`` defaults to ``keep='top'``, the tau used centroids with the
  most clients assigned (ties: popularity, then index), because the platform's methods still need fixed
  shapes.
* l2 is the Bernoulli log-likelihood of each used centroid over the clients, count_i log pi_i +
  (n_clients - count_i) log(1 - pi_i): largest at pi_i = count_i / n_clients, the share of clients that
  use it. The reference weights it by z, so only used centroids enter, with log pi alone (each n_local
  times, through a broadcast in its ``Independent(Bernoulli)``), which can only push pi up. Summed over
  every centroid instead, the unused copies of a shared prompt that the initialisation leaves beside its
  merged centroid teach the network that shared regions are unpopular: pi of a shared mode and of a
  loner's prompt both tend to 1 / n_clients, and on the planted case above the carried margin stayed
  at -0.04 to 0.00.
* The popularity term of the assignment score is log pi_i - log(1 - pi_i) for every centroid i: the
  change in l2 when client t joins centroid i. The reference adds n_local * log Bernoulli(u_i; pi_i)
  with u_i from the *previous* assignment: a fixed per-centroid bonus that scores the new assignment
  with the prior of the old one (log pi to centroids the client already used, log(1 - pi) to the
  others, so among new centroids it prefers unpopular ones); on the two-group case it never gave one
  centroid per group (mostly two each).
* The std has a floor (``STD_FLOOR``) so the log-likelihood stays finite; log pi and log(1 - pi) are
  computed with logsigmoid.
* Everything random (network initialisation like ``nn.Linear``'s default, the initial random
  one-to-one maps) is drawn from the caller's ``torch.Generator``; the global RNG is never touched,
  so the same inputs, generator seed and carried popularity state give the same output.
* The log-likelihood is evaluated for all centroids at once (matrix products over a block of clients)
  instead of one centroid at a time; the result is the same, only faster.

Properties inherited from the reference model, worth knowing when reading results:

* The std is a sigmoid, below 1, so only prompts whose spread is well under 1 per coordinate merge
  (FED-PRIME's prompts start in U(+-0.044)); far-apart prompts each keep their own centroid.
* Cost: per outer loop, the networks over n_global centroids and their backward pass (linear in
  n_clients; per_client: once per client), the scores of every client's prompts against every centroid
  (n_clients^2 * n_local^2 * D multiply-adds, in blocks) and n_clients Hungarian solves on
  [n_local, n_global]; see benchmarks/aggregation.py. The computation runs on the pools' device, in
  float32; results are returned in the pools' dtype.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment

State = dict[str, torch.Tensor]

PROMPT_CHOICES = ("selected", "all")   # which prompts are clustered (cluster_pool)
KEEP_CHOICES = ("used", "top")         # which centroids make the new pool
SCHEDULES = ("batched", "per_client")  # one Adam step per outer loop for all clients, or one per client
MAX_POOL_FACTOR = 4  # keep='used': the new pool holds at most this many times tau prompts
STD_FLOOR = 1e-3  # the Gaussian std is STD_FLOOR + (1 - STD_FLOOR) * sigmoid(.), in (STD_FLOOR, 1)
_LOG_2PI = math.log(2.0 * math.pi)


@dataclass(frozen=True, eq=False)
class Clustering:
    """The result of ``cluster_prompts``.

    centroids: [n_global, D], every centroid after the last step (used or not).
    assignment: int64 [n_clients, n_local], the centroid of each local prompt; a row has distinct entries.
    popularity: [n_global], the Bernoulli probability pi(C_i) after the last step.
    initial_popularity: [n_global], pi(C_i) of the popularity network as the call started, at the same (final)
        centroids: popularity - initial_popularity is what the network learned in this call.
    popularity_state: the popularity network and its Adam moments after the call, for the next round.
    """

    centroids: torch.Tensor
    assignment: np.ndarray
    popularity: torch.Tensor
    initial_popularity: torch.Tensor | None = None
    popularity_state: State | None = None

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


def _popularity_logit(x: torch.Tensor, params: Sequence[torch.Tensor]) -> torch.Tensor:
    """[n]: the popularity network's pre-sigmoid output, logit pi(x), for every row of x."""
    return _mlp(x, params).squeeze(1)


def _std(pre: torch.Tensor) -> torch.Tensor:
    """The per-coordinate Gaussian *std* (the reference passes its cov_net's sigmoid as Normal's scale),
    floored so that log-likelihoods stay finite."""
    return STD_FLOOR + (1.0 - STD_FLOOR) * torch.sigmoid(pre)


def _gaussian_terms(centroids: torch.Tensor, std: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """What ``_loglik_all`` needs of the centroids, computed once per outer loop: the precisions
    1/s^2, c/s^2, sum_d c^2/s^2 and the normalising constant of each centroid."""
    prec = std.pow(-2)
    cp = centroids * prec
    return prec, cp, torch.linalg.vecdot(centroids, cp), std.log().sum(1) + 0.5 * centroids.shape[1] * _LOG_2PI


def _loglik_all(x: torch.Tensor, terms: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """[m, k]: log N(x_j | c_i, diag(std_i^2)) for every prompt j and centroid i, by matrix products
    (``terms`` from ``_gaussian_terms``): sum_d (x - c)^2 / s^2 = x^2 . (1/s^2) - 2 x . (c/s^2) + sum_d c^2/s^2."""
    prec, cp, cc, norm = terms
    quad = torch.addmm(cc, x.pow(2), prec.T)
    quad = quad.addmm_(x, cp.T, alpha=-2.0).clamp_min_(0.0)  # >= 0 up to rounding
    return -0.5 * quad - norm


def _loglik_pairs(x: torch.Tensor, centroids: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """[m]: log N(x_j | c_j, diag(std_j^2)) row by row (exact differences, for the loss)."""
    z = (x - centroids) / std
    return -0.5 * z.pow(2).sum(1) - std.log().sum(1) - 0.5 * x.shape[1] * _LOG_2PI


def _solve_assignments(local: torch.Tensor, terms: tuple[torch.Tensor, ...], bonus: torch.Tensor,
                       chunk_elements: int = 1 << 22) -> np.ndarray:
    """int64 [n_clients, n_local]: each client's Hungarian assignment maximising log-likelihood + ``bonus``.
    The scores are computed for a block of clients at a time (one matrix product), the solves one client at a time."""
    n_clients, n_local, _ = local.shape
    per_block = max(1, chunk_elements // max(1, n_local * len(bonus)))
    out = np.empty((n_clients, n_local), np.int64)
    for first in range(0, n_clients, per_block):
        block = local[first:first + per_block]
        score = (_loglik_all(block.reshape(-1, block.shape[-1]), terms) + bonus).double().cpu().numpy()
        for t, rows in enumerate(score.reshape(len(block), n_local, -1)):
            out[first + t] = linear_sum_assignment(rows, maximize=True)[1]
    return out


_LAYERS = ("w1", "b1", "w2", "b2")  # a network's tensors, in ``_mlp``'s order
_MOMENTS = ("exp_avg", "exp_avg_sq")  # Adam's per-tensor moments


def _popularity_state(params: Sequence[torch.Tensor], opt: torch.optim.Optimizer) -> State:
    """The popularity network and its Adam moments as flat CPU tensors ("w1", ..., "exp_avg.w1", ..., "step"),
    to carry to the next round."""
    state = {}
    for layer, p in zip(_LAYERS, params):
        state[layer] = p.detach().cpu().clone()
        moments = opt.state.get(p)
        for moment in _MOMENTS:
            state[f"{moment}.{layer}"] = (moments[moment] if moments else torch.zeros_like(p)).cpu().clone()
    stepped = opt.state.get(params[0])  # all four tensors take every step: one step count
    state["step"] = (stepped["step"] if stepped else torch.zeros(())).detach().cpu().clone()
    return state


def _restore_popularity(state: State, params: Sequence[torch.Tensor], opt: torch.optim.Optimizer) -> None:
    """Load a carried popularity network (``_popularity_state``) into ``params`` and its Adam moments into ``opt``."""
    for layer, p in zip(_LAYERS, params):
        saved = state.get(layer)
        if saved is None or tuple(saved.shape) != tuple(p.shape):
            found = None if saved is None else tuple(saved.shape)
            raise ValueError(f"popularity state: {layer} has shape {found}, the network needs {tuple(p.shape)} "
                             f"(the prompts' width or the hidden size changed)")
        with torch.no_grad():
            p.copy_(saved)
        if float(state["step"]) > 0:  # a network that has not stepped yet has no Adam state
            opt.state[p] = {"step": state["step"].to(device=p.device, dtype=torch.float32).clone(),
                            **{m: state[f"{m}.{layer}"].to(p).clone() for m in _MOMENTS}}


def cluster_prompts(pools: Sequence[torch.Tensor], generator: torch.Generator, *, outer_loops: int = 5,
                    lr: float = 1e-3, hidden: int = 128, schedule: str = "batched",
                    popularity: State | None = None) -> Clustering:
    """Cluster the clients' prompt pools (pools[t]: [n_local, D], all alike) under the one-prompt-per-cluster
    constraint; see the module docstring for the model and the schedules. ``popularity``: the popularity network
    and its Adam moments from the previous round (``Clustering.popularity_state``), or None for a fresh one.
    Deterministic in (pools, generator state, popularity)."""
    if not pools:
        raise ValueError("cluster_prompts: no pools")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
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
    # All random draws come from `generator`, in a fixed order: the networks, then the initial maps. The popularity
    # network is drawn even when a carried one replaces it, so that the other draws do not depend on the state.
    scale_params = _init_mlp(dim, hidden, dim, generator)
    pop_params = _init_mlp(dim, hidden, 1, generator)
    assignment = np.stack([torch.randperm(n_global, generator=generator)[:n_local].numpy()
                           for _ in range(n_clients)]).astype(np.int64)

    centroids = local.reshape(n_global, dim).clone().requires_grad_(True)
    params = [p.to(device).requires_grad_(True) for p in scale_params + pop_params]
    scale_params, pop_params = params[:4], params[4:]
    opt = torch.optim.Adam([*params, centroids], lr=lr, fused=True)  # one pass per tensor
    if popularity is not None:
        _restore_popularity(popularity, pop_params, opt)
    initial_pop = [p.detach().clone() for p in pop_params]
    # batched: every client's assignment and one Adam step on their summed objective per outer loop;
    # per_client (the reference): client by client, one Adam step each
    blocks = [np.arange(n_clients)] if schedule == "batched" else [np.array([t]) for t in range(n_clients)]

    for _ in range(outer_loops):
        for block in blocks:
            # the two networks over every centroid (the scale network's gradient only through the block's rows)
            with torch.no_grad():
                std = _std(_mlp(centroids, scale_params))
            pre_pop = _popularity_logit(centroids, pop_params)
            log_pi, log_1m_pi = F.logsigmoid(pre_pop), F.logsigmoid(-pre_pop)
            # l1 + l2 of the block's clients under the current assignments. l2 runs over the centroids some client
            # uses; a client uses n_local distinct ones, so its l2 is sum_{used i} log(1 - pi_i) plus, for each i
            # it uses, log pi_i - log(1 - pi_i)
            z = torch.from_numpy(assignment[block].reshape(-1)).to(device)
            used = torch.from_numpy(np.bincount(assignment.ravel(), minlength=n_global) > 0).to(device)
            assigned = centroids[z]
            l1 = _loglik_pairs(local[block].reshape(-1, dim), assigned, _std(_mlp(assigned, scale_params))).sum()
            gain = log_pi - log_1m_pi
            l2 = len(block) * log_1m_pi[used].sum() + gain[z].sum()
            # the block's new assignments, from the parameters before this step (as in the reference)
            with torch.no_grad():
                next_assignment = _solve_assignments(local[block], _gaussian_terms(centroids, std), gain)
            opt.zero_grad(set_to_none=True)
            (-(l1 + l2)).backward()
            opt.step()
            assignment[block] = next_assignment

    with torch.no_grad():
        popularity_now = torch.sigmoid(_popularity_logit(centroids, pop_params))
        popularity_before = torch.sigmoid(_popularity_logit(centroids, initial_pop))
    return Clustering(centroids=centroids.detach().to(out_dtype), assignment=assignment,
                      popularity=popularity_now.to(out_dtype), initial_popularity=popularity_before.to(out_dtype),
                      popularity_state=_popularity_state(pop_params, opt))


@dataclass(frozen=True, eq=False)
class PoolUpdate:
    """The result of ``cluster_pool``: the new global pool and what it takes to rebuild one.

    prompts: [n_new, ...] the new pool (the input rows' trailing shape), ranked: centroids with the most clients
        first (``Clustering.ranked``), then, under ``keep='top'``, the unselected rows carried over.
    rows: int64 [m], the input rows that were clustered (every row, or the union of the selected masks).
    kept: int64 [n_kept], the centroid index of each of the first n_kept new prompts.
    carried: int64 [n_new - n_kept], the input row of each carried-over prompt (``keep='top'`` only).
    clustering: the fit on the clustered rows.
    diagnostics: see ``pool_diagnostics``.
    """

    prompts: torch.Tensor
    rows: np.ndarray
    kept: np.ndarray
    carried: np.ndarray
    clustering: Clustering
    diagnostics: dict[str, float]


def _clustered_rows(n_rows: int, n_clients: int, prompts: str, selected) -> np.ndarray:
    if prompts not in PROMPT_CHOICES:
        raise ValueError(f"prompts must be one of {PROMPT_CHOICES}, got {prompts!r}")
    if prompts == "all" or selected is None:
        return np.arange(n_rows)
    masks = [np.asarray(mask.cpu() if isinstance(mask, torch.Tensor) else mask) for mask in selected]
    if len(masks) != n_clients:
        raise ValueError(f"selected: {len(masks)} masks for {n_clients} clients")
    for t, mask in enumerate(masks):
        if mask.dtype != bool or mask.shape != (n_rows,):
            raise ValueError(f"selected[{t}] must be a bool mask of shape ({n_rows},), got {mask.dtype} {mask.shape}")
    rows = np.flatnonzero(np.any(masks, axis=0))
    if not len(rows):
        raise ValueError("selected: no client selected any prompt")
    return rows


def pool_diagnostics(pools: torch.Tensor, result: Clustering, new_pool: torch.Tensor,
                     previous: torch.Tensor | None = None) -> dict[str, float]:
    """What to log every round. pools: [n_clients, m, D] the clustered client prompts; new_pool: [n_new, D].

    * centroids_used: how many centroids hold a prompt (before any cut to the pool size);
    * pool_size: rows of the new pool;
    * shared_clusters: the fraction of used centroids that hold prompts of two or more clients (the share of
      clusters that actually merged something across clients; 0 when every client keeps its own prompts);
    * client_to_centroid: the mean L2 distance from each clustered client prompt to the centroid it is
      assigned to (how well the centroids summarise what the clients sent; it includes Adam's drift);
    * centroid_movement: the mean L2 distance of each used centroid from the client prompt it started at (how
      far the fit moved the centroids; 0 means the new pool is a subset of the clients' prompts);
    * popularity_spread: the standard deviation of pi over the used centroids (how much the popularity tells
      the used centroids apart);
    * popularity_change: the mean over the used centroids of |pi(C_i) - pi_0(C_i)|, where pi is the popularity
      network after the call and pi_0 the one it started from (carried from the last round, or drawn), both
      at the final centroids: what the network learned in this round;
    * moved (only with ``previous``, the old global pool [n_prev, D]): the mean L2 distance from each new
      prompt to the nearest old global prompt (how far the round moved the pool).
    """
    used = torch.from_numpy(result.used)
    counts = result.counts[result.used]
    flat = pools.reshape(-1, pools.shape[-1]).float()
    centroids = result.centroids.float().to(flat.device)
    assigned = centroids[torch.from_numpy(result.assignment.reshape(-1)).to(flat.device)]
    popularity = result.popularity.float()[used]
    out = {"centroids_used": float(len(counts)), "pool_size": float(len(new_pool)),
           "shared_clusters": float((counts >= 2).mean()),
           "client_to_centroid": float((flat - assigned).norm(dim=1).mean()),
           "centroid_movement": float((centroids[used] - flat[used]).norm(dim=1).mean()),
           "popularity_spread": float(popularity.std(correction=0))}
    if result.initial_popularity is not None:
        out["popularity_change"] = float((popularity - result.initial_popularity.float()[used]).abs().mean())
    if previous is not None:
        out["moved"] = float(torch.cdist(new_pool.float(), previous.reshape(len(previous), -1).float())
                             .min(1).values.mean())
    return out


def cluster_pool(pools: Sequence[torch.Tensor], generator: torch.Generator, *, selected=None,
                 prompts: str = "selected", keep: str = "used", pool_size: int | None = None,
                 max_pool: int | None = None, previous: torch.Tensor | None = None, outer_loops: int = 5,
                 lr: float = 1e-3, hidden: int = 128, schedule: str = "batched",
                 popularity: State | None = None) -> PoolUpdate:
    """FED-PRIME's inter-pool aggregation for one pool, faithful to the reference by default.

    pools[t]: client t's pool [tau_in, ...] (all alike; trailing dims are flattened for the clustering).
    ``selected``: one bool [tau_in] mask per client of the prompts it selected (retrieved) this round, or None
    (every prompt counts as selected). ``prompts``: 'selected' clusters the rows in the union of the masks,
    taken from every client, as the reference does (its ``union_prompts_checklist``); 'all' clusters every row.
    ``keep``: 'used' returns every used centroid, as the reference and the paper do, so the pool size varies
    from round to round; it is bounded by ``max_pool`` (default ``MAX_POOL_FACTOR * pool_size``), keeping the
    centroids with the most clients (``Clustering.ranked``). 'top' returns ``pool_size`` rows: the most used
    centroids, then, if fewer are used, the rows no client selected, carried over (their mean over clients,
    which is the old global prompt when clients leave unselected prompts untouched). ``pool_size`` defaults to
    tau_in; a method whose pool varies must pass its configured tau. ``previous``: the old global pool, for
    the 'moved' diagnostic only. ``schedule`` and ``popularity`` (the last round's
    ``update.clustering.popularity_state``, or None): see ``cluster_prompts``.

    Every used centroid holds one prompt of at least one client, and a client's m clustered prompts go to m
    distinct centroids, so at least m are used: a pool rebuilt from ``prompts`` can retrieve top-k whenever
    k <= m (each client that trained selected at least k prompts).
    """
    if keep not in KEEP_CHOICES:
        raise ValueError(f"keep must be one of {KEEP_CHOICES}, got {keep!r}")
    if not pools:
        raise ValueError("cluster_pool: no pools")
    first = pools[0]
    if first.dim() < 1 or first.shape[0] < 1:
        raise ValueError(f"cluster_pool: a pool must be [tau, ...], got {tuple(first.shape)}")
    tau_in = first.shape[0]
    pool_size = tau_in if pool_size is None else int(pool_size)
    max_pool = MAX_POOL_FACTOR * pool_size if max_pool is None else int(max_pool)
    if pool_size < 1 or max_pool < pool_size:
        raise ValueError(f"cluster_pool: need 1 <= pool_size <= max_pool, got {pool_size} and {max_pool}")
    flat = [pool.reshape(tau_in, -1) for pool in pools]
    rows = _clustered_rows(tau_in, len(pools), prompts, selected)
    index = torch.from_numpy(rows).to(first.device)
    clustered = torch.stack([pool[index] for pool in flat])
    result = cluster_prompts(list(clustered), generator, outer_loops=outer_loops, lr=lr, hidden=hidden,
                             schedule=schedule, popularity=popularity)
    kept = result.ranked()[:max_pool if keep == "used" else pool_size]
    new = result.centroids[torch.from_numpy(kept).to(result.centroids.device)]
    carried = np.zeros(0, np.int64)
    if keep == "top" and len(kept) < pool_size:
        carried = np.setdiff1d(np.arange(tau_in), rows)[:pool_size - len(kept)]
        rest = torch.stack(flat).double()[:, torch.from_numpy(carried).to(first.device)].mean(0)
        new = torch.cat([new, rest.to(new.dtype)])
    new_pool = new.reshape(len(new), *first.shape[1:]).to(first.dtype)
    diagnostics = pool_diagnostics(clustered, result, new, previous)
    return PoolUpdate(prompts=new_pool, rows=rows, kept=kept, carried=carried, clustering=result,
                      diagnostics=diagnostics)
