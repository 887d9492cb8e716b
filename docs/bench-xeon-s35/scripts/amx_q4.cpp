// Stop 35's AMX experiment (not adopted: the AVX-512 tile path is memory-bound up to 8 rows
// on the AMX Xeon, see docs/BENCHMARKS.md). Bitwise what q4::run_tiles computes.
#include "q4_kernel.h"
#include <sys/syscall.h>
#include <unistd.h>

namespace amxq {
using namespace q4;
constexpr int64_t PREFETCH_BLOCKS = 2;  // the AVX-512 path's level 0
struct Cfg { uint8_t palette, start; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; };

inline void configure(int R) {
  Cfg c; std::memset(&c, 0, sizeof c); c.palette = 1;
  // tiles 0,1: C [R x 16 i32]; 2,3: A [R x 32 i8]; 4,5: B [8 x 64 u8]
  for (int i : {0, 1}) { c.rows[i] = R; c.colsb[i] = 64; }
  for (int i : {2, 3}) { c.rows[i] = R; c.colsb[i] = 32; }
  for (int i : {4, 5}) { c.rows[i] = 8; c.colsb[i] = 64; }
  _tile_loadconfig(&c);
}

template <int R>
void tile_rows_amx(const Activations& a, int64_t row0, const uint8_t* tiles, const float* bias,
               float* y, int64_t K, int64_t N, int64_t S, int64_t t) {
  const int64_t G = S * GROUPS, X = a.stride;
  const int8_t* xq = a.xq.data() + row0 * X;
  const float* dx = a.dx.data() + row0 * S;
  const int16_t* xs = a.xs.data() + row0 * G;
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const uint8_t* base = tiles + t * S * TILE_BLOCK;
  alignas(64) uint8_t bbuf[GROUPS][8][64];
  alignas(64) int32_t cbuf[GROUPS][16][16];
  __m512 f[R];
  for (int r = 0; r < R; ++r) f[r] = _mm512_setzero_ps();
  for (int64_t s = 0; s < S; ++s) {
    const uint8_t* blk = base + s * TILE_BLOCK;
    const int64_t groups = std::min<int64_t>(GROUPS, (K - s * SB) / 32);
    const int64_t lines = TILE_BLOCK / 64;
    for (int64_t line = 0; line < lines; ++line)
      _mm_prefetch(reinterpret_cast<const char*>(blk + PREFETCH_BLOCKS * TILE_BLOCK + line * 64), _MM_HINT_T0);
    for (int64_t g = 0; g < groups; ++g) {
      for (int i = 0; i < 4; ++i) {
        const __m512i v = _mm512_loadu_si512(blk + (g * 4 + i) * 64);
        _mm512_store_si512(bbuf[g][2 * i], _mm512_and_si512(v, nibble));
        _mm512_store_si512(bbuf[g][2 * i + 1], _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble));
      }
    }
    const int8_t* xg = xq + s * SB;
    for (int64_t g = 0; g + 1 < groups; g += 2) {
      _tile_zero(0); _tile_zero(1);
      _tile_loadd(2, xg + g * 32, X); _tile_loadd(4, bbuf[g], 64);
      _tile_loadd(3, xg + g * 32 + 32, X); _tile_loadd(5, bbuf[g + 1], 64);
      _tile_dpbsud(0, 2, 4);
      _tile_dpbsud(1, 3, 5);
      _tile_stored(0, cbuf[g], 64);
      _tile_stored(1, cbuf[g + 1], 64);
    }
    __m512i I[R];
    for (int r = 0; r < R; ++r) I[r] = _mm512_setzero_si512();
    for (int64_t g = 0; g < groups; ++g) {
      const __m512i scale = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + TILE_QS + g * TILE)));
      for (int r = 0; r < R; ++r)
        I[r] = _mm512_add_epi32(I[r], _mm512_mullo_epi32(_mm512_load_si512(cbuf[g][r]), scale));
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
    for (int r = 0; r < R; ++r) {
      const __m512 dxr = _mm512_set1_ps(dx[r * S + s]);
      f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[r]), _mm512_mul_ps(ds, dxr), f[r]);
      f[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M[r]), _mm512_mul_ps(dmins, dxr), f[r]);
    }
  }
  const __m512 b = bias ? _mm512_loadu_ps(bias + t * TILE) : _mm512_setzero_ps();
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + r * N + t * TILE, _mm512_add_ps(f[r], b));
}

template <typename F>
inline void dispatch16(int64_t rows, F&& f) {
  switch (rows) {
#define C(n) case n: f(std::integral_constant<int, n>{}); break;
    C(1) C(2) C(3) C(4) C(5) C(6) C(7) C(8) C(9) C(10) C(11) C(12) C(13) C(14) C(15)
#undef C
    default: f(std::integral_constant<int, 16>{}); break;
  }
}

void run_amx(const Activations& a, int64_t R, const uint8_t* tiles, const float* bias, float* y, int64_t K, int64_t N, int64_t S) {
  const int64_t passes = (R + 15) / 16, chunk = (R + passes - 1) / passes;
  at::parallel_for(0, N / TILE, 2, [&](int64_t begin, int64_t end) {
    for (int64_t r0 = 0; r0 < R; r0 += chunk) {
      const int64_t rows = std::min(chunk, R - r0);
      configure(rows);
      for (int64_t t = begin; t < end; ++t)
        dispatch16(rows, [&](auto c) { tile_rows_amx<decltype(c)::value>(a, r0, tiles, bias, y + r0 * N, K, N, S, t); });
    }
    _tile_release();
  });
}
}  // namespace amxq

torch::Tensor gemv(torch::Tensor x, torch::Tensor tiles, int64_t N, bool amx) {
  const int64_t R = x.size(0), K = x.size(1), S = (K + q4::SB - 1) / q4::SB;
  auto y = torch::empty({R, N}, x.options().dtype(torch::kFloat));
  const q4::Activations a = q4::quantize_rows(x.data_ptr<float>(), R, K, S);
  if (amx) amxq::run_amx(a, R, tiles.data_ptr<uint8_t>(), nullptr, y.data_ptr<float>(), K, N, S);
  else q4::run_tiles(a, R, tiles.data_ptr<uint8_t>(), nullptr, y.data_ptr<float>(), K, N, S);
  return y;
}
bool perm() { return syscall(SYS_arch_prctl, 0x1023, 18) == 0; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("gemv", &gemv); m.def("perm", &perm); }
