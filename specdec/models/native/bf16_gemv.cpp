// y = x @ W.T for the few rows of a decode or verify step, W in bf16, on CPUs whose vector
// units have no bf16 arithmetic (AVX2 + FMA, e.g. Zen 3): each weight is widened to fp32 in
// registers (a bf16 is the top half of an fp32) as it streams from memory, once for all
// rows of x, so a step reads the bf16 bytes once instead of an fp32 copy twice their size.
// The pure-PyTorch equivalent, which the tests compare against, is
// F.linear(x.float(), W.float()).

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace {

inline __m256 widen(const uint16_t* p) {  // 8 bf16 -> 8 fp32
  __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// R rows of x against output rows [begin, end) of W [N, K], T output rows at a time (T
// independent weight streams keep more loads in flight); K % 8 == 0.
//
// Each block of T weight rows asks for the next block's bytes as it reads its own (a
// software prefetch one block ahead, a cache line per row every 32 weights). The hardware
// prefetchers alone lose the stream at each row's end when rows are short: measured on a
// Zen 3 for the 1.5B's K = 1536 shapes, 1-4 rows streamed 15-26 GB/s without it and 23-32
// with it (the read bandwidth is 32-33).
template <int R, int T>
void rows_times_weights(const float* x, const uint16_t* w, float* y, int64_t K, int64_t N,
                        int64_t begin, int64_t end) {
  int64_t n = begin;
  for (; n + T <= end; n += T) {
    __m256 acc[T][R];
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) acc[t][r] = _mm256_setzero_ps();
    const uint16_t* next_block = w + (n + T) * K;  // prefetching past W's end is harmless
    for (int64_t k = 0; k < K; k += 8) {
      if (k % 32 == 0)
        for (int t = 0; t < T; ++t)
          _mm_prefetch(reinterpret_cast<const char*>(next_block + t * K + k), _MM_HINT_T0);
      for (int t = 0; t < T; ++t) {
        __m256 wf = widen(w + (n + t) * K + k);
        for (int r = 0; r < R; ++r)
          acc[t][r] = _mm256_fmadd_ps(wf, _mm256_loadu_ps(x + r * K + k), acc[t][r]);
      }
    }
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) y[r * N + n + t] = hsum(acc[t][r]);
  }
  if (n < end) rows_times_weights<R, 1>(x, w, y, K, N, n, end);
}

template <int R>
void run(const float* x, const uint16_t* w, float* y, int64_t K, int64_t N) {
  // Chunks of output rows per thread: large enough to stream, small enough to balance.
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
    constexpr int T = R <= 2 ? 4 : (R <= 4 ? 2 : 1);  // T * R accumulators <= 12 registers
    rows_times_weights<R, T>(x, w, y, K, N, begin, end);
  });
}

}  // namespace

// x [R, K] fp32 (R <= 8), w [N, K] bf16 contiguous, K % 8 == 0 -> y [R, N] fp32.
torch::Tensor bf16_gemv(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "shapes");
  TORCH_CHECK(x.scalar_type() == torch::kFloat && w.scalar_type() == torch::kBFloat16, "dtypes");
  TORCH_CHECK(w.size(1) % 8 == 0 && x.size(0) >= 1 && x.size(0) <= 8, "K % 8, 1..8 rows");
  x = x.contiguous();
  w = w.contiguous();
  const int64_t R = x.size(0), K = x.size(1), N = w.size(0);
  auto y = torch::empty({R, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  float* yp = y.data_ptr<float>();
  switch (R) {
    case 1: run<1>(xp, wp, yp, K, N); break;
    case 2: run<2>(xp, wp, yp, K, N); break;
    case 3: run<3>(xp, wp, yp, K, N); break;
    case 4: run<4>(xp, wp, yp, K, N); break;
    case 5: run<5>(xp, wp, yp, K, N); break;
    case 6: run<6>(xp, wp, yp, K, N); break;
    case 7: run<7>(xp, wp, yp, K, N); break;
    default: run<8>(xp, wp, yp, K, N); break;
  }
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("bf16_gemv", &bf16_gemv, "y = x @ W.T, W bf16 widened in registers (AVX2 + FMA)");
}
