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

// W as panels of 32 outputs, [N / 32, K, 32] bf16: for each k one 64-byte line holds the 32
// outputs' weights. A shift and a mask split it into the even and the odd outputs as fp32
// (no cross-lane widening), each multiplied by x[r][k] broadcast: every output sums its
// products in one lane, in the order of k. V panels at a time; a panel is one sequential
// stream of K lines.
template <int R, int V, int PF>
inline void panel32(const float* x, const uint16_t* wp, float* y, int64_t ldy, int64_t K) {
  const __m512i hi = _mm512_set1_epi32(0xFFFF0000);
  __m512 ev[V][R], od[V][R];
  for (int v = 0; v < V; ++v)
    for (int r = 0; r < R; ++r) ev[v][r] = od[v][r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    for (int v = 0; v < V; ++v) {
      const uint16_t* line = wp + (v * K + k) * 32;
      if (PF) _mm_prefetch(reinterpret_cast<const char*>(line + PF * 32), _MM_HINT_T0);
      const __m512i raw = _mm512_loadu_si512(line);
      const __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
      const __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(raw, hi));
      for (int r = 0; r < R; ++r) {
        const __m512 xb = _mm512_set1_ps(x[r * K + k]);
        ev[v][r] = _mm512_fmadd_ps(we, xb, ev[v][r]);
        od[v][r] = _mm512_fmadd_ps(wo, xb, od[v][r]);
      }
    }
  }
  for (int v = 0; v < V; ++v)
    for (int r = 0; r < R; ++r) {
      alignas(64) float e[16], o[16];
      _mm512_store_ps(e, ev[v][r]);
      _mm512_store_ps(o, od[v][r]);
      float* out = y + r * ldy + v * 32;
      for (int i = 0; i < 16; ++i) { out[2 * i] = e[i]; out[2 * i + 1] = o[i]; }
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

template <int R, int V, int PF>
void run_panel32(const float* x, const uint16_t* wp, float* y, int64_t K, int64_t N) {
  const int64_t groups = N / 32 / V;
  at::parallel_for(0, groups, 1, [&](int64_t b, int64_t e) {
    for (int64_t g = b; g < e; ++g) v::panel32<R, V, PF>(x, wp + g * V * K * 32, y + g * V * 32, N, K);
  });
}

// x [R, K] fp32, wp [N / 32, K, 32] bf16 (N % (32 V) == 0) -> y [R, N].
torch::Tensor panels32(torch::Tensor x, torch::Tensor wp, int64_t V, int64_t pf) {
  const int64_t R = x.size(0), K = x.size(1), N = wp.size(0) * 32;
  auto y = torch::empty({R, N}, x.options());
  const float* a = x.data_ptr<float>();
  const uint16_t* w = reinterpret_cast<const uint16_t*>(wp.data_ptr<at::BFloat16>());
  float* o = y.data_ptr<float>();
#define P32(RR, VV, PP) \
  if (R == RR && V == VV && pf == PP) { run_panel32<RR, VV, PP>(a, w, o, K, N); return y; }
  P32(1, 2, 0) P32(1, 4, 0) P32(1, 4, 16) P32(1, 8, 0) P32(1, 8, 16)
  P32(2, 2, 0) P32(2, 4, 0) P32(2, 2, 16) P32(2, 4, 16)
  P32(4, 1, 16) P32(4, 2, 0) P32(4, 2, 16) P32(5, 1, 16) P32(5, 2, 0) P32(5, 2, 16)
  P32(8, 1, 16) P32(8, 1, 0)
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
