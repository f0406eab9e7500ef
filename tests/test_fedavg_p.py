"""FedAvg-P's size follows the reference by its stated rule, and the missing-rate study runs Centralized-P."""
from __future__ import annotations

import pytest
import torch

from fedvlp.config import CONFIGS_DIR, load_spec, read_yaml
from fedvlp.data.missing import FULL, MISSING_IMAGE, MISSING_TEXT
from fedvlp.methods.fedavg_p import prompted_layers

REFERENCE_LENGTH, REFERENCE_LAYERS, VILT_B_DEPTH = 16, 6, 12  # Lee et al.: input prompts on layers 0..5 of 12


def test_prompted_layers_are_half_the_depth_unless_given():
    assert prompted_layers(None, VILT_B_DEPTH) == REFERENCE_LAYERS
    assert prompted_layers(None, 4) == 2
    assert prompted_layers(None, 1) == 1
    assert prompted_layers(3, VILT_B_DEPTH) == 3
    assert prompted_layers(REFERENCE_LAYERS, 4) == 4          # capped at the depth


@pytest.mark.parametrize("config", ["fedavg_p_food101", "fedavg_p_mmimdb"])
def test_vilt_b_configs_are_the_reference_size(config):
    method = read_yaml(CONFIGS_DIR / f"{config}.yaml")["method"]   # read, not built: the dataset is not here
    assert method["prompt_length"] == REFERENCE_LENGTH
    assert prompted_layers(method.get("prompt_layers"), VILT_B_DEPTH) == REFERENCE_LAYERS


@pytest.mark.parametrize("config", ["fedavg_p_recipes", "fedprox_p_recipes", "centralized_p_recipes"])
def test_tiny_vilt_configs_get_16_tokens_on_the_first_half_of_the_layers(config):
    from fedvlp.backbones.loaders import load_backbone
    from fedvlp.data.recipes import CLASS_NAMES
    from fedvlp.methods.base import Task
    from fedvlp.platform.runtime.worker import build_method

    spec = load_spec(config, ["backbone.pretrained=none"])   # the shapes only: no pretraining needed
    backbone = load_backbone(spec)
    method = build_method(spec, backbone, Task(list(CLASS_NAMES), multilabel=False))
    assert backbone.num_layers == 4 and backbone.hidden_size == 128
    assert tuple(method.prompts.shape) == (3, 2, REFERENCE_LENGTH, 128)  # [missing type, layer, token, D]
    # zeros with one row of ones per type, the row the reference gives that type
    for code, row in {FULL: 0, MISSING_IMAGE: 1, MISSING_TEXT: 2}.items():
        expected = torch.zeros(2, REFERENCE_LENGTH, 128)
        expected[:, row] = 1.0
        assert torch.equal(method.prompts[code].detach(), expected)


def test_missing_rate_study_runs_centralized_p_as_its_run_config_defines_it():
    from fedvlp.platform.studies.spaces import load_sweep, trial_spec

    sweep = load_sweep("missing_rate")
    assert {"fedprime", "fedavg_p", "fedlora_vilt", "centralized_p"} <= set(sweep.variants)
    specs = {variant: trial_spec(sweep, {"seed": 0, "variant": variant, "data.missing_rate": 0.5}, "test")
             for variant in ("fedavg_p", "centralized_p")}
    central, federated = specs["centralized_p"], specs["fedavg_p"]
    assert central.federation.clients == 1 and federated.federation.clients == 10
    assert central.method.name == "fedavg_p" and central.method.params == load_spec(
        "centralized_p_recipes").method.params == federated.method.params
    assert central.data == federated.data and central.data.missing_rate == 0.5


@pytest.mark.parametrize("config, prompt_names", [
    ("fedavg_p_recipes", {"prompts"}),
    ("fedprime_recipes", {"intra_pool.prompts", "intra_pool.query.weight", "inter_pool.prompts",
                          "inter_pool.query.weight"}),
])
def test_prompt_lr_moves_the_prompts_alone_at_their_own_rate(config, prompt_names, monkeypatch):
    """method.prompt_lr: the optimiser a local update builds moves every prompt parameter (and no pooler or head
    parameter) by prompt_lr x its gradient, the rest by lr x theirs; unset, everything moves at lr (the reference)."""
    from fedvlp.backbones.loaders import load_backbone
    from fedvlp.data.recipes import CLASS_NAMES
    from fedvlp.methods import fedavg_p, fedprime
    from fedvlp.methods.base import Task
    from fedvlp.platform.runtime.worker import build_method

    spec = load_spec(config, ["backbone.pretrained=none", "method.prompt_lr=2.0", "method.lr=0.1"])
    method = build_method(spec, load_backbone(spec), Task(list(CLASS_NAMES), multilabel=False))
    names = {id(p): name for name, p in method.named_parameters()}
    assert {names[id(p)] for p in method.prompt_parameters()} == prompt_names
    built, prompt_sgd = [], fedprime.prompt_sgd

    def capture(trainable, prompts, lr, prompt_lr):
        built.append(prompt_sgd(trainable, prompts, lr, prompt_lr))
        raise StopIteration  # the optimiser is all this test needs
    monkeypatch.setattr(fedavg_p if config.startswith("fedavg") else fedprime, "prompt_sgd", capture)
    with pytest.raises(StopIteration):
        method.local_update(None, torch.Generator())
    trainable = method.trainable_parameters()
    for p in trainable:
        p.grad = torch.ones_like(p)
    for optimizer, prompt_step in ((built[0], 2.0), (prompt_sgd(trainable, [], 0.1, None), 0.1)):
        before = [p.detach().clone() for p in trainable]
        optimizer.step()
        for p, b in zip(trainable, before):
            step = prompt_step if names[id(p)] in prompt_names else 0.1
            assert torch.allclose(b - p.detach(), torch.full_like(b, step)), (names[id(p)], step)
