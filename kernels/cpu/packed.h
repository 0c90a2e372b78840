// Quantised weight matrices repacked for int8 matrix products, and those products.
//
// The packed layout: rows in groups of 8; for each 32-column block the 8 rows' quants
// are stored together so that one 32-byte vector holds 4 consecutive quants of each of
// the 8 rows (row r in bytes 4r..4r+3). A u8 x s8 dot-product instruction (AVX2
// vpmaddubsw, AVX-512 VNNI vpdpbusd) multiplies that vector with 4 activation bytes
// broadcast to every row and accumulates the 8 rows' sums side by side: no horizontal
// sums, and one activation load serves 8 rows. The bits are GGUF's, rearranged, so a
// packed matrix is the size of the original (+3% for Q4_K / Q5_K, whose 6-bit
// sub-block scales are stored as bytes). llama.cpp's CPU "repack" buffers follow the
// same idea.
//
// Activations are quantised per 32 elements to int8 with an fp16-representable scale
// (llama.cpp's Q8_0 activations: its numerics for quantised weights).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "base/thread_pool.h"
#include "kernels/types.h"

namespace ps {

// Types with a packed layout: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K.
bool Packable(DType type);
// Bytes of w's packed layout (rows rounded up to a multiple of 8).
size_t PackedBytes(DType type, int64_t rows, int64_t cols);
// Writes rows 8g..8g+7 of w (rows past w.rows as zeros) in the packed layout:
// PackedBytes(w.type, 8, w.cols) bytes.
void PackGroup(const MatrixView& w, int64_t g, uint8_t* dst);
// Writes all of w; dst holds PackedBytes(w.type, w.rows, w.cols) bytes.
void PackMatrix(const MatrixView& w, uint8_t* dst, ThreadPool& pool);
// Row r of a packed matrix of `cols` columns, dequantised: equal to DequantizeRow of
// the original row up to float rounding (tests; and embedding lookups).
void UnpackRow(DType type, const uint8_t* packed, int64_t cols, int64_t r, float* out);

// One activation block: 32 int8 quants q with scale d (x ~ d * q), their sums over
// elements 0..15 and 16..31, and d * (sum_lo + sum_hi).
struct ActBlock {
  float d;
  int32_t sum_lo, sum_hi;
  float s;
  int8_t qs[32];
};
static_assert(sizeof(ActBlock) == 48);
// Quantises n floats (n % 32 == 0) to n / 32 blocks.
void QuantizeActivations(const float* x, int64_t n, ActBlock* out);

// y[m, w.rows] = x[m, w.cols] · wᵀ with int8 activations. `packed` is w's packed layout
// (PackMatrix), or null: then w is packed a few groups at a time as the product runs
// (worth it from a few rows up; one-row products want the packed layout made once).
// Runs on `pool` at ActiveCpuIsa()'s level.
void PackedMatMul(const MatrixView& w, const uint8_t* packed, const float* x, int64_t m, float* y, ThreadPool& pool);
// Several such products of the same activations (a layer's q, k and v; its gate and up:
// matrices of as many columns) in one parallel region, the activations quantised once.
struct PackedProduct {
  MatrixView w;
  const uint8_t* packed = nullptr;  // as PackedMatMul's
  float* y = nullptr;               // [m, w.rows]
};
void PackedMatMuls(std::span<const PackedProduct> products, const float* x, int64_t m, ThreadPool& pool);

namespace packed_internal {

// What the kernels of every level need to know of one group of a packed matrix.
struct GroupArgs {
  DType type = DType::kQ4_0;
  const uint8_t* group = nullptr;   // PackedBytes(type, 8, cols) bytes
  const uint8_t* second = nullptr;  // avx512_vnni::GroupDot: the group of y's columns 8..15, or null
  int64_t blocks = 0;               // cols / 32
};
// y[i * y_stride + r] = row 8g + r of the group · activation row i, for r < 8, i < rows
// (avx2::GroupDot: 1..4); x[i] are the rows' blocks.
void GroupDotScalar(const GroupArgs& g, const ActBlock* const* x, int rows, float* y, int64_t y_stride);

namespace avx2 {
// The AVX2 kernel reads activations broadcast: each 4 quants of a block repeated 8 times
// (256 bytes a block), made once per row for every group it meets.
constexpr int64_t kBroadcastBytesPerBlock = 256;
void Quantize(const float* x, int64_t n, ActBlock* out);  // QuantizeActivations, bit for bit
void Broadcast(const ActBlock* x, int64_t blocks, uint8_t* out);
void GroupDot(const GroupArgs& g, const ActBlock* const* x, const uint8_t* const* xb, int rows, float* y,
              int64_t y_stride);
}  // namespace avx2

namespace avx512_vnni {
// avx2::GroupDot on AVX-512 VNNI (vpdpbusd), the same results; 1..8 activation rows.
// With g.second, two groups at once in 512-bit vectors: y's columns 8..15 are g.second's
// rows. Reads no broadcast copies (xb may be null).
void GroupDot(const GroupArgs& g, const ActBlock* const* x, const uint8_t* const* xb, int rows, float* y,
              int64_t y_stride);
// Products of many activation rows decode each pair of groups once per chunk: quants as
// bytes, scales as floats (DecodedBlockBytes a block, the blocks of a pair one after the
// other), and run DecodedDot on them, which spends fewer instructions per vpdpbusd than
// GroupDot and gives the same results.
size_t DecodedBlockBytes(DType type);
void DecodePair(const GroupArgs& g, uint8_t* out);  // g.second is needed (it may be g.group)
// GroupDot of `count` (1 or 2) decoded pairs one after the other at `pairs` (y's 16 count
// columns) against 1..kDecodedRows activation rows whose quants are stored unsigned
// (QuantizeUnsigned).
constexpr int kDecodedRows = 6;
// QuantizeActivations's blocks, each quant stored as q + 128 (unsigned; its other fields
// as QuantizeActivations gives them).
void QuantizeUnsigned(const float* x, int64_t n, ActBlock* out);
void DecodedDot(DType type, const uint8_t* pairs, int count, int64_t blocks, const ActBlock* const* x, int rows,
                float* y, int64_t y_stride);
}  // namespace avx512_vnni

}  // namespace packed_internal
}  // namespace ps
