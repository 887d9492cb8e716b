"""One decode step's products, both kernels taking turns: the 1.5B's 28 layers (qkv 2048 x
1536, o 1536 x 1536, gate/up 17920 x 1536, down 1536 x 8960) and its head (151936 x 1536),
random bf16 weights (3.1 GB a layout), each in the fp32-FMA panels of 32 (`ship`, stop 53's
AVX-512 build) and in the pair panels (`dp`, the AVX-512 BF16 build), R rows of x through
the whole sweep, the two alternating round by round. Prints ms a sweep and the ratio.
Usage: python sweep_ab.py [rounds] [rows,...]"""

import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load_inline

from specdec.models.native import BASE_FLAGS, ISA_FLAGS

NATIVE = Path(__file__).resolve().parents[3] / "specdec" / "models" / "native"
SOURCE = Path(__file__).with_name("bf16_dp_variants.cpp").read_text()


def build(name, functions, isa):
    return load_inline(
        name,
        cpp_sources=SOURCE,
        functions=functions,
        extra_include_paths=[str(NATIVE)],
        extra_cflags=[*BASE_FLAGS, *ISA_FLAGS[isa]],
        extra_ldflags=["-fopenmp"],
    )


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    rows = [int(r) for r in sys.argv[2].split(",")] if len(sys.argv) > 2 else [1, 5]
    torch.set_num_threads(2)
    ship, dp = build("bf16_ship", ["ship"], "avx512"), build("bf16_dp", ["dp"], "avx512bf16")
    shapes = [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)] * 28 + [(151936, 1536)]
    p32, p16 = [], []
    for N, K in shapes:
        w = torch.randn(N, K).to(torch.bfloat16)
        p32.append(w.view(N // 32, 32, K).transpose(1, 2).contiguous())
        p16.append(w.view(N // 16, 16, K // 2, 2).permute(0, 2, 1, 3).contiguous())
    V = {1: 4, 2: 4, 3: 4, 4: 4, 5: 4, 6: 2, 7: 2, 8: 2}
    for R in rows:
        xs = {K: torch.randn(R, K).to(torch.bfloat16).float() for K in (1536, 8960)}
        sweeps = {
            "ship": lambda xs=xs: [ship.ship(xs[p.shape[1]], p) for p in p32],
            "dp": lambda xs=xs, R=R: [dp.dp(xs[2 * p.shape[1]], p, V[R], 0) for p in p16],
        }
        times = {n: [] for n in sweeps}
        for r in range(rounds):
            for name in sweeps if r % 2 == 0 else reversed(list(sweeps)):
                t0 = time.perf_counter()
                sweeps[name]()
                times[name].append(time.perf_counter() - t0)
        ratios = [s / d for s, d in zip(times["ship"], times["dp"], strict=True)]
        print(
            f"R={R}: ship {1000 * statistics.median(times['ship']):.1f} ms, dp "
            f"{1000 * statistics.median(times['dp']):.1f} ms a sweep; ship / dp per round "
            f"median {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
