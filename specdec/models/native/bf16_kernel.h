// The bf16 product shared by bf16_gemv.cpp (one projection per call) and decode_stack.cpp
// (every layer of a decode step in one call): y = x @ W.T for the few rows of a decode or
// verify step, W in bf16, in fp32 arithmetic (AVX2 + FMA, AVX-512 where the CPU has it).
// Each weight is widened to fp32 in registers (a bf16 is the top half of an
// fp32) as it streams from memory, once for all rows of x, so a step reads the bf16 bytes
// once instead of an fp32 copy twice their size.
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>

#include "simd.h"

namespace bf16 {

// RG rows of x against the T output rows of W [N, K] from row n: one register tile, over all
// of K (K % 8 == 0). `prefetch`: ask for the next tile's bytes as this one is read (a
// software prefetch one tile ahead, a cache line per row every 32 weights). The hardware
// prefetchers alone lose the stream at each row's end when rows are short: measured on a
// Zen 3 for the 1.5B's K = 1536 shapes, 1-4 rows streamed 15-26 GB/s without it and 23-32
// with it (the read bandwidth is 32-33).
template <int RG, int T>
inline void tile_times_rows(const float* x, const uint16_t* w, float* y, int64_t K, int64_t N,
                            int64_t n, bool prefetch) {
  __m256 acc[T][RG];
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < RG; ++r) acc[t][r] = _mm256_setzero_ps();
  const uint16_t* next_tile = w + (n + T) * K;  // prefetching past W's end is harmless
  for (int64_t k = 0; k < K; k += 8) {
    if (prefetch && k % 32 == 0)
      for (int t = 0; t < T; ++t)
        _mm_prefetch(reinterpret_cast<const char*>(next_tile + t * K + k), _MM_HINT_T0);
    __m256 wf[T];
    for (int t = 0; t < T; ++t) wf[t] = simd::widen_bf16(w + (n + t) * K + k);
    for (int r = 0; r < RG; ++r) {  // each activation vector loaded once for the T rows of W
      const __m256 xv = _mm256_loadu_ps(x + r * K + k);
      for (int t = 0; t < T; ++t) acc[t][r] = _mm256_fmadd_ps(wf[t], xv, acc[t][r]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < RG; ++r) y[r * N + n + t] = simd::hsum(acc[t][r]);
}

// The largest row group one register tile serves: T = 2 weight rows x 6 activation rows
// take 12 accumulators, and 2 + 1 more registers hold the widened weights and a row of x.
constexpr int MAX_GROUP = 6;

// R rows of x (R <= 8) against output rows [begin, end) of W, in one pass over W's bytes:
// tiles of T output rows, each tile serving the rows in groups of at most MAX_GROUP (7 as
// 4 + 3, 8 as 4 + 4), a group after the first reading the tile from cache. Why: the kernel
// before served 5-8 rows from one weight row at a time, loading up to 8 activation vectors
// for each weight vector it widened, and a verify pass of 5-8 rows ran at half the memory's
// pace. Measured on a Zen 3 (2 threads, the 1.5B's shapes streamed from memory, the two
// kernels taking turns): 6-8 rows 1.11-1.43x faster, 5 rows 0.98-1.44x, 1-4 unchanged.
// Each (row, output) still sums its products in one register, in the order of k, whatever
// the grouping: the floats are the kernel's before, and batch-invariant.
template <int R, int T>
void rows_times_weights(const float* x, const uint16_t* w, float* y, int64_t K, int64_t N,
                        int64_t begin, int64_t end) {
  constexpr int groups = (R + MAX_GROUP - 1) / MAX_GROUP, first = (R + groups - 1) / groups;
  int64_t n = begin;
  for (; n + T <= end; n += T) {
    tile_times_rows<first, T>(x, w, y, K, N, n, true);
    if constexpr (first < R) tile_times_rows<R - first, T>(x + first * K, w, y + first * N, K, N, n, false);
  }
  if constexpr (T > 1)
    if (n < end) rows_times_weights<R, 1>(x, w, y, K, N, n, end);
}

#if defined(__AVX512F__)
// The same product 16 weights at a time, where the CPU has AVX-512 (built with -mavx512f,
// native/__init__.py): half the instructions per weight of the AVX2 loop above, which is
// what kept a verify pass of 4-8 rows below the memory's pace. Each row still sums its
// products in one fixed order whatever the row count (batch-invariant), but in 16 lanes,
// not 8: its floats differ from the AVX2 build's in the last bits.
template <int R, int T>
void rows_times_weights_512(const float* x, const uint16_t* w, float* y, int64_t K, int64_t N,
                            int64_t begin, int64_t end) {
  const int64_t K16 = K - K % 16;  // K % 8 == 0: a last 8 goes through zero-extended halves
  int64_t n = begin;
  for (; n + T <= end; n += T) {
    __m512 acc[T][R];
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) acc[t][r] = _mm512_setzero_ps();
    const uint16_t* next_block = w + (n + T) * K;  // prefetching past W's end is harmless
    for (int64_t k = 0; k < K16; k += 16) {
      if (k % 32 == 0)
        for (int t = 0; t < T; ++t)
          _mm_prefetch(reinterpret_cast<const char*>(next_block + t * K + k), _MM_HINT_T0);
      __m512 wf[T];
      for (int t = 0; t < T; ++t) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (n + t) * K + k));
        wf[t] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
      }
      for (int r = 0; r < R; ++r) {  // each activation vector loaded once for the T rows of W
        const __m512 xv = _mm512_loadu_ps(x + r * K + k);
        for (int t = 0; t < T; ++t) acc[t][r] = _mm512_fmadd_ps(wf[t], xv, acc[t][r]);
      }
    }
    if (K16 < K)
      for (int t = 0; t < T; ++t) {
        const __m512 wf = _mm512_zextps256_ps512(simd::widen_bf16(w + (n + t) * K + K16));
        for (int r = 0; r < R; ++r)
          acc[t][r] = _mm512_fmadd_ps(wf, _mm512_zextps256_ps512(_mm256_loadu_ps(x + r * K + K16)), acc[t][r]);
      }
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) y[r * N + n + t] = _mm512_reduce_add_ps(acc[t][r]);
  }
  if (n < end) rows_times_weights_512<R, 1>(x, w, y, K, N, n, end);
}
#endif

template <int R>
void run_rows(const float* x, const uint16_t* w, float* y, int64_t K, int64_t N) {
  // Chunks of output rows per thread: large enough to stream, small enough to balance.
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
#if defined(__AVX512F__)
    constexpr int T = R <= 2 ? 4 : (R <= 5 ? 3 : 2);  // T * R accumulators <= 16 of 32 registers
    rows_times_weights_512<R, T>(x, w, y, K, N, begin, end);
#else
    constexpr int T = R <= 2 ? 4 : 2;  // T x (a row group) accumulators <= 12 registers
    rows_times_weights<R, T>(x, w, y, K, N, begin, end);
#endif
  });
}

// x [R, K] fp32 (any R: more than 8 rows go in even chunks, 9 as 5 + 4, not 8 + 1, whose
// second stream of the weights would serve one row), w [N, K] bf16, K % 8 == 0 -> y [R, N].
inline void run(const float* x, int64_t R, const uint16_t* w, float* y, int64_t K, int64_t N) {
  const int64_t passes = (R + 7) / 8, chunk = (R + passes - 1) / passes;
  for (int64_t r0 = 0; r0 < R; r0 += chunk) {
    const float* xr = x + r0 * K;
    float* yr = y + r0 * N;
    switch (std::min(chunk, R - r0)) {
      case 1: run_rows<1>(xr, w, yr, K, N); break;
      case 2: run_rows<2>(xr, w, yr, K, N); break;
      case 3: run_rows<3>(xr, w, yr, K, N); break;
      case 4: run_rows<4>(xr, w, yr, K, N); break;
      case 5: run_rows<5>(xr, w, yr, K, N); break;
      case 6: run_rows<6>(xr, w, yr, K, N); break;
      case 7: run_rows<7>(xr, w, yr, K, N); break;
      default: run_rows<8>(xr, w, yr, K, N); break;
    }
  }
}

}  // namespace bf16
