# ruff: noqa: E501  (C++ source in a string)
"""Scratch (not landed): variants of the native bf16 panel kernel against the kernel as it
is (column 0), each bitwise the same products, taking turns. Prints GB/s of bf16 weights on
the 1.5B's shapes, weights cycled through ~600 MB (nothing cache-resident).

    python docs/bench-zen3-s49/scripts/panel_variants.py blocks 256 512 1024
    python docs/bench-zen3-s49/scripts/panel_variants.py prefetch 512 2048 4096 8192
    python docs/bench-zen3-s49/scripts/panel_variants.py dynamic 2 8

- blocks B: K in blocks of B, so that a block of the activations stays in L1 while every
  panel of a thread's share passes over it (partial sums kept in y between blocks).
- prefetch D: the software prefetch D bf16 elements of a panel ahead (the kernel: 512, 1 KB).
- dynamic C: the panel groups taken by the threads C at a time (OpenMP schedule(dynamic))
  instead of split in halves (at::parallel_for).
"""

import sys
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load_inline

from specdec.models.linear import pack_panels

ROOT = Path(__file__).resolve().parents[3]

SOURCE = r"""
#include "BF16_KERNEL_H"
#include <omp.h>
namespace variant {
using bf16::PANEL;
// R rows times V adjacent panels over k in [k0, k1), prefetching `ahead` elements ahead;
// the sums start from y unless `first`: the landed panels_times_rows with K split.
template <int R, int V>
inline void panels_times_rows(const float* x, const uint16_t* panel, float* y, int64_t N, int64_t K,
                              int64_t k0, int64_t k1, int64_t ahead, bool first) {
  __m256 acc[V][R];
  for (int v = 0; v < V; ++v)
    for (int r = 0; r < R; ++r) acc[v][r] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + r * N + v * PANEL);
  for (int64_t k4 = k0; k4 < k1; k4 += 4) {
    for (int v = 0; v < V; ++v)
      _mm_prefetch(reinterpret_cast<const char*>(panel + (v * K + k4) * PANEL + ahead), _MM_HINT_T0);
    for (int kk = 0; kk < 4; ++kk) {
      const int64_t k = k4 + kk;
      __m256 wf[V];
      for (int v = 0; v < V; ++v) wf[v] = simd::widen_bf16(panel + (v * K + k) * PANEL);
      for (int r = 0; r < R; ++r) {
        const __m256 xb = _mm256_broadcast_ss(x + r * K + k);
        for (int v = 0; v < V; ++v) acc[v][r] = _mm256_fmadd_ps(wf[v], xb, acc[v][r]);
      }
    }
  }
  for (int v = 0; v < V; ++v)
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(y + r * N + v * PANEL, acc[v][r]);
}
// Groups [begin, end) of V panels, K in blocks of `block` (0: whole).
template <int R, int V>
void groups(const float* x, const uint16_t* wp, float* y, int64_t K, int64_t N, int64_t begin, int64_t end,
            int64_t block, int64_t ahead) {
  const int64_t step = block ? block : K;
  for (int64_t k0 = 0; k0 < K; k0 += step)
    for (int64_t g = begin; g < end; ++g)
      panels_times_rows<R, V>(x, wp + g * V * K * PANEL, y + g * V * PANEL, N, K, k0, std::min(K, k0 + step),
                              ahead, k0 == 0);
}
template <int R, int V>
void rows(const float* x, const uint16_t* wp, float* y, int64_t K, int64_t N, int64_t block, int64_t ahead,
          int64_t chunk) {
  const int64_t whole = N / PANEL, count = whole / V;
  if (chunk) {
    const int64_t pieces = (count + chunk - 1) / chunk;
#pragma omp parallel for schedule(dynamic, 1) num_threads(at::get_num_threads())
    for (int64_t c = 0; c < pieces; ++c)
      groups<R, V>(x, wp, y, K, N, c * chunk, std::min(count, (c + 1) * chunk), block, ahead);
  } else {
    at::parallel_for(0, count, std::max<int64_t>(1, 64 / (PANEL * V)), [&](int64_t begin, int64_t end) {
      groups<R, V>(x, wp, y, K, N, begin, end, block, ahead);
    });
  }
  for (int64_t p = count * V; p < whole; ++p)
    panels_times_rows<R, 1>(x, wp + p * K * PANEL, y + p * PANEL, N, K, 0, K, ahead, true);
}
}  // namespace variant
// x [R, K] fp32, the panels of W [N, K] (N % 8 == 0) -> y [R, N]: the landed kernel where
// block, ahead and chunk are all 0, else the variant.
at::Tensor run(at::Tensor x, at::Tensor panels, int64_t N, int64_t block, int64_t ahead, int64_t chunk) {
  const int64_t R = x.size(0), K = x.size(1);
  TORCH_CHECK(N % 8 == 0 && R <= 8);
  auto y = at::empty({R, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(panels.data_ptr<at::BFloat16>());
  float* yp = y.data_ptr<float>();
  bf16::in_row_chunks(R, [&](auto rows, int64_t r0) {
    constexpr int C = decltype(rows)::value, V = bf16::panels_at_once(C);
    if (block == 0 && ahead == 0 && chunk == 0) bf16::panel_rows<C, V>(xp + r0 * K, wp, yp + r0 * N, K, N);
    else variant::rows<C, V>(xp + r0 * K, wp, yp + r0 * N, K, N, block, ahead ? ahead : 512, chunk);
  });
  return y;
}
"""

# mode -> (the argument's place in (block, ahead, chunk), rows, shapes, turns a cell),
# as each experiment ran (docs/bench-zen3-s49/kblock.log, kpf.log, dyn_split.log).
QKV, GATE_UP, DOWN, HEAD = (2048, 1536), (17920, 1536), (1536, 8960), (151936, 1536)
MODES = {
    "blocks": (0, (1, 4, 5, 6, 7, 8), {"qkv": QKV, "gate_up": GATE_UP, "down": DOWN}, 7),
    "prefetch": (1, (1, 5, 6, 8), {"qkv": QKV, "gate_up": GATE_UP, "down": DOWN}, 7),
    "dynamic": (2, (1, 5, 8), {"qkv": QKV, "gate_up": GATE_UP, "down": DOWN, "head": HEAD}, 9),
}


def main() -> None:
    mode, values = sys.argv[1], [int(a) for a in sys.argv[2:]]
    place, row_counts, shapes, turns = MODES[mode]
    variants = {0: (0, 0, 0)}
    for value in values:
        args = [0, 0, 0]
        args[place] = value
        variants[value] = tuple(args)
    source = SOURCE.replace("BF16_KERNEL_H", str(ROOT / "specdec/models/native/bf16_kernel.h"))
    mod = load_inline(
        "panel_variants",
        cpp_sources=[source],
        functions=["run"],
        extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
    )
    torch.set_num_threads(2)
    torch.manual_seed(0)
    panels = pack_panels(torch.randn(136, 1024).to(torch.bfloat16))
    for r in range(1, 9):
        x = torch.randn(r, 1024)
        landed = mod.run(x, panels, 136, 0, 0, 0)
        for args in variants.values():
            assert torch.equal(landed, mod.run(x, panels, 136, *args)), (r, args)
    print(f"{mode}: bitwise the landed kernel's products", flush=True)
    for name, (n, k) in shapes.items():
        copies = max(2, int(600e6 // (n * k * 2)))
        ps = [pack_panels(torch.randn(n, k).to(torch.bfloat16)) for _ in range(copies)]
        line = []
        for r in row_counts:
            x = torch.randn(r, k)
            times = {value: [] for value in variants}
            for _ in range(turns):
                for value, args in variants.items():
                    start = time.perf_counter()
                    for p in ps:
                        mod.run(x, p, n, *args)
                    times[value].append((time.perf_counter() - start) / copies)
            gbs = {v: n * k * 2 / sorted(t)[turns // 2] / 1e9 for v, t in times.items()}
            line.append(f"{r}: " + " ".join(f"{gbs[v]:4.1f}" for v in times))
        print(f"{name:8s} GB/s [0 {values}]", " | ".join(line), flush=True)


if __name__ == "__main__":
    main()
