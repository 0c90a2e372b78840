// The packed-matrix group kernel (kernels/cpu/packed.h), shared by the files compiled for
// AVX2 (packed_avx2.cc) and for AVX-512 VNNI (packed_avx512.cc) and to be included by no
// other. Groups of 8 weight rows against up to 8 activation rows. Per 4 columns ("step")
// a vector holds the rows' quants, multiplied with the activation row's 4 quants in
// every 32-bit lane (ActStep):
// - AVX2: one group in a 32-byte vector; vpmaddubsw adds pairs into 16-bit lanes, which
//   accumulate over as many steps as the quants' width allows without overflow
//   (|q_x| <= 127: 8 steps for 4-bit quants, 4 for 5-bit, 2 for 6-bit; signed 8-bit
//   quants go through vpsignb one step at a time) before vpmaddwd widens them to 32 bits;
//   4 activation rows a pass.
// - AVX-512 VNNI (__AVX512VNNI__): vpdpbusd sums each row's 4 products into 32 bits in
//   one instruction, a step at a time; 8 activation rows a pass. Signed 8-bit quants are
//   made unsigned (+128, one xor for all rows) and 128 times the activations' sum taken
//   off again, as the offset of the formats that have one. One group in a 32-byte vector
//   (Ymm), or two side by side in a 64-byte one (Zmm; packed.cc takes it for products of
//   9 to 31 rows, and from 32 (Q6_K: from 9) the decoded kernel of packed_avx512.cc): each
//   activation broadcast then serves 16 rows, and 8 rows' sums give vpdpbusd's latency room
//   (on Zen 4, 8 chains of 256-bit sums barely cover it).
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

// The rest of an activation block (QuantizeActivations) once its quants are found: from
// them plus 128 (`plus128`, as bytes) the halves' sums, d (max / 127 rounded through fp16)
// and s; the quants stored as `stored` (plus128 itself, or the signed ones).
inline void FinishActBlock(__m256i plus128, __m256i stored, float max, ActBlock& a) {
  // Summed 8 at a time by vpsadbw: 64-bit lanes of quants 0-7, 8-15, 16-23 and 24-31.
  const __m256i sums = _mm256_sad_epu8(plus128, _mm256_setzero_si256());
  const __m128i lo = _mm256_castsi256_si128(sums), hi = _mm256_extracti128_si256(sums, 1);
  a.sum_lo = _mm_cvtsi128_si32(lo) + _mm_extract_epi32(lo, 2) - 128 * 16;
  a.sum_hi = _mm_cvtsi128_si32(hi) + _mm_extract_epi32(hi, 2) - 128 * 16;
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.qs), stored);
  a.d = _cvtsh_ss(_cvtss_sh(max / 127.0f, _MM_FROUND_TO_NEAREST_INT));  // as Fp16ToFp32(Fp32ToFp16(...))
  a.s = a.d * static_cast<float>(a.sum_lo + a.sum_hi);
}

// The two widths of a pass, I (integer lanes) and F (float lanes), one lane per weight
// row: Ymm, one group (8 rows); Zmm (VNNI builds), two groups side by side (16 rows),
// whose loads take the first group's 8 rows at `a` and the second's at `b`.
struct Ymm {
  using I = __m256i;
  using F = __m256;
  static I Load(const uint8_t* a, const uint8_t*) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)); }
  static F Halves(const uint8_t* a, const uint8_t*) {  // 8 fp16 as floats
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a)));
  }
  static F Bytes(const uint8_t* a, const uint8_t*, bool is_signed) {  // 8 bytes as floats
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(a));
    return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v));
  }
  static I SplatBytes(char c) { return _mm256_set1_epi8(c); }
  static I SplatInts(int32_t v) { return _mm256_set1_epi32(v); }
  static F SplatFloats(float v) { return _mm256_set1_ps(v); }
  static I ZeroInts() { return _mm256_setzero_si256(); }
  static F ZeroFloats() { return _mm256_setzero_ps(); }
};
inline __m256i And(__m256i a, __m256i b) { return _mm256_and_si256(a, b); }
inline __m256i Or(__m256i a, __m256i b) { return _mm256_or_si256(a, b); }
inline __m256i Xor(__m256i a, __m256i b) { return _mm256_xor_si256(a, b); }
// a | (b & c): one vpternlogd with AVX-512.
inline __m256i OrAnd(__m256i a, __m256i b, __m256i c) {
#if defined(__AVX512VNNI__)
  return _mm256_ternarylogic_epi32(a, b, c, 0xF8);
#else
  return _mm256_or_si256(a, _mm256_and_si256(b, c));
#endif
}
inline __m256i ShiftLeft16(__m256i a, int n) { return _mm256_slli_epi16(a, n); }
inline __m256i ShiftRight16(__m256i a, int n) { return _mm256_srli_epi16(a, n); }
inline __m256i Sub32(__m256i a, __m256i b) { return _mm256_sub_epi32(a, b); }
inline __m256 ToFloats(__m256i a) { return _mm256_cvtepi32_ps(a); }
inline __m256 Mul(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
inline __m256 MulAdd(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
inline __m256 Negate(__m256 a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f)); }
inline void Store(float* y, __m256 v) { _mm256_storeu_ps(y, v); }

#if defined(__AVX512VNNI__)
struct Zmm {
  using I = __m512i;
  using F = __m512;
  static I Load(const uint8_t* a, const uint8_t* b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(Ymm::Load(a, a)), Ymm::Load(b, b), 1);
  }
  static F Halves(const uint8_t* a, const uint8_t* b) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
  }
  static F Bytes(const uint8_t* a, const uint8_t* b, bool is_signed) {
    const __m128i v = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)),
                                         _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)));
    return _mm512_cvtepi32_ps(is_signed ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v));
  }
  static I SplatBytes(char c) { return _mm512_set1_epi8(c); }
  static I SplatInts(int32_t v) { return _mm512_set1_epi32(v); }
  static F SplatFloats(float v) { return _mm512_set1_ps(v); }
  static I ZeroInts() { return _mm512_setzero_si512(); }
  static F ZeroFloats() { return _mm512_setzero_ps(); }
};
inline __m512i And(__m512i a, __m512i b) { return _mm512_and_si512(a, b); }
inline __m512i Or(__m512i a, __m512i b) { return _mm512_or_si512(a, b); }
inline __m512i Xor(__m512i a, __m512i b) { return _mm512_xor_si512(a, b); }
inline __m512i OrAnd(__m512i a, __m512i b, __m512i c) { return _mm512_ternarylogic_epi32(a, b, c, 0xF8); }
inline __m512i ShiftLeft16(__m512i a, int n) { return _mm512_slli_epi16(a, n); }
inline __m512i ShiftRight16(__m512i a, int n) { return _mm512_srli_epi16(a, n); }
inline __m512i Sub32(__m512i a, __m512i b) { return _mm512_sub_epi32(a, b); }
inline __m512 ToFloats(__m512i a) { return _mm512_cvtepi32_ps(a); }
inline __m512 Mul(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
inline __m512 MulAdd(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
inline __m512 Negate(__m512 a) {
  return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(INT32_MIN)));
}
inline void Store(float* y, __m512 v) { _mm512_storeu_ps(y, v); }
// vpdpbusd: each row's 4 products summed straight into 32 bits.
inline __m256i DotAdd(__m256i acc, __m256i w, __m256i x) { return _mm256_dpbusd_epi32(acc, w, x); }
inline __m512i DotAdd(__m512i acc, __m512i w, __m512i x) { return _mm512_dpbusd_epi32(acc, w, x); }
#endif

// Keeps the compiler from reordering a chain of 16-bit accumulations into a tree of
// products held in (spilled) registers.
inline void Pin(__m256i& v) { asm("" : "+x"(v)); }

// The quants of step j (0..7) of a block of the pass's groups (a; b for Zmm): each row's
// 4 quants, raw (unsigned; Q8_0 signed).
template <DType T, class W, class Vi = typename W::I>
inline Vi Quants(const uint8_t* a, const uint8_t* b, int j, Vi planes0, Vi planes1) {
  constexpr Layout l = LayoutFor(T);
  if constexpr (l.bits == 8) {
    return W::Load(a + l.qs + 32 * j, b + l.qs + 32 * j);
  } else {
    const Vi raw = W::Load(a + l.qs + 32 * (j % 4), b + l.qs + 32 * (j % 4));
    const Vi m4 = W::SplatBytes(0x0F);
    Vi q = j < 4 ? And(raw, m4) : And(ShiftRight16(raw, 4), m4);
    if constexpr (l.bits == 5) {  // bit j of each byte of the plane to bit 4
      const Vi h = j < 4 ? ShiftLeft16(planes0, 4 - j) : ShiftRight16(planes0, j - 4);
      q = OrAnd(q, h, W::SplatBytes(0x10));
    } else if constexpr (l.bits == 6) {  // bits 2s, 2s+1 of plane j / 4 to bits 4, 5
      const Vi p = j < 4 ? planes0 : planes1;
      const int s = j % 4;
      const Vi h = s < 2 ? ShiftLeft16(p, 4 - 2 * s) : (s == 2 ? p : ShiftRight16(p, 2));
      q = OrAnd(q, h, W::SplatBytes(0x30));
    }
    return q;
  }
}

// Activation row i's 4 quants of step j of block b, in every 32-bit lane. AVX2 loads them
// from the broadcast copy (xb); AVX-512 machines (Zen 4 and later) broadcast from the
// block itself in the load unit (vpbroadcastd), and their kernel reads no copy.
template <class W>
inline typename W::I ActStep(const ActBlock* const* x, const uint8_t* const* xb, int i, int64_t b, int j) {
  if constexpr (kVnni) {
    int32_t four;
    std::memcpy(&four, x[i][b].qs + 4 * j, 4);
    return W::SplatInts(four);
  } else {
    return W::Load(xb[i] + 256 * b + 32 * j, nullptr);
  }
}

// dw per half and mw (packed_layout.h) of block b of the pass's groups, as RowScales
// computes them; d_super and m_super carry a K format's super-block scales from its
// first block to the next ones.
template <DType T, class W, class Vf = typename W::F>
inline void BlockScales(const GroupArgs& g, int64_t b, Vf& d_super, Vf& m_super, Vf* dw, Vf& mw) {
  constexpr Layout l = LayoutFor(T);
  constexpr bool kTwo = sizeof(Vf) == 64;  // Zmm
  const uint8_t* ba = BlockAt(l, g.group, b);
  const uint8_t* bb = kTwo ? BlockAt(l, g.second, b) : ba;
  mw = W::ZeroFloats();
  if constexpr (IsKFormat(l)) {
    if (b % l.super == 0) {
      const uint8_t* ha = HeaderAt(l, g.group, b);
      const uint8_t* hb = kTwo ? HeaderAt(l, g.second, b) : ha;
      d_super = W::Halves(ha + l.d, hb + l.d);
      if constexpr (l.m >= 0) m_super = W::Halves(ha + l.m, hb + l.m);
    }
    if constexpr (l.bits == 6) {
      dw[0] = Mul(d_super, W::Bytes(ba + l.sc, bb + l.sc, true));
      dw[1] = Mul(d_super, W::Bytes(ba + l.sc + 8, bb + l.sc + 8, true));
    } else {
      dw[0] = Mul(d_super, W::Bytes(ba + l.sc, bb + l.sc, false));
      mw = Negate(Mul(m_super, W::Bytes(ba + l.sc + 8, bb + l.sc + 8, false)));
    }
  } else {
    dw[0] = W::Halves(ba + l.d, bb + l.d);
    if constexpr (l.m >= 0) mw = W::Halves(ba + l.m, bb + l.m);
  }
}

// y[i * y_stride + c] for the pass's rows c (g.group's 8; with Zmm, g.second's next).
template <DType T, int R, class W>
void Kernel(const GroupArgs& g, const ActBlock* const* x, const uint8_t* const* xb, float* y, int64_t y_stride) {
  using Vi = typename W::I;
  using Vf = typename W::F;
  constexpr Layout l = LayoutFor(T);
  constexpr int kHalves = l.bits == 6 ? 2 : 1;
  constexpr int kPhase = l.bits == 4 ? 8 : l.bits == 5 ? 4 : l.bits == 6 ? 2 : 1;
  constexpr bool kTwo = sizeof(Vf) == 64;  // Zmm
  // VNNI takes signed quants as unsigned ones less 128.
  constexpr int kOffset = kVnni && l.is_signed ? 128 : l.offset;
  Vf acc[R];
  for (int i = 0; i < R; ++i) acc[i] = W::ZeroFloats();
  Vf d_super = W::ZeroFloats(), m_super = W::ZeroFloats();
  for (int64_t b = 0; b < g.blocks; ++b) {
    const uint8_t* ba = BlockAt(l, g.group, b);
    const uint8_t* bb = kTwo ? BlockAt(l, g.second, b) : ba;
    Vf dw[kHalves], mw;
    BlockScales<T, W>(g, b, d_super, m_super, dw, mw);
    const Vi planes0 = l.bits == 5 || l.bits == 6 ? W::Load(ba + l.qh, bb + l.qh) : W::ZeroInts();
    const Vi planes1 = l.bits == 6 ? W::Load(ba + l.qh + 32, bb + l.qh + 32) : W::ZeroInts();
    for (int h = 0; h < kHalves; ++h) {
      Vi s32[R];
      for (int i = 0; i < R; ++i) s32[i] = W::ZeroInts();
      for (int p = 0; p < 8 / kHalves; p += kPhase) {
#if defined(__AVX512VNNI__)
        for (int jj = 0; jj < kPhase; ++jj) {
          const int j = h * (8 / kHalves) + p + jj;
          Vi w = Quants<T, W>(ba, bb, j, planes0, planes1);
          if constexpr (l.is_signed) w = Xor(w, W::SplatBytes(static_cast<char>(0x80)));
          for (int i = 0; i < R; ++i) s32[i] = DotAdd(s32[i], w, ActStep<W>(x, xb, i, b, j));
        }
#else
        Vi s16[R];
        for (int i = 0; i < R; ++i) s16[i] = W::ZeroInts();
        for (int jj = 0; jj < kPhase; ++jj) {
          const int j = h * (8 / kHalves) + p + jj;
          const Vi w = Quants<T, W>(ba, bb, j, planes0, planes1);
          if constexpr (l.is_signed) {
            const Vi aw = _mm256_sign_epi8(w, w);
            for (int i = 0; i < R; ++i) {
              const Vi xs = _mm256_sign_epi8(ActStep<W>(x, xb, i, b, j), w);
              s16[i] = _mm256_maddubs_epi16(aw, xs);  // one step a phase
            }
          } else {
            for (int i = 0; i < R; ++i) {
              const Vi prod = _mm256_maddubs_epi16(w, ActStep<W>(x, xb, i, b, j));
              s16[i] = _mm256_add_epi16(s16[i], prod);
              Pin(s16[i]);
            }
          }
        }
        const Vi ones = _mm256_set1_epi16(1);
        for (int i = 0; i < R; ++i) s32[i] = _mm256_add_epi32(s32[i], _mm256_madd_epi16(s16[i], ones));
#endif
      }
      for (int i = 0; i < R; ++i) {
        const ActBlock& a = x[i][b];
        if constexpr (kOffset != 0) {
          const int32_t xsum = kHalves == 2 ? (h == 0 ? a.sum_lo : a.sum_hi) : a.sum_lo + a.sum_hi;
          s32[i] = Sub32(s32[i], W::SplatInts(kOffset * xsum));
        }
        acc[i] = MulAdd(ToFloats(s32[i]), Mul(dw[h], W::SplatFloats(a.d)), acc[i]);
        if constexpr (l.m >= 0) acc[i] = MulAdd(mw, W::SplatFloats(a.s), acc[i]);
      }
    }
  }
  for (int i = 0; i < R; ++i) Store(y + i * y_stride, acc[i]);
}

// Up to 8 activation rows a call with VNNI (AVX-512's 32 vector registers hold 8 rows'
// sums), up to 4 on AVX2 (16 registers; packed.cc's tiles).
template <DType T, class W>
void KernelRows(const GroupArgs& g, const ActBlock* const* x, const uint8_t* const* xb, int rows, float* y,
                int64_t y_stride) {
  switch (rows) {
    case 1: return Kernel<T, 1, W>(g, x, xb, y, y_stride);
    case 2: return Kernel<T, 2, W>(g, x, xb, y, y_stride);
    case 3: return Kernel<T, 3, W>(g, x, xb, y, y_stride);
    case 4: return Kernel<T, 4, W>(g, x, xb, y, y_stride);
    default: break;
  }
  if constexpr (kVnni) {
    switch (rows) {
      case 5: return Kernel<T, 5, W>(g, x, xb, y, y_stride);
      case 6: return Kernel<T, 6, W>(g, x, xb, y, y_stride);
      case 7: return Kernel<T, 7, W>(g, x, xb, y, y_stride);
      case 8: return Kernel<T, 8, W>(g, x, xb, y, y_stride);
      default: break;
    }
  }
  PS_CHECK(false) << "packed kernel for " << rows << " rows";
}

template <class W>
void GroupDotX86(const GroupArgs& g, const ActBlock* const* x, const uint8_t* const* xb, int rows, float* y,
                 int64_t y_stride) {
  switch (g.type) {
    case DType::kQ4_0: return KernelRows<DType::kQ4_0, W>(g, x, xb, rows, y, y_stride);
    case DType::kQ4_1: return KernelRows<DType::kQ4_1, W>(g, x, xb, rows, y, y_stride);
    case DType::kQ5_0: return KernelRows<DType::kQ5_0, W>(g, x, xb, rows, y, y_stride);
    case DType::kQ5_1: return KernelRows<DType::kQ5_1, W>(g, x, xb, rows, y, y_stride);
    case DType::kQ8_0: return KernelRows<DType::kQ8_0, W>(g, x, xb, rows, y, y_stride);
    case DType::kQ4_K: return KernelRows<DType::kQ4_K, W>(g, x, xb, rows, y, y_stride);
    case DType::kQ5_K: return KernelRows<DType::kQ5_K, W>(g, x, xb, rows, y, y_stride);
    case DType::kQ6_K: return KernelRows<DType::kQ6_K, W>(g, x, xb, rows, y, y_stride);
    default: PS_CHECK(false) << "no packed kernel for " << DTypeName(g.type);
  }
}

}  // namespace
}  // namespace ps::packed_internal
