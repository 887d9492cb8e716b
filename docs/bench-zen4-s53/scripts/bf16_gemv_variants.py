"""Ways to stream a bf16 weight matrix for one to five rows of x on an AVX-512 CPU, timed
in turns against the kernel the engine ships (bf16_kernel.h) and against a plain read.

Why: on this Zen 4 the engine's bf16 1-row products stream ~25 GB/s while `x.sum()`
reads ~42 GB/s, and oneDNN reads no faster than ours, so the bf16 1.5B's plain step sits at
~60% of the bound. Variants (R rows of x, T rows of W per register tile):
  ship     the shipped kernel (16 weights a load: a 32-byte load widened by vpmovzxwd)
  ship TN  its loop with N output rows per register tile (stop 52 shipped 4 for 1-2 rows,
           stop 53 ships 8; 3 for 3-5 rows)
  pairs    64-byte loads, 32 weights split into the even and odd ones by a shift and a mask
           (x permuted to match once a call), no cross-lane widening
  panels32 W in panels of 32 outputs ([N / 32, K, 32]: one 64-byte line a k), split into
           the even and odd outputs as `pairs` does, V panels at a time, a line pfN k
           ahead prefetched (stop 53 ships this layout: bf16_kernel.h)
  touch    the same loads as `pairs` with one integer add each: what the access pattern reads
Usage: python bf16_gemv_variants.py [rounds]
"""

import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load_inline

from specdec.models.native import BASE_FLAGS, ISA_FLAGS

NATIVE = Path(__file__).resolve().parents[3] / "specdec" / "models" / "native"

SOURCE = Path(__file__).with_suffix(".cpp").read_text()

SHIP_T = "--tiles" in sys.argv  # the tile heights of `ship` (stop 53 chose 8 from these)
PAIRS = False  # the `pairs` layout: measured slower than `ship` here (see the log)
FUNCS = ["ship", "ship_t", "pairs", "panels32", "touch"]


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    torch.set_num_threads(2)
    mod = load_inline(
        "bf16_variants",
        cpp_sources=SOURCE,
        functions=FUNCS,
        extra_include_paths=[str(NATIVE)],
        extra_cflags=[*BASE_FLAGS, *ISA_FLAGS["avx512"]],  # the engine's AVX-512 build
        extra_ldflags=["-fopenmp"],
        verbose=False,
    )
    shapes = {
        "mlp_up 17920x1536": (17920, 1536),
        "qkv 2048x1536": (2048, 1536),
        "mlp_down 1536x8960": (1536, 8960),
        "head 151936x1536": (151936, 1536),
    }
    names = [a for a in sys.argv[2:] if not a.startswith("--")]
    if names:
        shapes = {k: v for k, v in shapes.items() if k.split()[0] in names[0].split(",")}
    for label, (N, K) in shapes.items():
        copies = max(2, int(440e6 // (N * K * 2)))
        ws = [torch.randn(N, K).to(torch.bfloat16) for _ in range(copies)]
        nbytes = N * K * 2
        packed = {id(w): w.view(N // 32, 32, K).transpose(1, 2).contiguous() for w in ws}
        for R in (1, 2, 4, 5, 8):
            x = torch.randn(R, K)
            ref = x @ ws[0].float().T
            cands = {"ship": lambda w, x=x: mod.ship(x, w)}
            for T in (
                {1: (4, 6, 8, 12), 2: (4, 6, 8, 10), 4: (3, 4), 5: (), 8: ()}[R] if SHIP_T else ()
            ):
                cands[f"ship T{T}"] = lambda w, x=x, T=T: mod.ship_t(x, w, T)
            Ts = (
                {1: [(4, 1), (8, 1)], 2: [(4, 1)], 4: [(3, 1)], 5: [(2, 1)], 8: []}[R]
                if PAIRS
                else []
            )
            for T, d in Ts:
                cands[f"pairs T{T} d{d}"] = lambda w, x=x, T=T, d=d: mod.pairs(x, w, T, d)
            for V, pf in {
                1: [(2, 0), (4, 0), (4, 16), (8, 0), (8, 16)],
                2: [(2, 0), (4, 0), (2, 16), (4, 16)],
                4: [(1, 16), (2, 0), (2, 16)],
                5: [(1, 16), (2, 0), (2, 16)],
                8: [(1, 0), (1, 16)],
            }[R]:
                if N % (32 * V):  # the prototype takes whole groups of V panels only
                    continue
                cands[f"panels32 V{V} pf{pf}"] = lambda w, x=x, V=V, pf=pf, packed=packed: (
                    mod.panels32(x, packed[id(w)], V, pf)
                )
            if R == 1:
                for T in (4, 8):
                    cands[f"touch T{T}"] = lambda w, T=T: mod.touch(w, T)
            shipped = mod.ship(x, ws[0])
            for name, f in cands.items():
                if name.startswith("ship "):  # the tile height is scheduling only: same floats
                    assert torch.equal(f(ws[0]), shipped), name
                if not name.startswith("touch"):
                    err = (f(ws[0]) - ref).abs().max().item()
                    assert err < 1e-2 * ref.abs().max().item(), (name, err)
            times = {name: [] for name in cands}
            for _ in range(rounds):
                for name, f in cands.items():
                    f(ws[0])
                    t0 = time.perf_counter()
                    for w in ws:
                        f(w)
                    times[name].append((time.perf_counter() - t0) / len(ws))
            rates = {n: nbytes / statistics.median(t) / 1e9 for n, t in times.items()}
            line = ", ".join(f"{n} {rate:.1f}" for n, rate in rates.items())
            print(f"{label} R={R} GB/s: {line}", flush=True)
        big = torch.randn(256 * 1024 * 1024)  # 1 GiB fp32, as `specdec doctor` reads
        reads = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            big.sum()
            reads.append(big.numel() * 4 / (time.perf_counter() - t0) / 1e9)
        print(f"x.sum() over 1 GiB: {statistics.median(reads):.1f} GB/s", flush=True)
        del big


if __name__ == "__main__":
    main()
