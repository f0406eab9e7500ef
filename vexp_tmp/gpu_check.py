import json, torch, numpy as np
import sys, types
try:
    import open_clip
except ImportError:
    s = types.ModuleType("open_clip"); s.add_model_config = lambda *a, **k: None; sys.modules["open_clip"] = s
from fedvlp.backbones.vilt import create_vilt
from fedvlp.data.recipes import generate_recipes
torch.manual_seed(0)
cpu = create_vilt()
gpu = create_vilt(); gpu.load_state_dict(cpu.state_dict()); gpu = gpu.to("cuda")
r = generate_recipes(300, "train", 0)
miss = np.zeros(300, bool); miss[::4] = True
texts = [("" if i % 5 == 0 else t) for i, t in enumerate(r.texts)]
hc, mc = cpu.embed(r.images, texts, miss)
hg, mg = gpu.embed(r.images, texts, miss)
out = {"device": str(gpu.device), "embed_dev": str(hg.device), "embed_maxdiff": float((hc - hg).abs().max()),
       "mask_equal": bool(torch.equal(mc, mg))}
hg2, _ = gpu.embed(r.images, texts, miss)
out["gpu_embed_deterministic"] = bool(torch.equal(hg, hg2))
prompts = {0: torch.randn(4, 128, device="cuda", requires_grad=True), 2: torch.randn(300, 2, 128, device="cuda", requires_grad=True)}
h = hg.cuda().requires_grad_(True)
y = gpu.encode(h, mg.cuda(), prompts)
y[:, 6].sum().backward()
yc = cpu.encode(hc, mc, {k: v.detach().cpu() for k, v in prompts.items()})
out.update(shape=list(y.shape), encode_maxdiff=float((y.detach().cpu() - yc).abs().max()),
           prompt_grad=[float(p.grad.abs().sum()) for p in prompts.values()], hidden_grad=float(h.grad.abs().sum()),
           weight_grads=sum(p.grad is not None for p in gpu.parameters()))
print(json.dumps(out))
