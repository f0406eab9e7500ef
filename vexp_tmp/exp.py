"""Compare tiny-ViLT pretraining variants on one device, sequentially."""
import json, sys, time, types
try:
    import open_clip  # noqa
except ImportError:  # the device has no open_clip; the ViLT code does not need it
    stub = types.ModuleType("open_clip"); stub.add_model_config = lambda *a, **k: None
    sys.modules["open_clip"] = stub
import torch
from fedvlp.backbones.pretrain import TinyViltRecipe, pretrain_tiny_vilt
device = sys.argv[1]
for line in open(sys.argv[2]):
    kw = json.loads(line)
    t = time.time()
    r = pretrain_tiny_vilt(TinyViltRecipe(**kw), progress=False, device=device)
    r["total"] = time.time() - t
    r.pop("path")
    print(json.dumps({"variant": kw, **{k: round(v, 4) for k, v in r.items()}}), flush=True)
