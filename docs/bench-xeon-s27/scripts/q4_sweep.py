"""ms per sweep of the 1.5B's 28 layers of int4 projections through the native kernel, per
row count, under one build: `SPECDEC_NATIVE_ISA=avx512|avx2 python q4_sweep.py`. Medians of
7 sweeps; run the builds in turn (the host drifts) and take medians over the turns."""

import json
import os
import time

import torch

from specdec.models import native
from specdec.models.quant import q4_quantize

os.environ["SPECDEC_NATIVE"] = "1"
torch.set_num_threads(2)
op = native.q4_gemv()
torch.manual_seed(0)
shapes = [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)]  # qkv, o, gate+up, down
layers = [[q4_quantize(torch.randn(n, k) * 0.05) for n, k in shapes] for _ in range(28)]
out = {}
for rows in (1, 2, 3, 4, 5, 8, 9):
    xs = {k: torch.randn(rows, k).to(torch.bfloat16) for _, k in shapes}
    times = []
    for _ in range(7):
        start = time.perf_counter()
        for layer in layers:
            for (_, k), q in zip(shapes, layer, strict=True):
                op(xs[k], q.qs, q.sc, q.mn, q.d, q.dmin)
        times.append(time.perf_counter() - start)
    out[rows] = round(sorted(times)[3] * 1e3, 2)
print(json.dumps({"isa": os.environ.get("SPECDEC_NATIVE_ISA", "widest"), "ms": out}))
