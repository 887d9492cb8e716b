// Prototype: the bf16 product with AVX-512 BF16's `vdpbf16ps` (two bf16 products a lane,
// summed into an fp32 accumulator) against the shipped fp32-FMA panel kernel.
// W in "pair panels" [N / 16, K / 2, 16, 2]: for each pair of k, 16 outputs' two weights
// side by side (one 64-byte line); x as bf16 pairs (x[k], x[k + 1]) broadcast to all lanes.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cstring>

#include "bf16_kernel.h"

#if defined(__AVX512BF16__)  // the dp module (built with -mavx512bf16)
template <int R, int V>
inline void pairs_times_rows(const uint32_t* xp, const uint16_t* panel, float* y, int64_t ldy,
                             int64_t K2, int ahead) {
  __m512 acc[V][R];
  for (int v = 0; v < V; ++v)
    for (int r = 0; r < R; ++r) acc[v][r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K2; ++k) {
    for (int v = 0; v < V; ++v) {
      const uint16_t* line = panel + (v * K2 + k) * 32;
      if (ahead) _mm_prefetch(reinterpret_cast<const char*>(line + ahead * 32), _MM_HINT_T0);
      const __m512bh w = (__m512bh)_mm512_loadu_si512(line);
      for (int r = 0; r < R; ++r)
        acc[v][r] = _mm512_dpbf16_ps(acc[v][r], w, (__m512bh)_mm512_set1_epi32(xp[r * K2 + k]));
    }
  }
  for (int v = 0; v < V; ++v)
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + r * ldy + v * 16, acc[v][r]);
}

template <int R, int V>
void pair_rows(const uint32_t* xp, const uint16_t* wp, float* y, int64_t K2, int64_t N, int ahead) {
  const int64_t groups = N / 16 / V;
  at::parallel_for(0, groups, std::max<int64_t>(1, 64 / (16 * V)), [&](int64_t b, int64_t e) {
    for (int64_t g = b; g < e; ++g)
      pairs_times_rows<R, V>(xp, wp + g * V * K2 * 32, y + g * V * 16, N, K2, ahead);
  });
}

// x [R, K] fp32 (bf16 values), wp [N/16, K/2, 16, 2] bf16 -> y [R, N]
torch::Tensor dp(torch::Tensor x, torch::Tensor wp, int64_t V, int64_t ahead) {
  const int64_t R = x.size(0), K = x.size(1), N = wp.size(0) * 16, K2 = K / 2;
  auto xb = x.to(torch::kBFloat16).contiguous();
  auto y = torch::empty({R, N}, x.options());
  const uint32_t* xp = reinterpret_cast<const uint32_t*>(xb.data_ptr<at::BFloat16>());
  const uint16_t* w = reinterpret_cast<const uint16_t*>(wp.data_ptr<at::BFloat16>());
  float* out = y.data_ptr<float>();
  int a = static_cast<int>(ahead);
#define CASE(RR, VV) if (R == RR && V == VV) { pair_rows<RR, VV>(xp, w, out, K2, N, a); return y; }
  CASE(1, 1) CASE(1, 2) CASE(1, 4) CASE(1, 8)
  CASE(2, 1) CASE(2, 2) CASE(2, 4)
  CASE(4, 1) CASE(4, 2) CASE(4, 4)
  CASE(5, 1) CASE(5, 2) CASE(5, 4)
  CASE(8, 1) CASE(8, 2)
  TORCH_CHECK(false, "no case");
}
#else  // the ship module: stop 53's fp32-FMA panels, as an AVX-512 build without BF16 has them

torch::Tensor ship(torch::Tensor x, torch::Tensor panels) {
  const int64_t R = x.size(0), K = x.size(1), N = panels.size(0) * bf16::PANEL;
  auto y = torch::empty({R, N}, x.options());
  bf16::run_panels(x.data_ptr<float>(), R, reinterpret_cast<const uint16_t*>(panels.data_ptr<at::BFloat16>()),
                   y.data_ptr<float>(), K, N);
  return y;
}
#endif
