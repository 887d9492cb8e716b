"""The native bf16 kernel's two layouts of W, rows [N, K] and panels of 8 outputs
[ceil(N / 8), K, 8] (`linear.pack_panels`), from one build, taking turns.

Checks that the panels give the reference product within fp32 rounding and that each
row's result is the same whatever the row count; then times both layouts on the 1.5B's
shapes with the weights cycled through ~600 MB (nothing cache-resident), 7 alternating
pairs per cell, and prints GB/s of weight bytes (median), rows -> panels.

    python docs/bench-zen3-s48/scripts/bf16_panels.py
"""

import time

import torch
import torch.nn.functional as F

from specdec.models import native
from specdec.models.linear import pack_panels

torch.set_num_threads(2)
op = native.bf16_gemv()
assert op is not None, "no native build on this machine"
torch.manual_seed(0)
for n, k in [(41, 72), (131, 1536), (1536, 8960), (7, 8)]:
    w = torch.randn(n, k).to(torch.bfloat16)
    p = pack_panels(w)
    x = torch.randn(19, k)
    one = torch.cat([op(x[i : i + 1], w, p) for i in range(19)])
    for r in range(1, 20):
        out = op(x[:r], w, p)
        ref = F.linear(x[:r].double(), w.double())  # fp32 sums of K terms: error ~ sqrt(K)
        bound = 1e-6 * k**0.5 * ref.abs().max().item()
        torch.testing.assert_close(out.double(), ref, atol=bound, rtol=0)
        assert torch.equal(out, one[:r]), (n, k, r)
print("panels: float64 reference within fp32 rounding, batch-invariant (4 shapes x 1-19 rows)")
shapes = {
    "qkv": (2048, 1536),
    "o": (1536, 1536),
    "gate_up": (17920, 1536),
    "down": (1536, 8960),
    "head": (151936, 1536),
}
for name, (n, k) in shapes.items():
    copies = max(2, int(600e6 // (n * k * 2)))
    ws = [torch.randn(n, k).to(torch.bfloat16) for _ in range(copies)]
    ps = [pack_panels(w) for w in ws]
    line = []
    for r in (1, 2, 3, 4, 5, 6, 7, 8):
        x = torch.randn(r, k)
        times = {False: [], True: []}
        for _ in range(7):
            for panels in (False, True):
                start = time.perf_counter()
                for w, p in zip(ws, ps, strict=True):
                    op(x, w, p if panels else None)
                times[panels].append((time.perf_counter() - start) / copies)
        gbs = {a: n * k * 2 / sorted(t)[3] / 1e9 for a, t in times.items()}
        line.append(f"{r}: {gbs[False]:4.1f} -> {gbs[True]:4.1f}")
    print(f"{name:8s}", " | ".join(line), flush=True)
