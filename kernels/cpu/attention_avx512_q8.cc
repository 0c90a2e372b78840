// Layouts: as attention_avx512.cc's, with 4 int8 quants to a 32-bit lane where the BF16
// tiles have 2 values: a key's 4 quants broadcast (vpdpbusd's signed operand) against the
// lanes of 16 query rows' 4 unsigned quants.
// GCC 12 warns inside its own AVX-512 headers (a known false positive).
#if defined(__GNUC__) && !defined(__clang__)  // GCC only: clang knows neither the warnings nor the false positives
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "kernels/cpu/attention_avx512_q8.h"

#include <immintrin.h>

#include <cstring>
#include <limits>

#include "base/status.h"
#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/attention_avx512_internal.h"

namespace ps::avx512_q8 {
namespace {

// Keys a pass of Scores: 4 x 4 integer sums of 16 rows. One thread, a tile of 64 rows by 256
// keys of 64 values from L1/L2 (Zen 4): 3 keys 167-180 G multiply-adds a second, 4 keys
// 170-184, 5 keys 141-157, 6 keys 146-148 (GCC spills its pointers), BF16 Scores 100-105.
constexpr int kScoreKeys = 4;

inline int32_t Word(const uint8_t* p) {
  int32_t x;
  std::memcpy(&x, p, 4);
  return x;
}
inline float BlockScale(const uint8_t* block) {
  uint16_t h;
  std::memcpy(&h, block, 2);
  return _cvtsh_ss(h);
}

// Scores of R keys against the tile's QV vectors of query rows, a block at a time: its
// integer sums in registers, the scaled sums so far in s; row_max updated.
template <int R, int QV>
void ScoreKeys(const uint8_t* qt, const float* qscale, const uint8_t* const* keys, const int32_t* offsets,
               const float* scales, int nb, float* s, __m512* row_max) {
  constexpr int64_t nqp = 16 * QV;  // a constant: the strides take no registers
  for (int b = 0; b < nb; ++b) {
    __m512i acc[R][QV];
    const uint8_t* k[R];
    for (int r = 0; r < R; ++r) {
      const __m512i o = _mm512_set1_epi32(offsets[r * nb + b]);
      for (int v = 0; v < QV; ++v) acc[r][v] = o;
      k[r] = keys[r] + b * kQ8BlockBytes + 2;
    }
    const uint8_t* qb = qt + 4 * (kQ8Values / 4) * b * nqp;  // the lanes of quads 8b..8b + 7
#pragma GCC unroll 8
    for (int t = 0; t < kQ8Values / 4; ++t) {
      __m512i a[QV];
      for (int v = 0; v < QV; ++v) a[v] = _mm512_loadu_si512(qb + 4 * (t * nqp + 16 * v));
      for (int r = 0; r < R; ++r) {
        const __m512i kr = _mm512_set1_epi32(Word(k[r] + 4 * t));
        for (int v = 0; v < QV; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], a[v], kr);
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m512 d = _mm512_set1_ps(scales[r * nb + b]);
      for (int v = 0; v < QV; ++v) {
        float* sv = s + r * nqp + 16 * v;
        const __m512 sum = _mm512_cvtepi32_ps(acc[r][v]);
        __m512 x = b == 0 ? _mm512_mul_ps(sum, d) : _mm512_fmadd_ps(sum, d, _mm512_loadu_ps(sv));
        if (b == nb - 1) {
          x = _mm512_mul_ps(x, _mm512_loadu_ps(qscale + 16 * v));
          row_max[v] = _mm512_max_ps(row_max[v], x);
        }
        _mm512_storeu_ps(sv, x);
      }
    }
  }
}

template <int QV>
void ScoresOf(const uint8_t* qt, const float* qscale, const uint8_t* const* keys, const int32_t* offsets,
              const float* scales, int64_t nt, int nb, float* s, float* row_max) {
  constexpr int64_t nqp = 16 * QV;
  __m512 mx[QV];
  for (int v = 0; v < QV; ++v) mx[v] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + kScoreKeys <= nt; j += kScoreKeys) {
    ScoreKeys<kScoreKeys, QV>(qt, qscale, keys + j, offsets + j * nb, scales + j * nb, nb, s + j * nqp, mx);
  }
  for (; j < nt; ++j) ScoreKeys<1, QV>(qt, qscale, keys + j, offsets + j * nb, scales + j * nb, nb, s + j * nqp, mx);
  for (int v = 0; v < QV; ++v) _mm512_storeu_ps(row_max + 16 * v, mx[v]);
}

}  // namespace

void PackQueries(const float* q, int64_t q_stride, int64_t nq, int hd, float mult, uint8_t* qt, float* qscale) {
  PS_CHECK(hd % kQ8Values == 0) << "head size " << hd;
  const int64_t nqp = avx512_bf16::PaddedRows(nq);
  auto* lanes = reinterpret_cast<int32_t*>(qt);  // [hd / 4][nqp]
  for (int64_t i0 = 0; i0 < nqp; i0 += 16) {
    float inverse[16];  // of each row's d
    for (int r = 0; r < 16; ++r) {
      const int64_t i = i0 + r;
      __m512 amax = _mm512_setzero_ps();
      for (int e = 0; i < nq && e < hd; e += 16)
        amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(q + i * q_stride + e)));
      const float d = _mm512_reduce_max_ps(amax) / 127.0f;
      inverse[r] = d > 0 ? 1.0f / d : 0.0f;
      qscale[i] = d * mult;
    }
    for (int e = 0; e < hd; e += 64) {  // 16 words of a row (8 where the head ends 32 values on)
      const int words = hd - e >= 64 ? 16 : 8;
      __m512i rows[16], t[16];
      for (int r = 0; r < 16; ++r) {
        const int64_t i = i0 + r;
        __m512i row = _mm512_setzero_si512();
        for (int c = 0; c < words / 4; ++c) {  // 16 values to 16 bytes
          const __m512 x = i < nq ? _mm512_loadu_ps(q + i * q_stride + e + 16 * c) : _mm512_setzero_ps();
          const __m512i n = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x, _mm512_set1_ps(inverse[r]))),
                                             _mm512_set1_epi32(128));
          row = _mm512_inserti32x4(row, _mm512_cvtepi32_epi8(n), c);
        }
        rows[r] = row;
      }
      avx512::Transpose16(rows, t);
      for (int w = 0; w < words; ++w) _mm512_storeu_si512(lanes + (e / 4 + w) * nqp + i0, t[w]);
    }
  }
}

void KeyTerms(const uint8_t* const* keys, int64_t nt, int hd, int32_t* offsets, float* scales) {
  PS_CHECK(hd % kQ8Values == 0) << "head size " << hd;
  const int nb = hd / kQ8Values;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t j = 0; j < nt; ++j) {
    for (int b = 0; b < nb; ++b) {
      const uint8_t* block = keys[j] + b * kQ8BlockBytes;
      // The quants + 128 as unsigned bytes, summed in four 64-bit lanes.
      const __m256i x = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2)), flip);
      const __m256i sums = _mm256_sad_epu8(x, _mm256_setzero_si256());
      const int64_t biased = _mm256_extract_epi64(sums, 0) + _mm256_extract_epi64(sums, 1) +
                             _mm256_extract_epi64(sums, 2) + _mm256_extract_epi64(sums, 3);
      offsets[j * nb + b] = -128 * static_cast<int32_t>(biased - 128 * kQ8Values);
      scales[j * nb + b] = BlockScale(block);
    }
  }
}

void Scores(const uint8_t* qt, const float* qscale, int64_t nqp, const uint8_t* const* keys, const int32_t* offsets,
            const float* scales, int64_t nt, int hd, float* s, float* row_max) {
  PS_CHECK(hd % kQ8Values == 0) << "head size " << hd;
  const int nb = hd / kQ8Values;
  avx512::WithRowVectors(nqp,
                         [&](auto qv) { ScoresOf<qv.value>(qt, qscale, keys, offsets, scales, nt, nb, s, row_max); });
}

void DequantizeRows(const uint8_t* const* rows, int64_t nt, int hd, uint16_t* out) {
  PS_CHECK(hd % kQ8Values == 0) << "head size " << hd;
  for (int64_t j = 0; j < nt; ++j) {
    for (int b = 0; b < hd / kQ8Values; ++b) {
      const uint8_t* block = rows[j] + b * kQ8BlockBytes;
      const __m512 d = _mm512_set1_ps(BlockScale(block));
      const __m128i* quants = reinterpret_cast<const __m128i*>(block + 2);
      const __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(quants))), d);
      const __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(quants + 1))), d);
      _mm512_storeu_si512(out + j * hd + b * kQ8Values, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
}

}  // namespace ps::avx512_q8
