// Layouts (prefill): PackQueries's qt holds, for each pair p of a head's values, a
// vector lane per query row with the row's values 2p, 2p + 1 (the operand vdpbf16ps pairs
// with a key's values 2p, 2p + 1 broadcast to every lane); the weights p hold, for each
// pair u of keys, a lane per row with its weights of keys 2u, 2u + 1; a packed value tile
// is [PaddedKeys(nt) / 2][hd] lanes holding value d of keys 2u and 2u + 1 (broadcast against
// the weights' lanes).
// GCC 12 warns inside its own AVX-512 headers (a known false positive).
#if defined(__GNUC__) && !defined(__clang__)  // GCC only: clang knows neither the warnings nor the false positives
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "kernels/cpu/attention_avx512.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "base/status.h"
#include "kernels/cpu/attention_avx512_internal.h"

namespace ps::avx512_bf16 {
namespace {

using avx512::Exp;
using avx512::Exp2Bf16;

constexpr int kScoreKeys = 6;     // keys a pass of Scores (6 x 4 accumulators of 16 rows)
constexpr int kValueColumns = 6;  // output columns a pass of AddValues (6 x 4 accumulators of 16 rows)

inline uint32_t Lane(const uint16_t* p) {
  uint32_t x;
  std::memcpy(&x, p, 4);
  return x;
}
inline __m512bh Pairs(__m512i x) { return (__m512bh)x; }  // the same bits
inline __m512bh Broadcast(const uint16_t* p) { return Pairs(_mm512_set1_epi32(static_cast<int>(Lane(p)))); }
inline __m512bh LoadPairs(const uint16_t* p) { return Pairs(_mm512_loadu_si512(p)); }

// Softmax's weights of keys [0, nt) for rows [i, i + 16), pairs of keys interleaved into
// p; returns their sum.
template <bool kFinite>
inline __m512 Weights(const float* s, int64_t nqp, int64_t nt, int64_t i, __m512 shift, __m512i interleave,
                      uint16_t* p) {
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < nt; j += 2) {
    const __m512 e0 = Exp2Bf16<kFinite>(_mm512_sub_ps(_mm512_loadu_ps(s + j * nqp + i), shift));
    const __m512 e1 = j + 1 < nt ? Exp2Bf16<kFinite>(_mm512_sub_ps(_mm512_loadu_ps(s + (j + 1) * nqp + i), shift))
                                 : _mm512_setzero_ps();
    sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
    const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(e1, e0);  // words 0-15: e0's, 16-31: e1's
    _mm512_storeu_si512(p + 2 * ((j / 2) * nqp + i), _mm512_permutexvar_epi16(interleave, both));
  }
  return sum;
}

// Scores of R keys against the tile's QV vectors of query rows; row_max updated.
template <int R, int QV>
void ScoreKeys(const uint16_t* qt, int64_t nqp, const uint16_t* const* keys, int hd, __m512 scale, float* s,
               __m512* row_max) {
  __m512 acc[R][QV];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < QV; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  const uint16_t* k[R];
  for (int r = 0; r < R; ++r) k[r] = keys[r];
  for (int p = 0; p < hd / 2; ++p) {
    const uint16_t* qp = qt + 2 * p * nqp;
    __m512bh a[QV];
    for (int v = 0; v < QV; ++v) {
      a[v] = LoadPairs(qp + 32 * v);
    }
    for (int r = 0; r < R; ++r) {
      const __m512bh kr = Broadcast(k[r] + 2 * p);
      for (int v = 0; v < QV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a[v], kr);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < QV; ++v) {
      const __m512 x = _mm512_mul_ps(acc[r][v], scale);
      _mm512_storeu_ps(s + r * nqp + 16 * v, x);
      row_max[v] = _mm512_max_ps(row_max[v], x);
    }
  }
}

template <int QV>
void ScoresOf(const uint16_t* qt, int64_t nqp, const uint16_t* const* keys, int64_t nt, int hd, float scale, float* s,
              float* row_max) {
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512 mx[QV];
  for (int v = 0; v < QV; ++v) mx[v] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + kScoreKeys <= nt; j += kScoreKeys)
    ScoreKeys<kScoreKeys, QV>(qt, nqp, keys + j, hd, vscale, s + j * nqp, mx);
  for (; j < nt; ++j) ScoreKeys<1, QV>(qt, nqp, keys + j, hd, vscale, s + j * nqp, mx);
  for (int v = 0; v < QV; ++v) _mm512_storeu_ps(row_max + 16 * v, mx[v]);
}

// Columns [d0, d0 + D) of QV vectors of rows of ot, rescaled, += the weights times the
// values.
template <int D, int QV>
void ValueColumns(const uint16_t* p, int64_t nqp, const uint16_t* values, int64_t pairs, int hd, int d0,
                  const float* corr, float* ot) {
  __m512 acc[D][QV];
  for (int v = 0; v < QV; ++v) {
    const __m512 c = _mm512_loadu_ps(corr + 16 * v);
    for (int d = 0; d < D; ++d) acc[d][v] = _mm512_mul_ps(_mm512_loadu_ps(ot + (d0 + d) * nqp + 16 * v), c);
  }
  for (int64_t u = 0; u < pairs; ++u) {
    __m512bh w[QV];
    for (int v = 0; v < QV; ++v) w[v] = LoadPairs(p + 2 * (u * nqp + 16 * v));
    const uint16_t* vu = values + 2 * (u * hd + d0);
    for (int d = 0; d < D; ++d) {
      const __m512bh x = Broadcast(vu + 2 * d);
      for (int v = 0; v < QV; ++v) acc[d][v] = _mm512_dpbf16_ps(acc[d][v], w[v], x);
    }
  }
  for (int d = 0; d < D; ++d) {
    for (int v = 0; v < QV; ++v) _mm512_storeu_ps(ot + (d0 + d) * nqp + 16 * v, acc[d][v]);
  }
}

template <int QV>
void ValuesOf(const uint16_t* p, int64_t nqp, const uint16_t* values, int64_t nt, int hd, const float* corr,
              float* ot) {
  const int64_t pairs = PaddedKeys(nt) / 2;
  int d0 = 0;
  for (; d0 + kValueColumns <= hd; d0 += kValueColumns)
    ValueColumns<kValueColumns, QV>(p, nqp, values, pairs, hd, d0, corr, ot);
  for (; d0 + 2 <= hd; d0 += 2) ValueColumns<2, QV>(p, nqp, values, pairs, hd, d0, corr, ot);
}

// The same, of the 16 32-bit words of each row from `at` (BF16 values) on.
inline void Transpose16(const uint16_t* const* rows, int at, __m512i t[16]) {
  __m512i a[16];
  for (int r = 0; r < 16; ++r) a[r] = _mm512_loadu_si512(rows[r] + at);
  avx512::Transpose16(a, t);
}

}  // namespace

void PackQueries(const float* q, int64_t q_stride, int64_t nq, int hd, uint16_t* qt) {
  PS_CHECK(hd % kHeadAlign == 0) << "head size " << hd;
  const int64_t nqp = PaddedRows(nq);
  auto* lanes = reinterpret_cast<__m512i*>(qt);  // [hd / 2][nqp / 16]
  for (int64_t i0 = 0; i0 < nqp; i0 += 16) {
    for (int e = 0; e < hd; e += 32) {
      __m512i pairs[16], t[16];  // pairs[r]: row i0 + r's values e + 2p, e + 2p + 1 rounded, p < 16
      for (int r = 0; r < 16; ++r) {
        const float* row = q + (i0 + r) * q_stride + e;
        const bool real = i0 + r < nq;
        const __m512 a = real ? _mm512_loadu_ps(row) : _mm512_setzero_ps();
        const __m512 b = real ? _mm512_loadu_ps(row + 16) : _mm512_setzero_ps();
        pairs[r] = (__m512i)_mm512_cvtne2ps_pbh(b, a);
      }
      avx512::Transpose16(pairs, t);
      for (int p = 0; p < 16; ++p) _mm512_storeu_si512(lanes + ((e / 2 + p) * nqp + i0) / 16, t[p]);
    }
  }
}

void UnpackOutputs(const float* ot, int64_t nqp, int64_t nq, int hd, float* out, int64_t out_stride) {
  PS_CHECK(hd % kHeadAlign == 0 && nqp % kRowAlign == 0 && nq <= nqp) << "head size " << hd << ", " << nqp << " rows";
  for (int64_t i0 = 0; i0 < nq; i0 += 16) {
    const int rows = static_cast<int>(std::min<int64_t>(16, nq - i0));
    for (int d0 = 0; d0 < hd; d0 += 16) {
      __m512i cols[16], t[16];  // cols[c]: output column d0 + c of rows i0..i0 + 15
      for (int c = 0; c < 16; ++c) cols[c] = _mm512_loadu_si512(ot + (d0 + c) * nqp + i0);
      avx512::Transpose16(cols, t);
      for (int r = 0; r < rows; ++r) _mm512_storeu_si512(out + (i0 + r) * out_stride + d0, t[r]);
    }
  }
}

void PackValues(const uint16_t* const* rows, int64_t nt, int hd, uint16_t* values) {
  PS_CHECK(hd % kHeadAlign == 0) << "head size " << hd;
  // Lane i of the first result: word i of a then of b; of the second, words 16 + i.
  alignas(64) uint16_t lo_idx[32], hi_idx[32];
  for (int i = 0; i < 16; ++i) {
    lo_idx[2 * i] = static_cast<uint16_t>(i);
    lo_idx[2 * i + 1] = static_cast<uint16_t>(32 + i);
    hi_idx[2 * i] = static_cast<uint16_t>(16 + i);
    hi_idx[2 * i + 1] = static_cast<uint16_t>(48 + i);
  }
  const __m512i lo = _mm512_load_si512(lo_idx), hi = _mm512_load_si512(hi_idx);
  const int64_t pairs = PaddedKeys(nt) / 2;
  for (int64_t u = 0; u < pairs; ++u) {
    uint16_t* dst = values + 2 * u * hd;
    for (int d = 0; d < hd; d += 32) {
      const int64_t j = 2 * u;
      const __m512i a = j < nt ? _mm512_loadu_si512(rows[j] + d) : _mm512_setzero_si512();
      const __m512i b = j + 1 < nt ? _mm512_loadu_si512(rows[j + 1] + d) : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + 2 * d, _mm512_permutex2var_epi16(a, lo, b));
      _mm512_storeu_si512(dst + 2 * d + 32, _mm512_permutex2var_epi16(a, hi, b));
    }
  }
}

void Scores(const uint16_t* qt, int64_t nqp, const uint16_t* const* keys, int64_t nt, int hd, float scale, float* s,
            float* row_max) {
  PS_CHECK(hd % kHeadAlign == 0) << "head size " << hd;
  avx512::WithRowVectors(nqp, [&](auto qv) { ScoresOf<qv.value>(qt, nqp, keys, nt, hd, scale, s, row_max); });
}

void Mask(int part, int32_t sinks, int32_t recent, const int32_t* key_pos, int64_t nt, const int32_t* q_pos,
          int64_t nqp, float* s, float* row_max) {
  PS_CHECK(nqp % kRowAlign == 0) << nqp << " query rows";
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < nqp; i += 16) {
    const __m512i qp = _mm512_loadu_si512(q_pos + i);
    const __m512i distant_from = _mm512_sub_epi32(qp, _mm512_set1_epi32(recent));  // keys at or before: distant
    __m512 mx = neg_inf;
    for (int64_t j = 0; j < nt; ++j) {
      const __m512i kp = _mm512_set1_epi32(key_pos[j]);
      __mmask16 sees = _mm512_cmple_epi32_mask(kp, qp);  // WindowSees, 16 rows at once
      if (part != 0) {
        const __mmask16 proximal =
            _mm512_cmplt_epi32_mask(kp, _mm512_set1_epi32(sinks)) | _mm512_cmpgt_epi32_mask(kp, distant_from);
        sees &= part == 1 ? proximal : static_cast<__mmask16>(~proximal);
      }
      float* sj = s + j * nqp + i;
      const __m512 x = _mm512_mask_blend_ps(sees, neg_inf, _mm512_loadu_ps(sj));
      _mm512_storeu_ps(sj, x);
      mx = _mm512_max_ps(mx, x);
    }
    _mm512_storeu_ps(row_max + i, mx);
  }
}

void Softmax(const float* s, int64_t nqp, int64_t nt, const float* row_max, bool finite, float* m, float* l,
             float* corr, uint16_t* p) {
  PS_CHECK(nqp % kRowAlign == 0) << nqp << " query rows";
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  // Word 2i of the result: word i of the first converted vector (key 2u), 2i + 1: of the second.
  alignas(64) uint16_t idx[32];
  for (int i = 0; i < 16; ++i) {
    idx[2 * i] = static_cast<uint16_t>(i);
    idx[2 * i + 1] = static_cast<uint16_t>(16 + i);
  }
  const __m512i interleave = _mm512_load_si512(idx);
  const int64_t pairs = PaddedKeys(nt) / 2;
  for (int64_t i = 0; i < nqp; i += 16) {
    const __m512 m_old = _mm512_loadu_ps(m + i);
    const __m512 m_new = _mm512_max_ps(m_old, _mm512_loadu_ps(row_max + i));
    // Rows that see nothing yet subtract 0: their -inf scores give 0.
    const __m512 shift =
        _mm512_mask_blend_ps(_mm512_cmp_ps_mask(m_new, neg_inf, _CMP_EQ_OQ), m_new, _mm512_setzero_ps());
    const __m512 sum = finite ? Weights<true>(s, nqp, nt, i, shift, interleave, p)
                              : Weights<false>(s, nqp, nt, i, shift, interleave, p);
    for (int64_t u = (nt + 1) / 2; u < pairs; ++u) _mm512_storeu_si512(p + 2 * (u * nqp + i), _mm512_setzero_si512());
    const __m512 c = Exp(_mm512_mul_ps(_mm512_sub_ps(m_old, shift), _mm512_set1_ps(0.693147180559945309f)));
    _mm512_storeu_ps(corr + i, c);
    _mm512_storeu_ps(l + i, _mm512_fmadd_ps(_mm512_loadu_ps(l + i), c, sum));
    _mm512_storeu_ps(m + i, m_new);
  }
}

void AddValues(const uint16_t* p, int64_t nqp, const uint16_t* values, int64_t nt, int hd, const float* corr,
               float* ot) {
  PS_CHECK(hd % kHeadAlign == 0) << "head size " << hd;
  avx512::WithRowVectors(nqp, [&](auto qv) { ValuesOf<qv.value>(p, nqp, values, nt, hd, corr, ot); });
}

namespace {

alignas(64) constexpr uint16_t kZeroRow[kMaxDecodeHeadSize] = {};

int64_t Flatten(const RowRun* runs, int64_t n_runs, int64_t stride, int64_t pad, int64_t limit,
                std::vector<const uint16_t*>* rows) {
  return avx512::FlattenRuns(runs, n_runs, stride, pad, limit, kZeroRow, rows);
}

void Fetch(const uint16_t* const* rows, int64_t n, const uint16_t* const* then, int64_t n_then, int64_t from,
           int64_t to, int hd) {
  avx512::FetchRows(rows, n, then, n_then, from, to, 2 * hd);
}

// acc + the BF16 pairs of x against *q's pair broadcast, the broadcast read by the product
// itself ({1to16}): through the intrinsics GCC emits a vpbroadcastd (a shuffle) a product.
// ScoreBatch's 6 products a row for SmolLM2's 3 heads: 3.9 ns a row with the intrinsics,
// 3.1-3.3 with this (Zen 4, L2).
inline __m512 DotBroadcast(__m512 acc, __m512i x, const uint32_t* q) {
  asm("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(x), "m"(*q));
  return acc;
}

// Scores of 16 rows (the first n real) against G heads' BF16 query pairs qb ([hd / 2][G]:
// pair e of every head, then e + 1's): the rows transposed 16 words at a time, a key to a
// lane, each head's pair broadcast; two sums a head (even and odd pairs) halve the chain.
template <int G>
void ScoreBatch(const uint32_t* qb, const uint16_t* const* rows, int hd, __m512 scale, float* out, int64_t out_step,
                int n) {
  __m512 acc[2][G];
  for (int g = 0; g < G; ++g) acc[0][g] = acc[1][g] = _mm512_setzero_ps();
  for (int c = 0; c < hd / 32; ++c) {
    __m512i t[16];
    Transpose16(rows, 32 * c, t);
    const uint32_t* qc = qb + 16 * c * G;
#pragma GCC unroll 16
    for (int e = 0; e < 16; ++e) {
      for (int g = 0; g < G; ++g) acc[e % 2][g] = DotBroadcast(acc[e % 2][g], t[e], qc + e * G + g);
    }
  }
  const auto keep = static_cast<__mmask16>((1u << n) - 1);
  for (int g = 0; g < G; ++g) {
    _mm512_mask_storeu_ps(out + g * out_step, keep, _mm512_mul_ps(_mm512_add_ps(acc[0][g], acc[1][g]), scale));
  }
}

template <int G>
void ScoresOf(const uint32_t* qb, const uint16_t* const* rows, int64_t n, const uint16_t* const* then, int64_t n_then,
              int hd, float scale, float* out, int64_t out_step, int64_t ahead) {
  const __m512 vscale = _mm512_set1_ps(scale);
  Fetch(rows, n, then, n_then, 0, ahead, hd);
  for (int64_t j = 0; j < n; j += 16) {
    Fetch(rows, n, then, n_then, j + ahead, j + ahead + 16, hd);
    ScoreBatch<G>(qb, rows + j, hd, vscale, out + j, out_step, static_cast<int>(std::min<int64_t>(16, n - j)));
  }
}

using avx512::kValuePairs;

// Columns [32 c0, 32 (c0 + C)) of G heads' outputs += P · the rows (ValueColumnsOf), the
// same weights for every chunk (pb[g * kValuePairs + u]: head g's weights of keys 2u, 2u + 1).
template <int G, int C>
void ValueColumns(const uint32_t* pb, int64_t pairs, const uint16_t* const* rows, int hd, int c0, float* out,
                  int64_t ahead) {
  avx512::ValueColumnsOf<G, C>(
      pairs,
      [&](int64_t u, int c, __m512i* a, __m512i* b) {
        *a = _mm512_loadu_si512(rows[2 * u] + 32 * (c0 + c));
        *b = _mm512_loadu_si512(rows[2 * u + 1] + 32 * (c0 + c));
      },
      [&](int g, int, int64_t u) { return pb + g * kValuePairs + u; },
      [&](int64_t u) {
        if (ahead > 0) Fetch(rows, 2 * pairs, nullptr, 0, 2 * u + ahead, 2 * u + ahead + 2, hd);
      },
      hd, c0, out);
}

template <int G>
void ValuesOf(const uint32_t* pb, int64_t pairs, const uint16_t* const* rows, int hd, float* out, int64_t ahead) {
  constexpr int C = G <= 2 ? 4 : G <= 6 ? 2 : 1;  // 2 G C sums and 2 C row vectors in registers
  const int chunks = hd / 32;
  int c0 = 0;
  for (; c0 + C <= chunks; c0 += C) ValueColumns<G, C>(pb, pairs, rows, hd, c0, out, c0 == 0 ? ahead : 0);
  for (; c0 < chunks; ++c0) ValueColumns<G, 1>(pb, pairs, rows, hd, c0, out, c0 == 0 ? ahead : 0);
}

// n values rounded to BF16, in pairs: pair i holds values 2i, 2i + 1 (0 past the n-th).
void ToPairs(const float* x, int64_t n, uint32_t* pairs) {
  auto first = [](int64_t k) { return static_cast<__mmask16>(k >= 16 ? 0xFFFF : (1u << std::max<int64_t>(k, 0)) - 1); };
  for (int64_t i = 0; i < n; i += 32) {
    const int64_t left = n - i;
    const __m512 a = _mm512_maskz_loadu_ps(first(left), x + i), b = _mm512_maskz_loadu_ps(first(left - 16), x + i + 16);
    _mm512_mask_storeu_epi32(pairs + i / 2, first((left + 1) / 2), (__m512i)_mm512_cvtne2ps_pbh(b, a));
  }
}

}  // namespace

void DecodeScores(const float* q, int n_heads, const RowRun* runs, int64_t n_runs, const RowRun* then, int64_t n_then,
                  int64_t stride, int hd, float scale, float* out, int64_t out_step, int64_t ahead) {
  PS_CHECK(hd % kHeadAlign == 0 && hd <= kMaxDecodeHeadSize) << "head size " << hd;
  PS_CHECK(n_heads >= 1 && n_heads <= kMaxDecodeHeads) << n_heads << " heads";
  uint32_t by_head[kMaxDecodeHeads * kMaxDecodeHeadSize / 2], qb[kMaxDecodeHeads * kMaxDecodeHeadSize / 2];
  ToPairs(q, n_heads * hd, by_head);
  for (int g = 0; g < n_heads; ++g) {  // ScoreBatch's order: a pair of every head together
    for (int e = 0; e < hd / 2; ++e) qb[e * n_heads + g] = by_head[g * hd / 2 + e];
  }
  static thread_local std::vector<const uint16_t*> rows, then_rows;
  const int64_t n = Flatten(runs, n_runs, stride, 16, std::numeric_limits<int64_t>::max(), &rows);
  Flatten(then, n_then, stride, 1, ahead, &then_rows);  // only fetched
  avx512::WithHeads(n_heads, [&](auto g) {
    ScoresOf<g.value>(qb, rows.data(), n, then_rows.data(), std::ssize(then_rows), hd, scale, out, out_step, ahead);
  });
}

void DecodeValues(const float* p, int64_t p_step, int n_heads, const RowRun* runs, int64_t n_runs, int64_t stride,
                  int hd, float* out, int64_t ahead) {
  PS_CHECK(hd % kHeadAlign == 0 && hd <= kMaxDecodeHeadSize) << "head size " << hd;
  PS_CHECK(n_heads >= 1 && n_heads <= kMaxDecodeHeads) << n_heads << " heads";
  static thread_local std::vector<const uint16_t*> rows;
  static thread_local std::vector<uint32_t> pb(kMaxDecodeHeads * kValuePairs);
  // A zero row past an odd count, whose weight is 0.
  const int64_t n = Flatten(runs, n_runs, stride, 2, std::numeric_limits<int64_t>::max(), &rows);
  for (int64_t j0 = 0; j0 < n; j0 += 2 * kValuePairs) {
    const int64_t keys = std::min(2 * kValuePairs, n - j0), pairs = (keys + 1) / 2;
    for (int g = 0; g < n_heads; ++g) ToPairs(p + g * p_step + j0, keys, pb.data() + g * kValuePairs);
    avx512::WithHeads(n_heads, [&](auto g) { ValuesOf<g.value>(pb.data(), pairs, rows.data() + j0, hd, out, ahead); });
  }
}

float ExpShifted(float* x, int64_t n, float m) {
  const __m512 vm = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const auto keep = static_cast<__mmask16>(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1);
    const __m512 e = _mm512_maskz_mov_ps(keep, Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(keep, x + i), vm)));
    _mm512_mask_storeu_ps(x + i, keep, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

}  // namespace ps::avx512_bf16
