// The variants bf16_gemv_variants.py times (compiled there with load_inline).
#include "bf16_kernel.h"

namespace v {

// x permuted for `pairs`: in each block of 32, the 16 even positions then the 16 odd ones.
inline void permute(const float* x, float* xp, int64_t K) {
  for (int64_t k = 0; k < K; k += 32)
    for (int j = 0; j < 16; ++j) { xp[k + j] = x[k + 2 * j]; xp[k + 16 + j] = x[k + 2 * j + 1]; }
}

template <int R, int T, int DIST>
void pairs(const float* xp, const uint16_t* w, float* y, int64_t K, int64_t N, int64_t begin, int64_t end) {
  const __m512i hi = _mm512_set1_epi32(0xFFFF0000);
  int64_t n = begin;
  for (; n + T <= end; n += T) {
    __m512 acc[T][R];
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) acc[t][r] = _mm512_setzero_ps();
    const uint16_t* ahead = w + (n + DIST * T) * K;
    for (int64_t k = 0; k < K; k += 32) {
      for (int t = 0; t < T; ++t) _mm_prefetch(reinterpret_cast<const char*>(ahead + t * K + k), _MM_HINT_T0);
      __m512 we[T], wo[T];
      for (int t = 0; t < T; ++t) {
        const __m512i raw = _mm512_loadu_si512(w + (n + t) * K + k);
        we[t] = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
        wo[t] = _mm512_castsi512_ps(_mm512_and_si512(raw, hi));
      }
      for (int r = 0; r < R; ++r) {
        const __m512 xe = _mm512_loadu_ps(xp + r * K + k), xo = _mm512_loadu_ps(xp + r * K + k + 16);
        for (int t = 0; t < T; ++t) {
          acc[t][r] = _mm512_fmadd_ps(we[t], xe, acc[t][r]);
          acc[t][r] = _mm512_fmadd_ps(wo[t], xo, acc[t][r]);
        }
      }
    }
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) y[r * N + n + t] = _mm512_reduce_add_ps(acc[t][r]);
  }
  if (n < end) pairs<R, 1, DIST>(xp, w, y, K, N, n, end);
}

template <int T>
void touch(const uint16_t* w, float* y, int64_t K, int64_t N, int64_t begin, int64_t end) {
  int64_t n = begin;
  for (; n + T <= end; n += T) {
    __m512i acc = _mm512_setzero_si512();
    const uint16_t* ahead = w + (n + T) * K;
    for (int64_t k = 0; k < K; k += 32) {
      for (int t = 0; t < T; ++t) _mm_prefetch(reinterpret_cast<const char*>(ahead + t * K + k), _MM_HINT_T0);
      for (int t = 0; t < T; ++t) acc = _mm512_add_epi32(acc, _mm512_loadu_si512(w + (n + t) * K + k));
    }
    y[n] = (float)_mm512_reduce_add_epi32(acc);
  }
}

}  // namespace v

torch::Tensor ship_t(torch::Tensor x, torch::Tensor w, int64_t T) {
  const int64_t R = x.size(0), K = x.size(1), N = w.size(0);
  auto y = torch::empty({R, N}, x.options());
  const float* a = x.data_ptr<float>();
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  float* o = y.data_ptr<float>();
#define SHIP(RR, TT) if (R == RR && T == TT) { at::parallel_for(0, N, 64, [&](int64_t b, int64_t e) { bf16::rows_times_weights_512<RR, TT>(a, wp, o, K, N, b, e); }); return y; }
  SHIP(1, 4) SHIP(1, 6) SHIP(1, 8) SHIP(1, 12) SHIP(2, 4) SHIP(2, 6) SHIP(2, 8) SHIP(2, 10) SHIP(4, 3) SHIP(4, 4) SHIP(5, 3)
  TORCH_CHECK(false, "no such case");
}

torch::Tensor ship(torch::Tensor x, torch::Tensor w) {
  const int64_t R = x.size(0), K = x.size(1), N = w.size(0);
  auto y = torch::empty({R, N}, x.options());
  bf16::run(x.data_ptr<float>(), R, reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()), y.data_ptr<float>(), K, N);
  return y;
}

template <int R, int T, int DIST>
void run_pairs(const float* xp, const uint16_t* w, float* y, int64_t K, int64_t N) {
  at::parallel_for(0, N, 64, [&](int64_t b, int64_t e) { v::pairs<R, T, DIST>(xp, w, y, K, N, b, e); });
}

torch::Tensor pairs(torch::Tensor x, torch::Tensor w, int64_t T, int64_t dist) {
  const int64_t R = x.size(0), K = x.size(1), N = w.size(0);
  auto xp = torch::empty_like(x);
  for (int64_t r = 0; r < R; ++r) v::permute(x.data_ptr<float>() + r * K, xp.data_ptr<float>() + r * K, K);
  auto y = torch::empty({R, N}, x.options());
  const float* a = xp.data_ptr<float>();
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  float* o = y.data_ptr<float>();
#define CASE(RR, TT, DD) if (R == RR && T == TT && dist == DD) { run_pairs<RR, TT, DD>(a, wp, o, K, N); return y; }
  CASE(1, 1, 1) CASE(1, 2, 1) CASE(1, 4, 1) CASE(1, 8, 1) CASE(1, 4, 2) CASE(1, 2, 4)
  CASE(2, 4, 1) CASE(2, 2, 2) CASE(4, 2, 1) CASE(4, 3, 1) CASE(5, 2, 1)
  TORCH_CHECK(false, "no such case");
}

torch::Tensor touch(torch::Tensor w, int64_t T) {
  const int64_t K = w.size(1), N = w.size(0);
  auto y = torch::zeros({1, N}, torch::kFloat);
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  float* o = y.data_ptr<float>();
  at::parallel_for(0, N, 64, [&](int64_t b, int64_t e) {
    if (T == 1) v::touch<1>(wp, o, K, N, b, e); else if (T == 4) v::touch<4>(wp, o, K, N, b, e); else v::touch<8>(wp, o, K, N, b, e);
  });
  return y;
}
