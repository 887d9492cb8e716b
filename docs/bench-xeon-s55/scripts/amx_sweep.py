"""The 1.5B's decode-step products on AMX tiles (amx_variants.cpp) against the shipped
kernel's two AVX-512 BF16 layouts (fp32-FMA panels of 32, `vdpbf16ps` pair panels of 16),
all three taking turns round by round: its 28 layers and head, random bf16 weights of the
real shapes (3.1 GB a layout; the AMX prototype reads the pair panels). First checks the
AMX product against F.linear. Prints ms a sweep per kernel and row count.
Usage: python amx_sweep.py [rounds] [rows,...] [V] [ahead]"""

import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

from specdec.models import native
from specdec.models.linear import pack_panels
from specdec.models.native import BASE_FLAGS, ISA_FLAGS

SOURCE = Path(__file__).with_name("amx_variants.cpp").read_text()


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    rows = [int(r) for r in sys.argv[2].split(",")] if len(sys.argv) > 2 else [1, 5, 8]
    V = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    ahead = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    torch.set_num_threads(2)
    amx = load_inline(
        "amx_proto",
        cpp_sources=SOURCE,
        functions=["amx", "amx_init"],
        extra_cflags=[*BASE_FLAGS, *ISA_FLAGS["avx512bf16"], "-mamx-tile", "-mamx-bf16"],
        extra_ldflags=["-fopenmp"],
    )
    assert amx.amx_init(), "the kernel refused AMX tile data"
    gemv = native.bf16_gemv()
    w = torch.randn(96, 1536).to(torch.bfloat16)
    for R in (1, 5, 8, 16):
        x = torch.randn(R, 1536).to(torch.bfloat16).float()
        got = amx.amx(x, pack_panels(w, 16, 2), 2, ahead)
        torch.testing.assert_close(got, F.linear(x, w.float()), atol=1e-3, rtol=1e-4)
        one = torch.cat([amx.amx(x[i : i + 1], pack_panels(w, 16, 2), 2, ahead) for i in range(R)])
        assert torch.equal(got, one), "not batch-invariant"
    print("amx matches F.linear and is batch-invariant", flush=True)
    shapes = [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)] * 28 + [(151936, 1536)]
    fma, pairs = [], []
    for N, K in shapes:
        wt = torch.randn(N, K).to(torch.bfloat16)
        fma.append((wt, pack_panels(wt, 32, 1)))
        pairs.append((wt, pack_panels(wt, 16, 2)))
    for R in rows:
        xs = {K: torch.randn(R, K).to(torch.bfloat16).float() for K in (1536, 8960)}

        sweeps = {
            "fma": lambda xs=xs: [gemv(xs[wt.shape[1]], wt, p) for wt, p in fma],
            "pairs": lambda xs=xs: [gemv(xs[wt.shape[1]], wt, p) for wt, p in pairs],
            "amx": lambda xs=xs: [amx.amx(xs[wt.shape[1]], p, V, ahead) for wt, p in pairs],
        }
        times = {n: [] for n in sweeps}
        for r in range(rounds):
            order = list(sweeps) if r % 2 == 0 else list(reversed(list(sweeps)))
            for name in order:
                t0 = time.perf_counter()
                sweeps[name]()
                times[name].append(time.perf_counter() - t0)
        med = {n: 1000 * statistics.median(t) for n, t in times.items()}
        cells = ", ".join(f"{n} {m:.1f} ms" for n, m in med.items())
        print(f"R={R}: {cells}; fma / amx {med['fma'] / med['amx']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
