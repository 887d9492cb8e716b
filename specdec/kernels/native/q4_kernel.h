// The Q4_K-style int4 product shared by q4_gemv.cpp (one projection per call) and
// decode_stack.cpp (every layer of a decode step in one call): format and arithmetic
// are described in q4_gemv.cpp.
#pragma once

#include "torch_lite.h"
#include <immintrin.h>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "simd.h"

// Built with -mavx512bw -mavx512vnni where the CPU has them (native/__init__.py); AVX2 else.
#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define SPECDEC_Q4_AVX512 1
#else
#define SPECDEC_Q4_AVX512 0
#endif

namespace q4 {

constexpr int64_t SB = 256;  // weights per super-block
constexpr int GROUPS = 8;    // groups of 32 per super-block

struct Activations {
  int64_t stride;           // S * SB: a row of xq, zero past K (the tiles read whole blocks)
  std::vector<int8_t> xq;   // [R, stride]
  std::vector<float> dx;    // [R, S] activation scale per super-block
  std::vector<float> u;     // [R, G] dx * (sum of xq over the group): the row layout's minimums
  std::vector<int16_t> xs;  // [R, G] sum of xq over the group: the tile layout's minimums
};

// The activations as fp32: fp32 ones as they are, bf16 ones widened into `buffer`.
inline const float* as_floats(const float* x, int64_t, std::vector<float>&) { return x; }
inline const float* as_floats(const at::BFloat16* x, int64_t n, std::vector<float>& buffer) {
  buffer.resize(n);
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(x);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(buffer.data() + i, simd::widen_bf16(bits + i));
  for (; i < n; ++i) buffer[i] = static_cast<float>(x[i]);
  return buffer.data();
}

// Rows of x quantized to int8 per super-block (K % 64 == 0), vectorized: one scan for the
// largest magnitude, then per group of 32 a multiply, a rounding conversion (to nearest,
// ties to even, as std::nearbyint and torch.round) and a pack. Bitwise what the scalar
// loop computed (checked on ties too); one-row products of the 1.5B's shapes 1-3% faster.
template <typename In>
Activations quantize_rows(const In* xin, int64_t R, int64_t K, int64_t S) {
  std::vector<float> buffer;
  const float* x = as_floats(xin, R * K, buffer);
  Activations a{S * SB, std::vector<int8_t>(R * S * SB, 0), std::vector<float>(R * S),
                std::vector<float>(R * S * GROUPS, 0.f), std::vector<int16_t>(R * S * GROUPS, 0)};
  const __m256 sign = _mm256_set1_ps(-0.f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes the packs' lanes
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t s = 0; s < S; ++s) {
      const int64_t begin = s * SB, end = std::min(K, begin + SB);
      const float* xs = x + r * K;
      __m256 top = _mm256_setzero_ps();
      for (int64_t k = begin; k < end; k += 8) top = _mm256_max_ps(top, _mm256_andnot_ps(sign, _mm256_loadu_ps(xs + k)));
      __m128 m = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
      m = _mm_max_ps(m, _mm_movehl_ps(m, m));
      const float ax = std::max(_mm_cvtss_f32(m), _mm_cvtss_f32(_mm_movehdup_ps(m)));
      const float iscale = ax > 0.f ? 127.f / ax : 0.f;
      const float dx = ax / 127.f;
      const __m256 scale = _mm256_set1_ps(iscale);
      a.dx[r * S + s] = dx;
      for (int64_t k = begin; k < end; k += 32) {
        __m256i q[4];
        for (int j = 0; j < 4; ++j) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xs + k + 8 * j), scale));
        const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
        const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.xq.data() + r * a.stride + k), _mm256_permutevar8x32_epi32(packed, order));
        const int32_t sum32 = _mm_cvtsi128_si32(t);  // |sum| <= 32 * 127: int16
        a.u[r * S * GROUPS + k / 32] = dx * static_cast<float>(sum32);
        a.xs[r * S * GROUPS + k / 32] = static_cast<int16_t>(sum32);
      }
    }
  }
  return a;
}

#if SPECDEC_Q4_AVX512
// The integer part of one super-block for R rows with AVX-512 VNNI: `vpdpbusd` sums four
// 4-bit x 8-bit products into an int32 lane, and `vpdpwssd` multiplies that lane by its
// group's scale and accumulates (the lane's sum, at most 4 * 15 * 128, fits the low int16
// half; the scale vector's high halves are zero). 4 instructions a row per 128 weights
// where AVX2 takes 12, which is where a verify pass of several rows spent its time.
//
// A 64-weight chunk's 32 bytes hold its first group in the low nibbles and its second in
// the high ones; the chunk becomes one 512-bit vector [low nibbles | high nibbles], which
// lines up with the chunk's 64 activations as stored. Lanes i and 8 + i of the result sum
// the same bytes 4i..4i+3 of their groups that AVX2's lane i sums, so folding the two
// halves gives AVX2's 8 lanes exactly (integer sums): both builds compute the same floats.
// Chunk c's scale vector picks scale 2c for lanes 0-7 and 2c + 1 for lanes 8-15.
inline const __m512i SCALE_LANES[4] = {
    _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
    _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2),
    _mm512_set_epi32(5, 5, 5, 5, 5, 5, 5, 5, 4, 4, 4, 4, 4, 4, 4, 4),
    _mm512_set_epi32(7, 7, 7, 7, 7, 7, 7, 7, 6, 6, 6, 6, 6, 6, 6, 6)};

template <int R>
inline void block_products(const uint8_t* q, const uint8_t* scales, const int8_t* x, int64_t stride,
                           int64_t chunks, __m256i* iacc) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  // Lanes 0-7 take scale 2c, lanes 8-15 scale 2c + 1: as int16 pairs (scale, 0).
  const __m512i all = _mm512_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales)));
  __m512i acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_si512();
  int64_t c = 0;
  for (; c < chunks; c += 2) {
    __m512i w[2], sv[2];
    int n = 1;
    if (c + 1 < chunks) {  // two chunks from one 64-byte read
      const __m512i v = _mm512_loadu_si512(q + c * 32);
      const __m512i lo = _mm512_and_si512(v, nibble);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
      w[0] = _mm512_shuffle_i64x2(lo, hi, 0x44);  // [lo 0-31 | hi 0-31]: chunk c
      w[1] = _mm512_shuffle_i64x2(lo, hi, 0xEE);  // [lo 32-63 | hi 32-63]: chunk c + 1
      n = 2;
    } else {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + c * 32));
      const __m256i lo = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
      w[0] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
    for (int j = 0; j < n; ++j) sv[j] = _mm512_permutexvar_epi32(SCALE_LANES[c + j], all);
    for (int r = 0; r < R; ++r) {
      for (int j = 0; j < n; ++j) {
        const __m512i xv = _mm512_loadu_si512(x + r * stride + (c + j) * 64);
        acc[r] = _mm512_dpwssd_epi32(acc[r], _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[j], xv), sv[j]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    iacc[r] = _mm256_add_epi32(_mm512_castsi512_si256(acc[r]), _mm512_extracti64x4_epi64(acc[r], 1));
}
#endif

#if !SPECDEC_Q4_AVX512
// Byte-shuffle controls that pick int16 g of each 128-bit half into every int16 lane.
inline const __m256i SCALE_PICK[GROUPS] = {
    _mm256_set1_epi16(0x0100), _mm256_set1_epi16(0x0302), _mm256_set1_epi16(0x0504),
    _mm256_set1_epi16(0x0706), _mm256_set1_epi16(0x0908), _mm256_set1_epi16(0x0B0A),
    _mm256_set1_epi16(0x0D0C), _mm256_set1_epi16(0x0F0E)};
#endif

// Weight rows a row's loop prefetches ahead of itself. A row of the 1.5B's K = 1536 shapes
// is 768 bytes of nibbles, too short for the hardware prefetchers to follow from one row to
// the next: measured on a Zen 3, 1-2 rows streamed 21-24 GB/s without software prefetch and
// 24-29 with it, 2 to 8 rows ahead alike (prefetching past the arrays' end is harmless).
constexpr int64_t PREFETCH_ROWS = 4;

// Rows [0, R) of the quantized activations against output rows [begin, end) of W. The
// integer accumulators take registers (one per row); the float ones live in a small array
// touched once per super-block, which lets one pass over a weight row serve up to 8 rows
// (with 8 float accumulators in registers too, it served 4, and a 5-row verify paid for
// a second pass: 18% more than this on the 1.5B's gate/up shape).
template <int R>
void rows_times_weights(const Activations& a, int64_t row0, const uint8_t* qs, const uint8_t* sc,
                        const uint8_t* mn, const float* d, const float* dmin, const float* bias,
                        float* y, int64_t K, int64_t N, int64_t S, int64_t begin, int64_t end) {
  const int64_t G = S * GROUPS, X = a.stride;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const int8_t* xq = a.xq.data() + row0 * X;
  const float* dx = a.dx.data() + row0 * S;
  const float* u = a.u.data() + row0 * G;
  alignas(32) float facc[R][8];
  for (int64_t n = begin; n < end; ++n) {
    for (int r = 0; r < R; ++r) _mm256_store_ps(facc[r], _mm256_setzero_ps());
    const uint8_t* qn = qs + n * (K / 2);
    const uint8_t* scn = sc + n * G;
    // Ask for the weight row PREFETCH_ROWS ahead while this one is read (see PREFETCH_ROWS).
    const char* ahead = reinterpret_cast<const char*>(qn + PREFETCH_ROWS * (K / 2));
    _mm_prefetch(reinterpret_cast<const char*>(sc + (n + PREFETCH_ROWS) * G), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(mn + (n + PREFETCH_ROWS) * G), _MM_HINT_T0);
    for (int64_t s = 0; s < S; ++s) {
      _mm_prefetch(ahead + s * 128, _MM_HINT_T0);  // a super-block's 128 bytes: two lines
      _mm_prefetch(ahead + s * 128 + 64, _MM_HINT_T0);
      const int64_t pairs = (std::min(K, (s + 1) * SB) - s * SB) / 64;
      __m256i iacc[R];
#if SPECDEC_Q4_AVX512
      block_products<R>(qn + s * 128, scn + s * GROUPS, xq + s * SB, X, pairs, iacc);
#else
      for (int r = 0; r < R; ++r) iacc[r] = _mm256_setzero_si256();
      // The super-block's 8 group scales as int16, in both 128-bit halves: one byte shuffle
      // spreads a group's scale over a vector, where a broadcast from memory took three
      // instructions per group.
      const __m256i scales = _mm256_broadcastsi128_si256(
          _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scn + s * GROUPS))));
      for (int64_t p = 0; p < pairs; ++p) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qn + s * 128 + p * 32));
        const __m256i lo = _mm256_and_si256(v, nibble);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
        const __m256i s_lo = _mm256_shuffle_epi8(scales, SCALE_PICK[2 * p]);
        const __m256i s_hi = _mm256_shuffle_epi8(scales, SCALE_PICK[2 * p + 1]);
        const int64_t k = s * SB + p * 64;
        for (int r = 0; r < R; ++r) {
          const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * X + k));
          const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * X + k + 32));
          iacc[r] = _mm256_add_epi32(iacc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), s_lo));
          iacc[r] = _mm256_add_epi32(iacc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), s_hi));
        }
      }
#endif
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
    for (int r = 0; r < R; ++r) y[r * N + n] = simd::hsum(_mm256_load_ps(facc[r])) + (bias ? bias[n] : 0.f);
  }
}

constexpr int64_t MAX_CHUNK = 8;  // rows per pass over a weight row (8 int accumulators)

// Rows in as few passes of at most MAX_CHUNK as there must be, split evenly (9 rows: 5 + 4,
// not 8 + 1, whose second pass repeats the weight unpacking for a single row); a pass
// after the first reads the weight row from L1, where the first left it.
inline int64_t chunk_rows(int64_t R) {
  const int64_t passes = (R + MAX_CHUNK - 1) / MAX_CHUNK;
  return (R + passes - 1) / passes;
}

// f(std::integral_constant<int, C>{}) for C = `rows` (1 to MAX_CHUNK): each row count of a
// pass gets its own instantiation of a kernel templated on it (its accumulators in registers).
template <typename F>
inline void dispatch_rows(int64_t rows, F&& f) {
  switch (rows) {
#define Q4_ROWS(C) \
  case C: f(std::integral_constant<int, C>{}); break;
    Q4_ROWS(1) Q4_ROWS(2) Q4_ROWS(3) Q4_ROWS(4) Q4_ROWS(5) Q4_ROWS(6) Q4_ROWS(7)
#undef Q4_ROWS
    default: f(std::integral_constant<int, 8>{}); break;
  }
}

// A row block's int8 activations (K bytes a row) at most: every output row of a thread's share
// passes over a block while the block is in L2. Why: with all rows at once, a prefill's
// activations (2,048 rows of a 4 x 512-token prompt: 3 MB at K = 1,536, 18 MB at K = 8,960)
// streamed from L3 or memory once per tile of 8 output rows. Measured on a Zen 3 (2 threads,
// 2,048 rows): the 1.5B's down projection 301 -> 182 us a row, gate/up 486 -> 428, qkv 57 -> 48;
// 64-512 KB blocks measured alike, and 8-512 rows are unchanged. The weights are read once per
// block instead of once per call, a few MB against a block's ~100 ms of arithmetic.
constexpr int64_t BLOCK_BYTES = 128 << 10;
// But never fewer rows than this in a block: each block streams the weights again, and a
// decode or verify pass (up to 8 rows a row of the batch) must stream them once. At 64 rows a
// block's arithmetic is ~30x the weights' streaming; the down projection's 64-row blocks
// (573 KB) measured 198 us a row at 2,048 rows, against 182 in 8-row blocks and 301 in one.
constexpr int64_t MIN_BLOCK_ROWS = 64;

// Rows of a row block: as many as BLOCK_BYTES holds, in whole passes of MAX_CHUNK, at least
// MIN_BLOCK_ROWS; all R rows where R is no more than that.
inline int64_t block_rows(int64_t R, int64_t K) {
  const int64_t fits = BLOCK_BYTES / K / MAX_CHUNK * MAX_CHUNK;
  return std::min(R, std::max(MIN_BLOCK_ROWS, fits));
}

inline void run(const Activations& a, int64_t R, const uint8_t* qs, const uint8_t* sc, const uint8_t* mn,
         const float* d, const float* dmin, const float* bias, float* y, int64_t K, int64_t N,
         int64_t S) {
  const int64_t block = block_rows(R, K);
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t b0 = 0; b0 < R; b0 += block) {  // a block of rows, every tile of outputs
      const int64_t b1 = std::min(R, b0 + block), chunk = chunk_rows(b1 - b0);
      for (int64_t n0 = begin; n0 < end; n0 += 8) {  // a tile of output rows, every row chunk
        const int64_t n1 = std::min(end, n0 + 8);
        for (int64_t r0 = b0; r0 < b1; r0 += chunk) {
          dispatch_rows(std::min(chunk, b1 - r0), [&](auto rows) {
            rows_times_weights<decltype(rows)::value>(a, r0, qs, sc, mn, d, dmin, bias, y + r0 * N, K, N, S, n0, n1);
          });
        }
      }
    }
  });
}

// The tile layout (every build): the same values as the row layout, re-ordered so that
// each 32-bit lane of a vector holds one output row's weights. Per tile of 16 output rows
// and super-block s, one block of TILE_BLOCK bytes, tiles after one another and a tile's
// blocks in order of s (one stream per tile):
//   qs   [8 groups][4][64] u8  byte 4j + b of vector i of group g: low nibble = weight
//                              32 g + 8 i + b of output j, high nibble = weight 32 g + 8 i + 4 + b
//   sc   [8][16] u8            group scales; mn [4][16][2] u8: the minimums of groups 2p, 2p + 1
//   d    [16] f32, dmin [16] f32
// Why: in the row layout every output row spends its own float arithmetic on each
// super-block and a vector lane of integer sums covers 4 weights of one output; here a
// `vpdpbusd` against 4 activations broadcast to all lanes advances 16 outputs at once, a
// group's scale multiplies 16 outputs' sums in one `vpdpwssd`, and the float step of a
// super-block serves 16 outputs: about a third of the instructions per extra row, which is
// what a verify pass of several rows pays for (the 4-bit weights themselves are the same).
constexpr int64_t TILE = 16;
constexpr bool TILES = true;  // the tile path is built everywhere (q4_gemv's `TILES`)
constexpr int64_t TILE_QS = GROUPS * 4 * 64, TILE_SC = GROUPS * TILE, TILE_MN = GROUPS * TILE;
constexpr int64_t TILE_D = TILE_QS + TILE_SC + TILE_MN, TILE_BLOCK = TILE_D + 2 * TILE * 4;

// Row layout -> tile layout (N % 16 == 0); scalar, once per layer at load.
inline void to_tiles(const uint8_t* qs, const uint8_t* sc, const uint8_t* mn, const float* d,
                     const float* dmin, uint8_t* out, int64_t N, int64_t K, int64_t S) {
  const int64_t G = S * GROUPS;
  auto level = [&](int64_t n, int64_t k) -> uint8_t {  // weight k of row n, 0 past K
    if (k >= K) return 0;
    const uint8_t byte = qs[n * (K / 2) + (k / 64) * 32 + k % 32];
    return (k % 64) < 32 ? (byte & 0x0F) : (byte >> 4);
  };
  at::parallel_for(0, N / TILE, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t s = 0; s < S; ++s) {
        uint8_t* blk = out + (t * S + s) * TILE_BLOCK;
        for (int64_t j = 0; j < TILE; ++j) {
          const int64_t n = t * TILE + j;
          for (int64_t g = 0; g < GROUPS; ++g) {
            for (int64_t i = 0; i < 4; ++i)
              for (int64_t b = 0; b < 4; ++b) {
                const int64_t k = s * SB + 32 * g + 8 * i + b;
                blk[(g * 4 + i) * 64 + 4 * j + b] = level(n, k) | (level(n, k + 4) << 4);
              }
            blk[TILE_QS + g * TILE + j] = sc[n * G + s * GROUPS + g];
            blk[TILE_QS + TILE_SC + (g / 2) * 2 * TILE + 2 * j + g % 2] = mn[n * G + s * GROUPS + g];
          }
          reinterpret_cast<float*>(blk + TILE_D)[j] = d[n * S + s];
          reinterpret_cast<float*>(blk + TILE_D)[TILE + j] = dmin[n * S + s];
        }
      }
    }
  });
}

// How a tile's stream asks for its blocks ahead of itself, one setting per process (shared
// by the module's files: an inline function's static; `native.set_tile_prefetch`), chosen by
// timing on the machine at hand (`tuning.tune_prefetch`): which is faster depends on the CPU.
//   0: into L1, 2 blocks ahead. Measured on a Zen 4 at one row, 2 blocks streamed the
//      vocabulary head's shape 1.1-1.5x faster than none, 6 no better than 2.
//   1: into L2, 4 blocks ahead. Measured on a 2-vCPU Xeon with AMX (24 GB/s read), the 1.5B's
//      28 layers streamed 15.5 GB/s with 0 and 20.6 with 1 at one row (1.33x), 14.9 and
//      17.5 at four rows; into L1 at 4 or 8 blocks ahead read 15.4-17.7. There a load that
//      misses L1 holds one of few fill buffers until memory answers, while L2 keeps many
//      more requests in flight.
inline int& tile_prefetch() {
  static int level = 0;
  return level;
}

// The blocks a tile's stream asks for ahead of itself, and where (see tile_prefetch): its 38
// lines spread over the block's groups, as all at once they slowed a 4-row pass by a third
// (into L1, on a Zen 4).
template <bool L2>
inline void prefetch_ahead(const uint8_t* blk, int64_t g, int64_t groups) {
  constexpr int64_t PREFETCH_BLOCKS = L2 ? 4 : 2;
  constexpr auto HINT = L2 ? _MM_HINT_T1 : _MM_HINT_T0;
  const int64_t lines = TILE_BLOCK / 64, first = g * lines / groups, last = (g + 1) * lines / groups;
  for (int64_t line = first; line < last; ++line)
    _mm_prefetch(reinterpret_cast<const char*>(blk + PREFETCH_BLOCKS * TILE_BLOCK + line * 64), HINT);
}

#if SPECDEC_Q4_AVX512
// Rows [0, R) of the activations against the 16 output rows of tile t (see to_tiles), the
// blocks ahead prefetched into L2 (`L2`) or L1 (see tile_prefetch).
template <int R, bool L2>
void tile_rows(const Activations& a, int64_t row0, const uint8_t* tiles, const float* bias,
               float* y, int64_t K, int64_t N, int64_t S, int64_t t) {
  const int64_t G = S * GROUPS, X = a.stride;
  const int8_t* xq = a.xq.data() + row0 * X;
  const float* dx = a.dx.data() + row0 * S;
  const int16_t* xs = a.xs.data() + row0 * G;
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const uint8_t* base = tiles + t * S * TILE_BLOCK;
  __m512 f[R];
  for (int r = 0; r < R; ++r) f[r] = _mm512_setzero_ps();
  for (int64_t s = 0; s < S; ++s) {
    const uint8_t* blk = base + s * TILE_BLOCK;
    const int64_t groups = std::min<int64_t>(GROUPS, (K - s * SB) / 32);  // even: K % 64 == 0
    __m512i I[R];
    for (int r = 0; r < R; ++r) I[r] = _mm512_setzero_si512();
    for (int64_t g = 0; g < groups; ++g) {
      prefetch_ahead<L2>(blk, g, groups);
      const __m512i scale = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + TILE_QS + g * TILE)));
      for (int h = 0; h < 2; ++h) {  // 16 weights a half: a lane's sum fits int16 for vpdpwssd
        const uint8_t* q = blk + (g * 4 + 2 * h) * 64;
        const __m512i v0 = _mm512_loadu_si512(q), v1 = _mm512_loadu_si512(q + 64);
        const __m512i lo0 = _mm512_and_si512(v0, nibble), hi0 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), nibble);
        const __m512i lo1 = _mm512_and_si512(v1, nibble), hi1 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), nibble);
        for (int r = 0; r < R; ++r) {
          const int32_t* x4 = reinterpret_cast<const int32_t*>(xq + r * X + s * SB + g * 32 + h * 16);
          __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo0, _mm512_set1_epi32(x4[0]));
          sum = _mm512_dpbusd_epi32(sum, hi0, _mm512_set1_epi32(x4[1]));
          sum = _mm512_dpbusd_epi32(sum, lo1, _mm512_set1_epi32(x4[2]));
          sum = _mm512_dpbusd_epi32(sum, hi1, _mm512_set1_epi32(x4[3]));
          I[r] = _mm512_dpwssd_epi32(I[r], sum, scale);  // |sum| <= 16 * 15 * 127: int16
        }
      }
    }
    __m512i M[R];
    for (int r = 0; r < R; ++r) M[r] = _mm512_setzero_si512();
    for (int64_t p = 0; p < groups / 2; ++p) {
      const __m512i mins = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + TILE_QS + TILE_SC + p * 2 * TILE)));
      for (int r = 0; r < R; ++r) {
        int32_t pair;
        std::memcpy(&pair, xs + r * G + s * GROUPS + 2 * p, sizeof(pair));
        M[r] = _mm512_dpwssd_epi32(M[r], mins, _mm512_set1_epi32(pair));
      }
    }
    const __m512 ds = _mm512_loadu_ps(reinterpret_cast<const float*>(blk + TILE_D));
    const __m512 dmins = _mm512_loadu_ps(reinterpret_cast<const float*>(blk + TILE_D) + TILE);
    for (int r = 0; r < R; ++r) {  // add_block for 16 outputs
      const __m512 dxr = _mm512_set1_ps(dx[r * S + s]);
      f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[r]), _mm512_mul_ps(ds, dxr), f[r]);
      f[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M[r]), _mm512_mul_ps(dmins, dxr), f[r]);
    }
  }
  const __m512 b = bias ? _mm512_loadu_ps(bias + t * TILE) : _mm512_setzero_ps();
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + r * N + t * TILE, _mm512_add_ps(f[r], b));
}
#else
// The same product with AVX2, a tile as two halves of 8 outputs (bytes 32 h..32 h + 31 of a
// 64-byte vector are outputs 8 h..8 h + 7 in every part of a block). `vpmaddubsw` against 4
// activations broadcast to every lane sums two products per int16 lane; a group's 8 of them
// sum in int16 (16 products: at most 16 * 15 * 127 = 30480), and one `vpmaddwd` by the
// group's scales (in both int16 halves of a lane) adds the lane's pair: 9 multiplies per
// 256 products a row where the row layout takes 16. The integer sums, and the float steps
// on them, are the AVX-512 path's operation for operation, so both builds should give the
// same floats (not yet compared on a machine with both).
template <int R, bool L2>
void tile_rows(const Activations& a, int64_t row0, const uint8_t* tiles, const float* bias,
               float* y, int64_t K, int64_t N, int64_t S, int64_t t) {
  const int64_t G = S * GROUPS, X = a.stride;
  const int8_t* xq = a.xq.data() + row0 * X;
  const float* dx = a.dx.data() + row0 * S;
  const int16_t* xs = a.xs.data() + row0 * G;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const uint8_t* base = tiles + t * S * TILE_BLOCK;
  alignas(32) float f[R][TILE];
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) _mm256_store_ps(f[r] + 8 * h, _mm256_setzero_ps());
  for (int64_t s = 0; s < S; ++s) {
    const uint8_t* blk = base + s * TILE_BLOCK;
    const int64_t groups = std::min<int64_t>(GROUPS, (K - s * SB) / 32);  // even: K % 64 == 0
    for (int h = 0; h < 2; ++h) {
      __m256i I[R], M[R];
      for (int r = 0; r < R; ++r) I[r] = M[r] = _mm256_setzero_si256();
      for (int64_t g = 0; g < groups; ++g) {
        if (h == 0) prefetch_ahead<L2>(blk, g, groups);
        const __m256i s32 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + TILE_QS + g * TILE + 8 * h)));
        const __m256i scale = _mm256_or_si256(s32, _mm256_slli_epi32(s32, 16));
        __m256i w[8];  // weights 32 g + 4 j + b of the 8 outputs, as bytes
        for (int i = 0; i < 4; ++i) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + (g * 4 + i) * 64 + 32 * h));
          w[2 * i] = _mm256_and_si256(v, nibble);
          w[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
        }
        for (int r = 0; r < R; ++r) {
          const int32_t* x4 = reinterpret_cast<const int32_t*>(xq + r * X + s * SB + g * 32);
          __m256i sum = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(x4[0]));
          for (int j = 1; j < 8; ++j) sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(w[j], _mm256_set1_epi32(x4[j])));
          I[r] = _mm256_add_epi32(I[r], _mm256_madd_epi16(sum, scale));
        }
      }
      for (int64_t p = 0; p < groups / 2; ++p) {
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + TILE_QS + TILE_SC + p * 2 * TILE + 16 * h)));
        for (int r = 0; r < R; ++r) {
          int32_t pair;
          std::memcpy(&pair, xs + r * G + s * GROUPS + 2 * p, sizeof(pair));
          M[r] = _mm256_add_epi32(M[r], _mm256_madd_epi16(mins, _mm256_set1_epi32(pair)));
        }
      }
      const __m256 ds = _mm256_loadu_ps(reinterpret_cast<const float*>(blk + TILE_D) + 8 * h);
      const __m256 dmins = _mm256_loadu_ps(reinterpret_cast<const float*>(blk + TILE_D) + TILE + 8 * h);
      for (int r = 0; r < R; ++r) {  // add_block for 8 outputs
        const __m256 dxr = _mm256_set1_ps(dx[r * S + s]);
        __m256 acc = _mm256_load_ps(f[r] + 8 * h);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[r]), _mm256_mul_ps(ds, dxr), acc);
        acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(M[r]), _mm256_mul_ps(dmins, dxr), acc);
        _mm256_store_ps(f[r] + 8 * h, acc);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) {
      const __m256 b = bias ? _mm256_loadu_ps(bias + t * TILE + 8 * h) : _mm256_setzero_ps();
      _mm256_storeu_ps(y + r * N + t * TILE + 8 * h, _mm256_add_ps(_mm256_load_ps(f[r] + 8 * h), b));
    }
}
#endif

inline void run_tiles(const Activations& a, int64_t R, const uint8_t* tiles, const float* bias,
                      float* y, int64_t K, int64_t N, int64_t S) {
  const int64_t block = block_rows(R, K);
  const bool l2 = tile_prefetch() == 1;
  at::parallel_for(0, N / TILE, 2, [&](int64_t begin, int64_t end) {
    for (int64_t b0 = 0; b0 < R; b0 += block) {  // as in `run`
      const int64_t b1 = std::min(R, b0 + block), chunk = chunk_rows(b1 - b0);
      for (int64_t t = begin; t < end; ++t) {
        for (int64_t r0 = b0; r0 < b1; r0 += chunk) {
          dispatch_rows(std::min(chunk, b1 - r0), [&](auto rows) {
            constexpr int C = decltype(rows)::value;
            if (l2)
              tile_rows<C, true>(a, r0, tiles, bias, y + r0 * N, K, N, S, t);
            else
              tile_rows<C, false>(a, r0, tiles, bias, y + r0 * N, K, N, S, t);
          });
        }
      }
    }
  });
}

}  // namespace q4
