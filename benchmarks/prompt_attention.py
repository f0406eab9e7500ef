"""How much of the attention do FedAvg-P's prompts take before training, under each initialisation?

FedAvg-P prepends 16 input prompts before each of the tiny ViLT's first two layers (so 16, then 32, accumulate in
front of the real tokens). For a batch of training pairs of centralized_p_recipes (tuning seed 100, their missing
codes, the frozen shipped tiny ViLT), each prompted layer's attention is run as the method runs it, and the share of
the real tokens' attention (mean over heads, queries and pairs) that lands on prompt positions is reported, per
initialisation:

- reference: zeros with one row of ones per missing type (Lee et al.; what fedvlp ships);
- normal: i.i.d. normal with the real token embeddings' standard deviation;
- sampled tokens: real token embeddings drawn from the batch;
- minus the mean token, minus sampled tokens: their negatives (keys pointing away from the real ones').

A token initialisation acts before each layer's norm, which removes a prompt's scale, so only its direction can
lower its keys' scores; measured, none lowers the share much below the reference's.
Writes benchmarks/results/prompt_attention.json. Run: python benchmarks/prompt_attention.py
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
from _common import bench_spec, machine, parse_args, write_results

from fedvlp.backbones.loaders import load_backbone
from fedvlp.backbones.vilt import additive_attention_mask
from fedvlp.data import prepare_data
from fedvlp.data.missing import apply_missing
from fedvlp.methods.fedavg_p import ONES_ROW, prompted_layers

LENGTH = 16  # centralized_p_recipes' prompt_length


def prompt_shares(backbone, x: torch.Tensor, mask: torch.Tensor, codes: torch.Tensor,
                  prompts: torch.Tensor) -> list[float]:
    """Per prompted layer, the mean share of the real tokens' attention on the prompts ([type, layer, token, D])."""
    h, m, shares = x, mask, []
    per_sample = prompts[codes]
    for i in range(prompts.shape[1]):
        p = per_sample[:, i]
        h, m = torch.cat([p, h], 1), torch.cat([torch.ones(len(h), p.shape[1], dtype=torch.bool), m], 1)
        h, attention = backbone.model.encoder.layer[i](h, additive_attention_mask(m, h.dtype), output_attentions=True)
        count = (i + 1) * prompts.shape[2]
        on_prompts = attention.mean(1)[:, count:, :count].sum(-1)  # [B, queries]
        shares.append(float(on_prompts[m[:, count:]].mean()))
    return shares


@torch.no_grad()
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=256)
    parser.add_argument("--seed", type=int, default=100, help="a tuning seed")
    args = parse_args(parser, argv, __file__, tiny={"pairs": 16})
    spec = bench_spec("centralized_p_recipes", [f"seed={args.seed}"], args.tiny)
    data, backbone = prepare_data(spec), load_backbone(spec)
    index = np.arange(min(args.pairs, len(data.dataset.train)))
    train = data.dataset.train
    assert train.texts is not None and data.train_missing is not None
    texts, image_missing = apply_missing([train.texts[i] for i in index], data.train_missing[index])
    x, mask = backbone.embed(train.images.load(index, backbone.image_size[0]), texts, image_missing)
    codes = torch.as_tensor(data.train_missing[index]).long()
    layers, dim = prompted_layers(None, backbone.num_layers), backbone.hidden_size
    real = x[mask]
    generator = torch.Generator().manual_seed(0)
    draws = torch.randint(len(real), (3 * layers * LENGTH,), generator=generator)
    sampled = real[draws].reshape(3, layers, LENGTH, dim)
    reference = torch.zeros(3, layers, LENGTH, dim)
    for code, row in ONES_ROW.items():
        reference[code, :, row] = 1.0
    inits = {"reference": reference,
             "normal": torch.randn(3, layers, LENGTH, dim, generator=generator) * real.std(),
             "sampled tokens": sampled,
             "minus the mean token": -real.mean(0).expand(3, layers, LENGTH, dim).clone(),
             "minus sampled tokens": -sampled}
    shares = {name: prompt_shares(backbone, x, mask, codes, prompts) for name, prompts in inits.items()}
    real_tokens = float(mask.sum(1).float().mean())
    for name, per_layer in shares.items():
        print(f"{name:<22} " + "  ".join(f"layer {i}: {s:.3f}" for i, s in enumerate(per_layer)))
    print(f"real tokens per pair: {real_tokens:.1f}; prompts per layer: "
          + ", ".join(str((i + 1) * LENGTH) for i in range(layers)))
    write_results("prompt_attention", {"machine": machine(), "seed": args.seed, "pairs": len(index),
                                       "real_tokens_per_pair": real_tokens, "prompt_share": shares}, args)


if __name__ == "__main__":
    main()
