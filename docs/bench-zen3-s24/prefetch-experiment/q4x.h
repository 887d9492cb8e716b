// The Q4_K-style int4 product shared by q4_gemv.cpp (one projection per call) and
// decode_stack.cpp (every layer of a decode step in one call): format and arithmetic
// are described in q4_gemv.cpp.
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <vector>

namespace q4 {
inline int64_t PF_ROWS = 0;
inline int64_t GRAIN = 16;

constexpr int64_t SB = 256;  // weights per super-block
constexpr int GROUPS = 8;    // groups of 32 per super-block

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

struct Activations {
  std::vector<int8_t> xq;  // [R, K]
  std::vector<float> dx;   // [R, S] activation scale per super-block
  std::vector<float> u;    // [R, G] dx * (sum of xq over the group): pairs with the minimums
};

inline float as_float(float v) { return v; }
inline float as_float(at::BFloat16 v) { return static_cast<float>(v); }

template <typename In>
Activations quantize_rows(const In* xin, int64_t R, int64_t K, int64_t S) {
  std::vector<float> x(R * K);
  for (int64_t i = 0; i < R * K; ++i) x[i] = as_float(xin[i]);
  Activations a{std::vector<int8_t>(R * K), std::vector<float>(R * S), std::vector<float>(R * S * GROUPS, 0.f)};
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t s = 0; s < S; ++s) {
      const int64_t begin = s * SB, end = std::min(K, begin + SB);
      float ax = 0.f;
      for (int64_t k = begin; k < end; ++k) ax = std::max(ax, std::fabs(x[r * K + k]));
      const float iscale = ax > 0.f ? 127.f / ax : 0.f;
      const float dx = ax / 127.f;
      a.dx[r * S + s] = dx;
      for (int64_t k = begin; k < end; k += 32) {
        int32_t sum = 0;
        for (int64_t i = k; i < k + 32; ++i) {
          const int32_t q = static_cast<int32_t>(std::nearbyint(x[r * K + i] * iscale));
          a.xq[r * K + i] = static_cast<int8_t>(q);
          sum += q;
        }
        a.u[r * S * GROUPS + k / 32] = dx * static_cast<float>(sum);
      }
    }
  }
  return a;
}

// Rows [0, R) of the quantized activations against output rows [begin, end) of W. The
// integer accumulators take registers (one per row); the float ones live in a small array
// touched once per super-block, which lets one pass over a weight row serve up to 8 rows
// (with 8 float accumulators in registers too, it served 4, and a 5-row verify paid for
// a second pass: 18% more than this on the 1.5B's gate/up shape).
template <int R>
void rows_times_weights(const Activations& a, int64_t row0, const uint8_t* qs, const uint8_t* sc,
                        const uint8_t* mn, const float* d, const float* dmin, const float* bias,
                        float* y, int64_t K, int64_t N, int64_t S, int64_t begin, int64_t end) {
  const int64_t G = S * GROUPS;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const int8_t* xq = a.xq.data() + row0 * K;
  const float* dx = a.dx.data() + row0 * S;
  const float* u = a.u.data() + row0 * G;
  alignas(32) float facc[R][8];
  for (int64_t n = begin; n < end; ++n) {
    for (int r = 0; r < R; ++r) _mm256_store_ps(facc[r], _mm256_setzero_ps());
    const uint8_t* qn = qs + n * (K / 2);
    const uint8_t* scn = sc + n * G;
    const char* ahead = reinterpret_cast<const char*>(qn + PF_ROWS * (K / 2));
    if (PF_ROWS) { _mm_prefetch(reinterpret_cast<const char*>(sc + (n + PF_ROWS) * G), _MM_HINT_T0); _mm_prefetch(reinterpret_cast<const char*>(mn + (n + PF_ROWS) * G), _MM_HINT_T0); }
    for (int64_t s = 0; s < S; ++s) {
      if (PF_ROWS) { _mm_prefetch(ahead + s * 128, _MM_HINT_T0); _mm_prefetch(ahead + s * 128 + 64, _MM_HINT_T0); }
      const int64_t pairs = (std::min(K, (s + 1) * SB) - s * SB) / 64;
      __m256i iacc[R];
      for (int r = 0; r < R; ++r) iacc[r] = _mm256_setzero_si256();
      for (int64_t p = 0; p < pairs; ++p) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qn + s * 128 + p * 32));
        const __m256i lo = _mm256_and_si256(v, nibble);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
        const __m256i s_lo = _mm256_set1_epi16(scn[s * GROUPS + 2 * p]);
        const __m256i s_hi = _mm256_set1_epi16(scn[s * GROUPS + 2 * p + 1]);
        const int64_t k = s * SB + p * 64;
        for (int r = 0; r < R; ++r) {
          const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * K + k));
          const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * K + k + 32));
          iacc[r] = _mm256_add_epi32(iacc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), s_lo));
          iacc[r] = _mm256_add_epi32(iacc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), s_hi));
        }
      }
      const __m128i mins8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(mn + n * G + s * GROUPS));
      const __m256 mins = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mins8)),
                                        _mm256_set1_ps(dmin[n * S + s]));
      const float ds = d[n * S + s];
      for (int r = 0; r < R; ++r) {
        __m256 f = _mm256_load_ps(facc[r]);
        f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[r]), _mm256_set1_ps(ds * dx[r * S + s]), f);
        f = _mm256_fnmadd_ps(mins, _mm256_loadu_ps(u + r * G + s * GROUPS), f);
        _mm256_store_ps(facc[r], f);
      }
    }
    for (int r = 0; r < R; ++r) y[r * N + n] = hsum(_mm256_load_ps(facc[r])) + (bias ? bias[n] : 0.f);
  }
}

constexpr int64_t MAX_CHUNK = 8;  // rows per pass over a weight row (8 int accumulators)

// Rows in as few passes of at most MAX_CHUNK as there must be, split evenly (9 rows: 5 + 4,
// not 8 + 1, whose second pass repeats the weight unpacking for a single row); a pass
// after the first reads the weight row from L1, where the first left it.
inline void run(const Activations& a, int64_t R, const uint8_t* qs, const uint8_t* sc, const uint8_t* mn,
         const float* d, const float* dmin, const float* bias, float* y, int64_t K, int64_t N,
         int64_t S) {
  const int64_t passes = (R + MAX_CHUNK - 1) / MAX_CHUNK, chunk = (R + passes - 1) / passes;
  at::parallel_for(0, N, GRAIN, [&](int64_t begin, int64_t end) {
    for (int64_t n0 = begin; n0 < end; n0 += 8) {  // a tile of output rows, every row chunk
      const int64_t n1 = std::min(end, n0 + 8);
      for (int64_t r0 = 0; r0 < R; r0 += chunk) {
        float* yr = y + r0 * N;
        switch (std::min(chunk, R - r0)) {
#define Q4_ROWS(C) \
  case C: rows_times_weights<C>(a, r0, qs, sc, mn, d, dmin, bias, yr, K, N, S, n0, n1); break;
          Q4_ROWS(1) Q4_ROWS(2) Q4_ROWS(3) Q4_ROWS(4) Q4_ROWS(5) Q4_ROWS(6) Q4_ROWS(7)
          default: rows_times_weights<8>(a, r0, qs, sc, mn, d, dmin, bias, yr, K, N, S, n0, n1); break;
#undef Q4_ROWS
        }
      }
    }
  });
}

}  // namespace q4
