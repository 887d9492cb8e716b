// Prototype: the bf16 product on AMX tiles (`tdpbf16ps`) over the pair panels the AVX-512
// BF16 build already packs ([N / 16, K / 2, 32]): 16 consecutive lines of a panel (32 k of
// its 16 outputs, by pairs) are exactly one B tile (16 rows x 64 bytes), and R rows of x in
// bf16 (32 k a row) one A tile, so C [R, 16] += A B is one instruction of 16 R x 512 MACs.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <vector>

namespace {
constexpr int ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: C of four panels [R, 16] fp32; 4: A [R, 32 bf16]; 5-7: B [16 pairs, 16 x 2].
inline void configure(int R) {
  TileConfig cfg;
  for (int t = 0; t < 5; ++t) cfg.rows[t] = R, cfg.colsb[t] = 64;
  for (int t = 5; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
}

template <int V>
inline void amx_panels(const uint16_t* xb, const uint16_t* panel, float* y, int64_t ldy, int64_t K, int ahead) {
  const int64_t K2 = K / 2;
  if constexpr (V > 0) _tile_zero(0);
  if constexpr (V > 1) _tile_zero(1);
  if constexpr (V > 2) _tile_zero(2);
  if constexpr (V > 3) _tile_zero(3);
  for (int64_t kb = 0; kb < K; kb += 32) {
    const uint16_t* b = panel + kb / 2 * 32;  // line kb / 2 of panel 0
    if (ahead)
      for (int v = 0; v < V; ++v)
        for (int l = 0; l < 16; l += 1)
          _mm_prefetch(reinterpret_cast<const char*>(b + v * K2 * 32 + (ahead * 16 + l) * 32), _MM_HINT_T0);
    _tile_loadd(4, xb + kb, K * 2);
    _tile_loadd(5, b, 64);
    _tile_dpbf16ps(0, 4, 5);
    if constexpr (V > 1) { _tile_loadd(6, b + K2 * 32, 64); _tile_dpbf16ps(1, 4, 6); }
    if constexpr (V > 2) { _tile_loadd(7, b + 2 * K2 * 32, 64); _tile_dpbf16ps(2, 4, 7); }
    if constexpr (V > 3) { _tile_loadd(5, b + 3 * K2 * 32, 64); _tile_dpbf16ps(3, 4, 5); }
  }
  _tile_stored(0, y, ldy * 4);
  if constexpr (V > 1) _tile_stored(1, y + 16, ldy * 4);
  if constexpr (V > 2) _tile_stored(2, y + 32, ldy * 4);
  if constexpr (V > 3) _tile_stored(3, y + 48, ldy * 4);
}
}  // namespace

bool amx_init() { return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0; }

// x [R, K] fp32 (bf16 values), R <= 16, K % 32 == 0; wp [N/16, K/2, 32] bf16, N % (16 V) == 0.
torch::Tensor amx(torch::Tensor x, torch::Tensor wp, int64_t V, int64_t ahead) {
  const int64_t R = x.size(0), K = x.size(1), N = wp.size(0) * 16, K2 = K / 2;
  TORCH_CHECK(R <= 16 && K % 32 == 0 && N % (16 * V) == 0, "shapes");
  auto xb = x.to(torch::kBFloat16).contiguous();
  auto y = torch::empty({R, N}, x.options());
  const uint16_t* xs = reinterpret_cast<const uint16_t*>(xb.data_ptr<at::BFloat16>());
  const uint16_t* w = reinterpret_cast<const uint16_t*>(wp.data_ptr<at::BFloat16>());
  float* out = y.data_ptr<float>();
  const int a = static_cast<int>(ahead);
  const int64_t groups = N / 16 / V;
  at::parallel_for(0, groups, std::max<int64_t>(1, 64 / (16 * V)), [&](int64_t b, int64_t e) {
    configure(static_cast<int>(R));
    for (int64_t g = b; g < e; ++g) {
      const uint16_t* p = w + g * V * K2 * 32;
      float* yo = out + g * V * 16;
      switch (V) {
        case 1: amx_panels<1>(xs, p, yo, N, K, a); break;
        case 2: amx_panels<2>(xs, p, yo, N, K, a); break;
        default: amx_panels<4>(xs, p, yo, N, K, a); break;
      }
    }
    _tile_release();
  });
  return y;
}
