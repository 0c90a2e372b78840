// Block-quantised weight formats (bit-compatible with GGUF/ggml) and the kernels
// that read them: dequantisation to F32 and dot products against activations
// quantised to Q8 blocks. Reference (scalar) versions are always available; the
// dispatching entry points pick AVX2 code when the CPU has it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"

namespace ps {

constexpr int kQK = 32;     // elements per Q4_0 / Q4_1 / Q8_0 block and per activation block
constexpr int kQK_K = 256;  // elements per K-quant super-block

struct BlockQ4_0 {
  uint16_t d;           // fp16 scale
  uint8_t qs[kQK / 2];  // element j in low nibble of qs[j], element j+16 in the high nibble
};
struct BlockQ4_1 {
  uint16_t d, m;  // fp16 scale and minimum: x = q * d + m
  uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];        // bit j: fifth bit of element j
  uint8_t qs[kQK / 2];  // low four bits, packed as in Q4_0; element = q - 16
};
struct BlockQ5_1 {
  uint16_t d, m;  // x = q * d + m
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];  // per 16 elements: 4-bit scale (low) and 4-bit min (high)
  uint8_t qs[kQK_K / 4];       // 2-bit quants: four 32-element groups per 32 bytes, by shifts 0, 2, 4, 6
  uint16_t d, dmin;
};
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];  // third bit (set: +0, clear: -4)
  uint8_t qs[kQK_K / 4];     // low 2 bits, laid out as Q2_K's
  uint8_t scales[12];        // 16 six-bit scales, offset by 32
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d, dmin;       // super-block scales for the 6-bit sub-block scales / mins
  uint8_t scales[12];     // 8 (scale, min) pairs, 6 bits each
  uint8_t qs[kQK_K / 2];  // 4-bit quants, 64 elements per 32 bytes (low nibbles first)
};
struct BlockQ5_K {
  uint16_t d, dmin;       // as Q4_K
  uint8_t scales[12];     // as Q4_K
  uint8_t qh[kQK_K / 8];  // bit j of qh[l]: fifth bit of element l of sub-block j
  uint8_t qs[kQK_K / 2];  // low four bits, as Q4_K
};
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];  // low 4 bits
  uint8_t qh[kQK_K / 4];  // high 2 bits
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24 && sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110);

// 6-bit scale and min of sub-block j (0..7) of a Q4_K super-block.
inline void Q4KScaleMin(int j, const uint8_t* scales, int* d, int* m) {
  if (j < 4) {
    *d = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *d = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4);
    *m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

// The 16 six-bit scales of a Q3_K super-block, offset removed (-32..31).
inline void Q3KScales(const uint8_t* packed, int8_t* out) {
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? packed[j] & 0xF : packed[j - 8] >> 4;
    const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = static_cast<int8_t>((low | (high << 4)) - 32);
  }
}

// Activation block for the int8 dot products: 32 int8 values with their scale, plus
// d * sum(qs) for formats with a minimum/offset term. d and s hold fp16-representable
// values, as llama.cpp's Q8_0/Q8_1 blocks do, so results match its numerics.
struct BlockQ8 {
  float d;
  float s;  // d * sum(qs)
  int8_t qs[kQK];
};

// Quantises n floats (n % 32 == 0) to n / 32 activation blocks.
void QuantizeRowQ8(const float* x, BlockQ8* out, int64_t n);

// Quantises n floats (n % 32 == 0) to n / 32 GGUF Q8_0 blocks (BlockQ8_0: an fp16
// scale amax / 127, then the values rounded to int8), as llama.cpp's
// quantize_row_q8_0 does: the Q8_0 KV cache's format.
void QuantizeRowQ8_0(const float* x, BlockQ8_0* out, int64_t n);

// Dequantises n elements of a row of `type` to floats.
void DequantizeRow(DType type, const void* row, float* out, int64_t n);

// Dot product of a quantised weight row of n elements with an activation row
// quantised by QuantizeRowQ8. Not for float types.
float DotQ8(DType type, const void* row, const BlockQ8* x, int64_t n);

// Dot product of a quantised weight row with an F32 activation row (no activation
// quantisation: exact up to float rounding). block_sums[i] = sum of x over the i-th
// 32-element block (see BlockSums), used for the formats' offset terms.
float DotF32Act(DType type, const void* row, const float* x, const float* block_sums, int64_t n);
void BlockSums(const float* x, float* sums, int64_t n);

namespace reference {
void DequantizeRow(DType type, const void* row, float* out, int64_t n);
float DotQ8(DType type, const void* row, const BlockQ8* x, int64_t n);
float DotF32Act(DType type, const void* row, const float* x, int64_t n);
}  // namespace reference

namespace avx2 {
bool Available();           // ActiveCpuIsa() >= kAvx2 (kernels/cpu/cpu_isa.h)
bool Supports(DType type);  // types with AVX2 dot products and dequantisation
float DotQ8(DType type, const void* row, const BlockQ8* x, int64_t n);
void QuantizeRowQ8(const float* x, BlockQ8* out, int64_t n);
float DotF32Act(DType type, const void* row, const float* x, const float* block_sums, int64_t n);
void DequantizeRow(DType type, const void* row, float* out, int64_t n);
// out[i * out_step] = DotQ8(type, row, x + i * x_step, n) for i < m, each weight block
// unpacked once for up to four activation rows (batched decode).
void DotQ8Rows(DType type, const void* row, const BlockQ8* x, int64_t x_step, int64_t m, int64_t n, float* out,
               int64_t out_step);
}  // namespace avx2

namespace avx512 {
bool Available();           // ActiveCpuIsa() >= kAvx512
bool Supports(DType type);  // types with an AVX-512 DotF32Act and DequantizeRow
float DotF32Act(DType type, const void* row, const float* x, const float* block_sums, int64_t n);
void DequantizeRow(DType type, const void* row, float* out, int64_t n);
}  // namespace avx512

}  // namespace ps
