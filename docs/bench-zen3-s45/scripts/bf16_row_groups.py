"""The native bf16 product at 4-8 rows: the shipped loop against rows of x in groups over a
block of weight rows (the shipped header with `bf16_kernel_grouped.patch`, beside this
script, applied; not shipped), built as variants of one source with macros and timed in
turns, weights cycled beyond the caches.

    python docs/bench-zen3-s45/scripts/bf16_row_groups.py 4,5,6,7,8

Prints GB/s of bf16 weights streamed per variant (the median of 11 turns). In the
patched header `GROUPED_FROM` (default 99: never) is the row count the grouped loop takes
over from, `GG` the rows of x per group and `GT` the weight rows per block.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

HERE = Path(__file__).parent
NATIVE = Path(__file__).resolve().parents[3] / "specdec" / "models" / "native"
VARIANTS = {
    "shipped": "",
    "g3t3": "-DGROUPED_FROM=5 -DGG=3 -DGT=3",
    "g4t2": "-DGROUPED_FROM=5 -DGG=4 -DGT=2",
}
SHAPES = [(17920, 1536), (1536, 8960), (2048, 1536)]  # the 1.5B's gate/up, down, qkv


def build(name: str, flags: str):
    src = Path(tempfile.mkdtemp(prefix=f"bf16_{name}_"))
    for f in ("bf16_gemv.cpp", "simd.h", "bf16_kernel.h"):
        shutil.copy(NATIVE / f, src / f)
    if name != "shipped":
        patch = HERE / "bf16_kernel_grouped.patch"
        subprocess.run(["patch", "-s", str(src / "bf16_kernel.h"), str(patch)], check=True)
    cflags = ["-O3", "-mavx2", "-mfma", "-fopenmp", *flags.split()]
    mod = load(
        name=f"v_{name}",
        sources=[str(src / "bf16_gemv.cpp")],
        extra_cflags=cflags,
        extra_ldflags=["-fopenmp"],
        build_directory=str(src),
        verbose=False,
    )
    return mod.bf16_gemv


def main() -> None:
    torch.set_num_threads(2)
    rows = [int(r) for r in (sys.argv[1] if len(sys.argv) > 1 else "4,5,6,7,8").split(",")]
    kernels = {name: build(name, flags) for name, flags in VARIANTS.items()}
    for n, k in SHAPES:
        weights = [torch.randn(n, k).bfloat16() for _ in range(max(2, int(600e6 // (n * k * 2))))]
        for r in rows:
            x = torch.randn(r, k)
            seconds = {name: [] for name in kernels}
            for _ in range(11):
                for name, fn in kernels.items():
                    fn(x, weights[0])
                    t = time.perf_counter()
                    for w in weights:
                        fn(x, w)
                    seconds[name].append((time.perf_counter() - t) / len(weights))
            line = "  ".join(
                f"{name}: {n * k * 2 / sorted(s)[5] / 1e9:5.1f}" for name, s in seconds.items()
            )
            print(f"{n}x{k} rows={r}  {line}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    main()
