// AVX2 helpers shared by the native kernels (bf16_kernel.h, q4_kernel.h, decode_stack.cpp).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace simd {

// 8 bf16 -> 8 fp32: a bf16 is the top half of an fp32.
inline __m256 widen_bf16(const uint16_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

// The sum of 8 floats, in a fixed order (the kernels' results depend on it bitwise).
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace simd
