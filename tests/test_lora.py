"""The LoRA baselines (fedvlp/methods/fedlora.py): peft adapters on the frozen CLIP text encoder and on ViLT.

Only the adapters and heads learn; at B = 0 the outputs are the frozen model's, bitwise; the state on the wire is
exactly the LoRA tensors (only B with FFA-LoRA) and the heads; in a federated run through Ray the clients' training
loss falls round after round, and the run resumes bitwise."""
from __future__ import annotations

import dataclasses
import importlib
import shutil

import pytest
import torch
import torch.nn.functional as F
from conftest import small_run
from peft import get_peft_model_state_dict
from peft.tuners.lora import LoraLayer

import fedvlp.methods
from fedvlp.config import load_spec
from fedvlp.methods.base import ClientData, Task
from fedvlp.platform.aggregation import state_nbytes

# Until fedvlp.methods imports fedlora itself, the Ray workers get it as a plugin, as users would.
BUILT_IN = "fedlora" in fedvlp.methods.METHODS
fedlora = importlib.import_module("fedvlp.methods.fedlora")  # registers fedlora and fedlora_vilt
PLUGIN = () if BUILT_IN else ("plugins=[fedvlp.methods.fedlora]",)
CLIP_HEADS = {"log_scale", "bias"}
VILT_HEADS = {"pooler.dense.weight", "pooler.dense.bias",
              *(f"classifier.{i}.{w}" for i in (0, 1, 3) for w in ("weight", "bias"))}


@pytest.fixture(scope="module")
def clip_world(tiny_clip):
    from fedvlp.backbones.loaders import load_clip
    from fedvlp.data.scenes import generate_scenes

    backbone = load_clip(load_spec(None))
    train = generate_scenes(128, "train", 0)
    labels = torch.as_tensor(train.labels, dtype=torch.float32)
    return {"backbone": backbone, "task": Task(train.class_names),
            "data": ClientData(backbone.encode_images(train.images), labels)}


@pytest.fixture(scope="module")
def vilt_world(tiny_vilt):
    from fedvlp.backbones.loaders import load_backbone
    from fedvlp.data.missing import apply_missing, missing_table
    from fedvlp.data.recipes import generate_recipes

    backbone = load_backbone(load_spec("fedprime_recipes"))
    train = generate_recipes(96, "train", 0)
    table = missing_table(96, 0.7, "both", 0)
    texts, image_missing = apply_missing(train.texts, table)
    embeddings, mask = backbone.embed(train.images, texts, image_missing)
    inputs = fedlora.FedLoraVilt.make_inputs(embeddings * mask.unsqueeze(-1), torch.as_tensor(table, dtype=torch.long))
    return {"backbone": backbone, "task": Task(train.class_names, multilabel=False),
            "data": ClientData(inputs, torch.as_tensor(train.labels))}


@pytest.fixture(params=["fedlora", "fedlora_vilt"])
def world(request):
    return request.getfixturevalue("clip_world" if request.param == "fedlora" else "vilt_world") | {
        "name": request.param}


def build(world, seed: int = 0, **overrides):
    cls = fedvlp.methods.METHODS[world["name"]]
    return cls(dataclasses.replace(cls.Params(), **overrides), world["backbone"], world["task"],
               torch.Generator().manual_seed(seed))


def lora_keys(method, with_a: bool = True) -> set[str]:
    """The LoRA tensors as peft names them, under the adapted module's attribute."""
    prefix = f"{method.adapter_module}."
    keys = {prefix + k for k in get_peft_model_state_dict(method._adapted())}
    return keys if with_a else {k for k in keys if ".lora_A." not in k}


def with_random_b(method, seed: int = 1):
    """The method's state with every B drawn at random (B = 0 at the start hides A's gradient and the adapters)."""
    g = torch.Generator().manual_seed(seed)
    state = method.global_state()
    for key in state:
        if ".lora_B." in key:
            state[key] = torch.randn(state[key].shape, generator=g) * 0.1
    method.load(state, None)
    return state


def frozen_outputs(world, method, batch):
    """What the frozen model gives for the method's inputs: the un-adapted path through the shared backbone."""
    backbone = world["backbone"]
    if world["name"] == "fedlora":
        text = F.normalize(backbone.encode_token_embeddings(method.prompt_embeddings, method.eot), dim=-1)
        return text, method.log_scale.exp() * batch @ text.T + method.bias
    hidden = backbone.encode(batch.embeddings, batch.mask)
    return hidden, method.classifier(method.pooler(hidden))


def adapted_outputs(world, method, batch):
    inner = method.text_features() if world["name"] == "fedlora" else method.hidden_states(batch)
    return inner, method(batch)


def test_peft_wraps_exactly_the_targets_and_never_the_shared_backbone(clip_world, vilt_world):
    vilt_targets = {"attention.attention.query", "attention.attention.value"}
    for world, name, expected in [(clip_world, "fedlora", {"mlp.c_fc", "mlp.c_proj"}),
                                  (vilt_world, "fedlora_vilt", vilt_targets)]:
        method = build(world | {"name": name})
        wrapped = [n for n, m in method._adapted().named_modules() if isinstance(m, LoraLayer)]
        backbone = world["backbone"]
        layers = len(backbone.model.transformer.resblocks) if name == "fedlora" else backbone.num_layers
        assert len(wrapped) == 2 * layers and {n.split(".", 2)[2] for n in wrapped} == expected
        assert not any(isinstance(m, LoraLayer) for m in world["backbone"].modules())  # the backbone is untouched
        # the adapted copy shares the backbone's frozen tensors instead of duplicating them
        frozen = {id(p) for p in world["backbone"].parameters()}
        assert all(id(p) in frozen for n, p in method._adapted().named_parameters() if "lora_" not in n)
    wide = build(vilt_world | {"name": "fedlora_vilt"}, targets="all_linear")
    assert sum(isinstance(m, LoraLayer) for m in wide._adapted().modules()) == 6 * vilt_world["backbone"].num_layers


@pytest.mark.parametrize("ffa", [False, True], ids=["lora", "ffa"])
def test_only_the_adapters_and_heads_get_gradients(world, ffa):
    method = build(world, ffa=ffa)
    heads = CLIP_HEADS if world["name"] == "fedlora" else VILT_HEADS
    trainable = {n for n, p in method.named_parameters() if p.requires_grad}
    lora = {n for n, _ in method.named_parameters() if ".lora_" in n}
    assert trainable == heads | {n for n in lora if ffa is False or ".lora_B." in n}
    with_random_b(method)
    batch, labels = world["data"].features[:32], world["data"].labels[:32]
    method.train()
    method.loss(method(batch), labels).backward()
    for name, p in method.named_parameters():
        if name in trainable:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert p.grad is None, name  # FFA's A
    assert all(p.grad is None for p in world["backbone"].parameters())
    assert all(not p.requires_grad for p in world["backbone"].parameters())


def test_at_the_start_the_outputs_are_the_frozen_models_bitwise(world):
    method = build(world)
    batch = world["data"].features[:32]
    assert all(not v.any() for k, v in method.global_state().items() if ".lora_B." in k)  # B = 0
    with torch.no_grad():
        method.eval()
        inner, logits = adapted_outputs(world, method, batch)
        frozen_inner, frozen_logits = frozen_outputs(world, method, batch)
        assert torch.equal(inner, frozen_inner) and torch.equal(logits, frozen_logits)
        method.train()  # the frozen layers stay in eval mode: training starts from the same function
        assert torch.equal(adapted_outputs(world, method, batch)[1], frozen_logits)
        with_random_b(method)
        method.eval()
        assert not torch.equal(adapted_outputs(world, method, batch)[0], frozen_inner)  # the adapters do act


@pytest.mark.parametrize("ffa", [False, True], ids=["lora", "ffa"])
def test_the_state_on_the_wire_is_exactly_the_lora_tensors_and_heads(world, ffa):
    method = build(world, ffa=ffa)
    heads = CLIP_HEADS if world["name"] == "fedlora" else VILT_HEADS
    state = method.global_state()
    assert set(state) == heads | lora_keys(method, with_a=not ffa) and not method.local_state()
    assert set(method.state_dict()) == set(state)  # what the engine derives the server rules from
    assert all(method.rule_of(k) == "fedavg" for k in state)
    rank = method.params.rank
    base = [m.get_base_layer() for m in method._adapted().modules() if isinstance(m, LoraLayer)]
    expected = sum(rank * (0 if ffa else b.in_features) + rank * b.out_features for b in base)  # A [r, in], B [out, r]
    assert sum(state[k].numel() for k in state if ".lora_" in k) == expected
    trainable = sum(p.numel() for p in method.parameters() if p.requires_grad)
    assert state_nbytes(state) == 4 * trainable  # float32: every trainable number, and nothing else, is sent

    # load is the inverse, through set_peft_model_state_dict; A under FFA comes from the seed, not the wire
    sent = with_random_b(method)
    other = build(world, ffa=ffa)
    other.load(sent, None)
    assert all(torch.equal(other.global_state()[k], v) for k, v in sent.items())
    for name, p in method.named_parameters():
        if ".lora_A." in name:
            assert torch.equal(p, dict(other.named_parameters())[name])  # same seed, same A
    reseeded = dict(build(world, seed=1, ffa=ffa).named_parameters())
    assert not any(torch.equal(p, reseeded[n]) for n, p in method.named_parameters() if ".lora_A." in n)
    if ffa:
        a_key = next(iter(lora_keys(method) - lora_keys(method, with_a=False)))
        with pytest.raises(RuntimeError, match="unexpected keys"):
            other.load({**sent, a_key: torch.zeros(1)}, None)


@pytest.mark.parametrize("dropout", [0.0, 0.1], ids=["no-dropout", "dropout"])
def test_local_training_is_reproducible_and_leaves_the_backbone_alone(clip_world, dropout):
    world = clip_world | {"name": "fedlora"}
    frozen = {k: v.clone() for k, v in world["backbone"].state_dict().items()}
    runs = []
    for _ in range(2):
        method = build(world, dropout=dropout, local_epochs=2)
        stats = method.local_update(world["data"], torch.Generator().manual_seed(7))
        runs.append(method.global_state())
    assert stats["steps"] == 2 * -(-len(world["data"]) // method.params.batch_size)
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])
    assert any(v.any() for k, v in runs[0].items() if ".lora_B." in k)  # it trained
    assert all(torch.equal(frozen[k], v) for k, v in world["backbone"].state_dict().items())


@pytest.mark.usefixtures("tiny_clip")
@pytest.mark.parametrize("ffa", [False, True], ids=["lora", "ffa"])
def test_training_loss_falls_round_after_round_and_a_run_resumes_bitwise(ray_cluster, tracking_uri, tmp_path, ffa):
    """With FFA, A is in no checkpoint: the resumed run's workers draw it again from the seed."""
    from fedvlp.platform.records.checkpoint import read_checkpoint
    from fedvlp.platform.runtime.engine import run_federated

    spec = small_run(tracking_uri, tmp_path, *PLUGIN, "data.num_train=400", "federation.rounds=3",
                     "resources.workers=1", "method.local_epochs=3", f"method.ffa={str(ffa).lower()}",
                     config="fedlora_scenes")
    saved = tmp_path / "round2.pt"

    def keep_round_2(round_index, metrics, checkpoint):
        if round_index == 2:
            shutil.copy(checkpoint, saved)

    whole = run_federated(spec, progress=False, on_round=keep_round_2)
    losses = [h["train_loss"] for h in whole.history]
    print(f"fedlora ffa={ffa}: train loss by round {losses}, val mAP {whole.initial['val_mAP']:.4f} -> "
          f"{whole.final['val_mAP']:.4f}")
    assert any(".lora_A." in k for k in whole.final_state) is not ffa
    # Each round starts from the aggregate of the last, so the clients' loss falls round after round. (LoRA starts
    # at zero-shot CLIP, which on synthetic-scenes 3 short rounds do not beat: val mAP 0.656 -> 0.652.)
    assert losses[2] < losses[1] < losses[0]
    first = whole.history[0]
    assert first["clients"] >= 2 and first["bytes_up"] == first["clients"] * state_nbytes(whole.final_state)
    resumed = run_federated(spec, progress=False, resume=read_checkpoint(saved))
    assert [h["round"] for h in resumed.history] == [3]
    assert set(resumed.final_state) == set(whole.final_state)
    assert all(torch.equal(resumed.final_state[k], v) for k, v in whole.final_state.items())
    assert resumed.final == whole.final


@pytest.mark.usefixtures("tiny_vilt")
def test_ffa_on_vilt_through_ray_sends_only_b_and_is_scored_on_the_six_eval_sets(ray_cluster, tracking_uri,
                                                                                  tmp_path):
    from fedvlp.platform.runtime.engine import run_federated

    spec = small_run(tracking_uri, tmp_path, *PLUGIN, "data.num_train=240", "data.num_val=128", "data.num_test=128",
                     "data.num_holdout=64", "federation.clients=2", "federation.rounds=1", "resources.workers=1",
                     "method.ffa=true", "method.local_epochs=1", config="fedlora_vilt_recipes")
    result = run_federated(spec, progress=False)
    assert not any(".lora_A." in k for k in result.final_state)
    assert sum(".lora_B." in k for k in result.final_state) == 2 * 4  # query and value of the 4 tiny layers
    assert result.history[0]["bytes_up"] == 2 * state_nbytes(result.final_state)
    for name in ("test", "test_full", "test_miss_image", "test_miss_text", "test_miss_both", "test_image_only",
                 "test_text_only"):
        assert f"{name}_accuracy" in result.final, name
