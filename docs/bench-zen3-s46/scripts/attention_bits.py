"""The decode stack's outputs (a ragged 301/250-token prompt, then steps of 1-5 tokens) on the
head shapes of the registry models and two odd ones, fp32 and bf16: `save FILE` with one
build, `check FILE` with another says whether every output is bitwise the same. Run from the
repository root: it builds tiny models with tests/tiny.py."""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path("tests").resolve()))
import torch

from specdec.models.quant import quantize

from tiny import hf_tiny, native_from_hf

torch.set_num_threads(2)
SHAPES = [  # heads, kv heads, head dim
    (12, 2, 128),
    (14, 2, 64),
    (9, 3, 64),
    (8, 2, 32),
    (6, 2, 96),
]
outs = {}
timing = {}
for heads, kv, d in SHAPES:
    for dtype in (torch.float32, torch.bfloat16):
        cfg = dict(
            hidden_size=heads * d,
            intermediate_size=256,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            num_hidden_layers=2,
            max_position_embeddings=2048,
        )
        if d * heads != cfg["hidden_size"]:
            cfg["head_dim"] = d
        model = quantize(native_from_hf(hf_tiny("qwen2", seed=1, **cfg), dtype), "int4")
        model.decode_stack.forced = True
        cache = model.new_cache(2, 700)
        g = torch.Generator().manual_seed(0)
        with torch.inference_mode():
            p = torch.randint(0, 90, (2, 301), generator=g)
            t0 = time.perf_counter()
            h = [model(p, cache, num_new=torch.tensor([301, 250])).hidden]
            timing[(heads, kv, d, str(dtype))] = time.perf_counter() - t0
            for T in (1, 3, 1, 5):
                h.append(model(torch.randint(0, 90, (2, T), generator=g), cache).hidden)
        outs[(heads, kv, d, str(dtype))] = h
mode, path = sys.argv[1], sys.argv[2]
if mode == "save":
    torch.save(outs, path)
else:
    ref = torch.load(path)
    for key, hs in outs.items():
        pairs = list(zip(hs, ref[key], strict=True))
        same = all(torch.equal(a, b) for a, b in pairs)
        diff = max((a.float() - b.float()).abs().max().item() for a, b in pairs)
        print(key, "bitwise" if same else f"DIFFER max {diff:.3g}")
print({k: round(v, 3) for k, v in timing.items()})
