#include "kernels/cpu/packed.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "base/fp16.h"
#include "base/status.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/fetch.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/quant.h"

namespace ps {
namespace {

using packed_internal::BlockAt;
using packed_internal::GroupArgs;
using packed_internal::HeaderAt;
using packed_internal::Layout;
using packed_internal::LayoutFor;

// One 32-column block of a GGUF row: its raw quants (unsigned, or signed for Q8_0)
// and scale fields as stored.
struct RawBlock {
  uint8_t q[32];
  uint16_t d = 0, m = 0;   // fp16: d and m (Q4_1/Q5_1), or the super-block's d and dmin (K formats)
  uint8_t sc[2] = {0, 0};  // K formats: the sub-block scale (Q6_K: one per 16 columns, signed)
  uint8_t mn = 0;          // Q4_K / Q5_K: the sub-block minimum
};

void Q5Quants(const uint8_t* qh_bytes, const uint8_t* qs, uint8_t* q) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<uint8_t>((qs[j] & 0xF) | (((qh >> j) & 1) << 4));
    q[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
  }
}

RawBlock ReadBlock(DType type, const uint8_t* row, int64_t b) {
  RawBlock r;
  switch (type) {
    case DType::kQ4_0:
    case DType::kQ4_1: {
      const uint8_t* qs = type == DType::kQ4_0 ? reinterpret_cast<const BlockQ4_0*>(row)[b].qs
                                               : reinterpret_cast<const BlockQ4_1*>(row)[b].qs;
      for (int j = 0; j < 16; ++j) r.q[j] = qs[j] & 0xF, r.q[j + 16] = qs[j] >> 4;
      if (type == DType::kQ4_0) {
        r.d = reinterpret_cast<const BlockQ4_0*>(row)[b].d;
      } else {
        r.d = reinterpret_cast<const BlockQ4_1*>(row)[b].d;
        r.m = reinterpret_cast<const BlockQ4_1*>(row)[b].m;
      }
      return r;
    }
    case DType::kQ5_0: {
      const BlockQ5_0& x = reinterpret_cast<const BlockQ5_0*>(row)[b];
      Q5Quants(x.qh, x.qs, r.q);
      r.d = x.d;
      return r;
    }
    case DType::kQ5_1: {
      const BlockQ5_1& x = reinterpret_cast<const BlockQ5_1*>(row)[b];
      Q5Quants(x.qh, x.qs, r.q);
      r.d = x.d;
      r.m = x.m;
      return r;
    }
    case DType::kQ8_0: {
      const BlockQ8_0& x = reinterpret_cast<const BlockQ8_0*>(row)[b];
      std::memcpy(r.q, x.qs, 32);
      r.d = x.d;
      return r;
    }
    case DType::kQ4_K:
    case DType::kQ5_K: {
      const int s = static_cast<int>(b % 8);
      const bool q5 = type == DType::kQ5_K;
      const auto& b4 = reinterpret_cast<const BlockQ4_K*>(row)[b / 8];
      const auto& b5 = reinterpret_cast<const BlockQ5_K*>(row)[b / 8];
      const uint8_t* qs = q5 ? b5.qs : b4.qs;
      for (int l = 0; l < 32; ++l) {
        r.q[l] = static_cast<uint8_t>((qs[(s / 2) * 32 + l] >> (4 * (s & 1))) & 0xF);
        if (q5) r.q[l] |= static_cast<uint8_t>(((b5.qh[l] >> s) & 1) << 4);
      }
      int sc, mn;
      Q4KScaleMin(s, q5 ? b5.scales : b4.scales, &sc, &mn);
      r.sc[0] = static_cast<uint8_t>(sc);
      r.mn = static_cast<uint8_t>(mn);
      r.d = q5 ? b5.d : b4.d;
      r.m = q5 ? b5.dmin : b4.dmin;
      return r;
    }
    case DType::kQ6_K: {
      // Element e of a super-block: low 4 bits in ql[(e / 128) * 64 + e % 64] (nibble
      // (e % 128) / 64), bits 4-5 in qh[(e / 128) * 32 + e % 32] at shift 2 ((e % 128) / 32).
      const BlockQ6_K& x = reinterpret_cast<const BlockQ6_K*>(row)[b / 8];
      for (int l = 0; l < 32; ++l) {
        const int e = static_cast<int>(b % 8) * 32 + l, h = e / 128, k = e % 128;
        const int low = (x.ql[h * 64 + k % 64] >> (4 * (k / 64))) & 0xF;
        const int high = (x.qh[h * 32 + k % 32] >> (2 * (k / 32))) & 3;
        r.q[l] = static_cast<uint8_t>(low | (high << 4));
      }
      r.sc[0] = static_cast<uint8_t>(x.scales[(b % 8) * 2]);
      r.sc[1] = static_cast<uint8_t>(x.scales[(b % 8) * 2 + 1]);
      r.d = x.d;
      return r;
    }
    default: break;
  }
  PS_CHECK(false) << "no packed layout for " << DTypeName(type);
  return r;
}

void Put16(uint8_t* p, int r, uint16_t v) { std::memcpy(p + 2 * r, &v, 2); }
uint16_t Get16(const uint8_t* p, int r) {
  uint16_t v;
  std::memcpy(&v, p + 2 * r, 2);
  return v;
}

// Writes row r's block into the packed block `out` (and its header `hdr` for K formats).
void PutBlock(const Layout& l, const RawBlock& raw, int r, uint8_t* hdr, uint8_t* out) {
  if (IsKFormat(l)) {
    Put16(hdr + l.d, r, raw.d);
    if (l.m >= 0) Put16(hdr + l.m, r, raw.m);
    if (l.bits == 6) {
      out[l.sc + r] = raw.sc[0];
      out[l.sc + 8 + r] = raw.sc[1];
    } else {
      out[l.sc + r] = raw.sc[0];
      out[l.sc + 8 + r] = raw.mn;
    }
  } else {
    Put16(out + l.d, r, raw.d);
    if (l.m >= 0) Put16(out + l.m, r, raw.m);
  }
  for (int k = 0; k < 32; ++k) {
    const int j = k / 4, i = k % 4;
    const uint8_t q = raw.q[k];
    if (l.bits == 8) {
      out[l.qs + 32 * j + 4 * r + i] = q;
      continue;
    }
    uint8_t& nib = out[l.qs + 32 * (j % 4) + 4 * r + i];
    nib = static_cast<uint8_t>(j < 4 ? (nib & 0xF0) | (q & 0xF) : (nib & 0x0F) | ((q & 0xF) << 4));
    if (l.bits == 5) out[l.qh + 4 * r + i] |= static_cast<uint8_t>(((q >> 4) & 1) << j);
    if (l.bits == 6) out[l.qh + 32 * (j / 4) + 4 * r + i] |= static_cast<uint8_t>(((q >> 4) & 3) << (2 * (j % 4)));
  }
}

// The raw quant of (row r, column k) of a packed block, with its scale terms.
int RawQuant(const Layout& l, const uint8_t* blk, int r, int k) {
  const int j = k / 4, i = k % 4;
  if (l.bits == 8) return static_cast<int8_t>(blk[l.qs + 32 * j + 4 * r + i]);
  const uint8_t nib = blk[l.qs + 32 * (j % 4) + 4 * r + i];
  int q = j < 4 ? nib & 0xF : nib >> 4;
  if (l.bits == 5) q |= ((blk[l.qh + 4 * r + i] >> j) & 1) << 4;
  if (l.bits == 6) q |= ((blk[l.qh + 32 * (j / 4) + 4 * r + i] >> (2 * (j % 4))) & 3) << 4;
  return q;
}

// dw and mw (packed_layout.h) of row r in block b, half h (Q6_K; 0 otherwise).
void RowScales(const Layout& l, const uint8_t* group, int64_t b, int r, int h, float* dw, float* mw) {
  const uint8_t* blk = BlockAt(l, group, b);
  if (!IsKFormat(l)) {
    *dw = Fp16ToFp32(Get16(blk + l.d, r));
    *mw = l.m >= 0 ? Fp16ToFp32(Get16(blk + l.m, r)) : 0.0f;
    return;
  }
  const uint8_t* hdr = HeaderAt(l, group, b);
  const float d = Fp16ToFp32(Get16(hdr + l.d, r));
  if (l.bits == 6) {
    *dw = d * static_cast<float>(static_cast<int8_t>(blk[l.sc + 8 * h + r]));
    *mw = 0.0f;
    return;
  }
  *dw = d * static_cast<float>(blk[l.sc + r]);
  *mw = -(Fp16ToFp32(Get16(hdr + l.m, r)) * static_cast<float>(blk[l.sc + 8 + r]));
}

thread_local std::vector<ActBlock> act_scratch;    // the calling thread's quantised activations
thread_local std::vector<uint8_t> bcast_scratch;   // ... and their broadcast form
thread_local std::vector<uint8_t> pack_scratch;    // a worker's groups packed on the fly
thread_local std::vector<uint8_t> decode_scratch;  // ... or decoded (avx512_vnni::DecodePair)

template <typename T>
T* Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}
// Grow's bytes from a 64-byte boundary: the decoded kernel's 64-byte loads then never
// straddle two cache lines.
uint8_t* GrowAligned(std::vector<uint8_t>& v, size_t n) {
  uint8_t* p = Grow(v, n + 63);
  return p + (-reinterpret_cast<uintptr_t>(p) & 63);
}

// Products are blocked so that a thread's current groups (at most this many bytes)
// stay in L2 while it runs every activation tile against them, and the broadcast
// activations of one pass (shared by the threads) fit in L3.
constexpr size_t kGroupsBytes = 192 << 10;
constexpr size_t kBroadcastBytes = 1 << 20;
// Activation rows per kernel call, at most: the VNNI kernel takes 8; AVX2's 4, whose
// broadcast copies (18 KiB for 4 rows of 2048 columns) then stay in L1 across groups.
constexpr int kTileRows = 8;
// From this many activation rows on, VNNI products decode their pairs of groups once per
// chunk (avx512_vnni::DecodePair): decoding costs about what one tile's unpacking does.
// Q6_K, whose unpacking costs the most, from two tiles of rows on: Qwen2.5-0.5B's Q6_K
// down projections at 16 rows (2 Zen 5 threads, ps_bench_matmul) 685 -> 914-926 GOP/s,
// where its Q5_0 and Q8_0 matrices ran slower decoded (1,021-1,129 -> 895-909; 795-850 ->
// 609-618).
constexpr int64_t kDecodeRows = 32;
constexpr int64_t kDecodeRowsQ6K = kTileRows + 1;

}  // namespace

bool Packable(DType type) { return LayoutFor(type).block > 0; }

size_t PackedBytes(DType type, int64_t rows, int64_t cols) {
  const Layout l = LayoutFor(type);
  PS_CHECK(cols % (32 * l.super) == 0) << "columns " << cols << " not a whole number of blocks";
  return static_cast<size_t>((rows + 7) / 8) * static_cast<size_t>(cols / (32 * l.super)) * SuperBytes(l);
}

void PackGroup(const MatrixView& w, int64_t g, uint8_t* dst) {
  const Layout l = LayoutFor(w.type);
  const int64_t blocks = w.cols / 32;
  std::memset(dst, 0, PackedBytes(w.type, 8, w.cols));
  for (int r = 0; r < 8 && 8 * g + r < w.rows; ++r) {
    const uint8_t* row = w.Row(8 * g + r);
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* hdr = dst + (b / l.super) * SuperBytes(l);
      PutBlock(l, ReadBlock(w.type, row, b), r, hdr, hdr + l.header + (b % l.super) * l.block);
    }
  }
}

void PackMatrix(const MatrixView& w, uint8_t* dst, ThreadPool& pool) {
  const size_t group_bytes = PackedBytes(w.type, 8, w.cols);
  pool.ParallelFor((w.rows + 7) / 8, 8, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) PackGroup(w, g, dst + g * group_bytes);
  });
}

void UnpackRow(DType type, const uint8_t* packed, int64_t cols, int64_t r, float* out) {
  const Layout l = LayoutFor(type);
  const uint8_t* group = packed + (r / 8) * PackedBytes(type, 8, cols);
  const int rr = static_cast<int>(r % 8);
  for (int64_t b = 0; b < cols / 32; ++b) {
    const uint8_t* blk = BlockAt(l, group, b);
    for (int k = 0; k < 32; ++k) {
      float dw, mw;
      RowScales(l, group, b, rr, k / 16, &dw, &mw);
      const int q = RawQuant(l, blk, rr, k) - l.offset;
      out[b * 32 + k] = dw * static_cast<float>(q) + mw;
    }
  }
}

void QuantizeActivations(const float* x, int64_t n, ActBlock* out) {
  if (ActiveCpuIsa() >= CpuIsa::kAvx2) return packed_internal::avx2::Quantize(x, n, out);
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    float amax = 0;
    for (int k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(x[k]));
    const float id = amax != 0 ? 127.0f / amax : 0.0f;
    ActBlock& a = out[b];
    a.sum_lo = a.sum_hi = 0;
    for (int k = 0; k < 32; ++k) {
      a.qs[k] = static_cast<int8_t>(std::nearbyint(x[k] * id));
      (k < 16 ? a.sum_lo : a.sum_hi) += a.qs[k];
    }
    a.d = Fp16ToFp32(Fp32ToFp16(amax / 127.0f));
    a.s = a.d * static_cast<float>(a.sum_lo + a.sum_hi);
  }
}

namespace packed_internal {

// The kernels' arithmetic, one row and block at a time: the integer dot product of
// the raw quants (per half block for Q6_K), the offset taken off in integers, then
// acc += float(S) * (dw * d) [+ mw * s], with fused multiply-adds as the SIMD kernels.
void GroupDotScalar(const GroupArgs& g, const ActBlock* const* x, int rows, float* y, int64_t y_stride) {
  const Layout l = LayoutFor(g.type);
  const int halves = l.bits == 6 ? 2 : 1;
  for (int i = 0; i < rows; ++i) {
    for (int r = 0; r < 8; ++r) {
      float acc = 0;
      for (int64_t b = 0; b < g.blocks; ++b) {
        const ActBlock& a = x[i][b];
        const uint8_t* blk = BlockAt(l, g.group, b);
        for (int h = 0; h < halves; ++h) {
          const int k0 = 32 / halves * h, k1 = 32 / halves * (h + 1);
          int32_t s = 0;
          for (int k = k0; k < k1; ++k) s += RawQuant(l, blk, r, k) * a.qs[k];
          const int32_t xsum = halves == 2 ? (h == 0 ? a.sum_lo : a.sum_hi) : a.sum_lo + a.sum_hi;
          s -= l.offset * xsum;
          float dw, mw;
          RowScales(l, g.group, b, r, h, &dw, &mw);
          acc = std::fma(static_cast<float>(s), dw * a.d, acc);
          if (l.m >= 0) acc = std::fma(mw, a.s, acc);
        }
      }
      y[i * y_stride + r] = acc;
    }
  }
}

}  // namespace packed_internal

void PackedMatMul(const MatrixView& w, const uint8_t* packed, const float* x, int64_t m, float* y, ThreadPool& pool) {
  const PackedProduct p{.w = w, .packed = packed, .y = y};
  PackedMatMuls({&p, 1}, x, m, pool);
}

namespace {

// Rows [m0, m1) of y = x · wᵀ (xq: x quantised), columns of w's groups [g0, g0 + groups),
// packed at `chunk`, by the decoded kernel: the chunk's pairs decoded once, then every
// tile of rows run against them two pairs a call.
void RunDecoded(const MatrixView& w, const uint8_t* chunk, int64_t g0, int64_t groups, const ActBlock* xq, int64_t m0,
                int64_t m1, float* y) {
  namespace vnni = packed_internal::avx512_vnni;
  const int64_t blocks = w.cols / 32, n = w.rows, pairs = (groups + 1) / 2;
  const size_t group_bytes = PackedBytes(w.type, 8, w.cols);
  const size_t pair_bytes = blocks * vnni::DecodedBlockBytes(w.type);
  uint8_t* decoded = GrowAligned(decode_scratch, static_cast<size_t>(pairs) * pair_bytes);
  for (int64_t g = 0; g < groups; g += 2) {
    const uint8_t* group = chunk + g * group_bytes;
    vnni::DecodePair(
        {.type = w.type, .group = group, .second = g + 1 < groups ? group + group_bytes : group, .blocks = blocks},
        decoded + g / 2 * pair_bytes);
  }
  float side[vnni::kDecodedRows * 32];  // a call's columns when not all of them are w's rows
  for (int64_t i0 = m0; i0 < m1; i0 += vnni::kDecodedRows) {
    const int rows = static_cast<int>(std::min<int64_t>(vnni::kDecodedRows, m1 - i0));
    const ActBlock* xr[vnni::kDecodedRows];
    for (int i = 0; i < rows; ++i) xr[i] = xq + (i0 + i) * blocks;
    for (int64_t p = 0; p < pairs; p += 2) {
      const int count = static_cast<int>(std::min<int64_t>(2, pairs - p));
      const int64_t col = 16 * p + 8 * g0, width = 16 * count, cover = std::min(width, n - col);
      float* out = cover == width ? y + i0 * n + col : side;
      vnni::DecodedDot(w.type, decoded + p * pair_bytes, count, blocks, xr, rows, out, cover == width ? n : width);
      for (int i = 0; cover < width && i < rows; ++i) {
        std::memcpy(y + (i0 + i) * n + col, side + width * i, cover * sizeof(float));
      }
    }
  }
}

}  // namespace

void PackedMatMuls(std::span<const PackedProduct> products, const float* x, int64_t m, ThreadPool& pool) {
  if (m <= 0 || products.empty()) return;
  const int64_t k = products[0].w.cols, blocks = k / 32;
  const bool simd = ActiveCpuIsa() >= CpuIsa::kAvx2, vnni = ActiveCpuIsa() >= CpuIsa::kAvx512Bf16;
  // With VNNI, products of more than one tile of rows take two groups a call (the
  // weights of a call then come from L2 from the second tile on; streamed from memory,
  // one group a call reads faster), decoded ones two pairs. Every count below is a
  // multiple of the groups a call takes, so that a call's groups are one matrix's and next
  // to each other (and a decoded chunk holds no lone pair: Q6_K's chunks of 6 groups gave
  // every third call one pair, at half the rate).
  const bool all_q6k =
      std::all_of(products.begin(), products.end(), [](const PackedProduct& p) { return p.w.type == DType::kQ6_K; });
  const bool decode = vnni && m >= (all_q6k ? kDecodeRowsQ6K : kDecodeRows);
  const int64_t span = decode ? 4 : vnni && m > kTileRows ? 2 : 1;
  auto whole_spans = [span](int64_t n) { return std::max<int64_t>(span, (n + span - 1) / span * span); };
  // The products' groups in one index space: matrix p's group g is first[p] + g (past
  // its last group, up to the next multiple of `span`, none).
  std::vector<int64_t> first(products.size() + 1, 0);
  int64_t grain = std::numeric_limits<int64_t>::max();
  for (size_t p = 0; p < products.size(); ++p) {
    const MatrixView& w = products[p].w;
    PS_CHECK(Packable(w.type) && w.cols == k) << "no packed kernels for " << DTypeName(w.type) << " x " << w.cols;
    first[p + 1] = first[p] + whole_spans((w.rows + 7) / 8);
    grain = std::min<int64_t>(grain, std::max<size_t>(1, kGroupsBytes / PackedBytes(w.type, 8, k)));
  }
  const int64_t groups = first.back();
  // Decoded products (many rows: compute-bound) split into about 16 claims per thread,
  // so that at the end a thread waits for at most a sixteenth of the other's share
  // (Qwen's Q4_K_M prefill on 2 Zen 5 cores, 4 -> 16: +3-4% at 512 and 2,048 rows).
  // Fewer rows (weights streamed from memory) keep 4: 16 ran 16 decode streams 3% slower.
  const int64_t chunks_per_thread = decode ? 16 : 4;
  grain = whole_spans(std::min(grain, groups / (chunks_per_thread * pool.num_threads())));
  ActBlock* xq = Grow(act_scratch, static_cast<size_t>(m * blocks));
  pool.ParallelFor(m, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if (decode) {
        packed_internal::avx512_vnni::QuantizeUnsigned(x + r * k, k, xq + r * blocks);
      } else {
        QuantizeActivations(x + r * k, k, xq + r * blocks);
      }
    }
  });
  // AVX2's kernel reads the activations from broadcast copies, made a pass of rows at a time.
  const bool broadcast = simd && !vnni;
  const int64_t tile = vnni ? kTileRows : 4;
  constexpr int64_t kBcast = packed_internal::avx2::kBroadcastBytesPerBlock;
  const int64_t pass_rows =
      broadcast ? std::max<int64_t>(tile, static_cast<int64_t>(kBroadcastBytes) / (blocks * kBcast) / tile * tile) : m;
  uint8_t* xb =
      broadcast ? Grow(bcast_scratch, static_cast<size_t>(std::min(m, pass_rows) * blocks * kBcast)) : nullptr;
  // Groups [g0, g1) of one product against activation rows [m0, m1).
  auto run = [&](const PackedProduct& pp, int64_t g0, int64_t g1, int64_t m0, int64_t m1) {
    const MatrixView& w = pp.w;
    const int64_t n = w.rows;
    const size_t group_bytes = PackedBytes(w.type, 8, k);
    const int64_t per_chunk = whole_spans(static_cast<int64_t>(kGroupsBytes / group_bytes));
    for (int64_t c0 = g0; c0 < g1; c0 += per_chunk) {
      const int64_t c1 = std::min(g1, c0 + per_chunk);
      const uint8_t* chunk = pp.packed != nullptr ? pp.packed + c0 * group_bytes : nullptr;
      if (chunk == nullptr) {
        uint8_t* buf = Grow(pack_scratch, static_cast<size_t>(c1 - c0) * group_bytes);
        for (int64_t g = c0; g < c1; ++g) PackGroup(w, g, buf + (g - c0) * group_bytes);
        chunk = buf;
      }
      if (decode) {
        RunDecoded(w, chunk, c0, c1 - c0, xq, m0, m1, pp.y);
        continue;
      }
      // Products of enough rows fetch the next chunk's weights into L2 meanwhile, a share
      // of them at each call: memory's latency would otherwise show at every chunk's first
      // tile (its weights' first reading, from memory; Q8_0's lm_head at 16 rows 366 ->
      // 411-416 GOP/s on a Zen 4). Fewer rows stream each chunk once, which the hardware's
      // prefetcher keeps up with alone: the fetches there only cost. VNNI: up to one tile
      // (Qwen's 169 matrices at 1 / 2 / 4 / 8 rows, 2 Zen 4 threads: 15.9-17.2 / 17.9-19.1 /
      // 21.4-26.1 / 28.9-30.0 ms a pass with them, 13.1-13.9 / 14.4-14.9 / 16.5-18.9 /
      // 23.9-24.4 without); AVX2, whose kernel does more work a byte, up to 2 rows (at the
      // avx2 level on that Zen 4, Qwen's decode: 1 stream 54-55 -> 64-65 tok/s without them,
      // 2 streams 88-101 either way, 4 streams 92-120 without against 111-131 with).
      const int64_t fetch_from_rows = vnni ? tile + 1 : 3;
      const bool fetch_next = pp.packed != nullptr && c1 < g1 && m1 - m0 >= fetch_from_rows;
      const uint8_t* next = fetch_next ? pp.packed + c1 * group_bytes : nullptr;
      const int64_t next_bytes = next != nullptr ? (std::min(g1, c1 + per_chunk) - c1) * group_bytes : 0;
      const int64_t calls = (m1 - m0 + tile - 1) / tile * ((c1 - c0 + span - 1) / span);
      const int64_t fetch_per_call = (next_bytes / calls + 63) / 64 * 64;
      int64_t fetched = 0;
      for (int64_t i0 = m0; i0 < m1; i0 += tile) {
        const int rows = static_cast<int>(std::min<int64_t>(tile, m1 - i0));
        const ActBlock* xr[kTileRows];
        const uint8_t* xbr[kTileRows];
        for (int i = 0; i < rows; ++i) {
          xr[i] = xq + (i0 + i) * blocks;
          xbr[i] = broadcast ? xb + (i0 + i - m0) * blocks * kBcast : nullptr;
        }
        for (int64_t g = c0; g < c1; g += span) {
          const uint8_t* group = chunk + (g - c0) * group_bytes;
          const bool pair = span == 2 && g + 1 < c1;
          const packed_internal::GroupArgs args{
              .type = w.type, .group = group, .second = pair ? group + group_bytes : nullptr, .blocks = blocks};
          // The call writes `width` columns; when not all are the matrix's rows (its rows
          // not a multiple of 8), to a side buffer first.
          const int64_t width = pair ? 16 : 8, cover = std::min<int64_t>(width, n - 8 * g);
          float side[kTileRows * 16];
          const bool whole = cover == width;
          float* out = whole ? pp.y + i0 * n + 8 * g : side;
          const int64_t stride = whole ? n : width;
          if (vnni) {
            packed_internal::avx512_vnni::GroupDot(args, xr, xbr, rows, out, stride);
          } else if (simd) {
            packed_internal::avx2::GroupDot(args, xr, xbr, rows, out, stride);
          } else {
            packed_internal::GroupDotScalar(args, xr, rows, out, stride);
          }
          for (int i = 0; !whole && i < rows; ++i) {
            std::memcpy(pp.y + (i0 + i) * n + 8 * g, side + stride * i, cover * sizeof(float));
          }
          for (const int64_t end = std::min(next_bytes, fetched + fetch_per_call); fetched < end; fetched += 64) {
            FetchLineL2(next + fetched);
          }
        }
      }
    }
  };
  for (int64_t m0 = 0; m0 < m; m0 += pass_rows) {
    const int64_t m1 = std::min(m, m0 + pass_rows);
    if (broadcast) {
      pool.ParallelFor(m1 - m0, 4, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          packed_internal::avx2::Broadcast(xq + (m0 + r) * blocks, blocks, xb + r * blocks * kBcast);
        }
      });
    }
    pool.ParallelFor(
        groups, grain,
        [&](int64_t g0, int64_t g1) {
          for (size_t p = 0; p < products.size(); ++p) {
            const int64_t a = std::max(g0, first[p]), b = std::min(g1, first[p] + (products[p].w.rows + 7) / 8);
            if (a < b) run(products[p], a - first[p], b - first[p], m0, m1);
          }
        },
        chunks_per_thread);
  }
}

}  // namespace ps
