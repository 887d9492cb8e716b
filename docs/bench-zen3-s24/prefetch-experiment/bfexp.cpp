#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include "simd.h"  // specdec/models/native/simd.h
namespace {
using simd::hsum;
inline __m256 widen(const uint16_t* p) { return simd::widen_bf16(p); }
// variant 0: current. PF: prefetch distance in bytes ahead of the T-row block (0 = none)
template <int R, int T>
void rtw(const float* x, const uint16_t* w, float* y, int64_t K, int64_t N, int64_t begin, int64_t end, int64_t pf) {
  int64_t n = begin;
  for (; n + T <= end; n += T) {
    __m256 acc[T][R];
    for (int t = 0; t < T; ++t) for (int r = 0; r < R; ++r) acc[t][r] = _mm256_setzero_ps();
    const char* blk = reinterpret_cast<const char*>(w + n * K);
    for (int64_t k = 0; k < K; k += 32) {
      if (pf > 0) for (int t = 0; t < T; ++t) _mm_prefetch(blk + pf + (t * K + k) * 2, _MM_HINT_T0);
      if (pf < 0) for (int t = 0; t < T; ++t) _mm_prefetch(blk - pf + (t * K + k) * 2, _MM_HINT_T0);
      for (int kk = 0; kk < 32; kk += 8)
      for (int t = 0; t < T; ++t) {
        __m256 wf = widen(w + (n + t) * K + k + kk);
        for (int r = 0; r < R; ++r) acc[t][r] = _mm256_fmadd_ps(wf, _mm256_loadu_ps(x + r * K + k + kk), acc[t][r]);
      }
    }
    for (int t = 0; t < T; ++t) for (int r = 0; r < R; ++r) y[r * N + n + t] = hsum(acc[t][r]);
  }
  if (n < end) rtw<R, 1>(x, w, y, K, N, n, end, pf);
}
// variant 1: sequential, one row at a time, U independent accumulators along k
template <int R, int U>
void seq(const float* x, const uint16_t* w, float* y, int64_t K, int64_t N, int64_t begin, int64_t end, int64_t pf) {
  for (int64_t n = begin; n < end; ++n) {
    __m256 acc[U][R];
    for (int u = 0; u < U; ++u) for (int r = 0; r < R; ++r) acc[u][r] = _mm256_setzero_ps();
    const uint16_t* wn = w + n * K;
    for (int64_t k = 0; k < K; k += 8 * U) {
      if (pf) _mm_prefetch(reinterpret_cast<const char*>(wn + k) + pf, _MM_HINT_T0);
      for (int u = 0; u < U; ++u) {
        __m256 wf = widen(wn + k + 8 * u);
        for (int r = 0; r < R; ++r) acc[u][r] = _mm256_fmadd_ps(wf, _mm256_loadu_ps(x + r * K + k + 8 * u), acc[u][r]);
      }
    }
    for (int r = 0; r < R; ++r) { __m256 s = acc[0][r]; for (int u = 1; u < U; ++u) s = _mm256_add_ps(s, acc[u][r]); y[r * N + n] = hsum(s); }
  }
}
}
torch::Tensor gemv(torch::Tensor x, torch::Tensor w, int64_t variant, int64_t pf, int64_t grain) {
  const int64_t R = x.size(0), K = x.size(1), N = w.size(0);
  auto y = torch::empty({R, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, N, grain, [&](int64_t b, int64_t e) {
    if (variant == 0) {
      if (R == 1) rtw<1, 4>(xp, wp, yp, K, N, b, e, pf);
      else if (R == 2) rtw<2, 4>(xp, wp, yp, K, N, b, e, pf);
      else if (R == 4) rtw<4, 2>(xp, wp, yp, K, N, b, e, pf);
      else rtw<8, 1>(xp, wp, yp, K, N, b, e, pf);
    } else {
      if (R == 1) seq<1, 4>(xp, wp, yp, K, N, b, e, pf);
      else if (R == 2) seq<2, 4>(xp, wp, yp, K, N, b, e, pf);
      else if (R == 4) seq<4, 2>(xp, wp, yp, K, N, b, e, pf);
      else seq<8, 1>(xp, wp, yp, K, N, b, e, pf);
    }
  });
  return y;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("gemv", &gemv); }
