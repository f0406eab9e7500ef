"""FED-PRIME and its baselines on the tiny ViLT: the method contract, retrieval, training, a federated run."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fedvlp.config import load_spec
from fedvlp.data.missing import FULL, MISSING_IMAGE, MISSING_TEXT, apply_missing, missing_table
from fedvlp.errors import ConfigError
from fedvlp.methods import METHODS
from fedvlp.methods.base import LOCAL, ClientData, Task
from fedvlp.methods.prompts import PromptPool
from fedvlp.platform.metrics import single_label_metrics

NUM_TRAIN, NUM_TEST = 600, 400


@pytest.fixture(scope="module")
def world(tiny_vilt):
    from fedvlp.backbones.loaders import load_backbone
    from fedvlp.data.recipes import generate_recipes

    backbone = load_backbone(load_spec("fedprime_recipes"))
    train, test = generate_recipes(NUM_TRAIN, "train", 0), generate_recipes(NUM_TEST, "test", 0)

    def inputs(split, table):
        texts, image_missing = apply_missing(split.texts, table)
        embeddings, mask = backbone.embed(split.images, texts, image_missing)
        method_cls = METHODS["fedprime"]
        return method_cls.make_inputs(embeddings * mask.unsqueeze(-1), torch.as_tensor(table, dtype=torch.long))

    return {"backbone": backbone, "task": Task(train.class_names, multilabel=False),
            "train": ClientData(inputs(train, missing_table(NUM_TRAIN, 0.7, "both", 0)),
                                torch.as_tensor(train.labels)),
            "test": inputs(test, missing_table(NUM_TEST, 0.0, "both", 0)), "test_labels": test.labels}


def build(world, name: str, seed: int = 0, **overrides):
    cls = METHODS[name]
    return cls(dataclasses.replace(cls.Params(), **overrides), world["backbone"], world["task"],
               torch.Generator().manual_seed(seed))


def accuracy(world, method) -> float:
    return single_label_metrics(method.score(world["test"]).numpy(), world["test_labels"])["accuracy"]


def test_token_mask_comes_back_from_the_cached_embeddings(world):
    inputs = world["train"].features
    assert inputs.mask.dtype == torch.bool and inputs.mask.shape == inputs.embeddings.shape[:2]
    text_tokens = inputs.mask[:, : world["backbone"].max_text_len].sum(1)
    missing_text = inputs.missing == MISSING_TEXT
    assert (text_tokens[missing_text] == 2).all()          # [CLS][SEP] only
    assert (text_tokens[~missing_text] > 2).all()
    assert inputs.mask[:, world["backbone"].max_text_len:].all()  # every image token is real


@pytest.mark.parametrize("pools,expected", [("both", {"intra_pool", "inter_pool"}), ("inter", {"inter_pool"}),
                                            ("intra", {"intra_pool"})])
def test_pools_switch_and_server_rules(world, pools, expected):
    method = build(world, "fedprime", pools=pools)
    present = {name.split(".")[0] for name, _ in method.named_parameters() if "_pool." in name}
    assert present == expected
    rules = {key: method.rule_of(key) for key in method.state_dict()}
    for key, rule in rules.items():
        if key.endswith("query.weight"):
            assert rule == LOCAL                           # the query projection never leaves its client
        elif key in ("inter_pool.prompts", "inter_pool.selected"):
            assert rule == "hungarian"                     # the pool and which of its prompts the client used
        else:
            assert rule == "fedavg"                        # intra prompts, pooler, classifier
    assert method.server_options()["hungarian"] == {"outer_loops": 5, "lr": 1e-3, "prompts": "selected",
                                                    "keep": "used", "pool_size": 20, "max_pool": None,
                                                    "schedule": "per_client"}


def test_the_inter_pool_marks_what_it_retrieved_and_takes_the_servers_size(world):
    method = build(world, "fedprime", pools="inter", top_k=2, pool_size=6, local_epochs=1)
    method.local_update(ClientData(world["train"].features[:64], world["train"].labels[:64]),
                        torch.Generator().manual_seed(0))
    selected = method.global_state()["inter_pool.selected"]
    assert selected.shape == (6,) and 2 <= selected.sum() <= 6 and set(selected.tolist()) <= {0.0, 1.0}
    state = {**method.global_state(), "inter_pool.prompts": torch.randn(9, method.inter_pool.prompts.shape[1]),
             "inter_pool.selected": torch.zeros(9)}
    method.load(state, None)  # a server that kept 9 used centroids
    assert method.inter_pool.prompts.shape[0] == 9
    assert torch.equal(method.inter_pool.prompts, state["inter_pool.prompts"])
    assert method(world["test"][:4]).shape == (4, 16)


def test_top_k_larger_than_the_pool_is_a_config_error():
    with pytest.raises(ConfigError, match="method.top_k"):
        load_spec("fedprime_recipes", ["method.top_k=30"])


def test_retrieval_picks_the_keys_nearest_the_query():
    generator = torch.Generator().manual_seed(0)
    pool = PromptPool(6, 8, top_k=2, batchwise=False, generator=generator)
    with torch.no_grad():
        pool.query.weight.copy_(torch.eye(8))
        pool.prompts.copy_(torch.eye(8)[:6] * torch.arange(1.0, 7.0).unsqueeze(1))
    query = torch.tensor([[0.0, 1.0, 0.9, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1.0, 0.1, 0]])
    selected, similarity = pool(query)
    norms = selected.norm(dim=-1)                          # prompt j has norm j + 1
    assert norms[0].tolist() == [2.0, 3.0] and norms[1, 0].item() == 6.0
    expected = (torch.nn.functional.normalize(query, dim=-1)[:, :6].topk(2).values.sum(-1)).mean()
    assert similarity.item() == pytest.approx(expected.item(), abs=1e-6)
    pool.batchwise = True                                  # the reference: one top-k for the whole batch
    selected, _ = pool(torch.cat([query[:1]] * 3 + [query[1:]]))
    assert selected.norm(dim=-1).sort(dim=-1).values.tolist() == [[2.0, 3.0]] * 4


@pytest.mark.parametrize("name,overrides", [("fedprime", {}), ("fedprime", {"selection": "batch"}),
                                            ("fedavg_p", {"prompt_length": 4, "prompt_layers": 2}),
                                            ("fedprox_p", {"prompt_length": 4, "prompt_layers": 2}),
                                            ("fedavg_p", {"prompt_length": 0})],
                         ids=["fedprime", "fedprime-batchwise", "fedavg_p", "fedprox_p", "no-prompts"])
def test_local_training_beats_the_untrained_start(world, name, overrides):
    method = build(world, name, local_epochs=3, **overrides)
    before = accuracy(world, method)
    frozen = {k: v.clone() for k, v in world["backbone"].state_dict().items()}
    stats = method.local_update(world["train"], torch.Generator().manual_seed(1))
    after = accuracy(world, method)
    print(f"{name} {overrides}: test accuracy {before:.3f} -> {after:.3f}")
    assert stats["steps"] == 3 * -(-NUM_TRAIN // method.params.batch_size)
    assert after > before + 0.03                           # 16 classes: chance is 0.0625
    assert all(torch.equal(frozen[k], v) for k, v in world["backbone"].state_dict().items())


def test_prompts_as_one_lower_the_retrieved_prompts_weight_in_fedprime(world):
    """method.prompt_attention: as_one reaches FED-PRIME's encoder (the 2k retrieved prompts, prepended at the input,
    start weighing as one token), and `tokens` is the reference's plain concatenation."""
    tokens, as_one = build(world, "fedprime"), build(world, "fedprime", prompt_attention="as_one")
    inputs = world["test"]
    x, mask = inputs.embeddings[:8], inputs.mask[:8]
    with torch.no_grad():
        reference = tokens.scores(type(inputs)(x, mask, inputs.missing[:8]))[0]
        query = x.masked_fill(~mask.unsqueeze(-1), float("-inf")).amax(1)
        prompts = torch.cat([tokens.intra_pool(query)[0], tokens.inter_pool(query)[0]], 1)
        hidden = world["backbone"].encode(torch.cat([prompts, x], 1), torch.cat([mask.new_ones(prompts.shape[:2]),
                                                                                 mask], 1))
        assert torch.equal(reference, tokens.classifier(tokens.pooler(hidden)))
        assert not torch.allclose(as_one.scores(type(inputs)(x, mask, inputs.missing[:8]))[0], reference)


def test_gradients_reach_exactly_the_trainable_parameters(world):
    method = build(world, "fedprime")
    batch = world["train"].features[:16]
    torch.nn.functional.cross_entropy(method(batch), world["train"].labels[:16]).backward()
    with_grad = {n for n, p in method.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    # The query projections are trained by the retrieval term only, which this loss leaves out.
    assert with_grad == {"intra_pool.prompts", "inter_pool.prompts", "pooler.dense.weight", "pooler.dense.bias",
                         *(f"classifier.{i}.{w}" for i in (0, 1, 3) for w in ("weight", "bias"))}
    assert all(p.grad is None for p in world["backbone"].parameters())


def test_missing_aware_prompts_follow_each_sample_missing_type(world):
    method = build(world, "fedavg_p", prompt_length=4, prompt_layers=2)
    inputs = world["train"].features
    rows = [int(np.flatnonzero(inputs.missing.numpy() == code)[0]) for code in (FULL, MISSING_TEXT, MISSING_IMAGE)]
    batch = inputs[torch.tensor(rows)]
    with torch.no_grad():
        logits = method(batch)
        # not a constant: LayerNorm removes one
        method.prompts[MISSING_TEXT].add_(torch.randn(method.prompts[MISSING_TEXT].shape,
                                                      generator=torch.Generator().manual_seed(0)))
        changed = (method(batch) - logits).abs().amax(-1) > 1e-6
    assert changed.tolist() == [False, True, False]
    # without prompts (the prompt-free baseline): the pooler and head on the frozen encoder's output
    bare = build(world, "fedavg_p", prompt_length=0)
    with torch.no_grad():
        expected = bare.classifier(bare.pooler(world["backbone"].encode(batch.embeddings, batch.mask, {})))
        assert torch.allclose(bare(batch), expected, atol=1e-6)


def test_fedprox_pulls_towards_the_round_start(world):
    far = build(world, "fedprox_p", prompt_length=4, prompt_layers=2, prox_mu=100.0, lr=0.01)
    free = build(world, "fedavg_p", prompt_length=4, prompt_layers=2, lr=0.01)
    start = free.prompts.detach().clone()
    for method in (far, free):
        method.local_update(world["train"], torch.Generator().manual_seed(2))
    assert (far.prompts - start).norm() < 0.5 * (free.prompts - start).norm()


def test_vilt_methods_need_a_vilt_backbone_and_text(tmp_path):
    with pytest.raises(ConfigError, match="backbone.name"):
        load_spec("fedprime_recipes", ["backbone.name=tiny-clip"])
    with pytest.raises(ConfigError, match="backbone.name"):
        load_spec(None, ["method.name=fedprime"])


@pytest.mark.slow
def test_federated_fedprime_logs_the_six_evaluation_sets(tiny_vilt, ray_cluster, tracking_uri, tmp_path):
    import mlflow

    from fedvlp.platform.runtime.engine import run_federated

    spec = load_spec("fedprime_recipes", [
        "data.num_train=600", "data.num_val=256", "data.num_test=256", "data.num_holdout=100", "federation.clients=4",
        "federation.rounds=3", "federation.eval_every=1", "federation.partition=iid", "resources.workers=2",
        "method.local_epochs=6",
        f"tracking.uri={tracking_uri}", f"output_dir={tmp_path}"])
    result = run_federated(spec, progress=False)
    sets = ("full", "miss_image", "miss_text", "miss_both", "image_only", "text_only")
    client = mlflow.MlflowClient(tracking_uri)
    for name in ("val", "test", *(f"test_{s}" for s in sets), "personal"):
        for metric in ("accuracy", "macro_f1"):
            history = client.get_metric_history(result.run_id, f"{name}_{metric}")
            assert [m.step for m in history] == [0, 1, 2, 3], f"{name}_{metric}"
    for name in ("centroids_used", "pool_size", "shared_clusters", "moved"):  # the clustering, visible every round
        history = client.get_metric_history(result.run_id, f"server/hungarian/inter_pool.prompts/{name}")
        assert [m.step for m in history] == [1, 2, 3], name
    # the query projections stay on the clients: the personal models differ from the global one
    assert result.final["personal_accuracy"] != result.final["test_accuracy"]
    assert result.final["val_accuracy"] > result.initial["val_accuracy"] + 0.04
    assert result.final["test_accuracy"] > result.initial["test_accuracy"] + 0.04
