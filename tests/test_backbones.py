"""The tiny CLIP fedvlp pretrains itself, the shared loader, and CoOp prompt encoding."""
import numpy as np
import open_clip
import pytest
import torch
from safetensors.torch import load_file

from fedvlp.backbones.clip import TINY_CLIP, ClipBackbone, create_clip
from fedvlp.backbones.pretrain_clip import TinyClipRecipe, zero_shot_maps
from fedvlp.backbones.shipped import read_manifest
from fedvlp.config import load_spec
from fedvlp.data.scenes import generate_scenes
from fedvlp.errors import BackboneError
from fedvlp.methods.fedmpt import PAPER_CONDITIONS
from fedvlp.seeding import torch_seed


def _fresh_tiny_clip() -> torch.nn.Module:
    """The tiny CLIP as pretraining initialises it."""
    torch.manual_seed(torch_seed(TinyClipRecipe().seed, "pretrain", 0))
    return create_clip(TINY_CLIP)


@pytest.fixture(scope="module")
def zero_shot(tiny_clip):
    """Zero-shot val mAP (pooled token, best patch) of the untrained and the pretrained tiny CLIP."""
    from fedvlp.backbones.loaders import load_clip

    val = generate_scenes(2000, "val", 0)
    return {name: zero_shot_maps(backbone, val.images, val.labels, val.class_names) for name, backbone in
            (("untrained", ClipBackbone(_fresh_tiny_clip(), TINY_CLIP)), ("pretrained", load_clip(load_spec(None))))}


def test_shipped_tiny_clip_scores_its_documented_zero_shot_figures(zero_shot):
    """The figures the manifest documents, measured again on the shipped float16 weights: a change to the data
    generator, the model code or the loader that silently invalidates the weights fails here. Untrained: chance."""
    figures = read_manifest()[TINY_CLIP]["figures"]
    assert zero_shot["pretrained"]["pooled"] == pytest.approx(figures["zero_shot_map"], abs=1e-3)
    assert zero_shot["pretrained"]["patches"] == pytest.approx(figures["patch_zero_shot_map"], abs=1e-3)
    assert zero_shot["untrained"]["pooled"] < 0.2


def test_patch_tokens_carry_evidence(zero_shot):
    """Region-level methods match the dense patch features against class prompts: per class, the best patch
    ranks images almost as well as the pooled token does (and far better than untrained patches)."""
    assert zero_shot["pretrained"]["patches"] >= 0.9 * zero_shot["pretrained"]["pooled"]
    assert zero_shot["untrained"]["patches"] < 0.2


def test_condition_phrases_are_trained_words(tiny_clip):
    """FedMPT fills its [COND] slot with these phrases: pretraining must have moved their token embeddings away
    from the seeded initialisation (a word no caption holds stays exactly put)."""
    fresh = _fresh_tiny_clip().token_embedding.weight.detach().half().float()  # shipped in float16
    trained = load_file(str(tiny_clip))["token_embedding.weight"].float()
    tokenizer = open_clip.get_tokenizer(TINY_CLIP)

    def moved(phrase: str) -> torch.Tensor:
        ids = tokenizer([phrase])[0]
        ids = ids[1 : int(ids.argmax())]
        return (trained[ids] - fresh[ids]).norm(dim=-1) / fresh[ids].norm(dim=-1)

    for phrase in PAPER_CONDITIONS:
        assert moved(phrase).min() > 0.2, phrase  # measured: 0.45 (pose) to 1.3 (spatial)
    assert moved("elephant").max() == 0


@pytest.mark.parametrize("name", ["tiny-clip", "ViT-B-16"])
def test_the_text_encoder_shortcut_equals_open_clips_encode_text(name):
    """`encode_token_embeddings` runs the last block for the end-of-text token only; its features must equal
    open_clip's own `model.encode_text` (a randomly initialised tower: no weights needed)."""
    from fedvlp.backbones.clip import ClipBackbone, create_clip

    torch.manual_seed(0)
    model = create_clip(name)
    backbone = ClipBackbone(model, name)
    texts = ["a photo of a red circle.", "two", "a much longer caption about a yellow cross and a blue square"]
    tokens = backbone.tokenize(texts)
    cut = tokens[:, : int(tokens.argmax(-1).max()) + 1]  # prompts are cut to their longest: the mask is causal
    with torch.no_grad():
        theirs = model.encode_text(tokens)
        for ids in (tokens, cut):
            ours = backbone.encode_token_embeddings(backbone.embed_tokens(ids), ids.argmax(-1))
            assert torch.allclose(ours, theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["tiny-clip", "ViT-B-16"])
def test_prompts_sharing_a_prefix_encode_as_if_each_ran_alone(name, monkeypatch):
    """`encode_prompt_groups` runs a group's shared prefix once; features and gradients must equal running every
    prompt through `encode_token_embeddings` (randomly initialised towers: no weights needed). The shared-prefix
    path must really run: it falls back to the flat one for shapes it cannot take, which would pass unseen."""
    from fedvlp.backbones import clip
    from fedvlp.backbones.clip import ClipBackbone, create_clip

    continuation_calls = []
    monkeypatch.setattr(clip, "_continuation_block", lambda *args, _run=clip._continuation_block, **kwargs: (
        continuation_calls.append(1), _run(*args, **kwargs))[1])
    torch.manual_seed(0)
    backbone = ClipBackbone(create_clip(name), name)
    groups, classes, length, shared, width = 3, 5, 12, 7, backbone.token_width
    prefix = torch.randn(groups, 1, shared, width) * 0.02
    rest = torch.randn(groups, classes, length - shared, width) * 0.02
    eot = torch.randint(shared, length, (groups, classes))
    results = []
    for grouped in (True, False):
        context = torch.nn.Parameter(prefix.clone())
        embeddings = torch.cat([context.expand(-1, classes, -1, -1), rest], dim=2)
        features = (backbone.encode_prompt_groups(embeddings, eot, shared) if grouped else
                    backbone.encode_token_embeddings(embeddings.flatten(0, 1), eot.flatten()).unflatten(0, eot.shape))
        features.pow(2).sum().backward()
        results.append((features.detach(), context.grad))
    (features, grad), (expected, expected_grad) = results
    assert len(continuation_calls) == len(backbone.model.transformer.resblocks)  # the fast path: once per layer
    assert features.shape == (groups, classes, backbone.embed_dim)
    assert torch.allclose(features, expected, atol=1e-5, rtol=0)
    assert torch.allclose(grad, expected_grad, atol=1e-5 * expected_grad.abs().max(), rtol=0)


def test_tiny_clip_architecture():
    model = create_clip("tiny-clip")
    assert 7.0e6 < sum(p.numel() for p in model.parameters()) < 8.0e6
    assert model.visual.preprocess_cfg["size"] in (32, (32, 32))


def test_real_models_fail_offline_with_one_line_that_says_how(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(BackboneError) as err:
        create_clip("ViT-B-16", "openai")
    message = str(err.value)
    assert "\n" not in message and "ViT-B-16/openai" in message and "backbone.pretrained" in message
    with pytest.raises(BackboneError, match="backbone.pretrained: '/no/such.pt' is neither a checkpoint"):
        create_clip("ViT-B-16", "/no/such.pt")
    with pytest.raises(BackboneError, match="backbone.name: unknown open_clip model 'ViT-Z-99'"):
        create_clip("ViT-Z-99")


def test_checkpoint_paths_go_through_the_same_loader(tiny_clip, tmp_path):
    from fedvlp.backbones.loaders import load_clip

    state = load_clip(load_spec(None)).model.state_dict()
    path = tmp_path / "tiny.pt"
    torch.save(state, path)
    spec = load_spec(None, [f"backbone.pretrained={path}"])
    loaded = load_clip(spec).model.state_dict()
    assert all(torch.equal(state[k], loaded[k]) for k in state)


def test_prompt_template_with_word_context_equals_the_plain_text_encoder(tiny_clip):
    from fedvlp.backbones.loaders import load_clip
    from fedvlp.methods.prompts import PromptTemplate

    backbone = load_clip(load_spec(None))
    names = ["red circle", "yellow cross", "blue diamond"]
    template = PromptTemplate(backbone, names, n_ctx=4)
    with torch.no_grad():
        learned = template.encode(template.init_context("a photo of a"))
    plain = backbone.encode_texts([f"a photo of a {n}." for n in names])
    assert torch.allclose(learned, plain, atol=1e-5)


def test_image_features_do_not_depend_on_batch_composition(tiny_clip):
    from fedvlp.backbones.loaders import load_clip

    backbone = load_clip(load_spec(None))
    images = np.random.default_rng(0).integers(0, 255, (300, 32, 32, 3), dtype=np.uint8)
    whole = backbone.encode_images(images)
    assert whole.shape == (300, 128)
    assert torch.allclose(whole.norm(dim=-1), torch.ones(300), atol=1e-5)
    assert torch.equal(backbone.encode_images(images[:256]), whole[:256])


def test_token_features_are_the_pooled_embedding_then_dense_patches(tiny_clip):
    from fedvlp.backbones.loaders import load_clip

    backbone = load_clip(load_spec(None))
    images = np.random.default_rng(1).integers(0, 255, (5, 32, 32, 3), dtype=np.uint8)
    tokens = backbone.encode_images(images, kind="tokens")
    assert tokens.shape == (5, 1 + 16, 128)  # 32 px / patch 8 = 4 x 4 patches
    assert torch.allclose(tokens[:, 0], backbone.encode_images(images), atol=1e-6)
    assert torch.allclose(tokens.norm(dim=-1), torch.ones(5, 17), atol=1e-5)
    assert not torch.allclose(tokens[:, 1], tokens[:, 2])  # patches differ
    with pytest.raises(ValueError, match="kind must be one of"):
        backbone.encode_images(images, kind="pixels")


def test_dense_features_work_for_any_open_clip_vit():
    """The value-path patch features are built from the generic open_clip ViT, not the tiny one: a randomly
    initialised ViT-B-16 gives [n, 1 + 196, 512], its pooled token the global feature."""
    torch.manual_seed(0)
    backbone = ClipBackbone(create_clip("ViT-B-16"), "ViT-B-16")
    images = np.random.default_rng(2).integers(0, 255, (2, 224, 224, 3), dtype=np.uint8)
    tokens = backbone.encode_images(images, kind="tokens")
    assert tokens.shape == (2, 1 + 14 * 14, 512)
    assert torch.allclose(tokens.norm(dim=-1), torch.ones(2, 197), atol=1e-5)
    assert torch.allclose(tokens[:, 0], backbone.encode_images(images), atol=1e-5)
    assert not torch.allclose(tokens[:, 1], tokens[:, 2])


@pytest.mark.parametrize("name", ["tiny-clip", "tiny-vilt"])
def test_shipped_weights_are_float16_under_20_mb_with_their_recipe_and_command(name):
    from dataclasses import asdict

    from fedvlp.backbones.pretrain_vilt import TinyViltRecipe
    from fedvlp.backbones.shipped import file_sha256, shipped_weights

    path, entry = shipped_weights(name), read_manifest()[name]
    assert entry["sha256"] == file_sha256(path) and entry["bytes"] == path.stat().st_size < 20 * 2**20
    assert {t.dtype for t in load_file(str(path)).values() if t.is_floating_point()} == {torch.float16}
    assert entry["recipe"] == asdict(TinyClipRecipe() if name == TINY_CLIP else TinyViltRecipe())
    assert entry["command"] == f"fedvlp pretrain {name}"


def test_a_short_budget_of_the_recipe_learns_repeats_and_ships(tmp_path, monkeypatch):
    """The pretraining recipe itself, at a budget a test can pay: zero-shot rises from chance, the same seed gives
    the same bits, and `ship` writes float16 weights whose checksum a changed byte breaks (one line)."""
    from fedvlp.backbones.pretrain_clip import measure_tiny_clip, pretrain_tiny_clip
    from fedvlp.backbones.shipped import regenerate, shipped_weights

    recipe = TinyClipRecipe(steps=100, pool_size=1000, eval_size=300, batch_size=64)
    results = []
    for run in ("a", "b"):
        monkeypatch.setenv("FEDVLP_CACHE_DIR", str(tmp_path / run))
        results.append(pretrain_tiny_clip(recipe, progress=False))
    a, b = (load_file(r["path"]) for r in results)
    assert all(torch.equal(a[k], b[k]) for k in a)
    print({k: v for k, v in results[0].items() if "map" in k})
    assert results[0]["zero_shot_map"] > results[0]["zero_shot_map_untrained"] + 0.1
    entry = regenerate(recipe, pretrain_tiny_clip, measure_tiny_clip, directory=tmp_path / "ship", progress=False)
    shipped = shipped_weights(TINY_CLIP, tmp_path / "ship")
    assert entry["figures"]["zero_shot_map"] == pytest.approx(results[0]["zero_shot_map"], abs=0.01)
    assert all(torch.equal(a[k].half(), t) for k, t in load_file(str(shipped)).items())
    data = bytearray(shipped.read_bytes())
    data[-1] ^= 1
    shipped.write_bytes(bytes(data))
    with pytest.raises(BackboneError, match=r"tiny-clip.safetensors: checksum does not match .*pretrain tiny-clip"):
        shipped_weights(TINY_CLIP, tmp_path / "ship")
