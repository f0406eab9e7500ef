"""FedLoRA: LoRA adapters on the frozen backbone, averaged by FedAvg; the PEFT baseline of the prompt methods.

Flower's FlowerTune, FederatedScope's FS-LLM and NVFlare's NeMo examples fine-tune through LoRA (Hu et al.,
ICLR 2022): a frozen weight W gets a trainable low-rank update, W x + (alpha / r) B A x, with A [r, in]
random and B [out, r] zero at the start, so the adapted model starts as the frozen one. Two methods,
both built with peft's own machinery (`LoraConfig`, `inject_adapter_in_model`,
`get_peft_model_state_dict` / `set_peft_model_state_dict`; nothing here computes a LoRA product):

* `fedlora` (CLIP, cached pooled image features): LoRA on the MLP of every block of the text encoder
  (`mlp.c_fc` and `mlp.c_proj`, `method.targets`). The classes are scored through hand-written prompts
  ("a photo of a {class}.", `method.template`) encoded at every step by the adapted text encoder;
  logit_c = s * cos(image, text_c) + b with a learned scale s and bias b, as PromptFL; masked binary
  cross-entropy (multi-label) or cross-entropy (single-label). The frozen image features stay cached.
* `fedlora_vilt` (ViLT, the FED-PRIME family's missing-modality inputs): LoRA on the query and value
  projections of every transformer layer (`method.targets`), plus FedAvg-P's trainable pooler and
  classifier head; cross-entropy (masked binary cross-entropy on multi-label data). Evaluated, like
  every ViLT method, on the test split under the training setting and the six fixed missing-modality sets.

What crosses the wire is exactly the trainable state, all FedAvg'd (weighted by client data size): the
LoRA tensors, as `get_peft_model_state_dict` names them (`text.resblocks.0.mlp.c_fc.lora_A.weight`, ...;
`encoder.layer.0.attention.attention.query.lora_B.weight`, ...), and the heads (`log_scale` and `bias`;
`pooler.*` and `classifier.*`). The frozen weights the adapters sit on are not state: `state_dict()` and
`load_state_dict()` go through peft and leave them out, so the platform's `global_state`, `load` and the
engine's server rules see only the communicated tensors.

FFA-LoRA (`method.ffa: true`; Sun et al., "Improving LoRA in privacy-preserving federated learning",
ICLR 2024): A stays frozen at its seeded initialisation and only B is trained and sent. A is drawn from
the run's "init" seed stream, so it is the same on every client, worker and resumed run and never needs
to travel; the average of the clients' B A is then exactly (average B) A, where plain FedAvg of A and B
averages the factors, not their product.

The frozen backbone is the worker's, shared by every client it serves. A method adapts its own copy of
the backbone's module tree that shares every weight tensor with it (no extra memory) and runs the
backbone's own code (`encode_token_embeddings`, `encode`) on that copy, so at the start (B = 0) its
outputs are bitwise those of the frozen model, and the shared backbone's modules are never touched.
A's initialisation (peft draws it from torch's global RNG) is seeded from the method's generator in a
forked RNG; LoRA dropout, when `method.dropout` > 0, is seeded from the client's generator the same way,
so a run is reproducible bit for bit (the default dropout is 0). The frozen layers always run in eval
mode, exactly as the frozen backbone does; only the adapters' dropout follows train/eval.

Optimiser (`method.optimizer`, built afresh every round): on CLIP AdamW without weight decay (= Adam) at
lr 2e-3, as PromptFL's Adam, and the optimiser of the LoRA paper and of the federated LoRA frameworks
above. On ViLT plain SGD at lr 0.05 with FedAvg-P's lr range, as the FED-PRIME family it is compared with,
so that comparison holds the optimiser fixed and differs only in what is trained. AdamW (`optimizer:
adamw`, lr ~2e-3) is LoRA as usually run, and learns faster in the tiny-ViLT world (fedlora_vilt_recipes,
10 rounds: test accuracy 0.60 with SGD, 0.71 with AdamW; FedAvg-P 0.52 with SGD); much of that is the
heads, which AdamW trains faster too. Under SGD A hardly moves (its gradient is scaled by B, which starts
at 0), so plain LoRA and FFA-LoRA end within 0.002 of each other there.

What peft cannot wrap here: the attention of open_clip's text encoder. It is a torch
`nn.MultiheadAttention`, whose query/key/value projection is a bare parameter (`in_proj_weight`, no
`nn.Linear` to wrap) and whose output projection `out_proj` is an `nn.Linear` that the attention never
calls (it passes `out_proj.weight` to `F.multi_head_attention_forward`): an adapter on `out_proj` alone is
silently ignored. peft's answer is its `lora.MultiheadAttention` layer, which adapts the whole attention
by adding B A to `in_proj_weight` and `out_proj.weight` before every forward and subtracting it after;
(W + dW) - dW is not W in floating point, so the frozen weights drift as B changes (on the tiny CLIP,
500 steps moved over half of `in_proj_weight`, by up to 5e-7, and the outputs then differ from a fresh
copy holding the same adapters): results would depend on how many forwards the worker had run, i.e. on
which worker served which client, and a resumed run would not be bitwise. (An adapter on `out_proj`
alone is checked the same way: with B random the output does not change at all.) So `fedlora` adapts
the text encoder's MLP linears only. ViLT's query/key/value and output projections are plain
`nn.Linear`s called as modules, which peft wraps directly.
"""
from __future__ import annotations

import contextlib
import copy
import math
from typing import Any, ClassVar, TypeVar

import torch
import torch.nn.functional as F

from fedvlp.errors import ConfigError
from fedvlp.methods import declarations
from fedvlp.methods.base import ClientData, Method, TokenInputs
from fedvlp.methods.fedprime import token_inputs, trainable_pooler, vilt_classifier
from fedvlp.methods.params import FedLoraParams, FedLoraViltParams
from fedvlp.methods.registry import register

ADAPTER = "default"  # peft's adapter name; get_peft_model_state_dict strips it from the keys
# module-name suffixes peft matches (a key matches a target t if it is t or ends with "." + t)
CLIP_TARGETS = {"mlp": ("c_fc", "c_proj"), "c_fc": ("c_fc",), "c_proj": ("c_proj",)}
VILT_TARGETS = {"query_value": ("query", "value"), "query_key_value": ("query", "key", "value"),
                # q, k, v, the attention output (attention.output.dense), the MLP (intermediate.dense, output.dense)
                "all_linear": ("query", "key", "value", "output.dense", "intermediate.dense")}


M = TypeVar("M", bound=torch.nn.Module)


def shared_copy(backbone: M) -> M:
    """A copy of the backbone's module tree whose parameters and buffers are the backbone's own tensors.

    Adapters injected into it replace modules of the copy only; the backbone's modules, and so every
    other user of the backbone, never see them. Nothing of the weights is duplicated."""
    memo = {id(t): t for t in (*backbone.parameters(), *backbone.buffers())}
    tokenizer = getattr(backbone, "tokenizer", None)
    if tokenizer is not None:
        memo[id(tokenizer)] = tokenizer
    clone = copy.deepcopy(backbone, memo)
    if not all(a is b for a, b in zip(clone.parameters(), backbone.parameters(), strict=True)):
        raise RuntimeError("shared_copy: the copy does not share the backbone's weights")
    return clone


@contextlib.contextmanager
def seeded_rng(seed: int, device: torch.device):
    """torch's global RNG of the CPU (and of `device`, if a GPU) seeded with `seed`, restored afterwards."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.default_generator.manual_seed(seed)
        if devices:
            with torch.cuda.device(device):
                torch.cuda.manual_seed(seed)
        yield


def lora_layer() -> Any:
    """peft's LoRA layer class. peft is imported where LoRA runs, never at import: it loads transformers'
    modelling stack (0.9 CPU s), which the driver and every other method's workers would pay at start-up."""
    from peft.tuners.lora import LoraLayer

    return LoraLayer


def inject_lora(module: torch.nn.Module, targets: tuple[str, ...], params, generator: torch.Generator | None
                ) -> torch.nn.Module:
    """peft LoRA adapters (A: peft's default Kaiming-uniform init, B: zero) on `targets` of `module`, in place.

    peft draws A from torch's global RNG: it is seeded here from `generator`, in a forked RNG (peft creates
    the adapters on the CPU and then moves them, so A does not depend on the device either). With
    `params.ffa` A is frozen."""
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=params.rank, lora_alpha=params.alpha, lora_dropout=params.dropout,
                        target_modules=list(targets), bias="none", init_lora_weights=True)
    seed = int(torch.randint(2**62, (1,), generator=generator))
    with seeded_rng(seed, next(module.parameters()).device):
        inject_adapter_in_model(config, module, adapter_name=ADAPTER)
    layers = [m for m in module.modules() if isinstance(m, lora_layer())]
    if not layers:
        raise ConfigError(f"method.targets: no module of the backbone matches {', '.join(targets)}")
    if params.ffa:
        for layer in layers:
            layer.lora_A.requires_grad_(False)
    return module


class LoraMethod(Method):
    """What both LoRA methods share: the adapted module `adapter_module` (an attribute, registered, so its
    adapters move, train and count as parameters with the method), a state that is exactly the communicated
    tensors, the frozen layers held in eval mode, and the local update."""
    adapter_module: ClassVar[str]
    adapted: Any  # the backbone's copy that carries the adapters (set with object.__setattr__: not a submodule)

    def _adapted(self) -> torch.nn.Module:
        return getattr(self, self.adapter_module)

    def state_dict(self, *, destination=None, prefix: str = "", keep_vars: bool = False):
        """The heads' tensors and the LoRA tensors (through `get_peft_model_state_dict`; only B with FFA):
        the frozen weights of the adapted module are not part of the method's state."""
        from peft import get_peft_model_state_dict

        state = super().state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)
        own = f"{prefix}{self.adapter_module}."
        module_state = {key[len(own):]: state.pop(key) for key in [k for k in state if k.startswith(own)]}
        lora = get_peft_model_state_dict(self._adapted(), state_dict=module_state, adapter_name=ADAPTER,
                                         save_embedding_layers=False)
        for key, value in lora.items():
            if not (self.params.ffa and ".lora_A." in key):
                state[own + key] = value
        return state

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """The inverse of `state_dict`: the LoRA tensors through `set_peft_model_state_dict`, the heads as usual."""
        from peft import set_peft_model_state_dict

        own = f"{self.adapter_module}."
        expected = set(self.state_dict())
        missing, unexpected = sorted(expected - set(state_dict)), sorted(set(state_dict) - expected)
        if strict and (missing or unexpected):
            raise RuntimeError(f"{type(self).__name__}.load_state_dict: missing keys {missing}, unexpected keys "
                               f"{unexpected}")
        lora = {k[len(own):]: v for k, v in state_dict.items() if k.startswith(own) and k in expected}
        heads = {k: v for k, v in state_dict.items() if not k.startswith(own) and k in expected}
        loaded = set_peft_model_state_dict(self._adapted(), lora, adapter_name=ADAPTER)
        refused = loaded.unexpected_keys  # type: ignore[attr-defined]
        if refused:
            raise RuntimeError(f"set_peft_model_state_dict did not take {sorted(refused)}")
        super().load_state_dict(heads, strict=False, assign=assign)
        return torch.nn.modules.module._IncompatibleKeys(missing, unexpected)

    def train(self, mode: bool = True):
        """The frozen layers stay in eval mode (they compute what the frozen backbone computes); the heads and
        the adapters' dropout follow `mode`."""
        super().train(mode)
        adapted = self._adapted()
        adapted.eval()
        for module in adapted.modules():
            if isinstance(module, lora_layer()):
                module.lora_dropout.train(mode)
        return self

    def local_update(self, data: ClientData, generator: torch.Generator) -> dict[str, float]:
        trainable = self.trainable_parameters()
        optimizer: torch.optim.Optimizer
        if self.params.optimizer == "adamw":
            optimizer = torch.optim.AdamW(trainable, lr=self.params.lr, weight_decay=0.0)
        else:
            optimizer = torch.optim.SGD(trainable, lr=self.params.lr)
        with self._seeded_dropout(generator):
            return self.train_epochs(data, generator, optimizer)

    @contextlib.contextmanager
    def _seeded_dropout(self, generator: torch.Generator):
        """LoRA dropout draws from torch's global RNG: seed it from the client's generator (forked RNG)."""
        if self.params.dropout == 0:
            yield
            return
        seed = int(torch.randint(2**62, (1,), generator=generator))
        with seeded_rng(seed, next(self.parameters()).device):
            yield


@register
class FedLora(declarations.FedLora, LoraMethod):
    """LoRA on the CLIP text encoder's MLP linears, hand-written prompts, PromptFL's multi-label head."""
    adapter_module = "text"

    def __init__(self, params: FedLoraParams, backbone, task, generator=None):
        super().__init__(params, backbone, task)
        adapted = shared_copy(backbone)
        object.__setattr__(self, "adapted", adapted)  # out of the module tree, like the backbone
        self.text = inject_lora(adapted.model.transformer, CLIP_TARGETS[params.targets], params, generator)
        tokens = backbone.tokenize([params.template.format(name) for name in task.class_names])
        eot = tokens.argmax(-1)
        with torch.no_grad():  # cut to the longest prompt, as PromptTemplate does
            embeddings = backbone.embed_tokens(tokens[:, : int(eot.max()) + 1])
        self.register_buffer("prompt_embeddings", embeddings.clone(), persistent=False)
        self.register_buffer("eot", eot, persistent=False)
        self.log_scale = torch.nn.Parameter(torch.tensor(math.log(backbone.logit_scale)))
        self.bias = torch.nn.Parameter(torch.tensor(params.init_bias))

    def text_features(self) -> torch.Tensor:
        """L2-normalised features [C, D] of the class prompts through the adapted text encoder."""
        return F.normalize(self.adapted.encode_token_embeddings(self.prompt_embeddings, self.eot), dim=-1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.log_scale.exp() * features @ self.text_features().T + self.bias


@register
class FedLoraVilt(declarations.FedLoraVilt, LoraMethod):
    """LoRA on ViLT's query and value projections, FedAvg-P's trainable pooler and classifier head."""
    adapter_module = "encoder"
    make_inputs = staticmethod(token_inputs)

    def __init__(self, params: FedLoraViltParams, backbone, task, generator=None):
        super().__init__(params, backbone, task)
        adapted = shared_copy(backbone)
        object.__setattr__(self, "adapted", adapted)  # out of the module tree, like the backbone
        self.encoder = inject_lora(adapted.model.encoder, VILT_TARGETS[params.targets], params, generator)
        self.pooler = trainable_pooler(backbone)
        self.classifier = vilt_classifier(backbone.hidden_size, len(task.class_names), generator)

    def hidden_states(self, inputs: TokenInputs) -> torch.Tensor:
        """The adapted transformer's last hidden states [B, L, D] (the backbone's `encode`, on the adapted copy)."""
        return self.adapted.encode(inputs.embeddings, inputs.mask)

    def forward(self, inputs: TokenInputs) -> torch.Tensor:
        return self.classifier(self.pooler(self.hidden_states(inputs)))
