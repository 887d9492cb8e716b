# ruff: noqa: E501  (C++ source in a string)
"""Scratch (not landed): the bf16 panel kernel with its software prefetch further ahead,
against the kernel as it is (column 0): the arguments are distances in bf16 elements of a
panel (512 = 1 KB = what the kernel uses). Same timing as kblock.py.

    python docs/bench-zen3-s49/scripts/kpf.py 512 2048 4096 8192
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
namespace kb {
using bf16::PANEL;
int64_t PF = 512;
template <int R, int V>
inline void acc_block(const float* x, int64_t ldx, const uint16_t* panel, int64_t K, int64_t k0, int64_t k1,
                      float* y, int64_t ldy, bool first) {
  __m256 acc[V][R];
  for (int v = 0; v < V; ++v)
    for (int r = 0; r < R; ++r) acc[v][r] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + r * ldy + v * PANEL);
  for (int64_t k4 = k0; k4 < k1; k4 += 4) {
    for (int v = 0; v < V; ++v)
      _mm_prefetch(reinterpret_cast<const char*>(panel + (v * K + k4) * PANEL + PF), _MM_HINT_T0);
    for (int kk = 0; kk < 4; ++kk) {
      const int64_t k = k4 + kk;
      __m256 wf[V];
      for (int v = 0; v < V; ++v) wf[v] = simd::widen_bf16(panel + (v * K + k) * PANEL);
      for (int r = 0; r < R; ++r) {
        const __m256 xb = _mm256_broadcast_ss(x + r * ldx + k);
        for (int v = 0; v < V; ++v) acc[v][r] = _mm256_fmadd_ps(wf[v], xb, acc[v][r]);
      }
    }
  }
  for (int v = 0; v < V; ++v)
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(y + r * ldy + v * PANEL, acc[v][r]);
}
template <int R, int V>
void rows_blocked(const float* x, const uint16_t* wp, float* y, int64_t K, int64_t N, int64_t KB) {
  const int64_t whole = N / PANEL, groups = whole / V;
  at::parallel_for(0, groups, std::max<int64_t>(1, 64 / (PANEL * V)), [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g)
        acc_block<R, V>(x, K, wp + g * V * K * PANEL, K, 0, K, y + g * V * PANEL, N, true);
  });
  for (int64_t p = groups * V; p < whole; ++p)
    acc_block<R, 1>(x, K, wp + p * K * PANEL, K, 0, K, y + p * PANEL, N, true);
}
}
at::Tensor run(at::Tensor x, at::Tensor panels, int64_t N, int64_t KB) {
  const int64_t R = x.size(0), K = x.size(1);
  TORCH_CHECK(N % 8 == 0 && R <= 8);
  auto y = at::empty({R, N}, x.options());
  const float* xp = x.data_ptr<float>(); const uint16_t* wp = reinterpret_cast<const uint16_t*>(panels.data_ptr<at::BFloat16>());
  float* yp = y.data_ptr<float>();
  bf16::in_row_chunks(R, [&](auto rows, int64_t r0) {
    constexpr int C = decltype(rows)::value;
    if (KB == 0) bf16::panel_rows<C, bf16::panels_at_once(C)>(xp + r0 * K, wp, yp + r0 * N, K, N);
    else { kb::PF = KB; kb::rows_blocked<C, bf16::panels_at_once(C)>(xp + r0 * K, wp, yp + r0 * N, K, N, KB); }
  });
  return y;
}
"""
src = src.replace("BF16_KERNEL_H", str(ROOT / "specdec/models/native/bf16_kernel.h"))
mod = load_inline(
    "kpf",
    cpp_sources=[src],
    functions=["run"],
    extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
    verbose=False,
)
torch.set_num_threads(2)
torch.manual_seed(0)
KBS = [int(a) for a in sys.argv[1:]] or [256, 512]
# exactness: blocked == unblocked bitwise
w = torch.randn(136, 1024).to(torch.bfloat16)
p = pack_panels(w)
for r in range(1, 9):
    x = torch.randn(r, 1024)
    base = mod.run(x, p, 136, 0)
    for kbs in KBS:
        assert torch.equal(base, mod.run(x, p, 136, kbs)), (r, kbs)
print("blocked == unblocked bitwise", flush=True)
shapes = {"qkv": (2048, 1536), "gate_up": (17920, 1536), "down": (1536, 8960)}
for name, (n, k) in shapes.items():
    copies = max(2, int(600e6 // (n * k * 2)))
    ps = [pack_panels(torch.randn(n, k).to(torch.bfloat16)) for _ in range(copies)]
    line = []
    for r in (1, 5, 6, 8):
        x = torch.randn(r, k)
        times = {kb: [] for kb in [0, *KBS]}
        for _ in range(7):
            for kbs in times:
                start = time.perf_counter()
                for p in ps:
                    mod.run(x, p, n, kbs)
                times[kbs].append((time.perf_counter() - start) / copies)
        gbs = {a: n * k * 2 / sorted(t)[3] / 1e9 for a, t in times.items()}
        line.append(f"{r}: " + " ".join(f"{gbs[a]:4.1f}" for a in times))
    print(f"{name:8s} GB/s [0 {KBS}]", " | ".join(line), flush=True)
