"""The int4 tile layout through AMX (TDPBSUD per group of 32, the group scales applied to
the stored int32 tiles) against the AVX-512 tile path: bitwise equal, and ms per sweep of
the 1.5B's 28 layers per row count (stop 35). Run from the repository root:

    mkdir -p /tmp/amx-build && python docs/bench-xeon-s35/scripts/amx_q4_sweep.py
"""

import sys
import time

import torch
from torch.utils.cpp_extension import load

from specdec.models import native
from specdec.models.quant import q4_quantize

torch.set_num_threads(2)
ext = load(
    name="amx_q4",
    sources=["docs/bench-xeon-s35/scripts/amx_q4.cpp"],
    extra_include_paths=["specdec/models/native"],
    extra_cflags=[
        "-O3",
        "-mavx2",
        "-mfma",
        "-fopenmp",
        "-mavx512f",
        "-mavx512bw",
        "-mavx512vl",
        "-mavx512vnni",
        "-mamx-tile",
        "-mamx-int8",
    ],
    extra_ldflags=["-fopenmp"],
    build_directory="/tmp/amx-build",
    verbose=False,
)
print("perm", ext.perm())
tiles = native.q4_tiles()
torch.manual_seed(0)
# correctness
w = q4_quantize(torch.randn(512, 1536) * 0.05)
tl = tiles(*w.tensors())
for R in (1, 2, 5, 9, 16, 17, 40):
    x = torch.randn(R, 1536)
    a, b = ext.gemv(x, tl, 512, True), ext.gemv(x, tl, 512, False)
    assert torch.equal(a, b), (R, (a - b).abs().max())
print("bitwise equal")
shapes = [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)]
layers = [
    [(n, tiles(*q4_quantize(torch.randn(n, k) * 0.05).tensors())) for n, k in shapes]
    for _ in range(28)
]
for rows in [int(r) for r in sys.argv[1:]] or (1, 2, 3, 4, 5, 8, 9, 12, 16):
    xs = {k: torch.randn(rows, k) for _, k in shapes}
    t = {"avx512": [], "amx": []}
    for _ in range(5):
        for mode in t:
            start = time.perf_counter()
            for layer in layers:
                for (_, k), (n, tl) in zip(shapes, layer, strict=False):
                    ext.gemv(xs[k], tl, n, mode == "amx")
            t[mode].append(time.perf_counter() - start)
    print(rows, {m: round(sorted(v)[2] * 1e3, 1) for m, v in t.items()}, flush=True)
