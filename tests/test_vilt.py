"""The tiny ViLT fedvlp pretrains itself, its frozen embed/encode halves, and the ViLT loader."""
import json
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fedvlp.backbones.loaders import backbone_family, backbone_id, load_backbone, load_vilt
from fedvlp.backbones.vilt import MAX_TEXT_LEN, TINY_VILT, ViltBackbone, create_vilt, tiny_vocabulary
from fedvlp.data.recipes import VOCABULARY, generate_recipes
from fedvlp.errors import BackboneError


def spec(name=TINY_VILT, pretrained="fedvlp", seed=0):
    return SimpleNamespace(backbone=SimpleNamespace(name=name, pretrained=pretrained), seed=seed)


@pytest.fixture(scope="module")
def backbone(tiny_vilt):
    return load_vilt(spec())


@pytest.fixture(scope="module")
def recipes():
    return generate_recipes(40, "test", 0)


def test_tiny_vilt_architecture_and_vocabulary():
    torch.manual_seed(0)
    model = create_vilt().model
    config = model.config
    shape = (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.intermediate_size,
             config.patch_size, config.image_size, config.max_position_embeddings)
    assert shape == (128, 4, 4, 512, 8, 32, MAX_TEXT_LEN)
    vocabulary = tiny_vocabulary()
    assert vocabulary[:5] == ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
    assert list(vocabulary[5:]) == sorted(VOCABULARY) and config.vocab_size == len(vocabulary)
    assert 0.8e6 < sum(p.numel() for p in model.parameters()) < 0.9e6


def test_embed_shapes_mask_and_determinism(backbone, recipes):
    n = len(recipes)
    hidden, mask = backbone.embed(recipes.images, recipes.texts, np.zeros(n, bool))
    length = MAX_TEXT_LEN + 1 + 16  # text, image [CLS], 4 x 4 patches of 8 px
    assert backbone.seq_len == length and backbone.num_patches == 16 and backbone.image_size == (32, 32)
    assert hidden.shape == (n, length, 128) and hidden.dtype == torch.float32 and mask.shape == (n, length)
    words = torch.tensor([len(t.split()) for t in recipes.texts])
    assert torch.equal(mask[:, :MAX_TEXT_LEN].sum(1), words + 2)  # [CLS] words [SEP], one token per word
    assert mask[:, MAX_TEXT_LEN:].all()
    again, _ = backbone.embed(recipes.images, recipes.texts, np.zeros(n, bool))
    assert torch.equal(hidden, again)
    part, _ = backbone.embed(recipes.images[:7], recipes.texts[:7], np.zeros(7, bool))
    assert torch.equal(part, hidden[:7])  # a sample's embedding does not depend on its batch


def test_missing_text_is_cls_sep_and_missing_image_is_the_all_ones_image(backbone, recipes):
    n = len(recipes)
    texts = ["" if i % 3 == 0 else t for i, t in enumerate(recipes.texts)]
    image_missing = np.arange(n) % 4 == 1
    hidden, mask = backbone.embed(recipes.images, texts, image_missing)
    blank = np.arange(n) % 3 == 0
    assert mask[blank, :2].all() and not mask[blank, 2:MAX_TEXT_LEN].any()
    assert torch.equal(hidden[blank, :2], hidden[np.flatnonzero(blank)[:1], :2].expand(int(blank.sum()), -1, -1))
    ones = torch.ones(1, 3, 32, 32)
    with torch.no_grad():
        expected = backbone.image_embeddings(ones)
    image = hidden[image_missing, MAX_TEXT_LEN:]
    assert torch.allclose(image, expected.expand_as(image), atol=1e-6)
    full, _ = backbone.embed(recipes.images, recipes.texts, np.zeros(n, bool))
    kept = ~image_missing
    assert torch.equal(hidden[kept, MAX_TEXT_LEN:], full[kept, MAX_TEXT_LEN:])  # the others are untouched


def test_embed_then_encode_is_vilts_own_forward(backbone, recipes):
    # transformers' ViltModel with the same image embeddings (its visual_embed would sample patches at random)
    texts = list(recipes.texts[:6])
    texts[2] = ""
    hidden, mask = backbone.embed(recipes.images[:6], texts, np.zeros(6, bool))
    ids, text_mask = backbone.tokenize(texts)
    with torch.no_grad():
        images = backbone.image_embeddings(backbone.preprocess(recipes.images[:6]))
        images = images - backbone.model.embeddings.token_type_embeddings.weight[1]  # ViltModel adds the type
        ours = backbone.encode(hidden, mask)
        theirs = backbone.model(input_ids=ids, attention_mask=text_mask.long(), image_embeds=images,
                                pixel_mask=torch.ones(6, 17, dtype=torch.long))
    assert torch.allclose(ours, theirs.last_hidden_state, atol=1e-5)
    assert torch.allclose(backbone.pooler(ours), theirs.pooler_output, atol=1e-5)


def test_image_embeddings_are_visual_embed_without_its_random_patch_order(backbone, recipes):
    pixels = backbone.preprocess(recipes.images[:3])
    embeddings = backbone.model.embeddings
    with torch.no_grad():
        theirs, _, (patch_index, _) = embeddings.visual_embed(pixels, torch.ones(3, 32, 32, dtype=torch.long),
                                                              max_image_length=16)
        ours = backbone.image_embeddings(pixels) - embeddings.token_type_embeddings.weight[1]
    order = patch_index[..., 0] * 4 + patch_index[..., 1]  # theirs[:, 1 + k] is grid patch order[:, k]
    assert torch.allclose(theirs[:, 0], ours[:, 0], atol=1e-6)
    assert torch.allclose(theirs[:, 1:], torch.gather(ours[:, 1:], 1, order[..., None].expand(-1, -1, 128)), atol=1e-6)


def test_layer_prompts_accumulate_and_only_they_and_the_input_get_gradients(backbone, recipes):
    hidden, mask = backbone.embed(recipes.images[:5], recipes.texts[:5], np.zeros(5, bool))
    hidden.requires_grad_(True)
    shared = torch.randn(3, 128, requires_grad=True)
    per_sample = torch.randn(5, 2, 128, requires_grad=True)
    out = backbone.encode(hidden, mask, {0: shared, 2: per_sample})
    assert out.shape == (5, hidden.shape[1] + 3 + 2, 128)
    backbone.pooler(out).sum().backward()
    assert shared.grad.abs().sum() > 0 and per_sample.grad.abs().sum() > 0 and hidden.grad.abs().sum() > 0
    assert all(p.grad is None and not p.requires_grad for p in backbone.parameters())
    with torch.no_grad():  # [P, D] is the same prompt for every sample
        expanded = backbone.encode(hidden, mask, {0: shared.expand(5, -1, -1), 2: per_sample})
    assert torch.allclose(out.detach(), expanded, atol=1e-6)
    with pytest.raises(ValueError, match="layer indices"):
        backbone.encode(hidden, mask, {4: shared})


def test_prompts_as_one_weigh_as_one_token_whatever_their_count(backbone, recipes):
    """prompts_as_one lowers each score on the P prompts in front of a layer by log P: P copies of one token then act
    on the real tokens exactly as that token alone does, also once prompts accumulate over two layers; without it,
    the copies take more of the attention and the real tokens come out otherwise."""
    hidden, mask = backbone.embed(recipes.images[:4], recipes.texts[:4], np.zeros(4, bool))
    token = torch.randn(2, 1, 128)
    one = backbone.encode(hidden, mask, {0: token[0], 1: token[1]}, prompts_as_one=True)
    copies = backbone.encode(hidden, mask, {0: token[0].expand(8, -1), 1: token[1].expand(8, -1)},
                             prompts_as_one=True)
    plain = backbone.encode(hidden, mask, {0: token[0].expand(8, -1), 1: token[1].expand(8, -1)})
    real = mask[:, :, None]
    assert torch.allclose((one[:, 2:] * real), (copies[:, 16:] * real), atol=1e-5)
    assert not torch.allclose((plain[:, 16:] * real), (copies[:, 16:] * real), atol=1e-3)
    assert torch.equal(backbone.encode(hidden, mask, {0: token[0]}, prompts_as_one=True),
                       backbone.encode(hidden, mask, {0: token[0]}))  # one prompt: nothing to lower


def test_shipped_tiny_vilt_probes_as_documented_with_either_modality_missing(tiny_vilt):
    """Measured here, train -> val: the figures the manifest documents for the shipped float16 weights (a change
    that silently invalidates them fails here), above the targets (0.6 with both modalities, 0.45 with either one
    missing); a random initialisation of the same model stays well below on both modalities and without the text."""
    from fedvlp.backbones.pretrain_vilt import probe_accuracies
    from fedvlp.backbones.shipped import read_manifest

    pretrained = probe_accuracies(load_vilt(spec()))
    untrained = probe_accuracies(load_vilt(spec(pretrained="none")), settings=("full", "text_missing"))
    print("tiny ViLT pooled-feature probe on val, pretrained:", pretrained, "random init:", untrained)
    documented = read_manifest()["tiny-vilt"]["figures"]
    assert all(pretrained[k] == pytest.approx(documented[f"probe_{k}"], abs=2e-3) for k in pretrained)
    assert pretrained["full"] >= 0.6 and pretrained["text_missing"] >= 0.45 and pretrained["image_missing"] >= 0.45
    assert pretrained["full"] > untrained["full"] + 0.2 and pretrained["text_missing"] > untrained["text_missing"] + 0.2


def test_pretraining_is_bit_identical_for_a_seed(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from fedvlp.backbones.pretrain_vilt import TinyViltRecipe, pretrain_tiny_vilt

    recipe = TinyViltRecipe(steps=3, batch_size=16, pool_size=200, itm_eval_size=0, probe_train=0)
    weights = []
    for run in ("a", "b"):
        monkeypatch.setenv("FEDVLP_CACHE_DIR", str(tmp_path / run))
        weights.append(load_file(pretrain_tiny_vilt(recipe, progress=False)["path"]))
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    monkeypatch.setenv("FEDVLP_CACHE_DIR", str(tmp_path / "c"))
    other = load_file(pretrain_tiny_vilt(replace(recipe, seed=1), progress=False)["path"])
    assert not torch.equal(weights[0]["pooler.dense.weight"], other["pooler.dense.weight"])


def test_random_init_is_seeded_by_the_run(tiny_vilt):
    a, b, c = (load_vilt(spec(pretrained="none", seed=s)).model.state_dict() for s in (0, 0, 1))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["pooler.dense.weight"], c["pooler.dense.weight"])


def test_real_vilt_fails_offline_with_one_line_that_says_how(monkeypatch, tmp_path):
    from fedvlp.config import load_spec

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = load_spec("fedprime_recipes", ["backbone.name=dandelin/vilt-b32-mlm"])
    with pytest.raises(BackboneError) as err:
        load_backbone(run)
    assert "\n" not in str(err.value) and "dandelin/vilt-b32-mlm" in str(err.value)
    for name, pretrained, named in (("dandelin/vilt-b32-mlm", "fedvlp", "dandelin/vilt-b32-mlm"),
                                    ("vilt", str(tmp_path / "no-such-dir"), "no-such-dir")):
        with pytest.raises(BackboneError) as err:
            load_vilt(spec(name, pretrained))
        message = str(err.value)
        assert "\n" not in message and named in message, message
        assert "backbone.pretrained" in message and "save_pretrained" in message


def test_a_local_vilt_directory_loads_through_the_real_model_path(tiny_vilt, tmp_path):
    tiny = load_vilt(spec())
    tiny.model.save_pretrained(tmp_path / "vilt")
    tiny.tokenizer.save_pretrained(tmp_path / "vilt")
    assert backbone_family(str(tmp_path / "vilt")) == "vilt"
    loaded = load_backbone(spec(str(tmp_path / "vilt")))
    assert isinstance(loaded, ViltBackbone) and loaded.max_text_len == MAX_TEXT_LEN
    recipes = generate_recipes(4, "test", 0)
    missing = np.array([False, True, False, False])
    expected, mask = tiny.embed(recipes.images, recipes.texts, missing)
    got, got_mask = loaded.embed(recipes.images, recipes.texts, missing)
    assert torch.equal(mask, got_mask) and torch.allclose(got, expected)
    with torch.no_grad():
        assert torch.allclose(loaded.encode(got, got_mask), tiny.encode(expected, mask), atol=1e-6)
    assert backbone_id(spec(str(tmp_path / "vilt"))).startswith(f"{tmp_path / 'vilt'}:{(tmp_path / 'vilt').resolve()}:")


def test_backbone_family_and_ids(tmp_path):
    assert backbone_family(TINY_VILT) == "vilt" and backbone_family("dandelin/vilt-b32-mlm") == "vilt"
    assert backbone_family("tiny-clip") == "clip" and backbone_family("ViT-B-16") == "clip"
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "vilt"}))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert backbone_family(str(tmp_path / "m")) == "vilt" and backbone_family(str(tmp_path / "c")) == "clip"
    from fedvlp.backbones.pretrain_vilt import TinyViltRecipe
    from fedvlp.backbones.shipped import read_manifest

    assert backbone_id(spec()) == f"tiny-vilt:fedvlp:{read_manifest()['tiny-vilt']['sha256'][:12]}"
    assert backbone_id(spec(pretrained="none", seed=3)) == "tiny-vilt:random:3"
    assert TinyViltRecipe().key() != TinyViltRecipe(seed=1).key()
