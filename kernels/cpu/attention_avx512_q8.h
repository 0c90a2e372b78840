// Prefill attention's tiles over a Q8_0 cache on AVX-512 VNNI (kernels/cpu/attention.cc):
// the scores on int8 dot products (vpdpbusd), as llama.cpp multiplies a quantised K
// cache: each query row quantised to int8 with one scale per head (its largest value /
// 127), each key's Q8_0 blocks (an fp16 scale and 32 int8 values) read in place. The
// tiles are avx512_bf16's key-major ones (kernels/cpu/attention_avx512.h): the scores
// transposed, 16 query rows to a vector, a key's 4 quants broadcast against them; the
// values dequantised to BF16 for avx512_bf16's softmax and value products. Call only at
// CpuIsa::kAvx512Bf16 (which has VNNI) with head sizes a multiple of kQ8Values.
#pragma once

#include <cstdint>

namespace ps::avx512_q8 {

constexpr int kQ8Values = 32;      // values of a Q8_0 block
constexpr int kQ8BlockBytes = 34;  // an fp16 scale, then 32 int8 quants

// nq query rows (hd F32 values each, q_stride apart) as Scores reads them: row i's values
// over d_i = (their largest magnitude) / 127, rounded to int8 and stored + 128 (unsigned):
// 32-bit lane t * nqp + i of qt holds row i's quants 4t..4t + 3; rows nq <= i < nqp =
// PaddedRows(nq) quants of 0. qscale[i] = d_i * mult (0 for the padding rows). hd * nqp
// bytes, nqp scales.
void PackQueries(const float* q, int64_t q_stride, int64_t nq, int hd, float mult, uint8_t* qt, float* qscale);

// Per key j < nt (keys[j]: a head's hd / 32 Q8_0 blocks) and block b: offsets[j * nb + b]
// = -128 times the sum of the block's quants (what PackQueries's + 128 adds to a dot
// product), scales[j * nb + b] = the block's scale; nb = hd / 32.
void KeyTerms(const uint8_t* const* keys, int64_t nt, int hd, int32_t* offsets, float* scales);

// s[j * nqp + i] = qscale[i] * sum over blocks b of scales[j, b] * (q_i · k_j over b's
// quants), for keys j < nt read in place and rows i < nqp of PackQueries's qt; row_max[i]
// = the largest of row i's. The integer dot products are exact.
void Scores(const uint8_t* qt, const float* qscale, int64_t nqp, const uint8_t* const* keys, const int32_t* offsets,
            const float* scales, int64_t nt, int hd, float* s, float* row_max);

// nt value rows (rows[j]: a head's hd / 32 Q8_0 blocks) dequantised and rounded to BF16,
// row j's hd values at out + j * hd.
void DequantizeRows(const uint8_t* const* rows, int64_t nt, int hd, uint16_t* out);

}  // namespace ps::avx512_q8
