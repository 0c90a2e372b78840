// Prefill attention's tiles over a Q8_0 cache on AVX-512 VNNI (kernels/cpu/attention.cc):
// the scores on int8 dot products (vpdpbusd), as llama.cpp multiplies a Q8_0 K cache:
// each query row quantised to Q8_0's blocks too (32 values to an F32 scale, their largest /
// 127), each key's Q8_0 blocks (an fp16 scale and 32 int8 values) read in place. The
// tiles are avx512_bf16's key-major ones (kernels/cpu/attention_avx512.h): the scores
// transposed, 16 query rows to a vector, a key's 4 quants broadcast against them; the
// values dequantised to BF16 for avx512_bf16's softmax and value products. And decode's
// kernels over Q8_0 rows read in place (DecodeScores, DecodeValues, at the end). Call only at
// CpuIsa::kAvx512Bf16 (which has VNNI) with head sizes a multiple of kQ8Values.
#pragma once

#include <cstdint>

#include "kernels/cpu/attention_avx512.h"

namespace ps::avx512_q8 {

constexpr int kQ8Values = 32;      // values of a Q8_0 block
constexpr int kQ8BlockBytes = 34;  // an fp16 scale, then 32 int8 quants

// nq query rows (hd F32 values each, q_stride apart) as Scores reads them: the values of
// row i's block b (32 values) over d_ib = (their largest magnitude) / 127, rounded to int8
// and stored + 128 (unsigned): 32-bit lane t * nqp + i of qt holds row i's quants 4t..4t +
// 3; rows nq <= i < nqp = PaddedRows(nq) quants of 0. qscale[b * nqp + i] = d_ib * mult (0
// for the padding rows). hd * nqp bytes, hd / 32 * nqp scales.
void PackQueries(const float* q, int64_t q_stride, int64_t nq, int hd, float mult, uint8_t* qt, float* qscale);

// Per key j < nt (keys[j]: a head's hd / 32 Q8_0 blocks) and block b: offsets[j * nb + b]
// = -128 times the sum of the block's quants (what PackQueries's + 128 adds to a dot
// product), scales[j * nb + b] = the block's scale; nb = hd / 32.
void KeyTerms(const uint8_t* const* keys, int64_t nt, int hd, int32_t* offsets, float* scales);

// s[j * nqp + i] = sum over blocks b of qscale[b, i] * scales[j, b] * (q_i · k_j over b's
// quants), for keys j < nt read in place and rows i < nqp of PackQueries's qt; row_max[i]
// = the largest of row i's. The integer dot products are exact.
void Scores(const uint8_t* qt, const float* qscale, int64_t nqp, const uint8_t* const* keys, const int32_t* offsets,
            const float* scales, int64_t nt, int hd, float* s, float* row_max);

// nt value rows (rows[j]: a head's hd / 32 Q8_0 blocks) dequantised and rounded to BF16,
// row j's hd values at out + j * hd.
void DequantizeRows(const uint8_t* const* rows, int64_t nt, int hd, uint16_t* out);

// Decode (one query row) over Q8_0 rows read in place, all query heads of a GQA group at
// once (avx512_bf16's decode kernels' shapes: up to kMaxDecodeHeads heads of up to
// kMaxDecodeHeadSize values).
using ByteRun = avx512_bf16::Run<uint8_t>;  // rows `stride` bytes apart

// out[h * out_step + j] = scale * (q_h · k_j) for heads h < n_heads (q_h = q + h * hd,
// quantised block by block as PackQueries does) and the runs' rows j, numbered across the runs in
// order: the rows' quants transposed 16 at a time in registers (a row to a lane) against
// each head's 4 quants broadcast, every block's integer sums scaled by the rows' scales.
// Meanwhile the rows `ahead` on are fetched into L2 (past the last run, `then`'s).
void DecodeScores(const float* q, int n_heads, const ByteRun* runs, int64_t n_runs, const ByteRun* then, int64_t n_then,
                  int64_t stride, int hd, float scale, float* out, int64_t out_step, int64_t ahead);

// out_h[0, hd) += sum_j p[h * p_step + j] v_j for heads h < n_heads (out_h = out + h * hd)
// over the runs' rows j, as DecodeScores numbers them and fetches ahead, on BF16 dot
// products: each weight times the row's block scale rounded to BF16, against the quants
// (exact in BF16).
void DecodeValues(const float* p, int64_t p_step, int n_heads, const ByteRun* runs, int64_t n_runs, int64_t stride,
                  int hd, float* out, int64_t ahead);

}  // namespace ps::avx512_q8
