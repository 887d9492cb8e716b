"""The native int4 product's cost per row as the rows grow (random weights of the 1.5B's
gate/up and down shapes, 2 threads): flat up to a block, and since the row blocks, flat past
it too."""

import time

import torch

from specdec.models import native
from specdec.models.quant import q4_quantize

torch.set_num_threads(2)
f = native.q4_gemv()
for N, K in [(17920, 1536), (1536, 8960)]:
    w = q4_quantize(torch.randn(N, K) * 0.02)
    t = w.tensors()
    for R in [1, 8, 9, 16, 64, 65, 128, 512, 2048]:
        x = torch.randn(R, K)
        f(x, *t)
        reps = max(1, 256 // R)
        best = 1e9
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(reps):
                f(x, *t)
            best = min(best, (time.perf_counter() - t0) / reps)
        us_a_row, rate = best / R * 1e6, R * N * K / best / 1e9
        print(
            f"{N}x{K} R={R:5d}: {best * 1e3:8.2f} ms  {us_a_row:7.1f} us a row  {rate:5.1f} GMAC/s"
        )
