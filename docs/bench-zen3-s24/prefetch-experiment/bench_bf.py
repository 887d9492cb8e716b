"""bf16 kernel variants (bfexp.cpp): the kernel before prefetching (v0, pf 0), with the
next T-row block prefetched (v0, pf = the block's bytes), with each stream prefetched
1-2 KB ahead in its row (v0, negative pf), and one row at a time prefetched ahead (v1).
GB/s of the bf16 bytes each call reads, weights cycled through 400 MB, best of 5.

    .venv/bin/python docs/bench-zen3-s24/prefetch-experiment/bench_bf.py
"""

import tempfile
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

HERE = Path(__file__).parent
NATIVE = HERE.parents[2] / "specdec" / "models" / "native"  # simd.h
VARIANTS = [(0, 0), (0, 1), (0, -1024), (0, -2048), (1, 1024), (1, 2048)]  # pf 1: a block


def main() -> None:
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as build:
        m = load(
            name="bfexp",
            sources=[str(HERE / "bfexp.cpp")],
            extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp", f"-I{NATIVE}"],
            extra_ldflags=["-fopenmp"],
            build_directory=build,
        )
        for n, k in [(17920, 1536), (1536, 8960), (2048, 1536), (151936, 1536)]:
            per = n * k * 2
            copies = max(2, int(400e6 // per) + 1)
            ws = [torch.randn(n, k).to(torch.bfloat16) for _ in range(copies)]
            for rows in (1, 2, 4):
                x = torch.randn(rows, k)
                ref = torch.nn.functional.linear(x, ws[0].float())
                line = []
                for variant, pf in VARIANTS:
                    if variant == 0 and pf == 1:  # one T-row block ahead (T = 4, 2 or 1)
                        pf = (4 if rows <= 2 else 2 if rows == 4 else 1) * k * 2
                    y = m.gemv(x, ws[0], variant, pf, 64)
                    assert torch.allclose(y, ref, rtol=1e-3, atol=1e-2), (variant, pf)
                    times = []
                    for _ in range(5):
                        start = time.perf_counter()
                        for w in ws:
                            m.gemv(x, w, variant, pf, 64)
                        times.append((time.perf_counter() - start) / len(ws))
                    line.append(f"v{variant}/pf{pf}:{per / min(times) / 1e9:5.1f}")
                print(n, k, rows, " ".join(line), flush=True)


if __name__ == "__main__":
    main()
