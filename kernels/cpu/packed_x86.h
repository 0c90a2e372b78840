// The packed-matrix group kernel (kernels/cpu/packed.h), shared by the files compiled for
// AVX2 (packed_avx2.cc) and for AVX-512 VNNI (packed_avx512.cc) and to be included by no
// other. One group of 8 weight rows against up to 8 activation rows. Per 4 columns
// ("step") a 32-byte vector holds the 8 rows' quants, multiplied with the activation row's
// 4 quants in every 32-bit lane (ActStep):
// - AVX2: vpmaddubsw adds pairs into 16-bit lanes, which accumulate over as many steps as
//   the quants' width allows without overflow (|q_x| <= 127: 8 steps for 4-bit quants, 4
//   for 5-bit, 2 for 6-bit; signed 8-bit quants go through vpsignb one step at a time)
//   before vpmaddwd widens them to 32 bits; 4 activation rows a pass.
// - AVX-512 VNNI (__AVX512VNNI__): vpdpbusd sums each row's 4 products into 32 bits in one
//   instruction, a step at a time; 8 activation rows a pass.
// Both sum the same integers exactly, so both agree bit for bit with GroupDotScalar, whose
// arithmetic per row and block this is, operation for operation. Everything is in an
// unnamed namespace: each including file gets its own copy, built for its own instructions.
#pragma once

#include <immintrin.h>

#include <cstring>

#include "base/status.h"
#include "kernels/cpu/packed.h"
#include "kernels/cpu/packed_layout.h"

namespace ps::packed_internal {
namespace {

#if defined(__AVX512VNNI__)
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif

inline __m256i Load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m256 Halves(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m256 Bytes(const uint8_t* p, bool is_signed) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b));
}

// Keeps the compiler from reordering a chain of 16-bit accumulations into a tree of
// products held in (spilled) registers.
inline void Pin(__m256i& v) { asm("" : "+x"(v)); }

// The quants of step j (0..7) of a block: 8 rows x 4 columns, raw (unsigned; Q8_0 signed).
template <DType T>
inline __m256i Quants(const uint8_t* blk, int j, __m256i planes0, __m256i planes1) {
  constexpr Layout l = LayoutFor(T);
  if constexpr (l.bits == 8) {
    return Load(blk + l.qs + 32 * j);
  } else {
    const __m256i raw = Load(blk + l.qs + 32 * (j % 4));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i q = j < 4 ? _mm256_and_si256(raw, m4) : _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
    if constexpr (l.bits == 5) {  // bit j of each byte of the plane to bit 4
      const __m256i h = j < 4 ? _mm256_slli_epi16(planes0, 4 - j) : _mm256_srli_epi16(planes0, j - 4);
      q = _mm256_or_si256(q, _mm256_and_si256(h, _mm256_set1_epi8(0x10)));
    } else if constexpr (l.bits == 6) {  // bits 2s, 2s+1 of plane j / 4 to bits 4, 5
      const __m256i p = j < 4 ? planes0 : planes1;
      const int s = j % 4;
      const __m256i h = s < 2 ? _mm256_slli_epi16(p, 4 - 2 * s) : (s == 2 ? p : _mm256_srli_epi16(p, 2));
      q = _mm256_or_si256(q, _mm256_and_si256(h, _mm256_set1_epi8(0x30)));
    }
    return q;
  }
}

// Activation row i's 4 quants of step j of block b, in every 32-bit lane. AVX2 loads them
// from the broadcast copy (xb); AVX-512 machines (Zen 4 and later) broadcast from the
// block itself in the load unit (vpbroadcastd), and their kernel reads no copy.
inline __m256i ActStep(const ActBlock* const* x, const uint8_t* const* xb, int i, int64_t b, int j) {
  if constexpr (kVnni) {
    int32_t four;
    std::memcpy(&four, x[i][b].qs + 4 * j, 4);
    return _mm256_set1_epi32(four);
  } else {
    return Load(xb[i] + 256 * b + 32 * j);
  }
}

template <DType T, int R>
void Kernel(const GroupArgs& g, const ActBlock* const* x, const uint8_t* const* xb, float* y, int64_t y_stride) {
  constexpr Layout l = LayoutFor(T);
  constexpr int kHalves = l.bits == 6 ? 2 : 1;
  constexpr int kPhase = l.bits == 4 ? 8 : l.bits == 5 ? 4 : l.bits == 6 ? 2 : 1;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
  for (int i = 0; i < R; ++i) acc[i] = _mm256_setzero_ps();
  __m256 d_super = _mm256_setzero_ps(), m_super = _mm256_setzero_ps();
  for (int64_t b = 0; b < g.blocks; ++b) {
    const uint8_t* blk = BlockAt(l, g.group, b);
    // dw per half and mw (packed_layout.h), as RowScales computes them.
    __m256 dw[kHalves], mw = _mm256_setzero_ps();
    if constexpr (IsKFormat(l)) {
      if (b % l.super == 0) {
        const uint8_t* hdr = HeaderAt(l, g.group, b);
        d_super = Halves(hdr + l.d);
        if constexpr (l.m >= 0) m_super = Halves(hdr + l.m);
      }
      if constexpr (l.bits == 6) {
        dw[0] = _mm256_mul_ps(d_super, Bytes(blk + l.sc, true));
        dw[kHalves - 1] = _mm256_mul_ps(d_super, Bytes(blk + l.sc + 8, true));
      } else {
        dw[0] = _mm256_mul_ps(d_super, Bytes(blk + l.sc, false));
        mw = _mm256_xor_ps(_mm256_mul_ps(m_super, Bytes(blk + l.sc + 8, false)), _mm256_set1_ps(-0.0f));
      }
    } else {
      dw[0] = Halves(blk + l.d);
      if constexpr (l.m >= 0) mw = Halves(blk + l.m);
    }
    const __m256i planes0 = l.bits == 5 || l.bits == 6 ? Load(blk + l.qh) : _mm256_setzero_si256();
    const __m256i planes1 = l.bits == 6 ? Load(blk + l.qh + 32) : _mm256_setzero_si256();
    for (int h = 0; h < kHalves; ++h) {
      __m256i s32[R];
      for (int i = 0; i < R; ++i) s32[i] = _mm256_setzero_si256();
      for (int p = 0; p < 8 / kHalves; p += kPhase) {
        __m256i s16[R];
        for (int i = 0; i < R; ++i) s16[i] = _mm256_setzero_si256();
        for (int jj = 0; jj < kPhase; ++jj) {
          const int j = h * (8 / kHalves) + p + jj;
          const __m256i w = Quants<T>(blk, j, planes0, planes1);
          if constexpr (kVnni) {  // vpdpbusd: each row's 4 products summed straight into 32 bits
            if constexpr (l.is_signed) {
              const __m256i aw = _mm256_sign_epi8(w, w);
              for (int i = 0; i < R; ++i) {
                s32[i] = _mm256_dpbusd_epi32(s32[i], aw, _mm256_sign_epi8(ActStep(x, xb, i, b, j), w));
              }
            } else {
              for (int i = 0; i < R; ++i) s32[i] = _mm256_dpbusd_epi32(s32[i], w, ActStep(x, xb, i, b, j));
            }
          } else if constexpr (l.is_signed) {
            const __m256i aw = _mm256_sign_epi8(w, w);
            for (int i = 0; i < R; ++i) {
              const __m256i xs = _mm256_sign_epi8(ActStep(x, xb, i, b, j), w);
              s16[i] = _mm256_maddubs_epi16(aw, xs);  // one step a phase
            }
          } else {
            for (int i = 0; i < R; ++i) {
              const __m256i prod = _mm256_maddubs_epi16(w, ActStep(x, xb, i, b, j));
              s16[i] = _mm256_add_epi16(s16[i], prod);
              Pin(s16[i]);
            }
          }
        }
        for (int i = 0; !kVnni && i < R; ++i) {
          const __m256i wide = _mm256_madd_epi16(s16[i], ones);
          s32[i] = _mm256_add_epi32(s32[i], wide);
        }
      }
      for (int i = 0; i < R; ++i) {
        const ActBlock& a = x[i][b];
        if constexpr (l.offset != 0) {
          const int32_t xsum = kHalves == 2 ? (h == 0 ? a.sum_lo : a.sum_hi) : a.sum_lo + a.sum_hi;
          s32[i] = _mm256_sub_epi32(s32[i], _mm256_set1_epi32(l.offset * xsum));
        }
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32[i]), _mm256_mul_ps(dw[h], _mm256_set1_ps(a.d)), acc[i]);
        if constexpr (l.m >= 0) acc[i] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.s), acc[i]);
      }
    }
  }
  for (int i = 0; i < R; ++i) _mm256_storeu_ps(y + i * y_stride, acc[i]);
}

// Up to 8 activation rows a call with VNNI (AVX-512's 32 vector registers hold 8 rows'
// sums), up to 4 on AVX2 (16 registers; packed.cc's tiles).
template <DType T>
void KernelRows(const GroupArgs& g, const ActBlock* const* x, const uint8_t* const* xb, int rows, float* y,
                int64_t y_stride) {
  switch (rows) {
    case 1: return Kernel<T, 1>(g, x, xb, y, y_stride);
    case 2: return Kernel<T, 2>(g, x, xb, y, y_stride);
    case 3: return Kernel<T, 3>(g, x, xb, y, y_stride);
    case 4: return Kernel<T, 4>(g, x, xb, y, y_stride);
    default: break;
  }
  if constexpr (kVnni) {
    switch (rows) {
      case 5: return Kernel<T, 5>(g, x, xb, y, y_stride);
      case 6: return Kernel<T, 6>(g, x, xb, y, y_stride);
      case 7: return Kernel<T, 7>(g, x, xb, y, y_stride);
      case 8: return Kernel<T, 8>(g, x, xb, y, y_stride);
      default: break;
    }
  }
  PS_CHECK(false) << "packed kernel for " << rows << " rows";
}

inline void GroupDotX86(const GroupArgs& g, const ActBlock* const* x, const uint8_t* const* xb, int rows, float* y,
                        int64_t y_stride) {
  switch (g.type) {
    case DType::kQ4_0: return KernelRows<DType::kQ4_0>(g, x, xb, rows, y, y_stride);
    case DType::kQ4_1: return KernelRows<DType::kQ4_1>(g, x, xb, rows, y, y_stride);
    case DType::kQ5_0: return KernelRows<DType::kQ5_0>(g, x, xb, rows, y, y_stride);
    case DType::kQ5_1: return KernelRows<DType::kQ5_1>(g, x, xb, rows, y, y_stride);
    case DType::kQ8_0: return KernelRows<DType::kQ8_0>(g, x, xb, rows, y, y_stride);
    case DType::kQ4_K: return KernelRows<DType::kQ4_K>(g, x, xb, rows, y, y_stride);
    case DType::kQ5_K: return KernelRows<DType::kQ5_K>(g, x, xb, rows, y, y_stride);
    case DType::kQ6_K: return KernelRows<DType::kQ6_K>(g, x, xb, rows, y, y_stride);
    default: PS_CHECK(false) << "no packed kernel for " << DTypeName(g.type);
  }
}

}  // namespace
}  // namespace ps::packed_internal
