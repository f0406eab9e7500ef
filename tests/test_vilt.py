"""The tiny ViLT: deterministic embedding layers, the frozen encoder with prompts, pretraining, loading."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedvlp.backbones import backbone_family, load_backbone
from fedvlp.config import load_spec
from fedvlp.data.missing import fill_missing_images
from fedvlp.data.recipes import generate_recipes
from fedvlp.errors import BackboneError


@pytest.fixture(scope="module")
def vilt(tiny_vilt):
    return load_backbone(load_spec("configs/fedprime_recipes.yaml"))


@pytest.fixture(scope="module")
def recipes():
    return generate_recipes(16, "test", 0)


def test_embed_is_text_then_image_with_a_mask_and_deterministic(vilt, recipes):
    none = np.zeros(len(recipes), bool)
    hidden, mask = vilt.embed(recipes.images, recipes.texts, none)
    assert hidden.shape == (16, vilt.max_text_len + 1 + vilt.num_patches, vilt.hidden_size)
    assert mask.shape == hidden.shape[:2] and mask[:, vilt.max_text_len:].all()
    words = [len(t.split()) for t in recipes.texts]  # every recipe word is one token of the tiny vocabulary
    assert mask[:, : vilt.max_text_len].sum(1).tolist() == [min(w + 2, vilt.max_text_len) for w in words]
    again, _ = vilt.embed(recipes.images, recipes.texts, none)
    assert torch.equal(hidden, again)


def test_missing_text_and_missing_image(vilt, recipes):
    texts = ["" if i % 2 else t for i, t in enumerate(recipes.texts)]
    image_missing = np.arange(len(recipes)) % 3 == 0
    hidden, mask = vilt.embed(recipes.images, texts, image_missing)
    assert (mask[1::2, : vilt.max_text_len].sum(1) == 2).all()       # [CLS][SEP] only
    ones = fill_missing_images(vilt.preprocess(recipes.images[:1]), np.ones(1, bool))
    assert (ones == 1).all()
    expected = vilt.image_embeddings(ones)[0]
    for i in np.flatnonzero(image_missing):
        assert torch.allclose(hidden[i, vilt.max_text_len:], expected, atol=1e-6)


def test_encode_prepends_layer_prompts_and_trains_only_them(vilt, recipes):
    hidden, mask = vilt.embed(recipes.images[:4], recipes.texts[:4], np.zeros(4, bool))
    prompts = {0: torch.randn(3, vilt.hidden_size, requires_grad=True),
               1: torch.randn(4, 2, vilt.hidden_size, requires_grad=True)}
    out = vilt.encode(hidden, mask, prompts)
    assert out.shape == (4, hidden.shape[1] + 5, vilt.hidden_size)
    vilt.pooler(out[:, 5:]).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in prompts.values())
    assert all(p.grad is None and not p.requires_grad for p in vilt.parameters())


def test_pretraining_learned_image_text_matching(tiny_vilt):
    """Held-out image-text matching accuracy recorded by the pretraining run (chance is 0.5)."""
    assert float(tiny_vilt["itm_accuracy"]) > 0.6


def test_family_and_offline_errors(monkeypatch):
    assert backbone_family("tiny-vilt") == backbone_family("dandelin/vilt-b32-mlm") == "vilt"
    assert backbone_family("tiny-clip") == backbone_family("ViT-B-16") == "clip"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = load_spec("configs/fedprime_recipes.yaml", ["backbone.name=dandelin/vilt-b32-mlm"])
    with pytest.raises(BackboneError) as error:
        load_backbone(spec)
    assert "\n" not in str(error.value) and "dandelin/vilt-b32-mlm" in str(error.value)
