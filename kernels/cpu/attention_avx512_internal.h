// What the AVX-512 attention kernels of kernels/cpu/ share (attention_avx512.cc,
// attention_avx512_q8.cc): the softmax's exponentials, a 16 x 16 transpose of 32-bit words
// in registers, the dispatch on a tile's count of row vectors and on a GQA group's heads,
// and decode's row lists, fetching and value products. Include only from files compiled
// for AVX-512 BF16.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "base/status.h"
#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/fetch.h"

namespace ps::avx512 {

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

// 2^v for v <= 0, 16 lanes, where the result is rounded to BF16 or to a byte (prefill's
// softmax weights): 2^n 2^f, n an integer and |f| <= 1/2, 2^f by a degree-3 polynomial (relative
// error 1.0e-4, a twentieth of BF16's rounding; exactly 1 at 0); v below -126 (and -inf)
// gives 0. Three FMAs where Exp takes seven (its multiply by log2 e, its f and five):
// those share the FMA pipes with the tiles' dot products. kFinite: no lane is -inf (an
// unmasked tile), so the clamp is left out (vscalefps takes any n, BF16 flushes what
// falls below its range).
template <bool kFinite>
inline __m512 Exp2Bf16(__m512 v) {
  __mmask16 keep = 0xFFFF;
  if constexpr (!kFinite) {
    keep = _mm512_cmp_ps_mask(v, _mm512_set1_ps(-126.0f), _CMP_GE_OQ);
    v = _mm512_max_ps(v, _mm512_set1_ps(-126.0f));
  }
  const __m512 n = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(v, n);
  __m512 p = _mm512_set1_ps(5.500835279e-2f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.422095363e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.932828328e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  if constexpr (kFinite) return _mm512_scalef_ps(p, n);
  return _mm512_maskz_scalef_ps(keep, p, n);
}

// t[e] lane r = 32-bit word e of a[r] (e, r < 16): a 16 x 16 transpose in four rounds of
// two-vector shuffles (a is overwritten).
inline void Transpose16(__m512i a[16], __m512i t[16]) {
  __m512i b[16];
  for (int r = 0; r < 16; r += 2) {  // b[r] 128-bit lane L: words 4L, 4L + 1 of rows r, r + 1; b[r + 1]: 4L + 2, 4L + 3
    b[r] = _mm512_unpacklo_epi32(a[r], a[r + 1]);
    b[r + 1] = _mm512_unpackhi_epi32(a[r], a[r + 1]);
  }
  for (int q = 0; q < 16; q += 4) {  // a[q + c] lane L: word 4L + c of rows q..q + 3
    a[q] = _mm512_unpacklo_epi64(b[q], b[q + 2]);
    a[q + 1] = _mm512_unpackhi_epi64(b[q], b[q + 2]);
    a[q + 2] = _mm512_unpacklo_epi64(b[q + 1], b[q + 3]);
    a[q + 3] = _mm512_unpackhi_epi64(b[q + 1], b[q + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // b[c]: words c, 8 + c of rows 0-3, then of rows 4-7; b[4 + c]: 4 + c, 12 + c
    b[c] = _mm512_shuffle_i32x4(a[c], a[4 + c], 0x88);
    b[4 + c] = _mm512_shuffle_i32x4(a[c], a[4 + c], 0xDD);
    b[8 + c] = _mm512_shuffle_i32x4(a[8 + c], a[12 + c], 0x88);
    b[12 + c] = _mm512_shuffle_i32x4(a[8 + c], a[12 + c], 0xDD);
  }
  for (int c = 0; c < 4; ++c) {
    t[c] = _mm512_shuffle_i32x4(b[c], b[8 + c], 0x88);
    t[8 + c] = _mm512_shuffle_i32x4(b[c], b[8 + c], 0xDD);
    t[4 + c] = _mm512_shuffle_i32x4(b[4 + c], b[12 + c], 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(b[4 + c], b[12 + c], 0xDD);
  }
}

// fn(std::integral_constant<int, QV>) for a tile of nqp query rows, QV = nqp / 16 vectors.
template <class Fn>
void WithRowVectors(int64_t nqp, const Fn& fn) {
  PS_CHECK(nqp % avx512_bf16::kRowAlign == 0 && nqp > 0 && nqp <= avx512_bf16::kMaxTileRows) << nqp << " query rows";
  switch (nqp / avx512_bf16::kRowAlign) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 3: return fn(std::integral_constant<int, 3>{});
    default: return fn(std::integral_constant<int, 4>{});
  }
}

// fn(std::integral_constant<int, G>) for G = n_heads query heads of a KV head, 1 to 8.
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
    default: PS_CHECK(false) << n_heads << " query heads per KV head (at most " << avx512_bf16::kMaxDecodeHeads << ")";
  }
}

// The runs' rows in order (at most `limit`; `stride` T apart within a run), then copies of
// `zero` up to a multiple of `pad`; returns how many are the runs'.
template <class T>
int64_t FlattenRuns(const avx512_bf16::Run<T>* runs, int64_t n_runs, int64_t stride, int64_t pad, int64_t limit,
                    const T* zero, std::vector<const T*>* rows) {
  int64_t n = 0;
  for (int64_t u = 0; u < n_runs; ++u) n += runs[u].n;
  n = std::min(n, limit);
  rows->resize((n + pad - 1) / pad * pad);  // then filled through a plain pointer: push_back's
  const T** out = rows->data();             // stores to a thread_local cost 5% of the decode
  for (int64_t u = 0, j = 0; j < n; ++u) {
    const int64_t take = std::min(runs[u].n, n - j);
    for (int64_t r = 0; r < take; ++r) out[j + r] = runs[u].rows + r * stride;
    j += take;
  }
  std::fill(out + n, out + rows->size(), zero);
  return n;
}

// Asks for rows [from, to) of `rows` (n of them), then of `then` (n_then), into L2: each
// row's first `row_bytes`.
template <class T>
void FetchRows(const T* const* rows, int64_t n, const T* const* then, int64_t n_then, int64_t from, int64_t to,
               int64_t row_bytes) {
  for (int64_t j = from; j < to; ++j) {
    const T* r = j < n ? rows[j] : j - n < n_then ? then[j - n] : nullptr;
    if (r == nullptr) return;
    for (int64_t b = 0; b < row_bytes; b += 64) FetchLineL2(reinterpret_cast<const char*>(r) + b);
  }
}

// Lane i of a value pass's first result: output column i of the even-keyed (unpacklo)
// sums a and the odd-keyed (unpackhi) ones b, which hold columns 8L + [0, 4) and 8L + [4, 8)
// in their 128-bit lanes L; from column `from` on.
inline __m512i ColumnIndex(int from) {
  alignas(64) int32_t idx[16];
  for (int i = 0; i < 16; ++i) {
    const int d = from + i, lane = 4 * (d / 8) + d % 4;
    idx[i] = d % 8 < 4 ? lane : 16 + lane;
  }
  return _mm512_load_si512(idx);
}

// Keys a call of the decode value kernels takes at most: their weights' rows are this many
// pairs apart, so that every head's weight is at a fixed offset from the pair's first.
constexpr int64_t kValuePairs = 1024;

// Columns [32 c0, 32 (c0 + C)) of G heads' outputs (out_g = out + g * hd) += P · V over
// `pairs` pairs of keys, on BF16 dot products: a pair's two rows interleaved (a column's two
// values to a lane) against its two weights broadcast. rows(u, c, &a, &b) gives the 32 BF16
// values of chunk c0 + c of pair u's two rows; weight(g, c, u) points at head g's two weights
// (BF16, a 32-bit pair) for them; fetch(u) runs before pair u.
template <int G, int C, class Rows, class Weight, class Fetch>
void ValueColumnsOf(int64_t pairs, const Rows& rows, const Weight& weight, const Fetch& fetch, int hd, int c0,
                    float* out) {
  __m512 lo[G][C], hi[G][C];
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < C; ++c) lo[g][c] = hi[g][c] = _mm512_setzero_ps();
  }
  for (int64_t u = 0; u < pairs; ++u) {
    fetch(u);
    __m512bh vl[C], vh[C];
    for (int c = 0; c < C; ++c) {
      __m512i a, b;
      rows(u, c, &a, &b);
      vl[c] = (__m512bh)_mm512_unpacklo_epi16(a, b);
      vh[c] = (__m512bh)_mm512_unpackhi_epi16(a, b);
    }
    for (int g = 0; g < G; ++g) {
      for (int c = 0; c < C; ++c) {
        const __m512bh w = (__m512bh)_mm512_set1_epi32(static_cast<int>(*weight(g, c, u)));
        lo[g][c] = _mm512_dpbf16_ps(lo[g][c], vl[c], w);
        hi[g][c] = _mm512_dpbf16_ps(hi[g][c], vh[c], w);
      }
    }
  }
  const __m512i first = ColumnIndex(0), second = ColumnIndex(16);
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < C; ++c) {
      float* o = out + g * hd + 32 * (c0 + c);
      _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), _mm512_permutex2var_ps(lo[g][c], first, hi[g][c])));
      _mm512_storeu_ps(o + 16,
                       _mm512_add_ps(_mm512_loadu_ps(o + 16), _mm512_permutex2var_ps(lo[g][c], second, hi[g][c])));
    }
  }
}

}  // namespace ps::avx512
