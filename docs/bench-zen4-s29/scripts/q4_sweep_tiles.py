"""ms per sweep of the 1.5B's 28 layers of int4 projections through the native kernel, row
layout against tile layout taking turns, per row count (medians of 5 sweeps each).

    python q4_sweep_tiles.py
"""

import time

import torch

from specdec.models import native
from specdec.models.quant import q4_quantize

torch.set_num_threads(2)
op, tiles = native.q4_gemv(), native.q4_tiles()
torch.manual_seed(0)
shapes = [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)]
layers = []
for _ in range(28):
    ws = [q4_quantize(torch.randn(n, k) * 0.05) for n, k in shapes]
    layers.append([(w, tiles(*w.tensors())) for w in ws])
res = {}
for rows in (1, 2, 3, 4, 5, 8, 9):
    xs = {k: torch.randn(rows, k).to(torch.bfloat16) for _, k in shapes}
    t = {"row": [], "tile": []}
    for _ in range(5):
        for mode in ("row", "tile"):
            start = time.perf_counter()
            for layer in layers:
                for (_, k), (w, tl) in zip(shapes, layer, strict=True):
                    op(xs[k], *w.tensors(), None, tl if mode == "tile" else None)
            t[mode].append(time.perf_counter() - start)
    res[rows] = {m: round(sorted(v)[2] * 1e3, 1) for m, v in t.items()}
    print(rows, res[rows], flush=True)
