"""The bf16 kernel before and after row groups (stop 47), built side by side in one process.

Builds `bf16_kernel.h` as of BEFORE (a commit) and as in the working tree into one extension,
checks that both give bitwise the same products for 1-19 rows on several shapes, then
times both on the 1.5B's shapes with the weights cycled through ~600 MB (nothing
cache-resident), the two builds taking turns. Prints GB/s of weight bytes, before -> after.

    python docs/bench-zen3-s47/scripts/bf16_groups.py [BEFORE]   # BEFORE defaults to 5b73fc0
"""

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

ROOT = Path(__file__).resolve().parents[3]
NATIVE = ROOT / "specdec" / "models" / "native"
before = sys.argv[1] if len(sys.argv) > 1 else "5b73fc0"
work = Path(tempfile.mkdtemp(prefix="bf16_groups_"))
old = subprocess.run(
    ["git", "-C", str(ROOT), "show", f"{before}:specdec/models/native/bf16_kernel.h"],
    check=True,
    capture_output=True,
    text=True,
).stdout
(work / "simd.h").write_text((NATIVE / "simd.h").read_text())
(work / "old.h").write_text(old.replace("namespace bf16 {", "namespace bf16_old {"))
new = (NATIVE / "bf16_kernel.h").read_text().replace("#pragma once", "")
(work / "new.h").write_text(new.replace('#include "simd.h"', ""))
(work / "both.cpp").write_text(
    """#include "old.h"
#include "new.h"
torch::Tensor run(torch::Tensor x, torch::Tensor w, bool after) {
  const int64_t R = x.size(0), K = x.size(1), N = w.size(0);
  auto y = torch::empty({R, N}, x.options());
  auto wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  if (after) bf16::run(x.data_ptr<float>(), R, wp, y.data_ptr<float>(), K, N);
  else bf16_old::run(x.data_ptr<float>(), R, wp, y.data_ptr<float>(), K, N);
  return y;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }
"""
)
torch.set_num_threads(2)
flags = ["-O3", "-mavx2", "-mfma", "-fopenmp"]
m = load(
    name="bf16_groups",
    sources=[str(work / "both.cpp")],
    extra_cflags=flags,
    extra_ldflags=["-fopenmp"],
    build_directory=str(work),
)
torch.manual_seed(0)
for n, k in [(43, 72), (131, 1536), (1536, 8960), (2048, 1536), (7, 8), (65, 896)]:
    w = torch.randn(n, k).to(torch.bfloat16)
    for r in range(1, 20):
        x = torch.randn(r, k)
        assert torch.equal(m.run(x, w, False), m.run(x, w, True)), (n, k, r)
print("bitwise equal: 6 shapes x 1-19 rows")
shapes = {"qkv": (2048, 1536), "o": (1536, 1536), "gate_up": (17920, 1536), "down": (1536, 8960)}
for name, (n, k) in shapes.items():
    copies = max(2, int(600e6 // (n * k * 2)))
    ws = [torch.randn(n, k).to(torch.bfloat16) for _ in range(copies)]
    line = []
    for r in range(1, 9):
        x = torch.randn(r, k)
        times = {False: [], True: []}
        for _ in range(5):
            for after in (False, True):
                start = time.perf_counter()
                for w in ws:
                    m.run(x, w, after)
                times[after].append((time.perf_counter() - start) / copies)
        gbs = {a: n * k * 2 / sorted(t)[2] / 1e9 for a, t in times.items()}
        line.append(f"{r}: {gbs[False]:4.1f} -> {gbs[True]:4.1f}")
    print(f"{name:8s}", " | ".join(line), flush=True)
