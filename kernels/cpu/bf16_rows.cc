// GCC 12 warns inside its own AVX-512 headers (a known false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "kernels/cpu/bf16_rows.h"

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/status.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/fetch.h"
#include "kernels/cpu/sgemm.h"

namespace ps {
namespace {

#define PS_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

// PackBf16's layout: blocks of 64 columns of W, each its k values in pairs (k padded):
// pair p of the block's columns is 64 x 2 values at p * 128.
constexpr int64_t kBlockColumns = kPackedBf16Columns, kPairValues = 2 * kBlockColumns;

// Pairs of a block that a group of rows takes in turn (32 KiB of weights, read again by the
// next group from L1), and how far ahead of a slice its groups fetch the weights: the next
// slice, the groups fetching it between them, so that the fetches run all the time rather
// than only while the first group takes the slice from memory (that left the memory idle
// while the others ran: 16 rows took about as long as reading the weights and then computing).
// Zen 5, one thread, 16 rows against 136 MB of weights: 6.0 ms with the fetches into L2,
// 5.0-5.4 into L1 (slices of 64 to 256 pairs within the noise of each other; 32 slower).
constexpr int64_t kSlicePairs = 128;
constexpr int64_t kFetchAhead = kSlicePairs * kPairValues * sizeof(uint16_t);

// Whether those fetches go into L1 or only into L2: into L1 where it holds more than a slice
// (Zen 5: 48 KiB); where a slice fills it (Zen 4: 32 KiB), the fetched lines would evict the
// slice's own, which the next groups read again, so they stop in L2. Zen 4, two threads, the
// 0.5B model's pass over all matrices (ps_bench_matmul, alternated, 6 runs each), median into
// L1 / into L2: 8 rows 44.3 / 34.8 ms, 16 rows 53.3 / 50.6. Zen 5 ran 10-20% slower into L2.
bool FetchIntoL1() {
  static const bool into_l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE) > kFetchAhead;
  return into_l1;
}

// s[i][j] += the block's pair of values in columns 16 j .. 16 j + 15 times row i's pair x[i].
template <int R>
PS_AVX512_BF16 __attribute__((always_inline)) inline void Step(__m512 (&s)[R][4], const uint16_t* w,
                                                               const uint32_t* x) {
  const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w), w1 = (__m512bh)_mm512_loadu_si512(w + 32);
  const __m512bh w2 = (__m512bh)_mm512_loadu_si512(w + 64), w3 = (__m512bh)_mm512_loadu_si512(w + 96);
  for (int i = 0; i < R; ++i) {
    const __m512bh xi = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(x[i]));
    s[i][0] = _mm512_dpbf16_ps(s[i][0], w0, xi);
    s[i][1] = _mm512_dpbf16_ps(s[i][1], w1, xi);
    s[i][2] = _mm512_dpbf16_ps(s[i][2], w2, xi);
    s[i][3] = _mm512_dpbf16_ps(s[i][3], w3, xi);
  }
}

// Sums of a's pairs [p0, p1) of R rows (k values each) with the block's: out row i, columns
// [0, columns), starts from zero at p0 = 0 and from its stored sums after that. The
// `fetch_lines` lines at `fetch` are fetched along the way, spread over the pairs, into L1 or
// (into_l1 false) L2.
template <int R>
PS_AVX512_BF16 void Tile(const uint16_t* a, int64_t k, const uint16_t* block, int64_t p0, int64_t p1, const char* fetch,
                         int64_t fetch_lines, bool into_l1, float* out, int64_t ldo, int64_t columns) {
  __m512 s[R][4];
  __mmask16 masks[4];
  for (int j = 0; j < 4; ++j) {
    const int64_t left = std::clamp<int64_t>(columns - 16 * j, 0, 16);
    masks[j] = static_cast<__mmask16>((1u << left) - 1);
  }
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < 4; ++j) {
      s[i][j] = p0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(masks[j], out + i * ldo + 16 * j);
    }
  }
  const int64_t whole = k / 2;  // pairs of two of a's values; an odd k's last value goes alone
  uint32_t x[R];
  int64_t fetched = 0;
  for (int64_t p = p0; p < p1; ++p) {
    const uint16_t* w = block + p * kPairValues;
    for (const int64_t until = (p + 1 - p0) * fetch_lines / (p1 - p0); fetched < until; ++fetched) {
      if (into_l1) {
        FetchLineL1(fetch + 64 * fetched);
      } else {
        FetchLineL2(fetch + 64 * fetched);
      }
    }
    for (int i = 0; i < R; ++i) std::memcpy(&x[i], a + i * k + 2 * p, sizeof(x[i]));
    Step<R>(s, w, x);
  }
  if (p1 == whole && k % 2 != 0) {
    for (int i = 0; i < R; ++i) x[i] = a[i * k + k - 1];
    Step<R>(s, block + whole * kPairValues, x);
  }
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < 4; ++j) _mm512_mask_storeu_ps(out + i * ldo + 16 * j, masks[j], s[i][j]);
  }
}

using TileFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, const char*, int64_t, bool, float*,
                        int64_t, int64_t);
constexpr TileFn kTiles[] = {nullptr, Tile<1>, Tile<2>, Tile<3>, Tile<4>, Tile<5>, Tile<6>};
constexpr int kMaxTileRows = 6;

}  // namespace

void SmallGemmBf16(int64_t m, int64_t n0, int64_t n1, int64_t k, const uint16_t* a, const uint16_t* packed, float* c,
                   int64_t ldc) {
  PS_CHECK(ActiveCpuIsa() >= CpuIsa::kAvx512Bf16) << "BF16 products need AVX-512 BF16";
  PS_CHECK(m > 0 && m <= kSmallGemmBf16Rows && n0 % kBlockColumns == 0 && n1 > n0)
      << m << " rows, columns [" << n0 << ", " << n1 << ")";
  const int64_t block_values = static_cast<int64_t>(PackedBf16Bytes(kBlockColumns, k) / sizeof(uint16_t));
  const int64_t whole = k / 2;
  // Rows in groups of at most 6, as even as they come (16 rows are 5 + 5 + 6), each group
  // over a slice of kSlicePairs pairs of the block in turn, the slice read from L1.
  const int64_t groups = (m + kMaxTileRows - 1) / kMaxTileRows;
  const bool into_l1 = FetchIntoL1();
  for (int64_t b = n0 / kBlockColumns; b * kBlockColumns < n1; ++b) {
    const uint16_t* block = packed + b * block_values;
    const int64_t columns = std::min(kBlockColumns, n1 - b * kBlockColumns);
    float* out = c + (b * kBlockColumns - n0);
    for (int64_t p0 = 0; p0 < std::max<int64_t>(whole, 1); p0 += kSlicePairs) {
      const int64_t p1 = std::min(whole, p0 + kSlicePairs);
      // The weights kFetchAhead bytes on, as many as this slice has, fetched while its groups
      // run: each group its share.
      const char* fetch = reinterpret_cast<const char*>(block + p0 * kPairValues) + kFetchAhead;
      const int64_t lines = (p1 - p0) * kPairValues * 2 / 64;
      for (int64_t g = 0, i0 = 0; g < groups; ++g) {
        const int64_t rows = (m - i0) / (groups - g);
        const int64_t first = g * lines / groups, last = (g + 1) * lines / groups;
        kTiles[rows](a + i0 * k, k, block, p0, p1, fetch + 64 * first, last - first, into_l1, out + i0 * ldc, ldc,
                     columns);
        i0 += rows;
      }
    }
  }
}

}  // namespace ps
