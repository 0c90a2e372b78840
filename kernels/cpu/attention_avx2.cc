// AVX2 + FMA inner loops of attention (see attention_avx2.h). Compiled with those
// flags; called only after avx2::Available() said yes.
#include "kernels/cpu/attention_avx2.h"

#include <immintrin.h>

#include <limits>

namespace ps::avx2 {
namespace {

// Sums of four vectors as one __m128: {Σa, Σb, Σc, Σd}.
inline __m128 Sum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);  // lane 0: partial sums of the low halves, lane 1: high halves
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

inline float Sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// e^v for v <= 0 (as vec.cc's ExpPoly: Cephes range reduction, degree-6 polynomial);
// v below -87.3 (and -inf) gives 0.
inline __m256 Exp(__m256 v) {
  const __m256 under = _mm256_cmp_ps(v, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  v = _mm256_max_ps(v, _mm256_set1_ps(-87.3f));
  const __m256 r = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 y = _mm256_fnmadd_ps(r, _mm256_set1_ps(0.693359375f), v);
  y = _mm256_fmadd_ps(r, _mm256_set1_ps(2.12194440e-4f), y);
  __m256 p = _mm256_set1_ps(1.9875691500E-4f);
  p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.3981999507E-3f));
  p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(8.3334519073E-3f));
  p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(4.1665795894E-2f));
  p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.6666665459E-1f));
  p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(5.0000001201E-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, y), y, _mm256_add_ps(y, _mm256_set1_ps(1.0f)));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(r), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}

}  // namespace

void GroupKeyDots(const float* q, int n_heads, const float* k, int64_t stride, int64_t rows, int hd, float* out,
                  int64_t out_step) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const float* k0 = k + r * stride;
    for (int h = 0; h < n_heads; ++h) {
      const float* qh = q + h * hd;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int d = 0; d < hd; d += 8) {
        const __m256 qv = _mm256_loadu_ps(qh + d);
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + stride + d), a1);
        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * stride + d), a2);
        a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * stride + d), a3);
      }
      _mm_storeu_ps(out + h * out_step + r, Sum4(a0, a1, a2, a3));
    }
  }
  for (; r < rows; ++r) {
    const float* kr = k + r * stride;
    for (int h = 0; h < n_heads; ++h) {
      __m256 a = _mm256_setzero_ps();
      for (int d = 0; d < hd; d += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * hd + d), _mm256_loadu_ps(kr + d), a);
      out[h * out_step + r] = Sum(a);
    }
  }
}

void GroupValueAxpys(const float* p, int64_t p_step, int n_heads, const float* v, int64_t stride, int64_t rows, int hd,
                     float* out) {
  for (int h = 0; h < n_heads; ++h) {
    const float* ph = p + h * p_step;
    float* oh = out + h * hd;
    for (int d0 = 0; d0 < hd; d0 += 64) {  // up to eight accumulators stay in registers across the rows
      const int w = hd - d0 < 64 ? hd - d0 : 64;
      __m256 acc[8];
      for (int j = 0; j < w / 8; ++j) acc[j] = _mm256_loadu_ps(oh + d0 + 8 * j);
      for (int64_t r = 0; r < rows; ++r) {
        if (ph[r] == 0.0f) continue;
        const __m256 pr = _mm256_set1_ps(ph[r]);
        const float* vr = v + r * stride + d0;
        for (int j = 0; j < w / 8; ++j) acc[j] = _mm256_fmadd_ps(pr, _mm256_loadu_ps(vr + 8 * j), acc[j]);
      }
      for (int j = 0; j < w / 8; ++j) _mm256_storeu_ps(oh + d0 + 8 * j, acc[j]);
    }
  }
}

float MaxOf(const float* x, int64_t n) {
  __m256 mv = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  float m = _mm_cvtss_f32(m4);
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

float ExpShifted(float* x, int64_t n, float m) {
  const __m256 vm = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = Sum(acc);
  if (i < n) {  // the tail through a padded vector
    alignas(32) float t[8];
    for (int j = 0; j < 8; ++j) t[j] = i + j < n ? x[i + j] - m : -std::numeric_limits<float>::infinity();
    _mm256_store_ps(t, Exp(_mm256_load_ps(t)));
    for (int64_t j = i; j < n; ++j) x[j] = t[j - i], sum += t[j - i];
  }
  return sum;
}

}  // namespace ps::avx2
