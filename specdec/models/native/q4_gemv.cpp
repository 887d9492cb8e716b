// y = x @ W.T for the few rows of a decode or verify step, W in 4 bits with a scale and a
// minimum per 32 weights (GGUF Q4_K's layout), on CPUs with AVX2. PyTorch's int4 kernel
// widens every weight to floating point and multiplies in fp32, which on AVX2 costs more
// instructions per byte than memory delivers bytes: it runs below the bandwidth even for
// one row and slows with every extra row. Here, as in llama.cpp, the activations are
// quantized too (to int8, one scale per 256 inputs) and the products are integer dot
// products (`vpmaddubsw`: 32 multiply-adds of 4-bit weights by 8-bit activations per
// instruction), so one weight read serves several rows at little extra cost.
//
// Format, per output row n (S = ceil(K / 256) super-blocks, G = 8 S groups of 32):
//   qs   [N, K/2]  u8   bytes i of each 64-weight chunk: low nibble = weight i, high
//                       nibble = weight 32 + i (Q4_K's qs, byte for byte)
//   sc   [N, G]    u8   group scales, mn [N, G] u8 group minimums (0 past K)
//   d    [N, S]    f32  super-block scale of sc, dmin [N, S] f32 of mn
//   w[n, k] = d[n, s] * sc[n, g] * q[n, k] - dmin[n, s] * mn[n, g], g = k / 32, s = k / 256
// Activations, per row r and super-block s: dx = max|x| / 127, xq = round(x * 127 / max|x|).
//
// Batch-invariant: each row's result is computed by the same operations in the same order
// whatever the number of rows, so a one-token decode step and a verify pass agree bitwise.
// The pure-PyTorch equivalent, which the tests compare against, is quant.q4_reference.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <vector>

namespace {

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

// Rows [0, R) of the quantized activations against output rows [begin, end) of W.
template <int R>
void rows_times_weights(const Activations& a, int64_t row0, const uint8_t* qs, const uint8_t* sc,
                        const uint8_t* mn, const float* d, const float* dmin, const float* bias,
                        float* y, int64_t K, int64_t N, int64_t S, int64_t begin, int64_t end) {
  const int64_t G = S * GROUPS;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const int8_t* xq = a.xq.data() + row0 * K;
  const float* dx = a.dx.data() + row0 * S;
  const float* u = a.u.data() + row0 * G;
  for (int64_t n = begin; n < end; ++n) {
    __m256 facc[R];
    for (int r = 0; r < R; ++r) facc[r] = _mm256_setzero_ps();
    const uint8_t* qn = qs + n * (K / 2);
    const uint8_t* scn = sc + n * G;
    for (int64_t s = 0; s < S; ++s) {
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
        facc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[r]), _mm256_set1_ps(ds * dx[r * S + s]), facc[r]);
        facc[r] = _mm256_fnmadd_ps(mins, _mm256_loadu_ps(u + r * G + s * GROUPS), facc[r]);
      }
    }
    for (int r = 0; r < R; ++r) y[r * N + n] = hsum(facc[r]) + (bias ? bias[n] : 0.f);
  }
}

// Rows in chunks of at most 4 (8 accumulators per chunk fit the 16 vector registers); a
// chunk after the first reads the weight row from L1, where the first chunk left it.
void run(const Activations& a, int64_t R, const uint8_t* qs, const uint8_t* sc, const uint8_t* mn,
         const float* d, const float* dmin, const float* bias, float* y, int64_t K, int64_t N,
         int64_t S) {
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n0 = begin; n0 < end; n0 += 8) {  // a tile of output rows, every row chunk
      const int64_t n1 = std::min(end, n0 + 8);
      for (int64_t r0 = 0; r0 < R; r0 += 4) {
        float* yr = y + r0 * N;
        switch (std::min<int64_t>(4, R - r0)) {
          case 1: rows_times_weights<1>(a, r0, qs, sc, mn, d, dmin, bias, yr, K, N, S, n0, n1); break;
          case 2: rows_times_weights<2>(a, r0, qs, sc, mn, d, dmin, bias, yr, K, N, S, n0, n1); break;
          case 3: rows_times_weights<3>(a, r0, qs, sc, mn, d, dmin, bias, yr, K, N, S, n0, n1); break;
          default: rows_times_weights<4>(a, r0, qs, sc, mn, d, dmin, bias, yr, K, N, S, n0, n1); break;
        }
      }
    }
  });
}

}  // namespace

// x [R, K] fp32 or bf16 (K % 64 == 0), the format above, an optional fp32 bias [N] ->
// y [R, N] in x's dtype: (product + bias) rounded once, as `(y + bias).to(x.dtype)` would.
torch::Tensor q4_gemv(torch::Tensor x, torch::Tensor qs, torch::Tensor sc, torch::Tensor mn,
                      torch::Tensor d, torch::Tensor dmin, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2, "x: [R, K]");
  TORCH_CHECK(x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kBFloat16, "x: fp32 or bf16");
  const int64_t R = x.size(0), K = x.size(1), N = qs.size(0), S = (K + SB - 1) / SB;
  TORCH_CHECK(K % 64 == 0 && qs.size(1) == K / 2 && qs.scalar_type() == torch::kUInt8, "qs: [N, K/2] u8, K % 64 == 0");
  TORCH_CHECK(sc.sizes() == mn.sizes() && sc.size(0) == N && sc.size(1) == S * GROUPS, "sc, mn: [N, 8 S] u8");
  TORCH_CHECK(sc.scalar_type() == torch::kUInt8 && mn.scalar_type() == torch::kUInt8, "sc, mn: u8");
  TORCH_CHECK(d.sizes() == dmin.sizes() && d.size(0) == N && d.size(1) == S, "d, dmin: [N, S] f32");
  TORCH_CHECK(d.scalar_type() == torch::kFloat && dmin.scalar_type() == torch::kFloat, "d, dmin: f32");
  torch::Tensor b;
  if (bias.has_value()) {
    b = bias->contiguous();
    TORCH_CHECK(b.dim() == 1 && b.size(0) == N && b.scalar_type() == torch::kFloat, "bias: [N] f32");
  }
  x = x.contiguous();
  qs = qs.contiguous(); sc = sc.contiguous(); mn = mn.contiguous();
  d = d.contiguous(); dmin = dmin.contiguous();
  auto y = torch::empty({R, N}, x.options().dtype(torch::kFloat));
  const Activations a = x.scalar_type() == torch::kFloat
                            ? quantize_rows(x.data_ptr<float>(), R, K, S)
                            : quantize_rows(x.data_ptr<at::BFloat16>(), R, K, S);
  run(a, R, qs.data_ptr<uint8_t>(), sc.data_ptr<uint8_t>(), mn.data_ptr<uint8_t>(),
      d.data_ptr<float>(), dmin.data_ptr<float>(), b.defined() ? b.data_ptr<float>() : nullptr,
      y.data_ptr<float>(), K, N, S);
  if (x.scalar_type() == torch::kFloat) return y;
  auto out = torch::empty({R, N}, x.options());
  const float* yp = y.data_ptr<float>();
  at::BFloat16* op = out.data_ptr<at::BFloat16>();
  for (int64_t i = 0; i < R * N; ++i) op[i] = at::BFloat16(yp[i]);  // round to nearest even
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("q4_gemv", &q4_gemv, "y = x @ W.T + b, W in Q4_K-style 4 bits, x quantized to int8 (AVX2)",
        py::arg("x"), py::arg("qs"), py::arg("sc"), py::arg("mn"), py::arg("d"), py::arg("dmin"),
        py::arg("bias") = py::none());
}
