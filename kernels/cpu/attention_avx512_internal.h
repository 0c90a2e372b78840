// What the AVX-512 attention kernels of kernels/cpu/ share (attention_avx512.cc,
// attention_avx512_q8.cc): a 16 x 16 transpose of 32-bit words in registers and the
// dispatch on a tile's count of row vectors. Include only from files compiled for AVX-512.
#pragma once

#include <immintrin.h>

#include <type_traits>

#include "base/status.h"
#include "kernels/cpu/attention_avx512.h"

namespace ps::avx512 {

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

}  // namespace ps::avx512
