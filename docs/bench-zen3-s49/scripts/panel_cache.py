"""The native bf16 panel kernel (2 threads) with its weights cache-resident (one copy of 0.8
or 6.3 MB, called again and again) and streamed (100 copies, 629 MB): GB/s of bf16 weights,
median of 7, at 1, 5, 6 and 8 rows. Where 8 rows read alike in cache and streamed, the
kernel is bound by arithmetic, not by memory.

    python docs/bench-zen3-s49/scripts/panel_cache.py
"""

import time

import torch

from specdec.models import native
from specdec.models.linear import pack_panels

torch.set_num_threads(2)
op = native.bf16_gemv()
assert op is not None, "no native build on this machine"
for n, k, copies in [(256, 1536, 1), (2048, 1536, 1), (2048, 1536, 100)]:
    ps = [pack_panels(torch.randn(n, k).to(torch.bfloat16)) for _ in range(copies)]
    w = torch.randn(n, k).to(torch.bfloat16)
    line = []
    for r in (1, 5, 6, 8):
        x = torch.randn(r, k)
        reps = max(1, 200 // copies)
        times = []
        for _ in range(7):
            start = time.perf_counter()
            for _ in range(reps):
                for p in ps:
                    op(x, w, p)
            times.append((time.perf_counter() - start) / (reps * copies))
        line.append(f"{r}: {n * k * 2 / sorted(times)[3] / 1e9:5.1f}")
    mb = n * k * 2 * copies / 1e6
    print(f"N={n} K={k} copies={copies} ({mb:.1f} MB) GB/s", " | ".join(line), flush=True)
