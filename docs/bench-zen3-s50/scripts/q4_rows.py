# ruff: noqa: E501  (C++ source in a string)
"""Scratch (not landed): the int4 one-row product as landed (q4::run with R = 1, column v0)
against a copy of its loop (v1) and the copy with NI = 2 or 4 output rows interleaved, their
float accumulators in registers and the activation loads shared (v2, v4). Each variant is
checked bitwise against the landed kernel, then timed at 1 and 2 threads on the 0.5B's and
the 1.5B's shapes, weights cycled through ~400 MB: us per call and GB/s of the int4 bytes.

    python docs/bench-zen3-s50/scripts/q4_rows.py [VARIANTS, default 0 1 2 4]

Why: at one row the int4 kernel streams 9-12 GB/s a thread on this Zen 3, under the memory's
rate; one output row's float accumulation is a chain of dependent steps through memory, and
interleaving rows would overlap those chains if latency were what bound it.
"""

import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load_inline

from specdec.models import quant

ROOT = Path(__file__).resolve().parents[3]
SOURCE = r"""
#include "Q4_KERNEL_H"
namespace variant {
template <int NI>
void rows(const q4::Activations& a, const uint8_t* qs, const uint8_t* sc, const uint8_t* mn,
          const float* d, const float* dmin, float* y, int64_t K, int64_t N, int64_t S,
          int64_t begin, int64_t end) {
  const int64_t G = S * q4::GROUPS;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const int8_t* xq = a.xq.data();
  const float* dx = a.dx.data();
  const float* u = a.u.data();
  for (int64_t n = begin; n < end; n += NI) {
    __m256 facc[NI];
    for (int i = 0; i < NI; ++i) facc[i] = _mm256_setzero_ps();
    const char* ahead = reinterpret_cast<const char*>(qs + (n + q4::PREFETCH_ROWS * NI) * (K / 2));
    for (int i = 0; i < NI; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(sc + (n + i + q4::PREFETCH_ROWS * NI) * G), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(mn + (n + i + q4::PREFETCH_ROWS * NI) * G), _MM_HINT_T0);
    }
    for (int64_t s = 0; s < S; ++s) {
      for (int i = 0; i < NI; ++i) {
        _mm_prefetch(ahead + i * (K / 2) + s * 128, _MM_HINT_T0);
        _mm_prefetch(ahead + i * (K / 2) + s * 128 + 64, _MM_HINT_T0);
      }
      const int64_t pairs = (std::min(K, (s + 1) * q4::SB) - s * q4::SB) / 64;
      __m256i iacc[NI], scales[NI];
      for (int i = 0; i < NI; ++i) {
        iacc[i] = _mm256_setzero_si256();
        scales[i] = _mm256_broadcastsi128_si256(
            _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + (n + i) * G + s * q4::GROUPS))));
      }
      for (int64_t p = 0; p < pairs; ++p) {
        const int64_t k = s * q4::SB + p * 64;
        const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + k));
        const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + k + 32));
        for (int i = 0; i < NI; ++i) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + (n + i) * (K / 2) + s * 128 + p * 32));
          const __m256i lo = _mm256_and_si256(v, nibble);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
          const __m256i s_lo = _mm256_shuffle_epi8(scales[i], q4::SCALE_PICK[2 * p]);
          const __m256i s_hi = _mm256_shuffle_epi8(scales[i], q4::SCALE_PICK[2 * p + 1]);
          iacc[i] = _mm256_add_epi32(iacc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), s_lo));
          iacc[i] = _mm256_add_epi32(iacc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), s_hi));
        }
      }
      const __m256 us = _mm256_loadu_ps(u + s * q4::GROUPS);
      for (int i = 0; i < NI; ++i) {
        const __m128i mins8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(mn + (n + i) * G + s * q4::GROUPS));
        const __m256 mins = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mins8)), _mm256_set1_ps(dmin[(n + i) * S + s]));
        facc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[i]), _mm256_set1_ps(d[(n + i) * S + s] * dx[s]), facc[i]);
        facc[i] = _mm256_fnmadd_ps(mins, us, facc[i]);
      }
    }
    for (int i = 0; i < NI; ++i) y[n + i] = simd::hsum(facc[i]) + 0.f;
  }
}
}  // namespace variant

torch::Tensor run(torch::Tensor x, torch::Tensor qs, torch::Tensor sc, torch::Tensor mn, torch::Tensor d, torch::Tensor dmin, int64_t which) {
  const int64_t K = x.size(1), N = qs.size(0), S = (K + q4::SB - 1) / q4::SB;
  auto y = torch::empty({1, N}, x.options());
  const q4::Activations a = q4::quantize_rows(x.data_ptr<float>(), 1, K, S);
  const uint8_t *q = qs.data_ptr<uint8_t>(), *s = sc.data_ptr<uint8_t>(), *m = mn.data_ptr<uint8_t>();
  const float *dd = d.data_ptr<float>(), *dm = dmin.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  if (which == 0) {
    q4::run(a, 1, q, s, m, dd, dm, nullptr, yp, K, N, S);
  } else {
    at::parallel_for(0, N / 16, 1, [&](int64_t b, int64_t e) {
      if (which == 2) variant::rows<2>(a, q, s, m, dd, dm, yp, K, N, S, b * 16, e * 16);
      else if (which == 4) variant::rows<4>(a, q, s, m, dd, dm, yp, K, N, S, b * 16, e * 16);
      else variant::rows<1>(a, q, s, m, dd, dm, yp, K, N, S, b * 16, e * 16);
    });
  }
  return y;
}
"""
ext = load_inline(
    "q4_variants_s50",
    [SOURCE.replace("Q4_KERNEL_H", str(ROOT / "specdec/models/native/q4_kernel.h"))],
    functions=["run"],
    extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
    build_directory=None,
    verbose=False,
)
variants = [int(v) for v in sys.argv[1:]] or [0, 1, 2, 4]
shapes = [
    (1152, 896),
    (896, 896),
    (9728, 896),
    (896, 4864),
    (151936, 896),
    (1536, 1536),
    (17920, 1536),
    (1536, 8960),
]
for N, K in shapes:
    w = quant.q4_quantize(torch.randn(N, K) * 0.02)
    t = [x.contiguous() for x in w.tensors()]
    nbytes = sum(x.numel() * x.element_size() for x in t)
    copies = [[x.clone() for x in t] for _ in range(max(1, int(400e6 // nbytes)))]
    x = torch.randn(1, K)
    ref = ext.run(x, *t, 0)
    for v in variants:
        assert torch.equal(ext.run(x, *t, v), ref), (N, K, v)
    res = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for _rep in range(4):
            for v in variants:
                start = time.perf_counter()
                for c in copies:
                    ext.run(x, *c, v)
                res.setdefault((threads, v), []).append((time.perf_counter() - start) / len(copies))
    line = f"{N}x{K} {nbytes / 1e6:.2f} MB:"
    for (th, v), times in res.items():
        us = 1e6 * statistics.median(times)
        line += f"  {th}T v{v} {us:.0f}us {nbytes / us / 1e3:.1f}"
    print(line, flush=True)
