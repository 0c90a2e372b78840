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

#include "base/status.h"

namespace ps::avx512_bf16 {
namespace {

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

// e^v for v <= 0, 16 lanes: 2^(v log2 e) as 2^n 2^f, n an integer and |f| <= 1/2, 2^f by a
// degree-5 polynomial (relative error 1.1e-7, fitted for this, exactly 1 at 0); v below
// -87.3 (and -inf) gives 0.
inline __m512 Exp(__m512 v) {
  const __mmask16 under = _mm512_cmp_ps_mask(v, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
  v = _mm512_max_ps(v, _mm512_set1_ps(-87.3f));
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(v, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_fmsub_ps(v, log2e, n);
  __m512 p = _mm512_set1_ps(1.326472731e-3f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.671512991e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550733581e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402224243e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931470037e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~under), p, n);
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

template <class Fn>
void WithRowVectors(int64_t nqp, const Fn& fn) {
  PS_CHECK(nqp % kRowAlign == 0 && nqp > 0 && nqp <= kMaxTileRows) << nqp << " query rows";
  switch (nqp / kRowAlign) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 3: return fn(std::integral_constant<int, 3>{});
    default: return fn(std::integral_constant<int, 4>{});
  }
}

}  // namespace

void PackQueries(const float* q, int64_t q_stride, int64_t nq, int hd, uint16_t* qt) {
  PS_CHECK(hd % kHeadAlign == 0) << "head size " << hd;
  const int64_t nqp = PaddedRows(nq);
  auto* lanes = reinterpret_cast<uint32_t*>(qt);  // [hd / 2][nqp]
  for (int64_t i = 0; i < nqp; ++i) {
    for (int e = 0; e < hd; e += 32) {
      const __m512 a = i < nq ? _mm512_loadu_ps(q + i * q_stride + e) : _mm512_setzero_ps();
      const __m512 b = i < nq ? _mm512_loadu_ps(q + i * q_stride + e + 16) : _mm512_setzero_ps();
      alignas(64) uint32_t pairs[16];  // values e + 2p, e + 2p + 1 rounded
      _mm512_store_si512(pairs, (__m512i)_mm512_cvtne2ps_pbh(b, a));
      for (int p = 0; p < 16; ++p) lanes[(e / 2 + p) * nqp + i] = pairs[p];
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
  WithRowVectors(nqp, [&](auto qv) { ScoresOf<qv.value>(qt, nqp, keys, nt, hd, scale, s, row_max); });
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

void Softmax(const float* s, int64_t nqp, int64_t nt, const float* row_max, float* m, float* l, float* corr,
             uint16_t* p) {
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
    __m512 sum = _mm512_setzero_ps();
    for (int64_t u = 0; u < pairs; ++u) {
      const int64_t j = 2 * u;
      const __m512 e0 = j < nt ? Exp(_mm512_sub_ps(_mm512_loadu_ps(s + j * nqp + i), shift)) : _mm512_setzero_ps();
      const __m512 e1 =
          j + 1 < nt ? Exp(_mm512_sub_ps(_mm512_loadu_ps(s + (j + 1) * nqp + i), shift)) : _mm512_setzero_ps();
      sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
      const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(e1, e0);  // words 0-15: e0's, 16-31: e1's
      _mm512_storeu_si512(p + 2 * (u * nqp + i), _mm512_permutexvar_epi16(interleave, both));
    }
    const __m512 c = Exp(_mm512_sub_ps(m_old, shift));
    _mm512_storeu_ps(corr + i, c);
    _mm512_storeu_ps(l + i, _mm512_fmadd_ps(_mm512_loadu_ps(l + i), c, sum));
    _mm512_storeu_ps(m + i, m_new);
  }
}

void AddValues(const uint16_t* p, int64_t nqp, const uint16_t* values, int64_t nt, int hd, const float* corr,
               float* ot) {
  PS_CHECK(hd % kHeadAlign == 0) << "head size " << hd;
  WithRowVectors(nqp, [&](auto qv) { ValuesOf<qv.value>(p, nqp, values, nt, hd, corr, ot); });
}

namespace {

// The decode kernels' widening: 32 BF16 values as F32, even ones and odd ones.
inline __m512 Evens(__m512i x) { return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)); }
inline __m512 Odds(__m512i x) { return _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(-65536))); }
// Lane i of the evens / odds: element 2i / 2i + 1 of a, b (32 values).
inline __m512i EvenIndex() { return _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0); }
inline __m512i OddIndex() { return _mm512_add_epi32(EvenIndex(), _mm512_set1_epi32(1)); }
// Lane i of the result: element i / 2 of evens (i even) or of odds (i odd), from lane `from`.
inline __m512i InterleaveIndex(int from) {
  alignas(64) int32_t idx[16];
  for (int i = 0; i < 16; ++i) idx[i] = (i % 2 == 0 ? 0 : 16) + from + i / 2;
  return _mm512_load_si512(idx);
}

void FetchRun(const RowRun& r, int64_t stride, int hd) {
  const auto* p = reinterpret_cast<const char*>(r.rows);
  const int64_t bytes = 2 * ((r.n - 1) * stride + hd);
  for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(p + b, _MM_HINT_T1);
}

// The sums of each of 4 vectors' lanes, in lanes 0..3.
inline __m128 Sums4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512d abd = _mm512_castps_pd(ab), cdd = _mm512_castps_pd(cd);
  const __m512 u =
      _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(abd, cdd)), _mm512_castpd_ps(_mm512_unpackhi_pd(abd, cdd)));
  const __m512 v = _mm512_add_ps(u, _mm512_shuffle_f32x4(u, u, 0x4E));
  const __m512 w = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));
  return _mm512_castps512_ps128(w);
}

// R rows (k: the first; R <= 4) against G heads' arranged queries qa ([G][hd / 32][evens,
// odds]): out[g * out_step + i] for i < R.
template <int G, int R>
inline void ScoreRows(const float* qa, const uint16_t* k, int64_t stride, int hd, float scale, float* out,
                      int64_t out_step) {
  __m512 acc[G][R];
  for (int g = 0; g < G; ++g) {
    for (int i = 0; i < R; ++i) acc[g][i] = _mm512_setzero_ps();
  }
  const int chunks = hd / 32;
  for (int c = 0; c < chunks; ++c) {
    __m512 ke[R], ko[R];
    for (int i = 0; i < R; ++i) {
      const __m512i x = _mm512_loadu_si512(k + i * stride + 32 * c);
      ke[i] = Evens(x);
      ko[i] = Odds(x);
    }
    for (int g = 0; g < G; ++g) {
      const __m512 qe = _mm512_loadu_ps(qa + (g * chunks + c) * 32),
                   qo = _mm512_loadu_ps(qa + (g * chunks + c) * 32 + 16);
      for (int i = 0; i < R; ++i) acc[g][i] = _mm512_fmadd_ps(qo, ko[i], _mm512_fmadd_ps(qe, ke[i], acc[g][i]));
    }
  }
  for (int g = 0; g < G; ++g) {
    __m512 v[4];  // the R rows' sums, zeros after
    for (int i = 0; i < 4; ++i) v[i] = i < R ? acc[g][i < R ? i : 0] : _mm512_setzero_ps();
    const __m128 s = _mm_mul_ps(Sums4(v[0], v[1], v[2], v[3]), _mm_set1_ps(scale));
    _mm_mask_storeu_ps(out + g * out_step, static_cast<__mmask8>((1 << R) - 1), s);
  }
}

template <int G>
void ScoresOf(const float* qa, const RowRun* runs, int64_t n_runs, const RowRun* then, int64_t n_then, int64_t stride,
              int hd, float scale, float* out, int64_t out_step, int64_t ahead) {
  constexpr int R = G <= 4 ? 4 : G <= 7 ? 3 : 2;  // rows a pass: G R sums, 2 R row vectors and 2 query ones
  int64_t j = 0;
  for (int64_t u = 0; u < n_runs; ++u) {
    const int64_t f = u + ahead;
    if (f < n_runs) {
      FetchRun(runs[f], stride, hd);
    } else if (f - n_runs < n_then) {
      FetchRun(then[f - n_runs], stride, hd);
    }
    const RowRun& run = runs[u];
    int64_t r = 0;
    for (; r + R <= run.n; r += R, j += R) {
      ScoreRows<G, R>(qa, run.rows + r * stride, stride, hd, scale, out + j, out_step);
    }
    for (; r < run.n; ++r, ++j) ScoreRows<G, 1>(qa, run.rows + r * stride, stride, hd, scale, out + j, out_step);
  }
}

// Columns [32 c0, 32 (c0 + C)) of G heads' outputs += p · the runs' rows.
template <int G, int C>
void ValueColumns(const float* p, int64_t p_step, const RowRun* runs, int64_t n_runs, int64_t stride, int hd, int c0,
                  float* out, int64_t ahead) {
  __m512 even[G][C], odd[G][C];
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < C; ++c) even[g][c] = odd[g][c] = _mm512_setzero_ps();
  }
  int64_t j = 0;
  for (int64_t u = 0; u < n_runs; ++u) {
    if (c0 == 0 && u + ahead < n_runs) FetchRun(runs[u + ahead], stride, hd);
    const RowRun& run = runs[u];
    for (int64_t r = 0; r < run.n; ++r, ++j) {
      const uint16_t* v = run.rows + r * stride + 32 * c0;
      __m512 ve[C], vo[C];
      for (int c = 0; c < C; ++c) {
        const __m512i x = _mm512_loadu_si512(v + 32 * c);
        ve[c] = Evens(x);
        vo[c] = Odds(x);
      }
      for (int g = 0; g < G; ++g) {
        const __m512 w = _mm512_set1_ps(p[g * p_step + j]);
        for (int c = 0; c < C; ++c) {
          even[g][c] = _mm512_fmadd_ps(w, ve[c], even[g][c]);
          odd[g][c] = _mm512_fmadd_ps(w, vo[c], odd[g][c]);
        }
      }
    }
  }
  const __m512i lo = InterleaveIndex(0), hi = InterleaveIndex(8);
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < C; ++c) {
      float* o = out + g * hd + 32 * (c0 + c);
      _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), _mm512_permutex2var_ps(even[g][c], lo, odd[g][c])));
      _mm512_storeu_ps(o + 16,
                       _mm512_add_ps(_mm512_loadu_ps(o + 16), _mm512_permutex2var_ps(even[g][c], hi, odd[g][c])));
    }
  }
}

template <int G>
void ValuesOf(const float* p, int64_t p_step, const RowRun* runs, int64_t n_runs, int64_t stride, int hd, float* out,
              int64_t ahead) {
  constexpr int C = G <= 2 ? 4 : G <= 4 ? 3 : G <= 6 ? 2 : 1;  // 2 G C sums and 2 C row vectors in registers
  const int chunks = hd / 32;
  int c0 = 0;
  for (; c0 + C <= chunks; c0 += C) ValueColumns<G, C>(p, p_step, runs, n_runs, stride, hd, c0, out, ahead);
  for (; c0 < chunks; ++c0) ValueColumns<G, 1>(p, p_step, runs, n_runs, stride, hd, c0, out, ahead);
}

template <class Fn>
void WithHeads(int n_heads, const Fn& fn) {
  switch (n_heads) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 3: return fn(std::integral_constant<int, 3>{});
    case 4: return fn(std::integral_constant<int, 4>{});
    case 5: return fn(std::integral_constant<int, 5>{});
    case 6: return fn(std::integral_constant<int, 6>{});
    case 7: return fn(std::integral_constant<int, 7>{});
    case 8: return fn(std::integral_constant<int, 8>{});
    default: PS_CHECK(false) << n_heads << " query heads per KV head (at most " << kMaxDecodeHeads << ")";
  }
}

}  // namespace

void DecodeScores(const float* q, int n_heads, const RowRun* runs, int64_t n_runs, const RowRun* then, int64_t n_then,
                  int64_t stride, int hd, float scale, float* out, int64_t out_step, int64_t ahead) {
  PS_CHECK(hd % kHeadAlign == 0) << "head size " << hd;
  float qa[kMaxDecodeHeads * 256];  // the queries arranged: [head][hd / 32][evens, odds]
  PS_CHECK(n_heads * hd <= kMaxDecodeHeads * 256) << n_heads << " heads of " << hd;
  const __m512i even = EvenIndex(), odd = OddIndex();
  for (int i = 0; i < n_heads * hd; i += 32) {
    const __m512 a = _mm512_loadu_ps(q + i), b = _mm512_loadu_ps(q + i + 16);
    _mm512_storeu_ps(qa + i, _mm512_permutex2var_ps(a, even, b));
    _mm512_storeu_ps(qa + i + 16, _mm512_permutex2var_ps(a, odd, b));
  }
  WithHeads(n_heads, [&](auto g) {
    ScoresOf<g.value>(qa, runs, n_runs, then, n_then, stride, hd, scale, out, out_step, ahead);
  });
}

void DecodeValues(const float* p, int64_t p_step, int n_heads, const RowRun* runs, int64_t n_runs, int64_t stride,
                  int hd, float* out, int64_t ahead) {
  PS_CHECK(hd % kHeadAlign == 0) << "head size " << hd;
  WithHeads(n_heads, [&](auto g) { ValuesOf<g.value>(p, p_step, runs, n_runs, stride, hd, out, ahead); });
}

}  // namespace ps::avx512_bf16
