// GCC 12 warns inside its own AVX-512 headers (a known false positive).
#if defined(__GNUC__) && !defined(__clang__)  // GCC only: clang knows neither the warnings nor the false positives
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "kernels/cpu/half_rows.h"

#include <immintrin.h>

#include "base/fp16.h"
#include "kernels/cpu/quant.h"

namespace ps {
namespace {

inline float ToF32(DType t, uint16_t h) { return t == DType::kF16 ? Fp16ToFp32(h) : Bf16ToFp32(h); }
inline uint16_t FromF32(DType t, float f) { return t == DType::kF16 ? Fp32ToFp16(f) : Fp32ToBf16(f); }

#define PS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma")))

PS_AVX512 inline __m512 Load16(DType t, const uint16_t* x) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  if (t == DType::kF16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

PS_AVX512 inline void Store16(DType t, __m512 v, uint16_t* out) {
  __m256i h;
  if (t == DType::kF16) {
    h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  } else {  // round to nearest even on the upper 16 bits; NaNs stay NaNs (quiet bit set)
    const __m512i x = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
    h = _mm512_cvtepi32_epi16(r);
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), h);
}

PS_AVX512 void HalfToF32Avx512(DType t, const uint16_t* x, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, Load16(t, x + i));
  for (; i < n; ++i) out[i] = ToF32(t, x[i]);
}

PS_AVX512 void F32ToHalfAvx512(DType t, const float* x, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) Store16(t, _mm512_loadu_ps(x + i), out + i);
  for (; i < n; ++i) out[i] = FromF32(t, x[i]);
}

PS_AVX512 float DotHalfAvx512(DType t, const uint16_t* x, const float* y, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(Load16(t, x + i), _mm512_loadu_ps(y + i), acc);
  float s = _mm512_reduce_add_ps(acc);
  for (; i < n; ++i) s += ToF32(t, x[i]) * y[i];
  return s;
}

PS_AVX512 void AxpyHalfAvx512(DType t, float a, const uint16_t* x, float* y, int64_t n) {
  const __m512 va = _mm512_set1_ps(a);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, Load16(t, x + i), _mm512_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += a * ToF32(t, x[i]);
}

// The same eight at a time (AVX2 + F16C). BF16 rounding as Store16's, without masks.
#define PS_AVX2 __attribute__((target("avx2,f16c,fma")))

PS_AVX2 inline __m256 Load8(DType t, const uint16_t* x) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  if (t == DType::kF16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

PS_AVX2 inline void Store8(DType t, __m256 v, uint16_t* out) {
  __m128i h;
  if (t == DType::kF16) {
    h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  } else {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i nan =
        _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40)), nan);
    h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), h);
}

PS_AVX2 void HalfToF32Avx2(DType t, const uint16_t* x, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, Load8(t, x + i));
  for (; i < n; ++i) out[i] = ToF32(t, x[i]);
}

PS_AVX2 void F32ToHalfAvx2(DType t, const float* x, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) Store8(t, _mm256_loadu_ps(x + i), out + i);
  for (; i < n; ++i) out[i] = FromF32(t, x[i]);
}

PS_AVX2 float DotHalfAvx2(DType t, const uint16_t* x, const float* y, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(Load8(t, x + i), _mm256_loadu_ps(y + i), acc0);
    acc1 = _mm256_fmadd_ps(Load8(t, x + i + 8), _mm256_loadu_ps(y + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(Load8(t, x + i), _mm256_loadu_ps(y + i), acc0);
  const __m256 acc = _mm256_add_ps(acc0, acc1);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  float s = _mm_cvtss_f32(_mm_add_ss(s4, _mm_movehdup_ps(s4)));
  for (; i < n; ++i) s += ToF32(t, x[i]) * y[i];
  return s;
}

PS_AVX2 void AxpyHalfAvx2(DType t, float a, const uint16_t* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, Load8(t, x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * ToF32(t, x[i]);
}

}  // namespace

void HalfToF32(DType t, const uint16_t* x, float* out, int64_t n) {
  if (avx512::Available()) return HalfToF32Avx512(t, x, out, n);
  if (avx2::Available()) return HalfToF32Avx2(t, x, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = ToF32(t, x[i]);
}

void F32ToHalf(DType t, const float* x, uint16_t* out, int64_t n) {
  if (avx512::Available()) return F32ToHalfAvx512(t, x, out, n);
  if (avx2::Available()) return F32ToHalfAvx2(t, x, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = FromF32(t, x[i]);
}

float DotHalf(DType t, const uint16_t* x, const float* y, int64_t n) {
  if (avx512::Available()) return DotHalfAvx512(t, x, y, n);
  if (avx2::Available()) return DotHalfAvx2(t, x, y, n);
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += ToF32(t, x[i]) * y[i];
  return s;
}

void AxpyHalf(DType t, float a, const uint16_t* x, float* y, int64_t n) {
  if (avx512::Available()) return AxpyHalfAvx512(t, a, x, y, n);
  if (avx2::Available()) return AxpyHalfAvx2(t, a, x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] += a * ToF32(t, x[i]);
}

}  // namespace ps
