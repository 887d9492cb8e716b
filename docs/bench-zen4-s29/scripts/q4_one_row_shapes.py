"""One-row GB/s (of the 4-bit weights alone) of wide shapes, row layout against tile layout
taking turns, weights cycled beyond the caches.

    python q4_one_row_shapes.py
"""

import time

import torch

from specdec.models import native
from specdec.models.quant import q4_quantize

torch.set_num_threads(2)
op, tiles = native.q4_gemv(), native.q4_tiles()
torch.manual_seed(0)
for n, k in [(151936, 896), (151936, 1536), (65536, 896)]:
    reps = max(2, int(120e6 / (n * k * 0.6)))
    ws = [q4_quantize(torch.randn(n, k) * 0.05) for _ in range(reps)]
    ts = [tiles(*w.tensors()) for w in ws]
    x = torch.randn(1, k).to(torch.bfloat16)
    res = {}
    for mode in ("row", "tile", "row", "tile"):
        times = []
        for _ in range(5):
            st = time.perf_counter()
            for w, t in zip(ws, ts, strict=True):
                op(x, *w.tensors(), None, t if mode == "tile" else None)
            times.append((time.perf_counter() - st) / reps)
        res[mode] = round(n * k * 0.5 / 1e3 / sorted(times)[2]) / 1e3  # GB/s of nibbles
    print(n, k, "GB/s", res, flush=True)
