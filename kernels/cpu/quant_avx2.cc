// AVX2 + FMA + F16C kernels for the quantised dot products and dequantisation. Compiled with those
// flags and only called after avx2::Available() said yes.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

#include "base/fp16.h"
#include "base/status.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_block_avx2.h"

namespace ps::avx2 {
namespace {

inline float HalfToFloat(uint16_t h) { return _cvtsh_ss(h); }

inline float HorizontalSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// Sum of products of 32 unsigned bytes with 32 signed bytes, as 8 floats.
inline __m256 DotU8S8(__m256i u, __m256i s) {
  const __m256i p16 = _mm256_maddubs_epi16(u, s);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}
// Sum of products of two signed byte vectors, as 8 floats.
inline __m256 DotS8S8(__m256i a, __m256i b) { return DotU8S8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a)); }
// 16 packed bytes -> 32 nibbles: low nibbles in bytes 0..15, high nibbles in 16..31.
inline __m256i UnpackNibbles(const uint8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}
inline __m256i Load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// 128 six-bit Q6_K quants (half a super-block) as four vectors of 32 values in
// [0, 63]: q[k] holds elements 32k..32k+31 of the half.
inline void UnpackQ6KHalf(const uint8_t* ql, const uint8_t* qh, __m256i q[4]) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(0x03);
  const __m256i l0 = Load256(ql), l1 = Load256(ql + 32), h = Load256(qh);
  auto high = [&](int shift) { return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, shift), m3), 4); };
  q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), high(0));
  q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), high(2));
  q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), high(4));
  q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), high(6));
}

// The 32 bits at p as 32 bytes: 0x10 where the bit is set (the fifth bit of Q5 quants).
inline __m256i FifthBits(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}
// The 32 five-bit quants (0..31) of a Q5_0 / Q5_1 block, in element order.
inline __m256i UnpackQ5(const uint8_t* qh, const uint8_t* qs) {
  return _mm256_or_si256(UnpackNibbles(qs), FifthBits(qh));
}
// Sub-block s (0..7) of a Q4_K / Q5_K super-block as 32 quants (0..15); qh (Q5_K's fifth
// bits, loaded once per super-block) adds 16 where bit s of qh[l] is set.
inline __m256i UnpackKSub(const uint8_t* qs, int s) {
  const __m256i raw = Load256(qs + 32 * (s / 2));
  return _mm256_and_si256(s % 2 == 0 ? raw : _mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0F));
}
inline __m256i KFifthBits(__m256i qh, int s) {
  const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(s)), _mm256_set1_epi8(1));
  return _mm256_slli_epi16(bit, 4);
}

float DotQ4_0(const BlockQ4_0* b, const BlockQ8* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i eight = _mm256_set1_epi8(8);
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i q = _mm256_sub_epi8(UnpackNibbles(b[i].qs), eight);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(HalfToFloat(b[i].d) * x[i].d), DotS8S8(q, Load256(x[i].qs)), acc);
  }
  return HorizontalSum(acc);
}

float DotQ4_1(const BlockQ4_1* b, const BlockQ8* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  float mins = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i q = UnpackNibbles(b[i].qs);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(HalfToFloat(b[i].d) * x[i].d), DotU8S8(q, Load256(x[i].qs)), acc);
    mins += HalfToFloat(b[i].m) * x[i].s;
  }
  return HorizontalSum(acc) + mins;
}

float DotQ8_0(const BlockQ8_0* b, const BlockQ8* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    acc =
        _mm256_fmadd_ps(_mm256_set1_ps(HalfToFloat(b[i].d) * x[i].d), DotS8S8(Load256(b[i].qs), Load256(x[i].qs)), acc);
  }
  return HorizontalSum(acc);
}

float DotQ5_0(const BlockQ5_0* b, const BlockQ8* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i sixteen = _mm256_set1_epi8(16);
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i q = _mm256_sub_epi8(UnpackQ5(b[i].qh, b[i].qs), sixteen);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(HalfToFloat(b[i].d) * x[i].d), DotS8S8(q, Load256(x[i].qs)), acc);
  }
  return HorizontalSum(acc);
}

float DotQ5_1(const BlockQ5_1* b, const BlockQ8* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  float mins = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i q = UnpackQ5(b[i].qh, b[i].qs);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(HalfToFloat(b[i].d) * x[i].d), DotU8S8(q, Load256(x[i].qs)), acc);
    mins += HalfToFloat(b[i].m) * x[i].s;
  }
  return HorizontalSum(acc) + mins;
}

float DotQ5_K(const BlockQ5_K* b, const BlockQ8* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  float mins = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = HalfToFloat(b[i].d), dmin = HalfToFloat(b[i].dmin);
    const __m256i qh = Load256(b[i].qh);
    const BlockQ8* xb = x + i * 8;
    for (int s = 0; s < 8; ++s) {
      int sc, m;
      Q4KScaleMin(s, b[i].scales, &sc, &m);
      const __m256i q = _mm256_or_si256(UnpackKSub(b[i].qs, s), KFifthBits(qh, s));
      acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc * xb[s].d), DotU8S8(q, Load256(xb[s].qs)), acc);
      mins += dmin * m * xb[s].s;
    }
  }
  return HorizontalSum(acc) - mins;
}

float DotQ4_K(const BlockQ4_K* b, const BlockQ8* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  float mins = 0;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t i = 0; i < nb; ++i) {
    const float d = HalfToFloat(b[i].d), dmin = HalfToFloat(b[i].dmin);
    const BlockQ8* xb = x + i * 8;
    for (int j = 0; j < 4; ++j) {
      const __m256i raw = Load256(b[i].qs + 32 * j);
      int sc1, m1, sc2, m2;
      Q4KScaleMin(2 * j, b[i].scales, &sc1, &m1);
      Q4KScaleMin(2 * j + 1, b[i].scales, &sc2, &m2);
      const __m256i lo = _mm256_and_si256(raw, m4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc1 * xb[2 * j].d), DotU8S8(lo, Load256(xb[2 * j].qs)), acc);
      acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc2 * xb[2 * j + 1].d), DotU8S8(hi, Load256(xb[2 * j + 1].qs)), acc);
      mins += dmin * (m1 * xb[2 * j].s + m2 * xb[2 * j + 1].s);
    }
  }
  return HorizontalSum(acc) - mins;
}

float DotQ6_K(const BlockQ6_K* b, const BlockQ8* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i off = _mm256_set1_epi8(32);
  for (int64_t i = 0; i < nb; ++i) {
    const float d = HalfToFloat(b[i].d);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = b[i].ql + 64 * half;
      const uint8_t* qh = b[i].qh + 32 * half;
      const int8_t* sc = b[i].scales + 8 * half;
      const BlockQ8* xb = x + i * 8 + 4 * half;
      __m256i q[4];
      UnpackQ6KHalf(ql, qh, q);
      for (int k = 0; k < 4; ++k) {
        const __m256i qs = _mm256_sub_epi8(q[k], off);
        const __m256 p = DotS8S8(qs, Load256(xb[k].qs));  // lanes 0-3: elements 0..15, 4-7: 16..31
        const float s0 = d * sc[2 * k] * xb[k].d, s1 = d * sc[2 * k + 1] * xb[k].d;
        acc = _mm256_fmadd_ps(_mm256_setr_ps(s0, s0, s0, s0, s1, s1, s1, s1), p, acc);
      }
    }
  }
  return HorizontalSum(acc);
}

// ---- F32 activations: weights decoded to floats in registers ----

// 8 consecutive bytes as floats (unsigned or signed).
inline __m256 U8ToFloat(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)); }
inline __m256 S8ToFloat(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)); }

// sum over 32 elements of q[j] * x[j], q given as 32 bytes (unsigned 0..63 or signed).
template <bool kSigned>
inline __m256 Dot32(__m256i q, const float* x) {
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  auto cvt = [](__m128i b) { return kSigned ? S8ToFloat(b) : U8ToFloat(b); };
  __m256 acc = _mm256_mul_ps(cvt(lo), _mm256_loadu_ps(x));
  acc = _mm256_fmadd_ps(cvt(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x + 8), acc);
  acc = _mm256_fmadd_ps(cvt(hi), _mm256_loadu_ps(x + 16), acc);
  acc = _mm256_fmadd_ps(cvt(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x + 24), acc);
  return acc;
}

float F32DotQ4_0(const BlockQ4_0* b, const float* x, const float* sums, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  float off = 0;
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    const float d = HalfToFloat(b[i].d);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), Dot32<false>(UnpackNibbles(b[i].qs), x), acc);
    off += d * sums[i];
  }
  return HorizontalSum(acc) - 8.0f * off;
}

float F32DotQ4_1(const BlockQ4_1* b, const float* x, const float* sums, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  float off = 0;
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    acc = _mm256_fmadd_ps(_mm256_set1_ps(HalfToFloat(b[i].d)), Dot32<false>(UnpackNibbles(b[i].qs), x), acc);
    off += HalfToFloat(b[i].m) * sums[i];
  }
  return HorizontalSum(acc) + off;
}

float F32DotQ8_0(const BlockQ8_0* b, const float* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    acc = _mm256_fmadd_ps(_mm256_set1_ps(HalfToFloat(b[i].d)), Dot32<true>(Load256(b[i].qs), x), acc);
  }
  return HorizontalSum(acc);
}

float F32DotQ5_0(const BlockQ5_0* b, const float* x, const float* sums, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  float off = 0;
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    const float d = HalfToFloat(b[i].d);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), Dot32<false>(UnpackQ5(b[i].qh, b[i].qs), x), acc);
    off += d * sums[i];
  }
  return HorizontalSum(acc) - 16.0f * off;
}

float F32DotQ5_1(const BlockQ5_1* b, const float* x, const float* sums, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  float off = 0;
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    acc = _mm256_fmadd_ps(_mm256_set1_ps(HalfToFloat(b[i].d)), Dot32<false>(UnpackQ5(b[i].qh, b[i].qs), x), acc);
    off += HalfToFloat(b[i].m) * sums[i];
  }
  return HorizontalSum(acc) + off;
}

float F32DotQ5_K(const BlockQ5_K* b, const float* x, const float* sums, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  float off = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = HalfToFloat(b[i].d), dmin = HalfToFloat(b[i].dmin);
    const __m256i qh = Load256(b[i].qh);
    for (int s = 0; s < 8; ++s, x += 32) {
      int sc, m;
      Q4KScaleMin(s, b[i].scales, &sc, &m);
      const __m256i q = _mm256_or_si256(UnpackKSub(b[i].qs, s), KFifthBits(qh, s));
      acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc), Dot32<false>(q, x), acc);
      off += dmin * m * sums[i * 8 + s];
    }
  }
  return HorizontalSum(acc) - off;
}

float F32DotQ4_K(const BlockQ4_K* b, const float* x, const float* sums, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  float off = 0;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t i = 0; i < nb; ++i) {
    const float d = HalfToFloat(b[i].d), dmin = HalfToFloat(b[i].dmin);
    for (int j = 0; j < 4; ++j, x += 64) {
      const __m256i raw = Load256(b[i].qs + 32 * j);
      int sc1, m1, sc2, m2;
      Q4KScaleMin(2 * j, b[i].scales, &sc1, &m1);
      Q4KScaleMin(2 * j + 1, b[i].scales, &sc2, &m2);
      acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc1), Dot32<false>(_mm256_and_si256(raw, m4), x), acc);
      acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc2),
                            Dot32<false>(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4), x + 32), acc);
      off += dmin * (m1 * sums[i * 8 + 2 * j] + m2 * sums[i * 8 + 2 * j + 1]);
    }
  }
  return HorizontalSum(acc) - off;
}

float F32DotQ6_K(const BlockQ6_K* b, const float* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i off = _mm256_set1_epi8(32);
  for (int64_t i = 0; i < nb; ++i) {
    const float d = HalfToFloat(b[i].d);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = b[i].ql + 64 * half;
      const uint8_t* qh = b[i].qh + 32 * half;
      const int8_t* sc = b[i].scales + 8 * half;
      __m256i q[4];
      UnpackQ6KHalf(ql, qh, q);
      for (int k = 0; k < 4; ++k, x += 32) {
        const __m256i qs = _mm256_sub_epi8(q[k], off);
        const __m128i lo = _mm256_castsi256_si128(qs), hi = _mm256_extracti128_si256(qs, 1);
        __m256 g0 = _mm256_mul_ps(S8ToFloat(lo), _mm256_loadu_ps(x));
        g0 = _mm256_fmadd_ps(S8ToFloat(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x + 8), g0);
        __m256 g1 = _mm256_mul_ps(S8ToFloat(hi), _mm256_loadu_ps(x + 16));
        g1 = _mm256_fmadd_ps(S8ToFloat(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x + 24), g1);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc[2 * k]), g0, acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc[2 * k + 1]), g1, acc);
      }
    }
  }
  return HorizontalSum(acc);
}

// ---- several activation rows per weight row (batched decode, int8 activations) ----

// One 32-element block of a weight row as signed quants with the scales of its two
// halves and its minimum term: value = d_half * q + min.
struct Block32 {
  __m256i q;
  __m256 d;  // lanes 0-3: elements 0..15's scale, lanes 4-7: 16..31's (DotS8S8's lanes)
  float min;
};

inline Block32 UnpackBlock(DType type, const uint8_t* row, int64_t b) {
  const __m256i eight = _mm256_set1_epi8(8), sixteen = _mm256_set1_epi8(16);
  switch (type) {
    case DType::kQ4_0: {
      const auto& x = reinterpret_cast<const BlockQ4_0*>(row)[b];
      return {_mm256_sub_epi8(UnpackNibbles(x.qs), eight), _mm256_set1_ps(HalfToFloat(x.d)), 0.0f};
    }
    case DType::kQ4_1: {
      const auto& x = reinterpret_cast<const BlockQ4_1*>(row)[b];
      return {UnpackNibbles(x.qs), _mm256_set1_ps(HalfToFloat(x.d)), HalfToFloat(x.m)};
    }
    case DType::kQ5_0: {
      const auto& x = reinterpret_cast<const BlockQ5_0*>(row)[b];
      return {_mm256_sub_epi8(UnpackQ5(x.qh, x.qs), sixteen), _mm256_set1_ps(HalfToFloat(x.d)), 0.0f};
    }
    case DType::kQ5_1: {
      const auto& x = reinterpret_cast<const BlockQ5_1*>(row)[b];
      return {UnpackQ5(x.qh, x.qs), _mm256_set1_ps(HalfToFloat(x.d)), HalfToFloat(x.m)};
    }
    case DType::kQ8_0: {
      const auto& x = reinterpret_cast<const BlockQ8_0*>(row)[b];
      return {Load256(x.qs), _mm256_set1_ps(HalfToFloat(x.d)), 0.0f};
    }
    case DType::kQ4_K:
    case DType::kQ5_K: {
      const bool q5 = type == DType::kQ5_K;
      const auto* b4 = reinterpret_cast<const BlockQ4_K*>(row) + b / 8;
      const auto* b5 = reinterpret_cast<const BlockQ5_K*>(row) + b / 8;
      const int s = static_cast<int>(b % 8);
      int sc, m;
      Q4KScaleMin(s, q5 ? b5->scales : b4->scales, &sc, &m);
      __m256i q = UnpackKSub(q5 ? b5->qs : b4->qs, s);
      if (q5) q = _mm256_or_si256(q, KFifthBits(Load256(b5->qh), s));
      const float d = HalfToFloat(q5 ? b5->d : b4->d), dmin = HalfToFloat(q5 ? b5->dmin : b4->dmin);
      return {q, _mm256_set1_ps(d * sc), -dmin * m};
    }
    case DType::kQ6_K: {
      const auto& x = reinterpret_cast<const BlockQ6_K*>(row)[b / 8];
      const int half = static_cast<int>(b % 8) / 4, k = static_cast<int>(b % 4);
      __m256i q[4];
      UnpackQ6KHalf(x.ql + 64 * half, x.qh + 32 * half, q);
      const float d = HalfToFloat(x.d);
      const int8_t* sc = x.scales + 8 * half + 2 * k;
      const float d0 = d * sc[0], d1 = d * sc[1];
      return {_mm256_sub_epi8(q[k], _mm256_set1_epi8(32)), _mm256_setr_ps(d0, d0, d0, d0, d1, d1, d1, d1), 0.0f};
    }
    default: break;
  }
  PS_CHECK(false) << "avx2::UnpackBlock: unsupported type " << static_cast<int>(type);
  return {_mm256_setzero_si256(), _mm256_setzero_ps(), 0.0f};
}

// ---- dequantisation: multiply, then add (no FMA; the file is built with
// -ffp-contract=off), so the results equal the reference's bit for bit ----

// out[0..31] = q[j] * d (+ m) for 32 signed byte quants; d0/m0 scale elements 0..15
// and d1/m1 elements 16..31.
template <bool kMin>
inline void Store32(__m256i q, float d0, float d1, float m0, float m1, float* out) {
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int k = 0; k < 4; ++k) {
    __m256 v = _mm256_mul_ps(S8ToFloat(parts[k]), _mm256_set1_ps(k < 2 ? d0 : d1));
    if (kMin) v = _mm256_add_ps(v, _mm256_set1_ps(k < 2 ? m0 : m1));
    _mm256_storeu_ps(out + 8 * k, v);
  }
}

void Dequantize(DType type, const void* row, float* out, int64_t n) {
  const __m256i eight = _mm256_set1_epi8(8), sixteen = _mm256_set1_epi8(16), off32 = _mm256_set1_epi8(32);
  switch (type) {
    case DType::kQ4_0:
      for (const BlockQ4_0& b : std::span(static_cast<const BlockQ4_0*>(row), n / kQK)) {
        const float d = HalfToFloat(b.d);
        Store32<false>(_mm256_sub_epi8(UnpackNibbles(b.qs), eight), d, d, 0, 0, out);
        out += kQK;
      }
      return;
    case DType::kQ4_1:
      for (const BlockQ4_1& b : std::span(static_cast<const BlockQ4_1*>(row), n / kQK)) {
        const float d = HalfToFloat(b.d), m = HalfToFloat(b.m);
        Store32<true>(UnpackNibbles(b.qs), d, d, m, m, out);
        out += kQK;
      }
      return;
    case DType::kQ5_0:
      for (const BlockQ5_0& b : std::span(static_cast<const BlockQ5_0*>(row), n / kQK)) {
        const float d = HalfToFloat(b.d);
        Store32<false>(_mm256_sub_epi8(UnpackQ5(b.qh, b.qs), sixteen), d, d, 0, 0, out);
        out += kQK;
      }
      return;
    case DType::kQ5_1:
      for (const BlockQ5_1& b : std::span(static_cast<const BlockQ5_1*>(row), n / kQK)) {
        const float d = HalfToFloat(b.d), m = HalfToFloat(b.m);
        Store32<true>(UnpackQ5(b.qh, b.qs), d, d, m, m, out);
        out += kQK;
      }
      return;
    case DType::kQ8_0:
      for (const BlockQ8_0& b : std::span(static_cast<const BlockQ8_0*>(row), n / kQK)) {
        const float d = HalfToFloat(b.d);
        Store32<false>(Load256(b.qs), d, d, 0, 0, out);
        out += kQK;
      }
      return;
    case DType::kQ4_K:
    case DType::kQ5_K: {
      const bool q5 = type == DType::kQ5_K;
      for (int64_t i = 0; i < n / kQK_K; ++i) {
        const auto* b4 = static_cast<const BlockQ4_K*>(row) + i;
        const auto* b5 = static_cast<const BlockQ5_K*>(row) + i;
        const uint16_t dh = q5 ? b5->d : b4->d, dminh = q5 ? b5->dmin : b4->dmin;
        const uint8_t* scales = q5 ? b5->scales : b4->scales;
        const uint8_t* qs = q5 ? b5->qs : b4->qs;
        const __m256i qh = q5 ? Load256(b5->qh) : _mm256_setzero_si256();
        const float d = HalfToFloat(dh), dmin = HalfToFloat(dminh);
        for (int s = 0; s < 8; ++s, out += 32) {
          int sc, m;
          Q4KScaleMin(s, scales, &sc, &m);
          const float ds = d * sc, ms = -(dmin * m);
          Store32<true>(_mm256_or_si256(UnpackKSub(qs, s), KFifthBits(qh, s)), ds, ds, ms, ms, out);
        }
      }
      return;
    }
    case DType::kQ6_K:
      for (const BlockQ6_K& b : std::span(static_cast<const BlockQ6_K*>(row), n / kQK_K)) {
        const float d = HalfToFloat(b.d);
        for (int half = 0; half < 2; ++half) {
          __m256i q[4];
          UnpackQ6KHalf(b.ql + 64 * half, b.qh + 32 * half, q);
          const int8_t* sc = b.scales + 8 * half;
          for (int k = 0; k < 4; ++k, out += 32) {
            Store32<false>(_mm256_sub_epi8(q[k], off32), d * sc[2 * k], d * sc[2 * k + 1], 0, 0, out);
          }
        }
      }
      return;
    default: break;
  }
  PS_CHECK(false) << "avx2::DequantizeRow: unsupported type " << static_cast<int>(type);
}

}  // namespace

bool Supports(DType type) {
  switch (type) {
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ8_0:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K: return true;
    default: return false;
  }
}

void DequantizeRow(DType type, const void* row, float* out, int64_t n) { Dequantize(type, row, out, n); }

void DotQ8Rows(DType type, const void* row, const BlockQ8* x, int64_t x_step, int64_t m, int64_t n, float* out,
               int64_t out_step) {
  const auto* w = static_cast<const uint8_t*>(row);
  const int64_t nb = n / kQK;
  for (int64_t i0 = 0; i0 < m; i0 += 4) {  // four activation rows share each unpacked block
    const int64_t rows = std::min<int64_t>(4, m - i0);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    double mins[4] = {0, 0, 0, 0};  // the minimum terms cancel against the products: keep their digits
    for (int64_t b = 0; b < nb; ++b) {
      const Block32 blk = UnpackBlock(type, w, b);
      const __m256i aq = _mm256_sign_epi8(blk.q, blk.q);
      for (int64_t i = 0; i < rows; ++i) {
        const BlockQ8& xb = x[(i0 + i) * x_step + b];
        const __m256i p16 = _mm256_maddubs_epi16(aq, _mm256_sign_epi8(Load256(xb.qs), blk.q));
        const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
        acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(blk.d, _mm256_set1_ps(xb.d)), p, acc[i]);
        mins[i] += blk.min * xb.s;
      }
    }
    for (int64_t i = 0; i < rows; ++i) out[(i0 + i) * out_step] = static_cast<float>(HorizontalSum(acc[i]) + mins[i]);
  }
}

float DotF32Act(DType type, const void* row, const float* x, const float* sums, int64_t n) {
  switch (type) {
    case DType::kQ4_0: return F32DotQ4_0(static_cast<const BlockQ4_0*>(row), x, sums, n / kQK);
    case DType::kQ4_1: return F32DotQ4_1(static_cast<const BlockQ4_1*>(row), x, sums, n / kQK);
    case DType::kQ8_0: return F32DotQ8_0(static_cast<const BlockQ8_0*>(row), x, n / kQK);
    case DType::kQ4_K: return F32DotQ4_K(static_cast<const BlockQ4_K*>(row), x, sums, n / kQK_K);
    case DType::kQ5_0: return F32DotQ5_0(static_cast<const BlockQ5_0*>(row), x, sums, n / kQK);
    case DType::kQ5_1: return F32DotQ5_1(static_cast<const BlockQ5_1*>(row), x, sums, n / kQK);
    case DType::kQ5_K: return F32DotQ5_K(static_cast<const BlockQ5_K*>(row), x, sums, n / kQK_K);
    case DType::kQ6_K: return F32DotQ6_K(static_cast<const BlockQ6_K*>(row), x, n / kQK_K);
    default: break;
  }
  PS_CHECK(false) << "avx2::DotF32Act: unsupported type " << static_cast<int>(type);
  return 0;
}

bool Available() { return ActiveCpuIsa() >= CpuIsa::kAvx2; }

float DotQ8(DType type, const void* row, const BlockQ8* x, int64_t n) {
  switch (type) {
    case DType::kQ4_0: return DotQ4_0(static_cast<const BlockQ4_0*>(row), x, n / kQK);
    case DType::kQ4_1: return DotQ4_1(static_cast<const BlockQ4_1*>(row), x, n / kQK);
    case DType::kQ8_0: return DotQ8_0(static_cast<const BlockQ8_0*>(row), x, n / kQK);
    case DType::kQ4_K: return DotQ4_K(static_cast<const BlockQ4_K*>(row), x, n / kQK_K);
    case DType::kQ5_0: return DotQ5_0(static_cast<const BlockQ5_0*>(row), x, n / kQK);
    case DType::kQ5_1: return DotQ5_1(static_cast<const BlockQ5_1*>(row), x, n / kQK);
    case DType::kQ5_K: return DotQ5_K(static_cast<const BlockQ5_K*>(row), x, n / kQK_K);
    case DType::kQ6_K: return DotQ6_K(static_cast<const BlockQ6_K*>(row), x, n / kQK_K);
    default: break;
  }
  PS_CHECK(false) << "avx2::DotQ8: unsupported type " << static_cast<int>(type);
  return 0;
}

void QuantizeRowQ8(const float* x, BlockQ8* out, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    __m256 v[4];
    const float amax = LoadAbsMax32(x, v);
    const float d = amax / 127.0f;
    __m256i qi[4];
    const __m256i bytes = QuantizeBytes32(v, d != 0 ? 127.0f / amax : 0.0f, qi);  // llama.cpp divides by amax, not by d
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[i].qs), bytes);
    const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s = _mm_hadd_epi32(s, s);
    s = _mm_hadd_epi32(s, s);
    out[i].d = Fp16ToFp32(Fp32ToFp16(d));  // stored as fp16, as llama.cpp does
    out[i].s = Fp16ToFp32(Fp32ToFp16(d * static_cast<float>(_mm_cvtsi128_si32(s))));
  }
}

}  // namespace ps::avx2
