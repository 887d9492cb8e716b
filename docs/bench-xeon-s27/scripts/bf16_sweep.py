"""ms per sweep of the 1.5B's 28 layers of bf16 projections through the native kernel, per
row count, under one build: `SPECDEC_NATIVE_ISA=avx512|avx2 python bf16_sweep.py`. Medians
of 5 sweeps; run the builds in turn and take medians over the turns."""

import json
import os
import time

import torch

from specdec.models import native

os.environ["SPECDEC_NATIVE"] = "1"
torch.set_num_threads(2)
op = native.bf16_gemv()
torch.manual_seed(0)
shapes = [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)]  # qkv, o, gate+up, down
layers = [[(torch.randn(n, k) * 0.05).to(torch.bfloat16) for n, k in shapes] for _ in range(28)]
out = {}
for rows in (1, 2, 4, 5, 8):
    xs = {k: torch.randn(rows, k) for _, k in shapes}
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for layer in layers:
            for (_, k), w in zip(shapes, layer, strict=True):
                op(xs[k], w)
        times.append(time.perf_counter() - start)
    out[rows] = round(sorted(times)[2] * 1e3, 1)
print(json.dumps({"isa": os.environ.get("SPECDEC_NATIVE_ISA", "widest"), "ms": out}))
