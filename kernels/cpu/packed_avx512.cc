// The AVX-512 VNNI build of the packed-matrix group kernel (kernels/cpu/packed_x86.h):
// vpdpbusd on 256-bit vectors (one group) or 512-bit ones (two at once, with g.second) in
// place of AVX2's vpmaddubsw/vpmaddwd pairs; bit for bit the same sums. Compiled with AVX-512 flags;
// called only at CpuIsa::kAvx512Bf16 (which has VNNI) or above. The activations' blocks
// are AVX2's (the decoded kernel's, stored unsigned, quantised here: QuantizeUnsigned).
//
// Also the decoded kernel (packed.h's DecodePair / DecodedDot), for products of many rows.
// On Zen 5 (full-width 512-bit pipes) vpdpbusd issues twice a cycle; with 12 independent
// sums, broadcasts and integer logic beside it cost nothing, but the float work per
// 32-column block (convert, scale, add) shares its pipes (8 vpdpbusd with it: 76% of
// their rate alone). The group kernel unpacks 4-6-bit quants (about 3 instructions a
// step) and broadcasts an activation for every vpdpbusd. Decoded once per chunk of
// groups, a pair's quants are plain bytes and its scales floats, and with two pairs a call
// each broadcast serves two vpdpbusd: Q5_0 at 512 rows, 1,100 -> 1,180-1,370 GOP/s on 2
// Zen 5 cores.
// GCC 12 warns inside its own AVX-512 headers (a known false positive).
#if defined(__GNUC__) && !defined(__clang__)  // GCC only: clang knows neither the warnings nor the false positives
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "kernels/cpu/packed_x86.h"

namespace ps::packed_internal::avx512_vnni {
namespace {

// A decoded block of a pair: 8 steps of 64 quant bytes (as Zmm::Load returns them: the
// first group's 8 rows x 4 quants, then the second's) as signed bytes, the offset taken
// off; per half, -128 times each row's sum of them (16 int32: the term that the
// activations' stored + 128 adds); dw per half (16 floats each); then mw (16 floats) for
// the formats with a minimum.
constexpr int64_t kQuantBytes = 8 * 64;
constexpr int Halves(const Layout& l) { return l.bits == 6 ? 2 : 1; }
constexpr int64_t BlockBytes(const Layout& l) { return kQuantBytes + 64 * (2 * Halves(l) + (l.m >= 0 ? 1 : 0)); }
template <DType T>
void Decode(const GroupArgs& g, uint8_t* out) {
  constexpr Layout l = LayoutFor(T);
  constexpr int kHalves = Halves(l);
  const __m512i offset = Zmm::SplatBytes(static_cast<char>(l.offset)), ones = Zmm::SplatBytes(1);
  __m512 d_super = _mm512_setzero_ps(), m_super = _mm512_setzero_ps();
  for (int64_t b = 0; b < g.blocks; ++b, out += BlockBytes(l)) {
    const uint8_t* ba = BlockAt(l, g.group, b);
    const uint8_t* bb = BlockAt(l, g.second, b);
    const __m512i planes0 = l.bits == 5 || l.bits == 6 ? Zmm::Load(ba + l.qh, bb + l.qh) : Zmm::ZeroInts();
    const __m512i planes1 = l.bits == 6 ? Zmm::Load(ba + l.qh + 32, bb + l.qh + 32) : Zmm::ZeroInts();
    __m512i sums[kHalves];
    for (int h = 0; h < kHalves; ++h) sums[h] = Zmm::ZeroInts();
    for (int j = 0; j < 8; ++j) {
      __m512i w = Quants<T, Zmm>(ba, bb, j, planes0, planes1);
      if constexpr (l.offset != 0) w = _mm512_sub_epi8(w, offset);
      sums[j * kHalves / 8] = DotAdd(sums[j * kHalves / 8], ones, w);
      _mm512_storeu_si512(out + 64 * j, w);
    }
    int32_t* terms = reinterpret_cast<int32_t*>(out + kQuantBytes);
    for (int h = 0; h < kHalves; ++h) {
      _mm512_storeu_si512(terms + 16 * h, Sub32(Zmm::ZeroInts(), _mm512_slli_epi32(sums[h], 7)));
    }
    __m512 dw[kHalves], mw;
    BlockScales<T, Zmm>(g, b, d_super, m_super, dw, mw);
    float* scales = reinterpret_cast<float*>(out + kQuantBytes + 64 * kHalves);
    for (int h = 0; h < kHalves; ++h) _mm512_storeu_ps(scales + 16 * h, dw[h]);
    if constexpr (l.m >= 0) _mm512_storeu_ps(scales + 16 * kHalves, mw);
  }
}

// Kernel's arithmetic on A decoded pairs (A = 2: 32 of y's columns, the pairs one after the
// other): the same integer sums and the same float operations, so the same results. The
// sums take the activations' quants unsigned (stored + 128) against the signed weights,
// started at the decoded block's -128 times the weights' sum: a load, where a sum started
// at the activations' offset term took a broadcast of a computed value per row (one Zen 5
// thread: Q5_0 +2%, Q6_K +3%). 6 rows and two pairs: 12 sums and 12 accumulators in
// registers (with 7 rows GCC keeps 6 of the accumulators on the stack: Q4_1 at 512 rows
// ran at 830-1,090 GOP/s, against 980-1,230 with 6, on 2 Zen 5 cores).
template <DType T, int A, int R>
void DecodedKernel(const uint8_t* pairs, int64_t blocks, const ActBlock* const* x, float* y, int64_t y_stride) {
  constexpr Layout l = LayoutFor(T);
  constexpr int kHalves = Halves(l);
  const int64_t pair_bytes = blocks * BlockBytes(l);
  __m512 acc[A][R];
  for (int a = 0; a < A; ++a) {
    for (int i = 0; i < R; ++i) acc[a][i] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = pairs + b * BlockBytes(l);
    for (int h = 0; h < kHalves; ++h) {
      __m512i s32[A][R];
      for (int a = 0; a < A; ++a) {
        const __m512i start = _mm512_loadu_si512(blk + a * pair_bytes + kQuantBytes + 64 * h);
        for (int i = 0; i < R; ++i) s32[a][i] = start;
      }
      for (int j = h * 8 / kHalves; j < (h + 1) * 8 / kHalves; ++j) {
        __m512i w[A];
        for (int a = 0; a < A; ++a) w[a] = _mm512_loadu_si512(blk + a * pair_bytes + 64 * j);
        for (int i = 0; i < R; ++i) {
          const __m512i xs = ActStep<Zmm>(x, nullptr, i, b, j);
          for (int a = 0; a < A; ++a) s32[a][i] = DotAdd(s32[a][i], xs, w[a]);
        }
      }
      for (int a = 0; a < A; ++a) {
        const float* scales = reinterpret_cast<const float*>(blk + a * pair_bytes + kQuantBytes + 64 * kHalves);
        const __m512 dw = _mm512_loadu_ps(scales + 16 * h);
        for (int i = 0; i < R; ++i) {
          acc[a][i] = MulAdd(ToFloats(s32[a][i]), Mul(dw, _mm512_set1_ps(x[i][b].d)), acc[a][i]);
          if constexpr (l.m >= 0)
            acc[a][i] = MulAdd(_mm512_loadu_ps(scales + 16), _mm512_set1_ps(x[i][b].s), acc[a][i]);
        }
      }
    }
  }
  for (int a = 0; a < A; ++a) {
    for (int i = 0; i < R; ++i) Store(y + i * y_stride + 16 * a, acc[a][i]);
  }
}

template <DType T, int A>
void DecodedRows(const uint8_t* pairs, int64_t blocks, const ActBlock* const* x, int rows, float* y, int64_t y_stride) {
  using Fn = void (*)(const uint8_t*, int64_t, const ActBlock* const*, float*, int64_t);
  static constexpr Fn kByRows[kDecodedRows] = {DecodedKernel<T, A, 1>, DecodedKernel<T, A, 2>, DecodedKernel<T, A, 3>,
                                               DecodedKernel<T, A, 4>, DecodedKernel<T, A, 5>, DecodedKernel<T, A, 6>};
  PS_CHECK(rows >= 1 && rows <= kDecodedRows) << "decoded kernel for " << rows << " rows";
  kByRows[rows - 1](pairs, blocks, x, y, y_stride);
}

template <DType T>
void DecodedPairs(const uint8_t* pairs, int count, int64_t blocks, const ActBlock* const* x, int rows, float* y,
                  int64_t y_stride) {
  PS_CHECK(count == 1 || count == 2) << "decoded kernel for " << count << " pairs";
  if (count == 2) return DecodedRows<T, 2>(pairs, blocks, x, rows, y, y_stride);
  DecodedRows<T, 1>(pairs, blocks, x, rows, y, y_stride);
}

}  // namespace

void GroupDot(const GroupArgs& g, const ActBlock* const* x, const uint8_t* const* xb, int rows, float* y,
              int64_t y_stride) {
  if (g.second != nullptr) return GroupDotX86<Zmm>(g, x, xb, rows, y, y_stride);
  GroupDotX86<Ymm>(g, x, xb, rows, y, y_stride);
}

size_t DecodedBlockBytes(DType type) { return static_cast<size_t>(BlockBytes(LayoutFor(type))); }

void DecodePair(const GroupArgs& g, uint8_t* out) {
  PS_CHECK(g.second != nullptr) << "a decoded pair needs two groups";
  switch (g.type) {
    case DType::kQ4_0: return Decode<DType::kQ4_0>(g, out);
    case DType::kQ4_1: return Decode<DType::kQ4_1>(g, out);
    case DType::kQ5_0: return Decode<DType::kQ5_0>(g, out);
    case DType::kQ5_1: return Decode<DType::kQ5_1>(g, out);
    case DType::kQ8_0: return Decode<DType::kQ8_0>(g, out);
    case DType::kQ4_K: return Decode<DType::kQ4_K>(g, out);
    case DType::kQ5_K: return Decode<DType::kQ5_K>(g, out);
    case DType::kQ6_K: return Decode<DType::kQ6_K>(g, out);
    default: PS_CHECK(false) << "no packed kernel for " << DTypeName(g.type);
  }
}

void QuantizeUnsigned(const float* x, int64_t n, ActBlock* out) {
  const __m256i top = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const float max = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const __m512 id = _mm512_set1_ps(max != 0 ? 127.0f / max : 0.0f);
    // Rounded to nearest even as avx2::Quantize's; within +-127, so saturation never acts.
    const __m128i q0 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, id)));
    const __m128i q1 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, id)));
    const __m256i plus128 = _mm256_xor_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1), top);
    FinishActBlock(plus128, plus128, max, out[b]);
  }
}

void DecodedDot(DType type, const uint8_t* pairs, int count, int64_t blocks, const ActBlock* const* x, int rows,
                float* y, int64_t y_stride) {
  switch (type) {
    case DType::kQ4_0: return DecodedPairs<DType::kQ4_0>(pairs, count, blocks, x, rows, y, y_stride);
    case DType::kQ4_1: return DecodedPairs<DType::kQ4_1>(pairs, count, blocks, x, rows, y, y_stride);
    case DType::kQ5_0: return DecodedPairs<DType::kQ5_0>(pairs, count, blocks, x, rows, y, y_stride);
    case DType::kQ5_1: return DecodedPairs<DType::kQ5_1>(pairs, count, blocks, x, rows, y, y_stride);
    case DType::kQ8_0: return DecodedPairs<DType::kQ8_0>(pairs, count, blocks, x, rows, y, y_stride);
    case DType::kQ4_K: return DecodedPairs<DType::kQ4_K>(pairs, count, blocks, x, rows, y, y_stride);
    case DType::kQ5_K: return DecodedPairs<DType::kQ5_K>(pairs, count, blocks, x, rows, y, y_stride);
    case DType::kQ6_K: return DecodedPairs<DType::kQ6_K>(pairs, count, blocks, x, rows, y, y_stride);
    default: PS_CHECK(false) << "no packed kernel for " << DTypeName(type);
  }
}

}  // namespace ps::packed_internal::avx512_vnni
