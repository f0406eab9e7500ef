"""What the config and a run's driver need of each built-in method, without importing its module (torch):
its name, hyper-parameters (`Params`, in `fedvlp.methods.params`), backbone, frozen inputs and server rules.

Each built-in's class (`fedvlp/methods/<module>.py`) subclasses its declaration here, so these are said once; a
plugin's method declares the same attributes on its `Method` subclass (docs/extending.md). A run's driver reads
them through `fedvlp.methods.registry.declaration` and never imports torch (2-3 CPU seconds of its start-up).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from fedvlp.methods.params import (
    DualCoOpParams,
    FedAvgPParams,
    FedLoraParams,
    FedLoraViltParams,
    FedMPTParams,
    FedOTPParams,
    FedPrimeParams,
    FedProxPParams,
    FedTPGParams,
    PromptFLParams,
    ZeroShotParams,
)
from fedvlp.platform.aggregation import LOCAL


@dataclass(frozen=True)
class Task:
    class_names: tuple[str, ...]
    multilabel: bool = True


class MethodDeclaration:
    """The attributes every method declares (`fedvlp.methods.base.Method` has them with these defaults)."""
    name: ClassVar[str]
    Params: ClassVar[type]
    backbone_kind: ClassVar[str] = "clip"
    # frozen inputs the method reads: CLIP image features "global" [B, D] or "tokens" [B, 1 + M, D]
    # (pooled, then patches); ViLT "embeddings" (TokenInputs: the embedding layers' outputs)
    feature_kind: ClassVar[str] = "global"
    # parameter-name prefix -> server rule (a name in fedvlp.platform.aggregation.RULES, or LOCAL);
    # the longest prefix wins; `server.rules` in the config overrides entries per prefix
    server_rules: dict[str, str] = {"": "fedavg"}
    # the evaluation set `fedvlp tune` selects on by default: "val", the global model on the val split, or
    # "personal_val", each client's own model on its local val set (a method whose reference evaluates only the
    # clients' own models, and whose global part is trained beside a local one, not to stand alone)
    selection_set: ClassVar[Literal["val", "personal_val"]] = "val"


# ---------------------------------------------------------------- the built-ins

class DualCoOp(MethodDeclaration):
    """Declares fedvlp.methods.dualcoop.DualCoOp."""
    name = "dualcoop"
    Params = DualCoOpParams
    feature_kind = "tokens"
    server_rules = {"": "fedavg"}


class FedAvgP(MethodDeclaration):
    """Declares fedvlp.methods.fedavg_p.FedAvgP."""
    name = "fedavg_p"
    Params = FedAvgPParams
    backbone_kind = "vilt"
    feature_kind = "embeddings"


class FedProxP(FedAvgP):
    """Declares fedvlp.methods.fedavg_p.FedProxP."""
    name = "fedprox_p"
    Params = FedProxPParams


class FedLora(MethodDeclaration):
    """Declares fedvlp.methods.fedlora.FedLora."""
    name = "fedlora"
    Params = FedLoraParams


class FedLoraVilt(MethodDeclaration):
    """Declares fedvlp.methods.fedlora.FedLoraVilt."""
    name = "fedlora_vilt"
    Params = FedLoraViltParams
    backbone_kind = "vilt"
    feature_kind = "embeddings"


class FedMPT(MethodDeclaration):
    """Declares fedvlp.methods.fedmpt.FedMPT."""
    name = "fedmpt"
    Params = FedMPTParams
    feature_kind = "tokens"


class FedOTP(MethodDeclaration):
    """Declares fedvlp.methods.fedotp.FedOTP."""
    name = "fedotp"
    Params = FedOTPParams
    feature_kind = "tokens"
    server_rules = {"": "fedavg", "local_ctx": LOCAL}
    selection_set = "personal_val"  # tuned on its clients' [global; local] prompts, the model its reference scores


class FedPrime(MethodDeclaration):
    """Declares fedvlp.methods.fedprime.FedPrime."""
    name = "fedprime"
    Params = FedPrimeParams
    backbone_kind = "vilt"
    feature_kind = "embeddings"
    server_rules = {"": "fedavg", "inter_pool.prompts": "hungarian", "inter_pool.selected": "hungarian",
                    "intra_pool.query": LOCAL, "inter_pool.query": LOCAL}


class FedTPG(MethodDeclaration):
    """Declares fedvlp.methods.fedtpg.FedTPG."""
    name = "fedtpg"
    Params = FedTPGParams
    server_rules = {"": "mean"}


class PromptFL(MethodDeclaration):
    """Declares fedvlp.methods.promptfl.PromptFL."""
    name = "promptfl"
    Params = PromptFLParams


class ZeroShot(MethodDeclaration):
    """Declares fedvlp.methods.zeroshot.ZeroShot."""
    name = "zeroshot"
    Params = ZeroShotParams


BUILT_IN: dict[str, type[MethodDeclaration]] = {cls.name: cls for cls in (
    DualCoOp, FedAvgP, FedProxP, FedLora, FedLoraVilt, FedMPT, FedOTP, FedPrime, FedTPG, PromptFL, ZeroShot)}
