# ruff: noqa: E501  (C++ source in a string)
"""Scratch (not landed): the bf16 panel kernel's panel groups split statically between the
threads (at::parallel_for, as landed) against taken dynamically, CHUNK groups at a time
(OpenMP schedule(dynamic)), taking turns; bitwise the same products. GB/s of bf16 weights,
weights cycled through ~600 MB, median of 9.

    python docs/bench-zen3-s49/scripts/dyn_split.py 2 8   # CHUNK sizes
"""

import sys
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load_inline

from specdec.models.linear import pack_panels

ROOT = Path(__file__).resolve().parents[3]

src = r"""
#include "BF16_KERNEL_H"
#include <omp.h>
template <int R, int V>
void rows_dynamic(const float* x, const uint16_t* wp, float* y, int64_t K, int64_t N, int64_t chunk) {
  using bf16::PANEL;
  const int64_t whole = N / PANEL, groups = whole / V;
  const int64_t pieces = (groups + chunk - 1) / chunk;
#pragma omp parallel for schedule(dynamic, 1) num_threads(at::get_num_threads())
  for (int64_t c = 0; c < pieces; ++c) {
    const int64_t end = std::min(groups, (c + 1) * chunk);
    for (int64_t g = c * chunk; g < end; ++g)
      bf16::panels_times_rows<R, V>(x, wp + g * V * K * PANEL, y + g * V * PANEL, N, K);
  }
  for (int64_t p = groups * V; p < whole; ++p)
    bf16::panels_times_rows<R, 1>(x, wp + p * K * PANEL, y + p * PANEL, N, K);
}
at::Tensor run(at::Tensor x, at::Tensor panels, int64_t N, int64_t chunk) {
  const int64_t R = x.size(0), K = x.size(1);
  auto y = at::empty({R, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(panels.data_ptr<at::BFloat16>());
  float* yp = y.data_ptr<float>();
  bf16::in_row_chunks(R, [&](auto rows, int64_t r0) {
    constexpr int C = decltype(rows)::value;
    if (chunk == 0) bf16::panel_rows<C, bf16::panels_at_once(C)>(xp + r0 * K, wp, yp + r0 * N, K, N);
    else rows_dynamic<C, bf16::panels_at_once(C)>(xp + r0 * K, wp, yp + r0 * N, K, N, chunk);
  });
  return y;
}
"""
src = src.replace("BF16_KERNEL_H", str(ROOT / "specdec/models/native/bf16_kernel.h"))
mod = load_inline(
    "dynsplit",
    cpp_sources=[src],
    functions=["run"],
    extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
)
torch.set_num_threads(2)
torch.manual_seed(0)
CH = [int(a) for a in sys.argv[1:]] or [4, 16]
w = torch.randn(1024, 1536).to(torch.bfloat16)
p = pack_panels(w)
for r in (1, 5, 8):
    x = torch.randn(r, 1536)
    for c in CH:
        assert torch.equal(mod.run(x, p, 1024, 0), mod.run(x, p, 1024, c))
print("dynamic == static bitwise", flush=True)
shapes = {
    "qkv": (2048, 1536),
    "gate_up": (17920, 1536),
    "down": (1536, 8960),
    "head": (151936, 1536),
}
for name, (n, k) in shapes.items():
    copies = max(2, int(600e6 // (n * k * 2)))
    ps = [pack_panels(torch.randn(n, k).to(torch.bfloat16)) for _ in range(copies)]
    line = []
    for r in (1, 5, 8):
        x = torch.randn(r, k)
        times = {c: [] for c in [0, *CH]}
        for _ in range(9):
            for c in times:
                start = time.perf_counter()
                for q in ps:
                    mod.run(x, q, n, c)
                times[c].append((time.perf_counter() - start) / copies)
        gbs = {a: n * k * 2 / sorted(t)[4] / 1e9 for a, t in times.items()}
        line.append(f"{r}: " + " ".join(f"{gbs[a]:4.1f}" for a in times))
    print(f"{name:8s} GB/s [static, dynamic {CH}]", " | ".join(line), flush=True)
