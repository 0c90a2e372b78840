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

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

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
// integer sums in registers, the sums scaled by both sides' block scales so far in s;
// row_max updated.
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
        const __m512 qd = _mm512_mul_ps(_mm512_loadu_ps(qscale + b * nqp + 16 * v), d);
        const __m512 x = b == 0 ? _mm512_mul_ps(sum, qd) : _mm512_fmadd_ps(sum, qd, _mm512_loadu_ps(sv));
        if (b == nb - 1) row_max[v] = _mm512_max_ps(row_max[v], x);
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
    for (int e = 0; e < hd; e += 64) {  // 16 words of a row, two blocks (8 words, one, where the head ends 32 on)
      const int words = hd - e >= 64 ? 16 : 8;
      __m512i rows[16], t[16];
      for (int r = 0; r < 16; ++r) {
        const int64_t i = i0 + r;
        __m256i blocks[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int h = 0; h < words / 8; ++h) {  // a block: its scale, then its 32 values to 32 bytes
          const int b = e / kQ8Values + h;
          const float* x = i < nq ? q + i * q_stride + b * kQ8Values : nullptr;
          const __m512 x0 = x != nullptr ? _mm512_loadu_ps(x) : _mm512_setzero_ps();
          const __m512 x1 = x != nullptr ? _mm512_loadu_ps(x + 16) : _mm512_setzero_ps();
          const float d = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1))) / 127.0f;
          qscale[b * nqp + i] = d * mult;
          const __m512 inverse = _mm512_set1_ps(d > 0 ? 1.0f / d : 0.0f);
          const __m512i bias = _mm512_set1_epi32(128);
          const __m128i lo =
              _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x0, inverse)), bias));
          const __m128i hi =
              _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x1, inverse)), bias));
          blocks[h] = _mm256_set_m128i(hi, lo);
        }
        rows[r] = _mm512_inserti64x4(_mm512_castsi256_si512(blocks[0]), blocks[1], 1);
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

void PackValues(const uint8_t* const* rows, int64_t nt, int hd, int8_t* values, float* gains, float* top) {
  PS_CHECK(hd % kQ8Values == 0) << "head size " << hd;
  const int nb = hd / kQ8Values;
  const int64_t padded = avx512_bf16::PaddedKeys(nt);
  for (int b = 0; b < nb; ++b) {
    float most = 0;
    for (int64_t j = 0; j < nt; ++j) most = std::max(most, BlockScale(rows[j] + b * kQ8BlockBytes));
    top[b] = most;
    const float gain = most > 0 ? 255.0f / most : 0.0f;
    for (int64_t j = 0; j < padded; ++j)
      gains[j * nb + b] = j < nt ? gain * BlockScale(rows[j] + b * kQ8BlockBytes) : 0;
  }
  const __m256i zero = _mm256_setzero_si256();
  for (int64_t g = 0; g < padded / kKeyQuad; ++g) {
    for (int b = 0; b < nb; ++b) {
      __m256i r[kKeyQuad];  // the 4 keys' 32 quants of block b
      for (int k = 0; k < kKeyQuad; ++k) {
        const int64_t j = kKeyQuad * g + k;
        r[k] = j < nt ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[j] + b * kQ8BlockBytes + 2)) : zero;
      }
      // Bytes to quads: within each 128-bit half, keys 0 and 1 (then 2 and 3) interleaved by
      // byte, the pairs by word; u0..u3 hold columns 0-3, 4-7, 8-11, 12-15 in their first
      // half and 16-19, ..., 28-31 in their second.
      const __m256i t0 = _mm256_unpacklo_epi8(r[0], r[1]), t1 = _mm256_unpackhi_epi8(r[0], r[1]);
      const __m256i t2 = _mm256_unpacklo_epi8(r[2], r[3]), t3 = _mm256_unpackhi_epi8(r[2], r[3]);
      const __m256i u0 = _mm256_unpacklo_epi16(t0, t2), u1 = _mm256_unpackhi_epi16(t0, t2);
      const __m256i u2 = _mm256_unpacklo_epi16(t1, t3), u3 = _mm256_unpackhi_epi16(t1, t3);
      auto* out = reinterpret_cast<__m256i*>(values + kKeyQuad * (g * hd + b * kQ8Values));
      _mm256_storeu_si256(out, _mm256_permute2x128_si256(u0, u1, 0x20));
      _mm256_storeu_si256(out + 1, _mm256_permute2x128_si256(u2, u3, 0x20));
      _mm256_storeu_si256(out + 2, _mm256_permute2x128_si256(u0, u1, 0x31));
      _mm256_storeu_si256(out + 3, _mm256_permute2x128_si256(u2, u3, 0x31));
    }
  }
}

namespace {

// Weights of keys [0, nt) for rows [i, i + 16) against each of the nb blocks' gains, 4
// keys to a lane (Softmax's layout); returns the sum of f. shift: the rows' maxima in this
// tile (0 for rows that see nothing).
template <bool kFinite>
__m512 QuadWeights(const float* s, int64_t nqp, int64_t nt, int nb, int64_t i, __m512 shift, const float* gains,
                   uint8_t* w) {
  // Within each 128-bit lane (rows 4L..4L + 3): the packs leave key k's bytes of the 4 rows
  // at 4k..4k + 3; each row's 4 keys go together.
  alignas(64) int8_t idx[64];
  for (int q = 0; q < 64; ++q) idx[q] = static_cast<int8_t>(4 * (q % 4) + (q % 16) / 4);
  const __m512i quads = _mm512_load_si512(idx);
  const int64_t groups = avx512_bf16::PaddedKeys(nt) / kKeyQuad;
  __m512 sum = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 e[kKeyQuad];
    for (int k = 0; k < kKeyQuad; ++k) {
      const int64_t j = kKeyQuad * g + k;
      e[k] = j < nt ? avx512::Exp2Bf16<kFinite>(_mm512_sub_ps(_mm512_loadu_ps(s + j * nqp + i), shift))
                    : _mm512_setzero_ps();
    }
    sum = _mm512_add_ps(sum, _mm512_add_ps(_mm512_add_ps(e[0], e[1]), _mm512_add_ps(e[2], e[3])));
    const float* gj = gains + kKeyQuad * g * nb;
    for (int b = 0; b < nb; ++b) {
      __m512i x[kKeyQuad];
      for (int k = 0; k < kKeyQuad; ++k) x[k] = _mm512_cvtps_epi32(_mm512_mul_ps(e[k], _mm512_set1_ps(gj[k * nb + b])));
      const __m512i bytes = _mm512_packus_epi16(_mm512_packus_epi32(x[0], x[1]), _mm512_packus_epi32(x[2], x[3]));
      _mm512_storeu_si512(w + kKeyQuad * ((b * groups + g) * nqp + i), _mm512_shuffle_epi8(bytes, quads));
    }
  }
  return sum;
}

// Columns [d0, d0 + D) (within one block) of QV vectors of rows of ot, rescaled, += the
// block's weights times the quants.
template <int D, int QV>
void ValueColumns(const uint8_t* w, int64_t groups, const int8_t* values, int hd, int d0, const float* corr,
                  const float* wscale, float* ot) {
  constexpr int64_t nqp = 16 * QV;
  __m512i acc[D][QV];
  for (int d = 0; d < D; ++d) {
    for (int v = 0; v < QV; ++v) acc[d][v] = _mm512_setzero_si512();
  }
  for (int64_t g = 0; g < groups; ++g) {
    __m512i a[QV];
    for (int v = 0; v < QV; ++v) a[v] = _mm512_loadu_si512(w + kKeyQuad * (g * nqp + 16 * v));
    const int8_t* vg = values + kKeyQuad * (g * hd + d0);
    for (int d = 0; d < D; ++d) {
      const __m512i x = _mm512_set1_epi32(Word(reinterpret_cast<const uint8_t*>(vg) + kKeyQuad * d));
      for (int v = 0; v < QV; ++v) acc[d][v] = _mm512_dpbusd_epi32(acc[d][v], a[v], x);
    }
  }
  for (int v = 0; v < QV; ++v) {
    const __m512 c = _mm512_loadu_ps(corr + 16 * v), ws = _mm512_loadu_ps(wscale + 16 * v);
    for (int d = 0; d < D; ++d) {
      float* o = ot + (d0 + d) * nqp + 16 * v;
      _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[d][v]), ws, _mm512_mul_ps(_mm512_loadu_ps(o), c)));
    }
  }
}

constexpr int kValueColumns = 4;  // output columns a pass of AddValues (4 x 4 integer sums of 16 rows)

template <int QV>
void ValuesOf(const uint8_t* w, const int8_t* values, int64_t nt, int hd, const float* corr, const float* wscale,
              float* ot) {
  constexpr int64_t nqp = 16 * QV;
  const int64_t groups = avx512_bf16::PaddedKeys(nt) / kKeyQuad;
  for (int d0 = 0; d0 < hd; d0 += kValueColumns) {
    const int b = d0 / kQ8Values;
    ValueColumns<kValueColumns, QV>(w + kKeyQuad * b * groups * nqp, groups, values, hd, d0, corr, wscale + b * nqp,
                                    ot);
  }
}

}  // namespace

void Softmax(const float* s, int64_t nqp, int64_t nt, int hd, const float* row_max, bool finite, const float* gains,
             const float* top, float* m, float* l, float* corr, float* wscale, uint8_t* w) {
  PS_CHECK(nqp % avx512_bf16::kRowAlign == 0 && hd % kQ8Values == 0) << nqp << " query rows, head size " << hd;
  const int nb = hd / kQ8Values;
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 ln2 = _mm512_set1_ps(0.693147180559945309f);
  for (int64_t i = 0; i < nqp; i += 16) {
    const __m512 m_old = _mm512_loadu_ps(m + i), tile_max = _mm512_loadu_ps(row_max + i);
    const __m512 m_new = _mm512_max_ps(m_old, tile_max);
    // Rows that see nothing (in the tile, or yet) subtract 0: their -inf give 0.
    const __m512 local =
        _mm512_mask_blend_ps(_mm512_cmp_ps_mask(tile_max, neg_inf, _CMP_EQ_OQ), tile_max, _mm512_setzero_ps());
    const __m512 shift =
        _mm512_mask_blend_ps(_mm512_cmp_ps_mask(m_new, neg_inf, _CMP_EQ_OQ), m_new, _mm512_setzero_ps());
    const __m512 sum = finite ? QuadWeights<true>(s, nqp, nt, nb, i, local, gains, w)
                              : QuadWeights<false>(s, nqp, nt, nb, i, local, gains, w);
    const __m512 c = avx512::Exp(_mm512_mul_ps(_mm512_sub_ps(m_old, shift), ln2));
    const __m512 f = avx512::Exp(_mm512_mul_ps(_mm512_sub_ps(tile_max, shift), ln2));  // 2^(tile max - m_new)
    _mm512_storeu_ps(corr + i, c);
    _mm512_storeu_ps(l + i, _mm512_fmadd_ps(_mm512_loadu_ps(l + i), c, _mm512_mul_ps(f, sum)));
    _mm512_storeu_ps(m + i, m_new);
    for (int b = 0; b < nb; ++b)
      _mm512_storeu_ps(wscale + b * nqp + i, _mm512_mul_ps(f, _mm512_set1_ps(top[b] / 255.0f)));
  }
}

void AddValues(const uint8_t* w, int64_t nqp, const int8_t* values, int64_t nt, int hd, const float* corr,
               const float* wscale, float* ot) {
  PS_CHECK(hd % kQ8Values == 0) << "head size " << hd;
  avx512::WithRowVectors(nqp, [&](auto qv) { ValuesOf<qv.value>(w, values, nt, hd, corr, wscale, ot); });
}

namespace {

using avx512::kValuePairs;

// Q8_0 rows of zeros (scales and quants) for the padding of decode's row lists.
alignas(64) constexpr uint8_t kZeroRow[avx512_bf16::kMaxDecodeHeadSize / kQ8Values * kQ8BlockBytes] = {};

// acc + the unsigned bytes of x against the 4 signed bytes at q broadcast, read by the
// product itself ({1to16}), as avx512_bf16's DotBroadcast.
inline __m512i DotBroadcast(__m512i acc, __m512i x, const int32_t* q) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(x), "m"(*q));
  return acc;
}

// Lane r: the scale of block b of rows[r], r < 16.
inline __m512 BlockScales(const uint8_t* const* rows, int b) {
  alignas(32) uint16_t h[16];
  for (int r = 0; r < 16; ++r) std::memcpy(&h[r], rows[r] + b * kQ8BlockBytes, 2);
  return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(h)));
}

// The 32 quants of a Q8_0 block as BF16 values (exact: integers of at most 127).
inline __m512i QuantsToBf16(const uint8_t* block) {
  const __m128i* q = reinterpret_cast<const __m128i*>(block + 2);
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q)));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1)));
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// G heads' queries quantised as PackQueries does: qw[w * G + g] = head g's quants 4w..4w + 3
// (signed bytes), offsets[b * G + g] = -128 times the sum of its block b's (what the rows'
// + 128 adds), dq[b * G + g] = that block's scale.
void QuantizeQuery(const float* q, int n_heads, int hd, int32_t* qw, int32_t* offsets, float* dq) {
  alignas(64) int8_t quants[avx512_bf16::kMaxDecodeHeadSize];
  for (int g = 0; g < n_heads; ++g) {
    for (int b = 0; b < hd / kQ8Values; ++b) {
      const float* x = q + g * hd + b * kQ8Values;
      const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
      const float d = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1))) / 127.0f;
      const __m512 inverse = _mm512_set1_ps(d > 0 ? 1.0f / d : 0.0f);
      dq[b * n_heads + g] = d;
      const __m128i n0 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(x0, inverse)));
      const __m128i n1 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(x1, inverse)));
      _mm_store_si128(reinterpret_cast<__m128i*>(quants + b * kQ8Values), n0);
      _mm_store_si128(reinterpret_cast<__m128i*>(quants + b * kQ8Values + 16), n1);
      int sum = 0;
      for (int e = 0; e < kQ8Values; ++e) sum += quants[b * kQ8Values + e];
      offsets[b * n_heads + g] = -128 * sum;
    }
    for (int w = 0; w < hd / 4; ++w) qw[w * n_heads + g] = Word(reinterpret_cast<const uint8_t*>(quants + 4 * w));
  }
}

// Scores of 16 rows (the first n real) against G heads' quantised queries: two blocks of
// the rows' quants transposed at a time (a row to a lane, 4 quants a word), made unsigned,
// each head's word broadcast; with few heads two sums a head (even and odd words) halve the
// chain. dqs[b * G + g]: head g's block b scale times the softmax's.
template <int G>
void ScoreBatch(const int32_t* qw, const int32_t* offsets, const float* dqs, const uint8_t* const* rows, int hd,
                float* out, int64_t out_step, int n) {
  constexpr int A = G <= 4 ? 2 : 1;
  const int nb = hd / kQ8Values;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 sum[G];
  for (int g = 0; g < G; ++g) sum[g] = _mm512_setzero_ps();
  for (int b = 0; b < nb; b += 2) {
    const bool two = b + 1 < nb;
    __m512i a[16], t[16];
    for (int r = 0; r < 16; ++r) {
      const uint8_t* block = rows[r] + b * kQ8BlockBytes + 2;
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block));
      const __m256i hi =
          two ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kQ8BlockBytes)) : _mm256_setzero_si256();
      a[r] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
    avx512::Transpose16(a, t);
    for (int h = 0; h < (two ? 2 : 1); ++h) {
      __m512i acc[A][G];
      for (int g = 0; g < G; ++g) {
        acc[0][g] = _mm512_set1_epi32(offsets[(b + h) * G + g]);
        if constexpr (A == 2) acc[1][g] = _mm512_setzero_si512();
      }
      const int32_t* qb = qw + 8 * (b + h) * G;
#pragma GCC unroll 8
      for (int w = 0; w < 8; ++w) {
        const __m512i x = _mm512_xor_si512(t[8 * h + w], flip);
        for (int g = 0; g < G; ++g) acc[w % A][g] = DotBroadcast(acc[w % A][g], x, qb + w * G + g);
      }
      const __m512 dk = BlockScales(rows, b + h);
      for (int g = 0; g < G; ++g) {
        const __m512i total = A == 2 ? _mm512_add_epi32(acc[0][g], acc[A - 1][g]) : acc[0][g];
        const __m512 dqk = _mm512_mul_ps(dk, _mm512_set1_ps(dqs[(b + h) * G + g]));
        sum[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), dqk, sum[g]);
      }
    }
  }
  const auto keep = static_cast<__mmask16>((1u << n) - 1);
  for (int g = 0; g < G; ++g) _mm512_mask_storeu_ps(out + g * out_step, keep, sum[g]);
}

// Columns [32 c0, 32 (c0 + C)) of G heads' outputs += P · the rows (ValueColumnsOf), the
// rows' quants as BF16 against weights that carry the blocks' scales (pb[(g * nb + c) *
// kValuePairs + u]: head g's weights of keys 2u, 2u + 1 times their block c's scales).
template <int G, int C>
void ValueColumns(const uint32_t* pb, int64_t pairs, const uint8_t* const* rows, int hd, int c0, float* out,
                  int64_t ahead) {
  const int nb = hd / kQ8Values;
  avx512::ValueColumnsOf<G, C>(
      pairs,
      [&](int64_t u, int c, __m512i* a, __m512i* b) {
        *a = QuantsToBf16(rows[2 * u] + (c0 + c) * kQ8BlockBytes);
        *b = QuantsToBf16(rows[2 * u + 1] + (c0 + c) * kQ8BlockBytes);
      },
      [&](int g, int c, int64_t u) { return pb + (g * nb + c0 + c) * kValuePairs + u; },
      [&](int64_t u) {
        if (ahead > 0) {
          avx512::FetchRows<uint8_t>(rows, 2 * pairs, nullptr, 0, 2 * u + ahead, 2 * u + ahead + 2, nb * kQ8BlockBytes);
        }
      },
      hd, c0, out);
}

}  // namespace

void DecodeScores(const float* q, int n_heads, const ByteRun* runs, int64_t n_runs, const ByteRun* then, int64_t n_then,
                  int64_t stride, int hd, float scale, float* out, int64_t out_step, int64_t ahead) {
  PS_CHECK(hd % kQ8Values == 0 && hd <= avx512_bf16::kMaxDecodeHeadSize) << "head size " << hd;
  PS_CHECK(n_heads >= 1 && n_heads <= avx512_bf16::kMaxDecodeHeads) << n_heads << " heads";
  constexpr int kMaxHeads = avx512_bf16::kMaxDecodeHeads, kMaxSize = avx512_bf16::kMaxDecodeHeadSize;
  int32_t qw[kMaxHeads * kMaxSize / 4], offsets[kMaxHeads * kMaxSize / kQ8Values];
  float dqs[kMaxHeads * kMaxSize / kQ8Values];
  QuantizeQuery(q, n_heads, hd, qw, offsets, dqs);
  for (int i = 0; i < n_heads * hd / kQ8Values; ++i) dqs[i] *= scale;
  static thread_local std::vector<const uint8_t*> rows, then_rows;
  const int64_t n = avx512::FlattenRuns(runs, n_runs, stride, 16, std::numeric_limits<int64_t>::max(), kZeroRow, &rows);
  avx512::FlattenRuns(then, n_then, stride, 1, ahead, kZeroRow, &then_rows);  // only fetched
  const int64_t row_bytes = hd / kQ8Values * kQ8BlockBytes;
  avx512::WithHeads(n_heads, [&](auto g) {
    avx512::FetchRows(rows.data(), n, then_rows.data(), std::ssize(then_rows), 0, ahead, row_bytes);
    for (int64_t j = 0; j < n; j += 16) {
      avx512::FetchRows(rows.data(), n, then_rows.data(), std::ssize(then_rows), j + ahead, j + ahead + 16, row_bytes);
      ScoreBatch<g.value>(qw, offsets, dqs, rows.data() + j, hd, out + j, out_step,
                          static_cast<int>(std::min<int64_t>(16, n - j)));
    }
  });
}

void DecodeValues(const float* p, int64_t p_step, int n_heads, const ByteRun* runs, int64_t n_runs, int64_t stride,
                  int hd, float* out, int64_t ahead) {
  PS_CHECK(hd % kQ8Values == 0 && hd <= avx512_bf16::kMaxDecodeHeadSize) << "head size " << hd;
  PS_CHECK(n_heads >= 1 && n_heads <= avx512_bf16::kMaxDecodeHeads) << n_heads << " heads";
  const int nb = hd / kQ8Values;
  static thread_local std::vector<const uint8_t*> rows;
  static thread_local std::vector<uint32_t> pb;  // [head][block][pair]
  pb.resize(n_heads * nb * kValuePairs);
  // A zero row past an odd count (its weight 0), and up to 16 for the scales' reads.
  const int64_t n = avx512::FlattenRuns(runs, n_runs, stride, 16, std::numeric_limits<int64_t>::max(), kZeroRow, &rows);
  for (int64_t j0 = 0; j0 < n; j0 += 2 * kValuePairs) {
    const int64_t keys = std::min(2 * kValuePairs, n - j0), pairs = (keys + 1) / 2;
    for (int64_t j = 0; j < keys; j += 16) {  // weights times the rows' block scales, rounded to BF16 in pairs
      const int64_t left = std::min<int64_t>(16, keys - j);
      const auto real = static_cast<__mmask16>((1u << left) - 1);
      const auto stored = static_cast<__mmask8>((1u << ((left + 1) / 2)) - 1);
      for (int b = 0; b < nb; ++b) {
        const __m512 dv = BlockScales(rows.data() + j0 + j, b);
        for (int g = 0; g < n_heads; ++g) {
          const __m512 w = _mm512_mul_ps(_mm512_maskz_loadu_ps(real, p + g * p_step + j0 + j), dv);
          _mm256_mask_storeu_epi32(pb.data() + (g * nb + b) * kValuePairs + j / 2, stored,
                                   (__m256i)_mm512_cvtneps_pbh(w));
        }
      }
    }
    avx512::WithHeads(n_heads, [&](auto g) {
      constexpr int G = g.value, C = G <= 2 ? 4 : G <= 6 ? 2 : 1;  // 2 G C sums and 2 C row vectors in registers
      int c0 = 0;
      for (; c0 + C <= nb; c0 += C)
        ValueColumns<G, C>(pb.data(), pairs, rows.data() + j0, hd, c0, out, c0 == 0 ? ahead : 0);
      for (; c0 < nb; ++c0) ValueColumns<G, 1>(pb.data(), pairs, rows.data() + j0, hd, c0, out, c0 == 0 ? ahead : 0);
    });
  }
}

}  // namespace ps::avx512_q8
