// AVX2 + FMA inner loops of attention (see attention_avx2.h). Compiled with those
// flags; called only after avx2::Available() said yes.
#include "kernels/cpu/attention_avx2.h"

#include <immintrin.h>

#include <cstdint>
#include <cstring>
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

// Eight elements of a row from element i (a multiple of 8) on, as F32.
template <KvElem T>
inline __m256 Load8(const void* row, int64_t i) {
  if constexpr (T == KvElem::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(row) + i);
  } else if constexpr (T == KvElem::kQ8_0) {
    const auto* block = static_cast<const uint8_t*>(row) + i / 32 * 34;  // fp16 scale, then 32 int8 values
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + 2 + i % 32));
    int16_t scale;
    std::memcpy(&scale, block, sizeof(scale));
    const __m256 d = _mm256_cvtph_ps(_mm_set1_epi16(scale));
    return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + i));
    if constexpr (T == KvElem::kF16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// Row r of rows `stride` elements apart.
template <KvElem T>
inline const void* Row(const void* base, int64_t r, int64_t stride) {
  const int64_t bytes = T == KvElem::kF32 ? 4 * stride : T == KvElem::kQ8_0 ? stride / 32 * 34 : 2 * stride;
  return static_cast<const uint8_t*>(base) + r * bytes;
}

// G heads (q: the first's) against the rows, four rows at a time: 4G accumulators,
// G query vectors and one key vector in registers.
template <KvElem T, int G>
void KeyDotsHeads(const float* q, const void* k, int64_t stride, int64_t rows, int hd, float scale, float* out,
                  int64_t out_step) {
  const __m256 vs = _mm256_set1_ps(scale);
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    __m256 acc[G][4];
    for (int g = 0; g < G; ++g) {
      for (int i = 0; i < 4; ++i) acc[g][i] = _mm256_setzero_ps();
    }
    for (int d = 0; d < hd; d += 8) {
      __m256 qv[G];
      for (int g = 0; g < G; ++g) qv[g] = _mm256_loadu_ps(q + g * hd + d);
      for (int i = 0; i < 4; ++i) {
        const __m256 kv = Load8<T>(Row<T>(k, r + i, stride), d);
        for (int g = 0; g < G; ++g) acc[g][i] = _mm256_fmadd_ps(qv[g], kv, acc[g][i]);
      }
    }
    for (int g = 0; g < G; ++g) {
      _mm_storeu_ps(out + g * out_step + r,
                    _mm_mul_ps(Sum4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]), _mm256_castps256_ps128(vs)));
    }
  }
  for (; r < rows; ++r) {
    __m256 acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d += 8) {
      const __m256 kv = Load8<T>(Row<T>(k, r, stride), d);
      for (int g = 0; g < G; ++g) acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * hd + d), kv, acc[g]);
    }
    for (int g = 0; g < G; ++g) out[g * out_step + r] = Sum(acc[g]) * scale;
  }
}

template <KvElem T>
void KeyDots(const float* q, int n_heads, const void* k, int64_t stride, int64_t rows, int hd, float scale, float* out,
             int64_t out_step) {
  for (int h = 0; h < n_heads; h += 3) {
    const float* qh = q + h * hd;
    float* oh = out + h * out_step;
    switch (n_heads - h) {
      case 1: KeyDotsHeads<T, 1>(qh, k, stride, rows, hd, scale, oh, out_step); break;
      case 2: KeyDotsHeads<T, 2>(qh, k, stride, rows, hd, scale, oh, out_step); break;
      default: KeyDotsHeads<T, 3>(qh, k, stride, rows, hd, scale, oh, out_step); break;
    }
  }
}

// G heads' outputs over W vectors (8W columns from d0) += p · the rows: GW
// accumulators and W value vectors in registers, the weights broadcast one at a time.
template <KvElem T, int G, int W>
void ValueAxpysHeads(const float* p, int64_t p_step, const void* v, int64_t stride, int64_t rows, int hd, int d0,
                     float* out) {
  __m256 acc[G][W];
  for (int g = 0; g < G; ++g) {
    for (int j = 0; j < W; ++j) acc[g][j] = _mm256_loadu_ps(out + g * hd + d0 + 8 * j);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const void* vr = Row<T>(v, r, stride);
    __m256 vv[W];
    for (int j = 0; j < W; ++j) vv[j] = Load8<T>(vr, d0 + 8 * j);
    for (int g = 0; g < G; ++g) {
      const __m256 pg = _mm256_broadcast_ss(p + g * p_step + r);
      for (int j = 0; j < W; ++j) acc[g][j] = _mm256_fmadd_ps(pg, vv[j], acc[g][j]);
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int j = 0; j < W; ++j) _mm256_storeu_ps(out + g * hd + d0 + 8 * j, acc[g][j]);
  }
}

template <KvElem T, int G>
void ValueAxpysColumns(const float* p, int64_t p_step, const void* v, int64_t stride, int64_t rows, int hd,
                       float* out) {
  int d0 = 0;
  for (; d0 + 16 <= hd; d0 += 16) ValueAxpysHeads<T, G, 2>(p, p_step, v, stride, rows, hd, d0, out);
  for (; d0 < hd; d0 += 8) ValueAxpysHeads<T, G, 1>(p, p_step, v, stride, rows, hd, d0, out);
}

template <KvElem T>
void ValueAxpys(const float* p, int64_t p_step, int n_heads, const void* v, int64_t stride, int64_t rows, int hd,
                float* out) {
  for (int h = 0; h < n_heads; h += 4) {
    const float* ph = p + h * p_step;
    float* oh = out + h * hd;
    switch (n_heads - h) {
      case 1: ValueAxpysColumns<T, 1>(ph, p_step, v, stride, rows, hd, oh); break;
      case 2: ValueAxpysColumns<T, 2>(ph, p_step, v, stride, rows, hd, oh); break;
      case 3: ValueAxpysColumns<T, 3>(ph, p_step, v, stride, rows, hd, oh); break;
      default: ValueAxpysColumns<T, 4>(ph, p_step, v, stride, rows, hd, oh); break;
    }
  }
}

}  // namespace

void GroupKeyDots(const float* q, int n_heads, KvElem t, const void* k, int64_t stride, int64_t rows, int hd,
                  float scale, float* out, int64_t out_step) {
  switch (t) {
    case KvElem::kF32: return KeyDots<KvElem::kF32>(q, n_heads, k, stride, rows, hd, scale, out, out_step);
    case KvElem::kF16: return KeyDots<KvElem::kF16>(q, n_heads, k, stride, rows, hd, scale, out, out_step);
    case KvElem::kBF16: return KeyDots<KvElem::kBF16>(q, n_heads, k, stride, rows, hd, scale, out, out_step);
    case KvElem::kQ8_0: return KeyDots<KvElem::kQ8_0>(q, n_heads, k, stride, rows, hd, scale, out, out_step);
  }
}

void GroupValueAxpys(const float* p, int64_t p_step, int n_heads, KvElem t, const void* v, int64_t stride, int64_t rows,
                     int hd, float* out) {
  switch (t) {
    case KvElem::kF32: return ValueAxpys<KvElem::kF32>(p, p_step, n_heads, v, stride, rows, hd, out);
    case KvElem::kF16: return ValueAxpys<KvElem::kF16>(p, p_step, n_heads, v, stride, rows, hd, out);
    case KvElem::kBF16: return ValueAxpys<KvElem::kBF16>(p, p_step, n_heads, v, stride, rows, hd, out);
    case KvElem::kQ8_0: return ValueAxpys<KvElem::kQ8_0>(p, p_step, n_heads, v, stride, rows, hd, out);
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
