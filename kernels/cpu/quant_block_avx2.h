// One block of 32 floats to int8, as llama.cpp's Q8_0 rounds it: shared by the files
// compiled for AVX2 (quant_avx2.cc, packed_avx2.cc) and to be included by no other.
#pragma once

#include <immintrin.h>

namespace ps::avx2 {

// Loads x[0..32) into v and returns the largest |x[i]|.
inline float LoadAbsMax32(const float* x, __m256 v[4]) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  __m256 amax = _mm256_setzero_ps();
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_loadu_ps(x + 8 * k);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, v[k]));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// q[k] = round-to-nearest-even(v[k] * inverse_scale) as int32; returns the 32 values as
// int8 in order.
inline __m256i QuantizeBytes32(const __m256 v[4], float inverse_scale, __m256i q[4]) {
  const __m256 id = _mm256_set1_ps(inverse_scale);
  for (int k = 0; k < 4; ++k) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], id));
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  return _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

}  // namespace ps::avx2
