"""The multi-label prompt-learning baselines: Fed-DualCoOp, FedOTP, FedTPG (one module each)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from fedvlp.config import load_spec
from fedvlp.methods import dualcoop, fedotp, fedtpg  # noqa: F401  (registers them)
from fedvlp.methods.base import LOCAL, ClientData, Task
from fedvlp.methods.registry import METHODS
from fedvlp.platform.aggregation import weighted_average
from fedvlp.platform.metrics import mean_average_precision

NUM_TRAIN, NUM_TEST = 600, 500
VARIANTS = [("dualcoop", {}), ("dualcoop", {"csc": True}), ("fedotp", {}), ("fedtpg", {})]
IDS = ["dualcoop", "dualcoop-csc", "fedotp", "fedtpg"]


@pytest.fixture(scope="module")
def world(tiny_clip):
    from fedvlp.backbones.loaders import load_clip
    from fedvlp.data.scenes import generate_scenes

    backbone = load_clip(load_spec(None))
    train, test = generate_scenes(NUM_TRAIN, "train", 0), generate_scenes(NUM_TEST, "test", 0)
    features = {kind: (backbone.encode_images(train.images, kind), backbone.encode_images(test.images, kind))
                for kind in ("global", "tokens")}
    return {"backbone": backbone, "task": Task(train.class_names), "features": features,
            "train_labels": torch.as_tensor(train.labels, dtype=torch.float32),
            "test_labels": test.labels}


def build(world, name: str, seed: int = 0, **overrides):
    """The method with its shipped config's settings (tuned on this world), then `overrides`."""
    cls = METHODS[name]
    config = "quickstart" if name == "promptfl" else f"{name}_scenes"
    params = dataclasses.replace(load_spec(config).method.params, **overrides)
    return cls(params, world["backbone"], world["task"], torch.Generator().manual_seed(seed))


def client(world, method, rows=slice(None)) -> ClientData:
    features = world["features"][method.feature_kind][0]
    return ClientData(features[rows], world["train_labels"][rows])


def map_on_test(world, method) -> float:
    scores = method.score(world["features"][method.feature_kind][1]).numpy()
    return mean_average_precision(scores, world["test_labels"])


@pytest.mark.parametrize("name,overrides", VARIANTS, ids=IDS)
def test_local_training_raises_test_map(world, name, overrides):
    method = build(world, name, **overrides)
    before = map_on_test(world, method)
    stats = method.local_update(client(world, method), torch.Generator().manual_seed(1))
    after = map_on_test(world, method)
    print(f"{name} {overrides}: test mAP {before:.3f} -> {after:.3f}")
    assert stats["steps"] == method.params.local_epochs * -(-NUM_TRAIN // method.params.batch_size)
    assert torch.isfinite(torch.tensor(stats["loss"]))
    assert after > before + 0.01


def test_dualcoop_logit_is_pos_minus_neg_under_the_positive_regions(world):
    cls = METHODS["dualcoop"]
    method = cls(cls.Params(), world["backbone"], world["task"], torch.Generator().manual_seed(0))  # the reference's
    features = world["features"]["tokens"][0][:8]
    with torch.no_grad():
        cos_pos = features[:, 1:] @ method.template.encode(method.ctx_pos).T  # [B, M, C]
        cos_neg = features[:, 1:] @ method.template.encode(method.ctx_neg).T
        weights = torch.softmax(20 * cos_pos, dim=1)  # over patches, from the positive map only
        scale = world["backbone"].logit_scale  # 5 * 20 in the reference, with CLIP's 100
        expected = scale * ((weights * cos_pos).sum(1) - (weights * cos_neg).sum(1))
        assert torch.allclose(method(features), expected, atol=1e-4)
        # sigmoid(pos - neg) is the reference's softmax over [neg, pos].
        dual = method.dual_logits(features)
        assert torch.allclose(dual.softmax(dim=1)[:, 1], torch.sigmoid(method(features)), atol=1e-6)


def test_fedotp_logit_is_the_transport_weighted_similarity(world):
    """transport=balanced: the reference's multiplicative Sinkhorn on K = exp(-(1 - cos) / eps), a = 1/M, b = 1/2.
    (The default partial transport is checked against POT in test_numerics.)"""
    method = build(world, "fedotp", transport="balanced", epsilon=0.1, ot_max_iter=2000, ot_tol=1e-9)
    features = world["features"]["tokens"][0][:4]
    with torch.no_grad():
        text = torch.stack([method.template.encode(method.global_ctx), method.template.encode(method.local_ctx)])
        sim = torch.einsum("bmd,ncd->bcmn", features[:, 1:].double(), text.double())
        kernel = torch.exp(-(1 - sim) / 0.1)
        u, v = torch.full(sim.shape[:-1], 1 / sim.shape[-2]), torch.full(sim.shape[:-2] + (2,), 0.5)
        r, c = torch.ones_like(u).double(), torch.ones_like(v).double()
        for _ in range(2000):
            r = u / (kernel @ c.unsqueeze(-1)).squeeze(-1)
            c = v / (kernel.transpose(-1, -2) @ r.unsqueeze(-1)).squeeze(-1)
        plan = r.unsqueeze(-1) * kernel * c.unsqueeze(-2)
        expected = world["backbone"].logit_scale * (plan * sim).sum((-2, -1)) + method.bias.double()
        assert torch.allclose(method(features).double(), expected, atol=1e-4)


MULTILABEL_TRAINED = sorted(name for name, cls in METHODS.items()
                            if cls.backbone_kind == "clip" and name != "zeroshot")


@pytest.mark.parametrize("name", MULTILABEL_TRAINED)
def test_loss_gradient_does_not_shrink_with_the_label_mask(world, name):
    """Every multi-label loss averages over the known labels: hiding 90 % of them leaves the gradient's
    scale where it was (a loss summed over classes and divided by the batch would shrink it about tenfold)."""
    method = build(world, name)
    data = client(world, method, slice(0, 128))
    hidden = torch.rand(data.labels.shape, generator=torch.Generator().manual_seed(0)) < 0.9

    def gradient_norm(labels: torch.Tensor) -> float:
        method.zero_grad(set_to_none=True)
        method.loss(method(data.features), labels).backward()
        return float(torch.cat([p.grad.flatten() for p in method.trainable_parameters()]).norm())

    full, masked = gradient_norm(data.labels), gradient_norm(torch.where(hidden, -1.0, data.labels))
    print(f"{name}: gradient norm {full:.4g} with every label, {masked:.4g} with 90 % hidden")
    assert 0.5 < masked / full < 2.0


@pytest.mark.parametrize("name,overrides", VARIANTS, ids=IDS)
def test_gradients_reach_exactly_the_trainable_parameters(world, name, overrides):
    method = build(world, name, **overrides)
    backbone = world["backbone"]
    data = client(world, method, slice(0, 64))
    labels = data.labels.clone()
    labels[::3, ::2] = -1  # unknown labels: their logits must not matter
    logits = method(data.features)
    assert logits.shape == (64, len(world["task"].class_names))
    method.loss(logits, labels).backward()
    trainable = {k: p for k, p in method.named_parameters() if p.requires_grad}
    assert trainable and not any(k.startswith("backbone") for k in method.state_dict())
    for key, p in trainable.items():
        assert p.grad is not None and p.grad.abs().sum() > 0, key
    assert all(p.grad is None for p in backbone.parameters())
    # Unknown labels contribute nothing to the loss.
    shifted = logits.detach() + 3.0 * (labels < 0)
    assert torch.allclose(method.loss(logits.detach(), labels), method.loss(shifted, labels))


def test_state_split_and_server_rules(world):
    keys = lambda state: set(state)  # noqa: E731
    dual = build(world, "dualcoop")
    assert keys(dual.global_state()) == {"ctx_pos", "ctx_neg"} and not dual.local_state()
    assert dual.ctx_pos.shape == (dual.params.n_ctx, world["backbone"].token_width) and dual.params.n_ctx == 16
    assert dual.rule_of("ctx_pos") == "fedavg"
    assert build(world, "dualcoop", aggregation="mean").rule_of("ctx_neg") == "mean"

    otp = build(world, "fedotp")
    assert keys(otp.global_state()) == {"global_ctx", "bias"}
    assert keys(otp.local_state()) == {"local_ctx"}
    assert otp.rule_of("global_ctx") == "fedavg" and otp.rule_of("local_ctx") == LOCAL

    tpg = build(world, "fedtpg")
    assert not tpg.local_state() and {"log_scale", "bias"} < keys(tpg.global_state())
    assert {k for k in tpg.global_state() if k.startswith("prompt_generator.")} == \
        {f"prompt_generator.{k}" for k in tpg.prompt_generator.state_dict()}
    assert {tpg.rule_of(k) for k in tpg.global_state()} == {"mean"}
    # Frozen text (prompt tokens, class-name embeddings) never travels.
    assert not any("template" in k or "class_embeddings" in k for m in (dual, otp, tpg) for k in m.state_dict())


def test_fedotp_keeps_each_clients_local_prompt(world):
    """Two clients, two rounds, the coordinator's rules by hand: global prompts averaged, local ones kept."""
    method = build(world, "fedotp", local_epochs=1)
    initial_local = method.local_state()
    rows = {0: slice(0, 300), 1: slice(300, 600)}
    global_state, local_states = method.global_state(), {0: None, 1: None}
    for round_index in range(2):
        updates = {}
        for cid in (0, 1):
            method.load(global_state, local_states[cid])
            expected = initial_local if local_states[cid] is None else local_states[cid]
            assert torch.equal(method.local_ctx, expected["local_ctx"])  # a client gets back its own prompt
            method.local_update(client(world, method, rows[cid]), torch.Generator().manual_seed(10 * round_index + cid))
            updates[cid] = {"global": method.global_state(), "local": method.local_state()}
        global_state = weighted_average([updates[c]["global"] for c in (0, 1)], [300, 300])
        local_states = {c: updates[c]["local"] for c in (0, 1)}
        assert torch.allclose(global_state["global_ctx"],
                              (updates[0]["global"]["global_ctx"] + updates[1]["global"]["global_ctx"]) / 2)
    assert not torch.equal(local_states[0]["local_ctx"], local_states[1]["local_ctx"])
    # A client's first round starts from the initial local prompt; a client's own model holds its own
    method.load(global_state, None)
    assert torch.equal(method.local_ctx, initial_local["local_ctx"])
    assert torch.equal(method.global_ctx, global_state["global_ctx"])
    global_map = map_on_test(world, method)
    method.load(global_state, local_states[0])
    assert torch.equal(method.local_ctx, local_states[0]["local_ctx"]) and map_on_test(world, method) != global_map


@pytest.mark.parametrize("name,overrides", VARIANTS, ids=IDS)
def test_same_seed_same_parameters(world, name, overrides):
    def trained(init_seed: int, train_seed: int):
        method = build(world, name, seed=init_seed, local_epochs=1, **overrides)
        start = method.state_dict()
        method.local_update(client(world, method, slice(0, 200)), torch.Generator().manual_seed(train_seed))
        return {k: v.clone() for k, v in start.items()}, method.state_dict()

    start_a, end_a = trained(0, 1)
    start_b, end_b = trained(0, 1)
    assert all(torch.equal(start_a[k], start_b[k]) and torch.equal(end_a[k], end_b[k]) for k in start_a)
    _, end_c = trained(0, 2)  # another shuffle: another result
    assert any(not torch.equal(end_a[k], end_c[k]) for k in end_a)
    start_d, _ = trained(1, 1)  # every method has a random start (a negative context, prompts, a generator)
    assert any(not torch.equal(start_a[k], start_d[k]) for k in start_a)




# What each reference's global model is, for every built-in method with LOCAL parameters (a new one must say):
# FedOTP scores its global prompt alone (the reference evaluates only the clients' own [global; local] prompts);
# FED-PRIME's server model keeps its query projections at their seeded start (they are never aggregated).
GLOBAL_EVALUATION = {"fedotp": "global", "fedprime": "initial"}


def test_every_method_with_local_state_says_what_its_global_model_is():
    with_local = {name for name, cls in METHODS.items()
                  if cls.__module__.startswith("fedvlp.methods.") and LOCAL in cls.server_rules.values()}
    assert {name: METHODS[name].global_evaluation for name in with_local} == GLOBAL_EVALUATION


def test_fedotp_global_model_is_the_global_prompt_alone(world):
    """val_* and test_* score the global prompt alone: neither the untrained initial local prompt nor a
    client's trained one changes the global scores; a client's own scores do depend on its local prompt."""
    method = build(world, "fedotp", local_epochs=1)
    method.local_update(client(world, method, slice(0, 128)), torch.Generator().manual_seed(1))
    global_state, trained_local = method.global_state(), method.local_state()
    features = world["features"]["tokens"][1][:128]

    def global_scores(model, local_ctx=None):
        model.load_global(global_state)
        if local_ctx is not None:
            with torch.no_grad():
                model.local_ctx.copy_(local_ctx)
        return model.score(features)

    expected = global_scores(method)
    assert method.global_only
    random_local = torch.randn(trained_local["local_ctx"].shape, generator=torch.Generator().manual_seed(5))
    assert torch.equal(global_scores(build(world, "fedotp", seed=7)), expected)  # another initial local prompt
    assert torch.equal(global_scores(method, random_local), expected)
    assert torch.equal(global_scores(method, trained_local["local_ctx"]), expected)
    method.load(global_state, trained_local)  # a client's own model: global and local prompts
    assert not method.global_only
    personal = method.score(features)
    method.load(global_state, {"local_ctx": random_local})
    assert (method.score(features) - personal).abs().max() > 0.1


def test_fedotp_global_prompt_alone_is_the_transport_with_one_prompt(world):
    """With one prompt the balanced plan is a = 1/M itself: the score is the mean cosine over the patches."""
    method = build(world, "fedotp", transport="balanced")
    method.load_global(method.global_state())
    features = world["features"]["tokens"][0][:8]
    with torch.no_grad():
        mean_cos = (features[:, 1:] @ method.template.encode(method.global_ctx).T).mean(1)  # [B, C]
        expected = world["backbone"].logit_scale * mean_cos + method.bias
        assert torch.allclose(method(features), expected, atol=1e-5)
