// The bf16 product shared by bf16_gemv.cpp (one projection per call) and decode_stack.cpp
// (every layer of a decode step in one call): y = x @ W.T for the few rows of a decode or
// verify step, W in bf16, in fp32 arithmetic (AVX2 + FMA, AVX-512 where the CPU has it).
// Each weight is widened to fp32 in registers (a bf16 is the top half of an
// fp32) as it streams from memory, once for all rows of x, so a step reads the bf16 bytes
// once instead of an fp32 copy twice their size. Two layouts of W: rows ([N, K], as the
// model holds it; the AVX-512 builds read this) and panels of 8 outputs (the AVX2 builds).
#pragma once

#include "torch_lite.h"

#include <algorithm>
#include <string>
#include <utility>
#include <type_traits>
#include <vector>

#include "simd.h"

#if defined(__AMX_BF16__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

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

// Calls body(std::integral_constant<int, C>, r0) for the rows [r0, r0 + C) of an R-row
// product, C <= 8: more than 8 rows go in even chunks, 9 as 5 + 4, not 8 + 1, whose second
// stream of the weights would serve one row. Both layouts' `run` take their rows this way.
template <class Body>
inline void in_row_chunks(int64_t R, Body&& body) {
  const int64_t passes = (R + 7) / 8, chunk = (R + passes - 1) / passes;
  for (int64_t r0 = 0; r0 < R; r0 += chunk) {
    switch (std::min(chunk, R - r0)) {
      case 1: body(std::integral_constant<int, 1>{}, r0); break;
      case 2: body(std::integral_constant<int, 2>{}, r0); break;
      case 3: body(std::integral_constant<int, 3>{}, r0); break;
      case 4: body(std::integral_constant<int, 4>{}, r0); break;
      case 5: body(std::integral_constant<int, 5>{}, r0); break;
      case 6: body(std::integral_constant<int, 6>{}, r0); break;
      case 7: body(std::integral_constant<int, 7>{}, r0); break;
      default: body(std::integral_constant<int, 8>{}, r0); break;
    }
  }
}

// --- The panel layout ---------------------------------------------------------------------
// W [N, K] stored as panels of PANEL outputs, [ceil(N / PANEL), K, PANEL] bf16: for each k
// the weights of outputs PANEL p .. PANEL p + PANEL - 1 side by side (zero rows past N;
// `linear.pack_panels` packs). A product broadcasts one activation and multiplies it into
// the panel's outputs at once, so each (row, output) sums its products in one lane, in the
// order of k, with no horizontal sum, and a panel is one sequential stream of K * PANEL
// weights. The floats are the same in both builds (one fused multiply-add per k and output,
// in the order of k); they differ from the row layout's in the last bits. Batch-invariant.
// - AVX2 builds: panels of 8 (one 16-byte load a k). On a Zen 3 (2 threads, the 1.5B's
//   shapes streamed from memory, both layouts taking turns; archived runs, commit 1f7ab6a
//   bf16_panels.log) 1-5 rows ran 1.04-1.26x faster than the row layout, 6 rows 1.01-1.13x,
//   7-8 rows 0.96-1.10x.
// - AVX-512 builds: panels of 32, a k's weights one 64-byte line, split into the even and
//   the odd outputs by a shift and a mask (no cross-lane widening). On a Zen 4 (2 threads,
//   the same shapes, taking turns; archived runs, commit 1f7ab6a) against the row
//   layout: 1 row 1.17-1.28x, 2 rows 1.14-1.28x, 4-5 rows 1.17-1.62x, 8 rows 1.41-1.48x.
//   The row layout read 8 output rows of 3 KB at once for the K = 1536 shapes, and that
//   pattern itself streamed slower than one sequential read.
// - AVX-512 BF16 builds (-mavx512bf16, where the CPU has it): panels of 16 outputs whose
//   line holds a pair of k for each output, [ceil(N / 16), K / 2, 32]: (W[n, k], W[n, k + 1])
//   side by side for n = 16 p .. 16 p + 15. One `vdpbf16ps` multiplies a line by a pair of
//   activations broadcast to every lane: 32 products an instruction where the fp32 FMAs do
//   16, with no widening. The activations are rounded to bf16 first, which changes nothing
//   where they are bf16 values already (a bf16 model's are: decode_stack.cpp rounds each
//   projection's input as the eager layers do). Each (row, output) still sums in one lane,
//   a pair of k at a time in the order of k, whatever the row count: batch-invariant, and
//   the floats differ from the other builds' in the last bits. Why: on a Zen 4 the FMA
//   kernel multiplies at most ~103 GMAC/s on two cores, so a 5-row verify pass is bound by
//   its arithmetic whenever the memory reads faster than ~41 GB/s (the host reads 30-58),
//   and 8 rows always were (25 GB/s); these panels multiply ~160-175 GMAC/s, and stream 8
//   rows at the memory's rate (archived runs, commit 1f7ab6a).
//
// Each layout is a struct: its PANEL (outputs a panel) and KSTEP (k of one output side by
// side in a line), the activations `X` its product takes, `times<R, V>` (R rows times V
// adjacent panels) and `at_once(R)` (panels read at a time). AVX-512 BF16 builds read both
// AVX-512 layouts, so which one a machine streams faster is measured there, not assumed
// (`tuning.tune_bf16_panels`): a Zen 4 ran 5-8 row passes 1.25-1.58x faster in pairs,
// a Xeon with AMX 0.77-0.87x as fast.
#if defined(__AVX512F__)
struct Panels32 {  // AVX-512: 32 outputs, one k a line
  static constexpr int PANEL = 32, KSTEP = 1;
  using X = float;

  // R rows of x [R, K] times V adjacent panels from `panel` -> y (row r at y + r * ldy, the
  // panels' 32 V outputs side by side). Any K. Where R > 2, a line 16 k ahead (1 KB) is
  // prefetched: in bf16_panels32.log 1.19-1.37x faster at 8 rows (one panel at a time),
  // 0.92-1.06x at 4-5 rows (two), 0.87-0.95x at one row and 0.98-1.04x at two (four).
  template <int R, int V>
  static void times(const float* x, const uint16_t* panel, float* y, int64_t ldy, int64_t K) {
    constexpr int AHEAD = R > 2 ? 16 : 0;  // lines
    const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    __m512 even[V][R], odd[V][R];  // outputs 2i and 2i + 1 of each panel in lane i
    for (int v = 0; v < V; ++v)
      for (int r = 0; r < R; ++r) even[v][r] = odd[v][r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; ++k) {
      for (int v = 0; v < V; ++v) {
        const uint16_t* line = panel + (v * K + k) * PANEL;
        if constexpr (AHEAD > 0) _mm_prefetch(reinterpret_cast<const char*>(line + AHEAD * PANEL), _MM_HINT_T0);
        const __m512i raw = _mm512_loadu_si512(line);  // 32 bf16: output 2i low, 2i + 1 high
        const __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
        const __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(raw, high));
        for (int r = 0; r < R; ++r) {
          const __m512 xb = _mm512_set1_ps(x[r * K + k]);
          even[v][r] = _mm512_fmadd_ps(we, xb, even[v][r]);
          odd[v][r] = _mm512_fmadd_ps(wo, xb, odd[v][r]);
        }
      }
    }
    for (int v = 0; v < V; ++v)
      for (int r = 0; r < R; ++r) {
        alignas(64) float e[16], o[16];
        _mm512_store_ps(e, even[v][r]);
        _mm512_store_ps(o, odd[v][r]);
        float* out = y + r * ldy + v * PANEL;
        for (int i = 0; i < 16; ++i) {
          out[2 * i] = e[i];
          out[2 * i + 1] = o[i];
        }
      }
  }

  // At most 16 accumulators (2 V R). On the Zen 4 (bf16_panels32.log) 4 panels at one row
  // streamed 1.01-1.09x as fast as 2, and 0.97-1.03x at two rows; 2 panels at 4-5 rows
  // 0.96-1.08x as fast as 1, and 1 at 8 rows.
  static constexpr int at_once(int R) { return R <= 2 ? 4 : (R <= 5 ? 2 : 1); }
};
#endif

#if defined(__AVX512BF16__)
struct PairPanels16 {  // AVX-512 BF16: 16 outputs, a pair of k a line
  static constexpr int PANEL = 16, KSTEP = 2;
  using X = uint32_t;  // x as bf16 pairs: (x[r, 2j], x[r, 2j + 1]) in one uint32 (`pairs`)

  // R rows of x as pairs (xp [R, K / 2]) times V adjacent pair panels from `panel` -> y (row
  // r at y + r * ldy, the panels' 16 V outputs side by side). K % 2 == 0.
  template <int R, int V>
  static void times(const uint32_t* xp, const uint16_t* panel, float* y, int64_t ldy, int64_t K) {
    const int64_t K2 = K / 2;
    __m512 acc[V][R];  // output i of each panel in lane i
    for (int v = 0; v < V; ++v)
      for (int r = 0; r < R; ++r) acc[v][r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K2; ++k) {
      for (int v = 0; v < V; ++v) {
        const __m512bh w = (__m512bh)_mm512_loadu_si512(panel + (v * K2 + k) * 2 * PANEL);
        for (int r = 0; r < R; ++r)
          acc[v][r] = _mm512_dpbf16_ps(acc[v][r], w, (__m512bh)_mm512_set1_epi32(static_cast<int>(xp[r * K2 + k])));
      }
    }
    for (int v = 0; v < V; ++v)
      for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + r * ldy + v * PANEL, acc[v][r]);
  }

  // At most 20 accumulators: measured from memory on the Zen 4 (bf16_dp_variants.log) 4 at
  // 1-5 rows within the noise of 1-2 at 1-2 rows and the best at 4-5, 2 the best at 8.
  static constexpr int at_once(int R) { return R <= 5 ? 4 : 2; }

  // x [R, K] fp32 -> bf16, round to nearest even (exact for bf16 values), as [R, K / 2] pairs.
  static std::vector<uint32_t> pairs(const float* x, int64_t R, int64_t K) {
    std::vector<uint32_t> xp(R * K / 2);
    uint16_t* out = reinterpret_cast<uint16_t*>(xp.data());
    int64_t i = 0;
    for (; i + 16 <= R * K; i += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
    for (; i < R * K; ++i) out[i] = c10::BFloat16(x[i]).x;
    return xp;
  }
};
#endif

#if defined(__AMX_BF16__)
// The pair panels on AMX tiles, where the CPU has AMX (built with -mamx-tile -mamx-bf16,
// native/__init__.py): 16 consecutive lines of a pair panel (32 k of its 16 outputs, by
// pairs) are one B tile (16 rows x 64 bytes) as they lie, and up to 16 rows of x in bf16
// (32 k a row) one A tile, so one `tdpbf16ps` adds 16 R x 32 products to C [R, 16]. A verify
// pass of 2-16 rows then costs what one row does: on a Xeon with AMX (2 threads, the 1.5B's
// step from memory, taking turns; archived runs, commit 1f7ab6a) 8 rows ran 1.5-2.1x
// faster than the fp32-FMA panels and 16 rows 2.1x, one row 0.75-1.23x, with the memory
// drift. Each (row, output) sums in its own C element, 32 k an instruction in the order of
// k, whatever the rows beside it: batch-invariant; the floats differ from `vdpbf16ps`'s in
// the last bits. Linux lends a process the tiles' state only when asked (`permitted`).
namespace amx {
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Whether this process may use AMX tile data (asked of Linux once; a kernel or a VM that
// refuses leaves the `vdpbf16ps` path to serve the pair panels).
inline bool permitted() {
  static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return ok;
}

// Tiles 0-3: C of four panels, [R, 16] fp32; 4: A, [R, 32] bf16; 5-7: B, 16 lines of 64 bytes.
inline void configure(int R) {
  TileConfig cfg;
  for (int t = 0; t < 5; ++t) cfg.rows[t] = static_cast<uint8_t>(R), cfg.colsb[t] = 64;
  for (int t = 5; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
}

// Lines of each panel prefetched ahead of its B tile loads, in tiles (1 KB each): 3 streamed
// the fastest of 0-8 at 1 and 8 rows (amx_sweep.log; 0 ran 1.3-1.5x slower).
constexpr int AHEAD = 3;

// R rows of x (xb [R, K] bf16) times V adjacent pair panels from `panel` -> y (row r at
// y + r * ldy, the panels' 16 V outputs side by side). K % 32 == 0; tiles configured for R.
template <int V>
inline void panels_times_rows(const uint16_t* xb, const uint16_t* panel, float* y, int64_t ldy, int64_t K) {
  const int64_t line = 32, panel_lines = K / 2;  // bf16 a line; lines a panel
  _tile_zero(0);
  if constexpr (V > 1) _tile_zero(1);
  if constexpr (V > 2) _tile_zero(2);
  if constexpr (V > 3) _tile_zero(3);
  for (int64_t k = 0; k < K; k += 32) {
    const uint16_t* b = panel + k / 2 * line;  // the tile of panel 0 at k
    for (int v = 0; v < V; ++v)
      for (int l = 0; l < 16; ++l)  // prefetching past the weights' end is harmless
        _mm_prefetch(reinterpret_cast<const char*>(b + (v * panel_lines + AHEAD * 16 + l) * line), _MM_HINT_T0);
    _tile_loadd(4, xb + k, K * 2);
    _tile_loadd(5, b, 64);
    _tile_dpbf16ps(0, 4, 5);
    if constexpr (V > 1) {
      _tile_loadd(6, b + panel_lines * line, 64);
      _tile_dpbf16ps(1, 4, 6);
    }
    if constexpr (V > 2) {
      _tile_loadd(7, b + 2 * panel_lines * line, 64);
      _tile_dpbf16ps(2, 4, 7);
    }
    if constexpr (V > 3) {
      _tile_loadd(5, b + 3 * panel_lines * line, 64);
      _tile_dpbf16ps(3, 4, 5);
    }
  }
  _tile_stored(0, y, ldy * 4);
  if constexpr (V > 1) _tile_stored(1, y + 16, ldy * 4);
  if constexpr (V > 2) _tile_stored(2, y + 32, ldy * 4);
  if constexpr (V > 3) _tile_stored(3, y + 48, ldy * 4);
}

// xb [R, K] bf16 (R <= 16, K % 32 == 0), wp W's pair panels -> y [R, N]: 4 panels at a time
// over the threads, the panels left one at a time, a last panel N cuts short via scratch.
inline void rows_times_panels(const uint16_t* xb, int64_t R, const uint16_t* wp, float* y, int64_t K, int64_t N) {
  constexpr int V = 4, PANEL = 16;
  const int64_t whole = N / PANEL, groups = whole / V;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    configure(static_cast<int>(R));  // tile state is per thread
    for (int64_t g = begin; g < end; ++g) panels_times_rows<V>(xb, wp + g * V * K * PANEL, y + g * V * PANEL, N, K);
    _tile_release();
  });
  if (groups * V == whole && whole * PANEL == N) return;
  configure(static_cast<int>(R));
  for (int64_t p = groups * V; p < whole; ++p) panels_times_rows<1>(xb, wp + p * K * PANEL, y + p * PANEL, N, K);
  if (whole * PANEL < N) {
    alignas(64) float tile[16 * PANEL];
    panels_times_rows<1>(xb, wp + whole * K * PANEL, tile, PANEL, K);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t n = whole * PANEL; n < N; ++n) y[r * N + n] = tile[r * PANEL + n - whole * PANEL];
  }
  _tile_release();
}

// x [R, K] fp32 (any R, in even chunks of at most 16 rows) -> y [R, N], W in pair panels.
inline void run(const float* x, int64_t R, const uint16_t* wp, float* y, int64_t K, int64_t N) {
  const int64_t passes = (R + 15) / 16, chunk = (R + passes - 1) / passes;
  for (int64_t r0 = 0; r0 < R; r0 += chunk) {
    const int64_t rows = std::min(chunk, R - r0);
    const std::vector<uint32_t> xp = PairPanels16::pairs(x + r0 * K, rows, K);  // [rows, K] bf16
    rows_times_panels(reinterpret_cast<const uint16_t*>(xp.data()), rows, wp, y + r0 * N, K, N);
  }
}
}  // namespace amx
#endif

#if !defined(__AVX512F__)
struct Panels8 {  // AVX2: 8 outputs, one k a line (16 bytes)
  static constexpr int PANEL = 8, KSTEP = 1;
  using X = float;

  // R rows of x [R, K] times V adjacent panels from `panel` -> y (row r at y + r * ldy, the
  // panels' 8 V outputs side by side). K % 4 == 0.
  template <int R, int V>
  static void times(const float* x, const uint16_t* panel, float* y, int64_t ldy, int64_t K) {
    __m256 acc[V][R];
    for (int v = 0; v < V; ++v)
      for (int r = 0; r < R; ++r) acc[v][r] = _mm256_setzero_ps();
    for (int64_t k0 = 0; k0 < K; k0 += 4) {
      // A line of each panel 1 KB ahead, every 4 k (a line is 4 k of one panel). The
      // prefetch is outside the unrolled loop: with it inside, GCC kept the accumulators in
      // memory.
      for (int v = 0; v < V; ++v)
        _mm_prefetch(reinterpret_cast<const char*>(panel + (v * K + k0) * PANEL + 512), _MM_HINT_T0);
      for (int kk = 0; kk < 4; ++kk) {
        const int64_t k = k0 + kk;
        __m256 wf[V];
        for (int v = 0; v < V; ++v) wf[v] = simd::widen_bf16(panel + (v * K + k) * PANEL);
        for (int r = 0; r < R; ++r) {
          const __m256 xb = _mm256_broadcast_ss(x + r * K + k);
          for (int v = 0; v < V; ++v) acc[v][r] = _mm256_fmadd_ps(wf[v], xb, acc[v][r]);
        }
      }
    }
    for (int v = 0; v < V; ++v)
      for (int r = 0; r < R; ++r) _mm256_storeu_ps(y + r * ldy + v * PANEL, acc[v][r]);
  }

  // At most 12 accumulators (V x R), and fewer panels at once streamed faster at 1-2 rows.
  static constexpr int at_once(int R) { return R == 4 ? 3 : (R <= 6 ? 2 : 1); }
};
#endif

// The layouts this build reads, as (PANEL, KSTEP): every one `check_panels` accepts, the
// first the build's default (the module exports them as LAYOUTS).
inline std::vector<std::pair<int, int>> layouts() {
#if defined(__AVX512BF16__)
  return {{PairPanels16::PANEL, PairPanels16::KSTEP}, {Panels32::PANEL, Panels32::KSTEP}};
#elif defined(__AVX512F__)
  return {{Panels32::PANEL, Panels32::KSTEP}};
#else
  return {{Panels8::PANEL, Panels8::KSTEP}};
#endif
}

// Checks that `panels` is W [N, K] in one of the build's layouts (bf16, contiguous,
// [ceil(N / PANEL), K / KSTEP, PANEL * KSTEP]) and returns its KSTEP: the layouts of one
// build differ in it (panels of 32 by one k, of 16 by pairs: both 32 weights a line).
inline int check_panels(const at::Tensor& panels, int64_t N, int64_t K) {
  const bool bf16 = panels.scalar_type() == at::kBFloat16 && panels.is_contiguous() && panels.dim() == 3;
  for (const auto& [panel, kstep] : layouts())
    if (bf16 && K % kstep == 0 && panels.size(0) == (N + panel - 1) / panel && panels.size(1) == K / kstep &&
        panels.size(2) == panel * kstep)
      return kstep;
  std::string shapes;
  for (const auto& [panel, kstep] : layouts())
    shapes += " [ceil(N / " + std::to_string(panel) + "), K / " + std::to_string(kstep) + ", " +
              std::to_string(panel * kstep) + "]";
  TORCH_CHECK(false, "bf16 panels: bf16, contiguous, one of", shapes);
  return 0;
}

// R rows (R <= 8) against every panel of layout L, V panels at a time, a last panel that N
// cuts short through a scratch tile. x: the activations as L takes them (L::X); a panel is
// K * PANEL weights in every layout.
template <class L, int R, int V>
void panel_rows(const typename L::X* x, const uint16_t* wp, float* y, int64_t K, int64_t N) {
  constexpr int PANEL = L::PANEL;
  const int64_t whole = N / PANEL, groups = whole / V;
  at::parallel_for(0, groups, std::max<int64_t>(1, 64 / (PANEL * V)), [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g)
      L::template times<R, V>(x, wp + g * V * K * PANEL, y + g * V * PANEL, N, K);
  });
  for (int64_t p = groups * V; p < whole; ++p)
    L::template times<R, 1>(x, wp + p * K * PANEL, y + p * PANEL, N, K);
  if (whole * PANEL < N) {
    float tile[R * PANEL];
    L::template times<R, 1>(x, wp + whole * K * PANEL, tile, PANEL, K);
    for (int r = 0; r < R; ++r)
      for (int64_t n = whole * PANEL; n < N; ++n) y[r * N + n] = tile[r * PANEL + n - whole * PANEL];
  }
}

// Every row of x [R, K] (in L's X) times V adjacent panels from `panel` -> y (row r at
// y + r * ldy): the rows in groups of G, a last group of 1 to G - 1.
template <class L, int G, int V>
inline void all_rows_times(const typename L::X* x, int64_t R, const uint16_t* panel, float* y, int64_t ldy,
                           int64_t K) {
  const int64_t KX = K / L::KSTEP;  // X a row
  int64_t r = 0;
  for (; r + G <= R; r += G) L::template times<G, V>(x + r * KX, panel, y + r * ldy, ldy, K);
  switch (R - r) {
    case 1: L::template times<1, V>(x + r * KX, panel, y + r * ldy, ldy, K); break;
    case 2: L::template times<2, V>(x + r * KX, panel, y + r * ldy, ldy, K); break;
    case 3: L::template times<3, V>(x + r * KX, panel, y + r * ldy, ldy, K); break;
    default: break;
  }
}

// Passes of more than MANY_ROWS rows (long verify passes, batched steps, prefills), which
// are bound by the arithmetic, not by the memory: a thread takes V adjacent panels and
// serves every row from them, 4 rows at a time (12 accumulators in the AVX2 build: two
// fused multiply-adds a cycle for their 4-cycle latency), the panels read from memory once
// and from cache for the other row groups. The chunks of 8 rows `in_row_chunks` gives the
// few-row passes streamed the whole of W again for every chunk, 8 accumulators a panel.
// Each (row, output) still sums its products in one lane, in the order of k, from zero:
// the floats are those of a one-row pass (batch-invariant), whichever path a pass takes.
constexpr int64_t MANY_ROWS = 8;

template <class L>
void many_rows(const typename L::X* x, int64_t R, const uint16_t* wp, float* y, int64_t K, int64_t N) {
  constexpr int PANEL = L::PANEL, G = 4, V = L::at_once(G);
  const int64_t whole = N / PANEL, groups = whole / V;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g)
      all_rows_times<L, G, V>(x, R, wp + g * V * K * PANEL, y + g * V * PANEL, N, K);
  });
  for (int64_t p = groups * V; p < whole; ++p) all_rows_times<L, G, 1>(x, R, wp + p * K * PANEL, y + p * PANEL, N, K);
  if (whole * PANEL < N) {
    std::vector<float> tile(R * PANEL);
    all_rows_times<L, G, 1>(x, R, wp + whole * K * PANEL, tile.data(), PANEL, K);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t n = whole * PANEL; n < N; ++n) y[r * N + n] = tile[r * PANEL + n - whole * PANEL];
  }
}

// x [R, K] (any R: few rows in chunks as `run`, many as `many_rows`) in L's X, wp W's
// panels in layout L -> y [R, N].
template <class L>
void layout_rows(const typename L::X* x, int64_t R, const uint16_t* wp, float* y, int64_t K, int64_t N) {
  if (R > MANY_ROWS) return many_rows<L>(x, R, wp, y, K, N);
  in_row_chunks(R, [&](auto rows, int64_t r0) {
    constexpr int C = decltype(rows)::value;
    panel_rows<L, C, L::at_once(C)>(x + r0 * K / L::KSTEP, wp, y + r0 * N, K, N);
  });
}

// x [R, K] fp32, wp the panels of W [N, K] in the layout whose KSTEP is `kstep` (what
// `check_panels` returned) -> y [R, N]. The pair layout rounds x to bf16 first.
inline void run_panels(const float* x, int64_t R, const uint16_t* wp, float* y, int64_t K, int64_t N, int kstep) {
#if defined(__AVX512BF16__)
  if (kstep == PairPanels16::KSTEP) {
#if defined(__AMX_BF16__)
    if (K % 32 == 0 && amx::permitted()) return amx::run(x, R, wp, y, K, N);
#endif
    const std::vector<uint32_t> xp = PairPanels16::pairs(x, R, K);
    layout_rows<PairPanels16>(xp.data(), R, wp, y, K, N);
    return;
  }
#endif
  (void)kstep;
#if defined(__AVX512F__)
  layout_rows<Panels32>(x, R, wp, y, K, N);
#else
  layout_rows<Panels8>(x, R, wp, y, K, N);
#endif
}

template <int R>
void run_rows(const float* x, const uint16_t* w, float* y, int64_t K, int64_t N) {
  // Chunks of output rows per thread: large enough to stream, small enough to balance.
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
#if defined(__AVX512F__)
    // Output rows per register tile: 8 for 1-2 rows (16 accumulators, 8 widened weights and
    // x: 25 of 32 registers), which streamed 1.10-1.29x faster than 4 at one row and
    // 1.13-1.16x at two on a Zen 4 (2 threads, the 1.5B's shapes from memory, taking turns:
    // archived runs, commit 1f7ab6a); 12 no faster than 8; 3-5 rows the same
    // at 3 and 4. The tile only orders the reads: every (row, output) sums in the same
    // order, so the floats are the same at any T. (The panels above are read instead
    // wherever a layer has them; this layout serves callers that give none.)
    constexpr int T = R <= 2 ? 8 : (R <= 5 ? 3 : 2);
    rows_times_weights_512<R, T>(x, w, y, K, N, begin, end);
#else
    constexpr int T = R <= 2 ? 4 : 2;  // T x (a row group) accumulators <= 12 registers
    rows_times_weights<R, T>(x, w, y, K, N, begin, end);
#endif
  });
}

// x [R, K] fp32 (any R, in chunks: `in_row_chunks`), w [N, K] bf16, K % 8 == 0 -> y [R, N].
inline void run(const float* x, int64_t R, const uint16_t* w, float* y, int64_t K, int64_t N) {
  in_row_chunks(R, [&](auto rows, int64_t r0) {
    run_rows<decltype(rows)::value>(x + r0 * K, w, y + r0 * N, K, N);
  });
}

}  // namespace bf16
