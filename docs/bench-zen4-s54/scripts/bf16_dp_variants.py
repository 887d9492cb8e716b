"""`vdpbf16ps` on pair panels against the shipped fp32-FMA panels, the 1.5B's shapes from
memory, rows 1-8, timed in turns (see the .cpp). Usage: python bf16_dp_variants.py [rounds]"""

import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load_inline

from specdec.models.native import BASE_FLAGS, ISA_FLAGS

NATIVE = Path(__file__).resolve().parents[3] / "specdec" / "models" / "native"


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    torch.set_num_threads(2)

    # Two builds of one source: bf16_kernel.h's panels are the fp32-FMA ones without
    # -mavx512bf16 (`ship`, stop 53) and the pair panels with it (the kernel since stop 54).
    def build(name, functions, isa):
        return load_inline(
            name,
            cpp_sources=Path(__file__).with_suffix(".cpp").read_text(),
            functions=functions,
            extra_include_paths=[str(NATIVE)],
            extra_cflags=[*BASE_FLAGS, *ISA_FLAGS[isa]],
            extra_ldflags=["-fopenmp"],
        )

    ship, dp = build("bf16_ship", ["ship"], "avx512"), build("bf16_dp", ["dp"], "avx512bf16")
    shapes = {"mlp_up": (17920, 1536), "qkv": (2048, 1536), "mlp_down": (1536, 8960)}
    for label, (N, K) in shapes.items():
        copies = max(2, int(440e6 // (N * K * 2)))
        ws = [torch.randn(N, K).to(torch.bfloat16) for _ in range(copies)]
        p32 = [w.view(N // 32, 32, K).transpose(1, 2).contiguous() for w in ws]
        p16 = [w.view(N // 16, 16, K // 2, 2).permute(0, 2, 1, 3).contiguous() for w in ws]
        for R in (1, 2, 3, 4, 5, 8):
            x = torch.randn(R, K).to(torch.bfloat16).float()
            ref = x.double() @ ws[0].double().T
            cands = {"ship": lambda i, x=x, p32=p32: ship.ship(x, p32[i])}
            for V in (1, 2, 4) if R <= 5 else (1, 2):
                for ahead in (0, 16):
                    if R in (1, 2, 4, 5, 8) and not (R == 8 and V == 4):
                        cands[f"dp V{V} a{ahead}"] = lambda i, x=x, V=V, a=ahead, p16=p16: dp.dp(
                            x, p16[i], V, a
                        )
            for name, f in cands.items():
                err = (f(0).double() - ref).abs().max().item()
                assert err < 1e-3 * ref.abs().max().item(), (name, err)
            times = {name: [] for name in cands}
            for _ in range(rounds):
                for name, f in cands.items():
                    f(0)
                    t0 = time.perf_counter()
                    for i in range(len(ws)):
                        f(i)
                    times[name].append((time.perf_counter() - t0) / len(ws))
            rates = {n: N * K * 2 / statistics.median(t) / 1e9 for n, t in times.items()}
            print(
                f"{label} R={R} GB/s: " + ", ".join(f"{n} {r:.1f}" for n, r in rates.items()),
                flush=True,
            )
    # The arithmetic's ceiling: a [512, 1536] matrix (1.5 MB, the two cores' L2) 200 times.
    N, K = 512, 1536
    w = torch.randn(N, K).to(torch.bfloat16)
    p32 = w.view(N // 32, 32, K).transpose(1, 2).contiguous()
    p16 = w.view(N // 16, 16, K // 2, 2).permute(0, 2, 1, 3).contiguous()
    for R in (1, 2, 4, 5, 8):
        x = torch.randn(R, K).to(torch.bfloat16).float()
        cands = {"ship": lambda x=x: ship.ship(x, p32)}
        for V in (1, 2, 4) if R < 8 else (1, 2):
            cands[f"dp V{V}"] = lambda x=x, V=V: dp.dp(x, p16, V, 0)
        rates = {}
        for name, f in cands.items():
            times = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                for _ in range(200):
                    f()
                times.append((time.perf_counter() - t0) / 200)
            rates[name] = R * N * K / statistics.median(times) / 1e9
        print(
            f"in cache R={R} GMAC/s: " + ", ".join(f"{n} {r:.0f}" for n, r in rates.items()),
            flush=True,
        )
    big = torch.randn(256 * 1024 * 1024)  # 1 GiB fp32, as `specdec doctor` reads
    reads = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        big.sum()
        reads.append(big.numel() * 4 / (time.perf_counter() - t0) / 1e9)
    print(f"x.sum() over 1 GiB: {statistics.median(reads):.1f} GB/s", flush=True)


if __name__ == "__main__":
    main()
