// GCC 12 warns inside its own AVX-512 headers (a known false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "kernels/cpu/bf16_rows.h"

#include <immintrin.h>

#include <algorithm>

#include "base/status.h"
#include "kernels/cpu/cpu_isa.h"

namespace ps {
namespace {

// How far ahead the weight rows are fetched, in 4-row groups for one tile per group: the
// time between the fetch and the use stays the same however many tiles a group has.
constexpr int64_t kFetchGroups = 4;

#define PS_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

// The sums of 16 vectors' lanes: lane j of the result is v[j]'s sum (pairs of vectors
// halve at each of four levels: within 64-bit pairs, 128-bit lanes, then across them).
PS_AVX512_BF16 __attribute__((always_inline)) inline __m512 SumLanes16(const __m512* v) {
  __m512 a[8], b[4], c[2];
  for (int j = 0; j < 8; ++j) {
    a[j] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * j], v[2 * j + 1]), _mm512_unpackhi_ps(v[2 * j], v[2 * j + 1]));
  }
  for (int j = 0; j < 4; ++j) {
    const __m512d lo = _mm512_castps_pd(a[2 * j]), hi = _mm512_castps_pd(a[2 * j + 1]);
    b[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(lo, hi)), _mm512_castpd_ps(_mm512_unpackhi_pd(lo, hi)));
  }
  for (int j = 0; j < 2; ++j) {
    c[j] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], 0xDD));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
}

// out[4 r + i] = w row r · a row i for 4 rows of each (k values, 32 a step; the last
// step's values past k read as 0). Meanwhile the `next_rows` rows at `next` are fetched
// into L2, a line of each per step: each tile of a group fetches its share of a later
// group's rows (fetched into L1, the next group's rows came too late: memory's latency
// showed, the lm_head's 16-row product ran at 11 GB/s). The 16 sums are named variables:
// GCC keeps a 1 KiB array of them in memory, storing each at every step.
PS_AVX512_BF16 void Tile(const uint16_t* const* a, const uint16_t* const* w, const uint16_t* const* next, int next_rows,
                         int64_t k, float* out) {
#define PS_SUMS(r) __m512 s##r##0 = _mm512_setzero_ps(), s##r##1 = s##r##0, s##r##2 = s##r##0, s##r##3 = s##r##0
  PS_SUMS(0);
  PS_SUMS(1);
  PS_SUMS(2);
  PS_SUMS(3);
#undef PS_SUMS
  for (int64_t kk = 0; kk < k; kk += 32) {
    const __mmask32 mask = kk + 32 <= k ? ~__mmask32{0} : (__mmask32{1} << (k - kk)) - 1;
    for (int r = 0; r < next_rows; ++r) _mm_prefetch(reinterpret_cast<const char*>(next[r] + kk), _MM_HINT_T1);
    const __m512bh a0 = (__m512bh)_mm512_maskz_loadu_epi16(mask, a[0] + kk);
    const __m512bh a1 = (__m512bh)_mm512_maskz_loadu_epi16(mask, a[1] + kk);
    const __m512bh a2 = (__m512bh)_mm512_maskz_loadu_epi16(mask, a[2] + kk);
    const __m512bh a3 = (__m512bh)_mm512_maskz_loadu_epi16(mask, a[3] + kk);
#define PS_ROW(r)                                                            \
  {                                                                          \
    const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mask, w[r] + kk); \
    s##r##0 = _mm512_dpbf16_ps(s##r##0, wv, a0);                             \
    s##r##1 = _mm512_dpbf16_ps(s##r##1, wv, a1);                             \
    s##r##2 = _mm512_dpbf16_ps(s##r##2, wv, a2);                             \
    s##r##3 = _mm512_dpbf16_ps(s##r##3, wv, a3);                             \
  }
    PS_ROW(0);
    PS_ROW(1);
    PS_ROW(2);
    PS_ROW(3);
#undef PS_ROW
  }
  const __m512 sums[16] = {s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33};
  _mm512_storeu_ps(out, SumLanes16(sums));
}

}  // namespace

void SmallGemmBf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* b, int64_t ldb, float* c,
                   int64_t ldc) {
  PS_CHECK(ActiveCpuIsa() >= CpuIsa::kAvx512Bf16) << "BF16 products need AVX-512 BF16";
  float out[16];
  const int64_t tiles = (m + 3) / 4, per_tile = (4 + tiles - 1) / tiles;  // next rows per tile
  const int64_t ahead = 4 * std::max<int64_t>(1, kFetchGroups / tiles);
  for (int64_t r0 = 0; r0 < n; r0 += 4) {
    const uint16_t *w[4], *next[4];  // past n: the last row again, its sums not stored
    for (int r = 0; r < 4; ++r) {
      w[r] = b + std::min(r0 + r, n - 1) * ldb;
      next[r] = b + std::min(r0 + ahead + r, n - 1) * ldb;
    }
    for (int64_t i0 = 0; i0 < m; i0 += 4) {
      const int64_t first = std::min<int64_t>(4, i0 / 4 * per_tile);
      const uint16_t* x[4];
      for (int i = 0; i < 4; ++i) x[i] = a + std::min(i0 + i, m - 1) * k;
      Tile(x, w, next + first, static_cast<int>(std::min<int64_t>(per_tile, 4 - first)), k, out);
      for (int r = 0; r < 4 && r0 + r < n; ++r) {
        for (int i = 0; i < 4 && i0 + i < m; ++i) c[(i0 + i) * ldc + r0 + r] = out[4 * r + i];
      }
    }
  }
}

}  // namespace ps
