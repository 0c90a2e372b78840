// AVX-512 kernels for the decode-path dot products with F32 activations on the
// 32-element formats (Q4_0, Q4_1, Q8_0): 16 lanes halve the decode instructions
// of the AVX2 versions. Compiled with AVX-512 flags; called only when available.
// GCC 12 warns inside its own AVX-512 headers (a known false positive).
#if defined(__GNUC__) && !defined(__clang__)  // GCC only: clang knows neither the warnings nor the false positives
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/quant.h"

namespace ps::avx512 {
namespace {

inline float HalfToFloat(uint16_t h) { return _cvtsh_ss(h); }

// Nibbles of one 32-element block as two vectors of 16 floats (elements 0..15, 16..31).
inline void Nibbles(const uint8_t* qs, __m512* lo, __m512* hi) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m4 = _mm_set1_epi8(0x0F);
  *lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(raw, m4)));
  *hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(raw, 4), m4)));
}

float DotQ4_0(const BlockQ4_0* b, const float* x, const float* sums, int64_t nb) {
  __m512 acc = _mm512_setzero_ps();
  float off = 0;
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    __m512 lo, hi;
    Nibbles(b[i].qs, &lo, &hi);
    const __m512 p = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + 16), _mm512_mul_ps(lo, _mm512_loadu_ps(x)));
    const float d = HalfToFloat(b[i].d);
    acc = _mm512_fmadd_ps(_mm512_set1_ps(d), p, acc);
    off += d * sums[i];
  }
  return _mm512_reduce_add_ps(acc) - 8.0f * off;
}

float DotQ4_1(const BlockQ4_1* b, const float* x, const float* sums, int64_t nb) {
  __m512 acc = _mm512_setzero_ps();
  float off = 0;
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    __m512 lo, hi;
    Nibbles(b[i].qs, &lo, &hi);
    const __m512 p = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + 16), _mm512_mul_ps(lo, _mm512_loadu_ps(x)));
    acc = _mm512_fmadd_ps(_mm512_set1_ps(HalfToFloat(b[i].d)), p, acc);
    off += HalfToFloat(b[i].m) * sums[i];
  }
  return _mm512_reduce_add_ps(acc) + off;
}

float DotQ8_0(const BlockQ8_0* b, const float* x, int64_t nb) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    const __m512 lo =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs))));
    const __m512 hi =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs + 16))));
    const __m512 p = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + 16), _mm512_mul_ps(lo, _mm512_loadu_ps(x)));
    acc = _mm512_fmadd_ps(_mm512_set1_ps(HalfToFloat(b[i].d)), p, acc);
  }
  return _mm512_reduce_add_ps(acc);
}

}  // namespace

void DequantizeRow(DType type, const void* row, float* out, int64_t n) {
  // Plain multiply and add (no FMA): bit for bit the reference's results.
  for (int64_t i = 0; i < n / kQK; ++i, out += kQK) {
    __m512 lo, hi;
    if (type == DType::kQ8_0) {
      const BlockQ8_0& b = static_cast<const BlockQ8_0*>(row)[i];
      const __m512 d = _mm512_set1_ps(HalfToFloat(b.d));
      lo = _mm512_mul_ps(
          _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs)))), d);
      hi = _mm512_mul_ps(
          _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16)))), d);
    } else if (type == DType::kQ4_0) {
      const BlockQ4_0& b = static_cast<const BlockQ4_0*>(row)[i];
      const __m512 d = _mm512_set1_ps(HalfToFloat(b.d)), eight = _mm512_set1_ps(8.0f);
      Nibbles(b.qs, &lo, &hi);
      lo = _mm512_mul_ps(_mm512_sub_ps(lo, eight), d);
      hi = _mm512_mul_ps(_mm512_sub_ps(hi, eight), d);
    } else {
      const BlockQ4_1& b = static_cast<const BlockQ4_1*>(row)[i];
      const __m512 d = _mm512_set1_ps(HalfToFloat(b.d)), m = _mm512_set1_ps(HalfToFloat(b.m));
      Nibbles(b.qs, &lo, &hi);
      lo = _mm512_add_ps(_mm512_mul_ps(lo, d), m);
      hi = _mm512_add_ps(_mm512_mul_ps(hi, d), m);
    }
    _mm512_storeu_ps(out, lo);
    _mm512_storeu_ps(out + 16, hi);
  }
}

bool Available() { return ActiveCpuIsa() >= CpuIsa::kAvx512; }

bool Supports(DType type) { return type == DType::kQ4_0 || type == DType::kQ4_1 || type == DType::kQ8_0; }

float DotF32Act(DType type, const void* row, const float* x, const float* sums, int64_t n) {
  switch (type) {
    case DType::kQ4_0: return DotQ4_0(static_cast<const BlockQ4_0*>(row), x, sums, n / kQK);
    case DType::kQ4_1: return DotQ4_1(static_cast<const BlockQ4_1*>(row), x, sums, n / kQK);
    default: return DotQ8_0(static_cast<const BlockQ8_0*>(row), x, n / kQK);
  }
}

}  // namespace ps::avx512
