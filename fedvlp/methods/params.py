"""Every built-in method's hyper-parameters (`Params`: a frozen dataclass of `spec_field`s, with the ranges
`fedvlp tune` searches), which the config and a run's driver read without importing the methods (torch). Each
method's declaration (`fedvlp.methods.declarations`) names its Params; a plugin's method defines its own beside it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fedvlp.errors import ConfigError
from fedvlp.spec import (
    CLIP_EPOCHS_RANGE,
    CLIP_LR_RANGE,
    VILT_EPOCHS_RANGE,
    VILT_LR_RANGE,
    VILT_PROMPT_LR_RANGE,
    log_range,
    spec_field,
)

PAPER_CONDITIONS = ("spatial layout", "object pose", "background", "lighting", "object scale")  # FedMPT's


# ---------------------------------------------------------------- hyper-parameters

# The ViLT prompt methods' (FedAvg-P, FedProx-P, FED-PRIME) two levers on the prompts' own training, declared alike.
PromptAttention = Literal["tokens", "as_one"]


def prompt_attention_field():
    return spec_field("tokens", "how the prompts in front of a layer are attended: as that many tokens (the "
                                "reference), or as_one: each score on a prompt lowered by log(prompts), so together "
                                "they start weighing as one token")


def prompt_lr_field(what: str):
    return spec_field(None, f"SGD learning rate of {what} (null: lr, as the reference); the pooler and head keep lr",
                      gt=0, tune=VILT_PROMPT_LR_RANGE)


@dataclass(frozen=True)
class DualCoOpParams:
    n_ctx: int = spec_field(16, "context tokens of each prompt (reference 16)", ge=1)
    ctx_init: str = spec_field(
        "a photo of a", "words the positive context starts from when they are n_ctx tokens; "
        "otherwise (and always for the negative context) N(0, 0.02)")
    csc: bool = spec_field(False, "class-specific contexts (one positive and one negative context per class)")
    region_scale: float = spec_field(
        20.0, "S = region_scale * cos(patch, text); the softmax over patches is of S (reference 20)", gt=0,
        tune=log_range(2.0, 20.0))
    output_scale: float | None = spec_field(
        None, "each side's logit = output_scale * sum_m w_m S_m; null: the backbone's logit scale / region_scale "
        "(reference 5 = 100 / 20 for OpenAI CLIP)", gt=0)
    lr: float = spec_field(0.2, "SGD learning rate, momentum 0.9 (reference 0.002 over 50 epochs, on a loss summed "
                                "over classes; here the loss is a mean over known labels)", gt=0,
                           tune=CLIP_LR_RANGE)
    batch_size: int = spec_field(32, "local batch size", ge=1)
    local_epochs: int = spec_field(5, "local epochs per round", ge=1, tune=CLIP_EPOCHS_RANGE)
    gamma_neg: float = spec_field(2.0, "asymmetric loss: focusing of the negatives", ge=0)
    gamma_pos: float = spec_field(1.0, "asymmetric loss: focusing of the positives", ge=0)
    asl_clip: float = spec_field(0.05, "asymmetric loss: probability margin of the negatives", ge=0, lt=1)
    aggregation: Literal["fedavg", "mean"] = spec_field(
        "fedavg", "server rule for both contexts: fedavg (weighted by data size) or mean (FedMPT's unweighted server)")


@dataclass(frozen=True)
class FedAvgPParams:
    prompt_length: int = spec_field(16, "prompt tokens per prompted layer (reference: 16; 0: no prompts, the trainable "
                                        "pooler and head alone, the prompt-free baseline)", ge=0)
    prompt_layers: int | None = spec_field(
        None, "prompted layers, from the first (null: the first half of the backbone's, as the reference's 6 of 12; "
              "capped at the depth)", ge=1)
    prox_mu: float = spec_field(0.0, "FedProx proximal weight mu (0: FedAvg-P)", ge=0)
    prompt_attention: PromptAttention = prompt_attention_field()
    lr: float = spec_field(0.05, "SGD learning rate", gt=0, tune=VILT_LR_RANGE)
    prompt_lr: float | None = prompt_lr_field("the prompts")
    batch_size: int = spec_field(64, "local batch size", ge=1)
    local_epochs: int = spec_field(1, "local epochs per round", ge=1, tune=VILT_EPOCHS_RANGE)


@dataclass(frozen=True)
class FedProxPParams(FedAvgPParams):
    prox_mu: float = spec_field(0.01, "FedProx proximal weight mu", gt=0, tune=log_range(1e-3, 1.0))


@dataclass(frozen=True)
class FedLoraParams:
    rank: int = spec_field(4, "LoRA rank r", ge=1)
    alpha: float = spec_field(8.0, "LoRA alpha: the update B A is scaled by alpha / rank", gt=0)
    dropout: float = spec_field(0.0, "dropout on the adapters' input (0: none; > 0 is seeded per client)",
                                ge=0, lt=1)
    targets: Literal["mlp", "c_fc", "c_proj"] = spec_field(
        "mlp", "adapted linears of every text-encoder block: mlp (c_fc and c_proj), c_fc or c_proj only")
    ffa: bool = spec_field(False, "FFA-LoRA: A frozen at its seeded initialisation and never sent; only B is "
                                  "trained and averaged (exact average)")
    template: str = spec_field("a photo of a {}.", "hand-written prompt; {} is replaced by the class name")
    optimizer: Literal["adamw", "sgd"] = spec_field("adamw", "local optimiser: adamw (no weight decay) or plain sgd")
    lr: float = spec_field(2e-3, "learning rate (AdamW, as PromptFL's Adam)", gt=0, tune=CLIP_LR_RANGE)
    batch_size: int = spec_field(64, "local batch size", ge=1)
    local_epochs: int = spec_field(5, "local epochs per round", ge=1, tune=CLIP_EPOCHS_RANGE)
    init_bias: float = spec_field(-5.0, "starting bias of the multi-label logits")

    def __post_init__(self):
        if "{}" not in self.template:
            raise ConfigError(f"method.template: expected a '{{}}' placeholder for the class name, "
                              f"got {self.template!r}")


@dataclass(frozen=True)
class FedLoraViltParams:
    rank: int = spec_field(4, "LoRA rank r", ge=1)
    alpha: float = spec_field(8.0, "LoRA alpha: the update B A is scaled by alpha / rank", gt=0)
    dropout: float = spec_field(0.0, "dropout on the adapters' input (0: none; > 0 is seeded per client)",
                                ge=0, lt=1)
    targets: Literal["query_value", "query_key_value", "all_linear"] = spec_field(
        "query_value", "adapted linears of every layer: query_value (the LoRA paper's), query_key_value, or "
                       "all_linear (q, k, v, attention output, MLP in and out)")
    ffa: bool = spec_field(False, "FFA-LoRA: A frozen at its seeded initialisation and never sent; only B is "
                                  "trained and averaged (exact average)")
    optimizer: Literal["sgd", "adamw"] = spec_field(
        "sgd", "local optimiser of adapters and heads: sgd (as FedAvg-P and FED-PRIME) or adamw (no weight decay)")
    lr: float = spec_field(0.05, "learning rate (SGD, as FedAvg-P)", gt=0, tune=VILT_LR_RANGE)
    batch_size: int = spec_field(64, "local batch size", ge=1)
    local_epochs: int = spec_field(2, "local epochs per round", ge=1, tune=VILT_EPOCHS_RANGE)


@dataclass(frozen=True)
class FedMPTParams:
    conditions: tuple[str, ...] = spec_field(PAPER_CONDITIONS, "the N conditions filled into [COND]")
    conditions_file: str | None = spec_field(None, "text file with one condition per line (replaces `conditions`)")
    n_cond_ctx: int = spec_field(4, "beta_cond: learned tokens per condition", ge=1)
    n_cls_ctx: int = spec_field(4, "beta_cls: learned class-level tokens shared by all prompts", ge=1)
    cls_ctx_init: str = spec_field("a photo of a", "words the class context starts from ('' = random)")
    adapter_rank: int = spec_field(32, "D_s: rank of each condition's adapter and of the gate", ge=1)
    regions: Literal["patches", "pooled+patches"] = spec_field(
        "patches", "what the condition prompts are aligned to: the M patch tokens (the paper's patch-level features), "
                   "or the pooled token with them")
    # Every temperature below divides a cosine (the paper's S, whose cost is C = 1 - S), so they compare directly.
    tau: float = spec_field(0.04, "temperature of the OT row marginal a_m = softmax_m(max_c cos_mc / tau) (patch "
                                  "importance); the paper's tau = 4 on CLIP ViT-B/16's logits (100 x cos) is 0.04",
                            gt=0)
    ot_epsilon: float = spec_field(0.2, "lambda: entropic regularisation of the Sinkhorn plan on the cost 1 - cos "
                                        "(paper 0.2), so a plan weighs patches as exp(cos / lambda)", gt=0)
    ot_iters: int = spec_field(100, "Sinkhorn iterations at most (it stops early at convergence)", ge=1)
    region_temperature: float | None = spec_field(
        None, "ot off: the softmax temperature over patches, softmax_m(cos_mc / T) (null: ot_epsilon, so that "
              "turning OT on changes the transport, not the sharpness)", gt=0)
    cps: bool = spec_field(True, "ablation: condition prompts")
    adapters: bool = spec_field(True, "ablation: per-condition adapters")
    ot: bool = spec_field(True, "ablation: optimal transport (off: region aggregation)")
    gate: bool = spec_field(True, "ablation: learned gate (off: mean over conditions)")
    gamma_neg: float = spec_field(2.0, "ASL focusing of negatives", ge=0)
    gamma_pos: float = spec_field(1.0, "ASL focusing of positives", ge=0)
    clip: float = spec_field(0.05, "ASL probability shift of negatives", ge=0, lt=1)
    init_bias: float = spec_field(-5.0, "starting bias of the logits")
    lr: float = spec_field(0.02, "SGD learning rate (paper: 1e-3 on a loss summed over classes with weight 0.02; "
                                 "here the loss is a mean over known labels)", gt=0, tune=CLIP_LR_RANGE)
    momentum: float = spec_field(0.9, "SGD momentum", ge=0, lt=1)
    weight_decay: float = spec_field(1e-5, "SGD weight decay", ge=0)
    batch_size: int = spec_field(32, "local batch size", ge=1)
    local_epochs: int = spec_field(1, "local epochs per round (paper: 1)", ge=1, tune=CLIP_EPOCHS_RANGE)

    def __post_init__(self):
        if self.conditions_file is not None:
            path = Path(self.conditions_file).expanduser()
            try:
                lines = [line.strip() for line in path.read_text().splitlines() if line.strip()]
            except OSError:
                raise ConfigError(f"method.conditions_file: cannot read {path}; expected a text file, "
                                  f"one condition per line") from None
            if not lines:
                raise ConfigError(f"method.conditions_file: {path} holds no condition")
            object.__setattr__(self, "conditions", tuple(lines))
        if not self.conditions:
            raise ConfigError("method.conditions: expected at least one condition")


@dataclass(frozen=True)
class FedOTPParams:
    n_ctx: int = spec_field(16, "context tokens of each prompt (reference 16)", ge=1)
    ctx_init: str = spec_field(
        "", "words both prompts start from, n_ctx tokens ('' = N(0, 0.02) each, the reference's start)")
    epsilon: float = spec_field(
        0.01, "entropic regularisation of the OT between patches and prompts (reference 0.01)", gt=0)
    transport: Literal["partial", "balanced"] = spec_field(
        "partial", "partial: the reference's unbalanced COT (prompts take top_percent of the mass, patches may "
                   "ship less than theirs); balanced: Sinkhorn with both marginals fixed")
    top_percent: float = spec_field(0.8, "transport=partial: the mass the prompts receive (reference 0.8)", gt=0, le=1)
    ot_max_iter: int = spec_field(100, "OT iterations at most (reference 100)", ge=1)
    ot_tol: float = spec_field(1e-3, "OT stops once its iterates change less than this (reference 1e-3)", gt=0)
    init_bias: float = spec_field(
        -2.0, "starting bias of the multi-label logits (learned, averaged like the global prompt)")
    lr: float = spec_field(0.2, "SGD learning rate, momentum 0.9 (reference 0.001, on a loss summed over classes; "
                                "here the loss is a mean over known labels)", gt=0, tune=CLIP_LR_RANGE)
    batch_size: int = spec_field(32, "local batch size (reference 32)", ge=1)
    local_epochs: int = spec_field(5, "local epochs per round (reference 1)", ge=1, tune=CLIP_EPOCHS_RANGE)
    gamma_neg: float = spec_field(2.0, "asymmetric loss: focusing of the negatives", ge=0)
    gamma_pos: float = spec_field(1.0, "asymmetric loss: focusing of the positives", ge=0)
    asl_clip: float = spec_field(0.05, "asymmetric loss: probability margin of the negatives", ge=0, lt=1)
    aggregation: Literal["fedavg", "mean"] = spec_field(
        "fedavg", "server rule for the global prompt and the bias: fedavg (weighted by data size, the reference) "
                  "or mean")


@dataclass(frozen=True)
class FedPrimeParams:
    pools: Literal["both", "inter", "intra"] = spec_field(
        "both", "prompt pools: both (FED-PRIME), inter only (Fed-Inter) or intra only (Fed-Intra)")
    pool_size: int = spec_field(20, "prompts per pool (tau)", ge=1)
    top_k: int = spec_field(5, "prompts retrieved from each pool (kappa)", ge=1)
    selection: Literal["sample", "batch"] = spec_field(
        "sample", "top-k per sample (paper), or the reference's batch-wise majority selection")
    retrieval_weight: float = spec_field(0.01, "weight of the retrieval regulariser", ge=0)
    lr: float = spec_field(0.05, "SGD learning rate (reference: 0.05 on Food-101)", gt=0, tune=VILT_LR_RANGE)
    prompt_lr: float | None = prompt_lr_field("both prompt pools (prompts and query projections)")
    prompt_attention: PromptAttention = prompt_attention_field()
    batch_size: int = spec_field(64, "local batch size", ge=1)
    local_epochs: int = spec_field(1, "local epochs per round (reference: 1)", ge=1, tune=VILT_EPOCHS_RANGE)
    outer_loops: int = spec_field(5, "server clustering: alternations of Adam steps and Hungarian matching", ge=1)
    cluster_lr: float = spec_field(1e-3, "server clustering: Adam learning rate", gt=0)
    cluster_prompts: Literal["selected", "all"] = spec_field(
        "selected", "server clustering: only the inter prompts the clients retrieved this round (the reference), "
                    "or the whole pool")
    keep_centroids: Literal["used", "top"] = spec_field(
        "used", "server clustering: every used centroid becomes a prompt (the paper; the pool size varies, at most "
                "max_pool), or the pool_size most used ones (a fixed size)")
    max_pool: int | None = spec_field(None, "keep_centroids=used: the most prompts the inter pool may grow to "
                                            "(null: 4 x pool_size)", ge=1)
    cluster_schedule: Literal["batched", "per_client"] = spec_field(
        "per_client", "server clustering: one Adam step per client and outer loop (the reference's, which the "
                      "paper's figures come from), or one per outer loop on all clients' objective (cheaper at many "
                      "clients)")

    def __post_init__(self):
        if self.top_k > self.pool_size:
            raise ConfigError(f"method.top_k: expected at most method.pool_size={self.pool_size}, got {self.top_k}")
        if self.max_pool is not None and self.max_pool < self.pool_size:
            raise ConfigError(f"method.max_pool: expected at least method.pool_size={self.pool_size}, "
                              f"got {self.max_pool}")


@dataclass(frozen=True)
class FedTPGParams:
    n_ctx: int = spec_field(4, "generated context tokens (reference n_ctx 4)", ge=1)
    heads: int = spec_field(4, "cross-attention heads (reference 4); must divide the token width", ge=1)
    ff_mult: int = spec_field(4, "feed-forward hidden width = ff_mult * token width (reference 4)", ge=1)
    init_bias: float = spec_field(-5.0, "starting bias of the multi-label logits")
    lr: float = spec_field(0.06, "SGD learning rate, momentum 0.9 (reference 0.003, on a loss summed over classes; "
                                 "here the loss is a mean over known labels)", gt=0, tune=CLIP_LR_RANGE)
    batch_size: int = spec_field(32, "local batch size (reference 200)", ge=1)
    local_epochs: int = spec_field(5, "local epochs per round (reference 1)", ge=1, tune=CLIP_EPOCHS_RANGE)
    gamma_neg: float = spec_field(2.0, "asymmetric loss: focusing of the negatives", ge=0)
    gamma_pos: float = spec_field(1.0, "asymmetric loss: focusing of the positives", ge=0)
    asl_clip: float = spec_field(0.05, "asymmetric loss: probability margin of the negatives", ge=0, lt=1)
    aggregation: Literal["fedavg", "mean"] = spec_field(
        "mean", "server rule for the generator and head: mean (unweighted, the reference's server) or fedavg")


@dataclass(frozen=True)
class PromptFLParams:
    n_ctx: int = spec_field(4, "learned context vectors M", ge=1)
    ctx_init: str = spec_field("a photo of a", "words the context starts from ('' = random); must be n_ctx tokens")
    lr: float = spec_field(2e-3, "Adam learning rate", gt=0, tune=CLIP_LR_RANGE)
    batch_size: int = spec_field(64, "local batch size", ge=1)
    local_epochs: int = spec_field(5, "local epochs per round", ge=1, tune=CLIP_EPOCHS_RANGE)
    init_bias: float = spec_field(-5.0, "starting bias of the multi-label logits")


@dataclass(frozen=True)
class ZeroShotParams:
    template: str = spec_field("a photo of a {}.", "prompt template; {} is replaced by the class name")
    bias: float = spec_field(-5.0, "bias of the multi-label logits")

    def __post_init__(self):
        if "{}" not in self.template:
            raise ConfigError(f"method.template: expected a '{{}}' placeholder for the class name, "
                              f"got {self.template!r}")
