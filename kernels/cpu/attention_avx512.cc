// Layouts: a packed key tile is blocks of kKeyAlign keys, each [hd / 2][kKeyAlign] 32-bit
// lanes holding a key's values 2p and 2p + 1 (the operand vdpbf16ps pairs with a query's
// values 2p, 2p + 1 broadcast to every lane); a packed value tile is [PaddedKeys(nt) / 2][hd]
// lanes holding value d of keys 2q and 2q + 1 (paired with a row's weights 2q, 2q + 1).
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

constexpr int kScoreRows = 8;  // query rows a pass of Scores (8 x 2 accumulators)
constexpr int kValueRows = 6;  // rows a pass of AddWeightedValues (6 x 4 accumulators)

inline uint32_t Lane(const uint16_t* p) {
  uint32_t x;
  std::memcpy(&x, p, 4);
  return x;
}
inline __m512bh Pairs(__m512i x) { return (__m512bh)x; }  // the same bits
inline __m512bh Broadcast(const uint16_t* p) { return Pairs(_mm512_set1_epi32(static_cast<int>(Lane(p)))); }
inline __m512bh LoadPairs(const uint16_t* p) { return Pairs(_mm512_loadu_si512(p)); }

// e^v for v <= 0, as attention_avx2.cc's Exp (Cephes range reduction, degree-6
// polynomial), 16 lanes; v below -87.3 (and -inf) gives 0.
inline __m512 Exp(__m512 v) {
  const __mmask16 under = _mm512_cmp_ps_mask(v, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
  v = _mm512_max_ps(v, _mm512_set1_ps(-87.3f));
  const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 y = _mm512_fnmadd_ps(r, _mm512_set1_ps(0.693359375f), v);
  y = _mm512_fmadd_ps(r, _mm512_set1_ps(2.12194440e-4f), y);
  __m512 p = _mm512_set1_ps(1.9875691500E-4f);
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.3981999507E-3f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(8.3334519073E-3f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(4.1665795894E-2f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.6666665459E-1f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(5.0000001201E-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, y), y, _mm512_add_ps(y, _mm512_set1_ps(1.0f)));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(r), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(static_cast<__mmask16>(~under), p, _mm512_castsi512_ps(bits));
}

// Rows [0, R) of a query tile (each row SplitQuery's two parts) against one packed key block
// (`valid` of its keys stored).
template <int R>
void ScoreBlock(const uint16_t* q, int64_t q_stride, const uint16_t* block, int hd, __m512 scale, int64_t valid,
                float* s, int64_t s_stride) {
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int p = 0; p < hd / 2; ++p) {
    const __m512bh k0 = LoadPairs(block + 2 * kKeyAlign * p), k1 = LoadPairs(block + 2 * kKeyAlign * p + 32);
    for (int r = 0; r < R; ++r) {
      const __m512bh a = Broadcast(q + r * q_stride + 2 * p), rest = Broadcast(q + r * q_stride + hd + 2 * p);
      acc[r][0] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(acc[r][0], a, k0), rest, k0);
      acc[r][1] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(acc[r][1], a, k1), rest, k1);
    }
  }
  const __mmask16 m0 = valid >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << valid) - 1);
  const __mmask16 m1 = valid >= 32 ? 0xFFFF : valid <= 16 ? 0 : static_cast<__mmask16>((1u << (valid - 16)) - 1);
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(s + r * s_stride, m0, _mm512_mul_ps(acc[r][0], scale));
    _mm512_mask_storeu_ps(s + r * s_stride + 16, m1, _mm512_mul_ps(acc[r][1], scale));
  }
}

// Rows [0, R) of o, columns [d0, d0 + 16 V), += their weights times a packed value tile.
template <int R, int V>
void ValueBlock(const uint16_t* p, int64_t p_stride, const uint16_t* values, int64_t pairs, int hd, int d0, float* o,
                int64_t o_stride) {
  __m512 acc[R][V];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_loadu_ps(o + r * o_stride + d0 + 16 * v);
  }
  for (int64_t u = 0; u < pairs; ++u) {
    __m512bh b[V];
    for (int v = 0; v < V; ++v) b[v] = LoadPairs(values + 2 * (u * hd + d0 + 16 * v));
    for (int r = 0; r < R; ++r) {
      const __m512bh a = Broadcast(p + r * p_stride + 2 * u);
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, b[v]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(o + r * o_stride + d0 + 16 * v, acc[r][v]);
  }
}

template <int V>
void ValueRows(int rows, const uint16_t* p, int64_t p_stride, const uint16_t* values, int64_t pairs, int hd, int d0,
               float* o, int64_t o_stride) {
  switch (rows) {
    case 1: return ValueBlock<1, V>(p, p_stride, values, pairs, hd, d0, o, o_stride);
    case 2: return ValueBlock<2, V>(p, p_stride, values, pairs, hd, d0, o, o_stride);
    case 3: return ValueBlock<3, V>(p, p_stride, values, pairs, hd, d0, o, o_stride);
    case 4: return ValueBlock<4, V>(p, p_stride, values, pairs, hd, d0, o, o_stride);
    case 5: return ValueBlock<5, V>(p, p_stride, values, pairs, hd, d0, o, o_stride);
    case 6: return ValueBlock<6, V>(p, p_stride, values, pairs, hd, d0, o, o_stride);
    default: PS_CHECK(false) << "value block of " << rows << " rows";
  }
}

}  // namespace

void PackKeys(const uint16_t* const* rows, int64_t nt, int hd, uint16_t* keys) {
  PS_CHECK(hd % kHeadAlign == 0) << "head size " << hd;
  const int64_t padded = PaddedKeys(nt);
  auto* out = reinterpret_cast<uint32_t*>(keys);  // [block][hd / 2][kKeyAlign]
  for (int64_t j = 0; j < padded; ++j) {
    uint32_t* dst = out + (j / kKeyAlign) * (hd / 2) * kKeyAlign + j % kKeyAlign;
    for (int p = 0; p < hd / 2; ++p) dst[p * kKeyAlign] = j < nt ? Lane(rows[j] + 2 * p) : 0;
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

float ExpToBf16(const float* s, int64_t nt, float m, uint16_t* p) {
  const __m512 vm = _mm512_set1_ps(m), neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 sum = _mm512_setzero_ps();
  const int64_t padded = PaddedKeys(nt);
  for (int64_t j = 0; j < padded; j += 16) {
    const __mmask16 valid = j + 16 <= nt ? 0xFFFF : j >= nt ? 0 : static_cast<__mmask16>((1u << (nt - j)) - 1);
    const __m512 x = _mm512_mask_loadu_ps(neg_inf, valid, s + j);
    const __m512 e = Exp(_mm512_sub_ps(x, vm));
    const __m256bh h = _mm512_cvtneps_pbh(e);
    std::memcpy(p + j, &h, sizeof h);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

void SplitQuery(const float* x, int hd, uint16_t* out) {
  PS_CHECK(hd % kHeadAlign == 0) << "head size " << hd;
  for (int e = 0; e < hd; e += 16) {
    const __m512 v = _mm512_loadu_ps(x + e);
    const __m256bh hi = _mm512_cvtneps_pbh(v);
    const __m512 back = _mm512_cvtpbh_ps(hi);
    const __m256bh lo = _mm512_cvtneps_pbh(_mm512_sub_ps(v, back));
    std::memcpy(out + e, &hi, sizeof hi);
    std::memcpy(out + hd + e, &lo, sizeof lo);
  }
}

void Scores(const uint16_t* q, int64_t q_stride, int64_t nq, const uint16_t* keys, int64_t nt, int hd, float scale,
            float* s, int64_t s_stride) {
  PS_CHECK(hd % kHeadAlign == 0) << "head size " << hd;
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t j0 = 0; j0 < nt; j0 += kKeyAlign) {
    const uint16_t* block = keys + j0 * hd;  // kKeyAlign keys x hd values
    const int64_t valid = nt - j0;
    for (int64_t i = 0; i < nq; i += kScoreRows) {
      const uint16_t* qi = q + i * q_stride;
      float* si = s + i * s_stride + j0;
      switch (std::min<int64_t>(kScoreRows, nq - i)) {
        case 1: ScoreBlock<1>(qi, q_stride, block, hd, vscale, valid, si, s_stride); break;
        case 2: ScoreBlock<2>(qi, q_stride, block, hd, vscale, valid, si, s_stride); break;
        case 3: ScoreBlock<3>(qi, q_stride, block, hd, vscale, valid, si, s_stride); break;
        case 4: ScoreBlock<4>(qi, q_stride, block, hd, vscale, valid, si, s_stride); break;
        case 5: ScoreBlock<5>(qi, q_stride, block, hd, vscale, valid, si, s_stride); break;
        case 6: ScoreBlock<6>(qi, q_stride, block, hd, vscale, valid, si, s_stride); break;
        case 7: ScoreBlock<7>(qi, q_stride, block, hd, vscale, valid, si, s_stride); break;
        default: ScoreBlock<8>(qi, q_stride, block, hd, vscale, valid, si, s_stride); break;
      }
    }
  }
}

void AddWeightedValues(const uint16_t* p, int64_t p_stride, int64_t nq, const uint16_t* values, int64_t nt, int hd,
                       float* o, int64_t o_stride) {
  PS_CHECK(hd % kHeadAlign == 0) << "head size " << hd;
  const int64_t pairs = PaddedKeys(nt) / 2;
  for (int64_t i = 0; i < nq; i += kValueRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kValueRows, nq - i));
    int d0 = 0;
    for (; d0 + 64 <= hd; d0 += 64)
      ValueRows<4>(rows, p + i * p_stride, p_stride, values, pairs, hd, d0, o + i * o_stride, o_stride);
    if (d0 < hd) ValueRows<2>(rows, p + i * p_stride, p_stride, values, pairs, hd, d0, o + i * o_stride, o_stride);
  }
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
