// Prefill attention's tiles over a Q8_0 cache on AVX-512 VNNI (kernels/cpu/attention.cc):
// the scores on int8 dot products (vpdpbusd), as llama.cpp multiplies a Q8_0 K cache:
// each query row quantised to Q8_0's blocks too (32 values to an F32 scale, their largest /
// 127), each key's Q8_0 blocks (an fp16 scale and 32 int8 values) read in place. The
// tiles are avx512_bf16's key-major ones (kernels/cpu/attention_avx512.h): the scores
// transposed, 16 query rows to a vector, a key's 4 quants broadcast against them; the
// values' products on int8 dot products as well (PackValues, below). And decode's
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

// The value products of a tile run on int8 dot products too: the softmax weights as
// unsigned bytes (vpdpbusd's unsigned operand) against the values' quants broadcast 4 keys
// at a time (its signed one). A value's block scale goes into its key's weight: weight
// byte = round(2^(s - row max in this tile) * 255 * (the key's block scale) / (the tile's
// largest scale of that block)), each row's bytes scaled back by 2^(row max - m) times that
// largest scale / 255.
constexpr int64_t kKeyQuad = 4;  // keys an int8 value lane holds

// Packs nt value rows (rows[j]: a head's hd / 32 Q8_0 blocks) into `values`
// (PaddedKeys(nt) * hd bytes): values[4 * (g * hd + d) + k] = quant d of key 4g + k (zeros
// past the last key). top[b] = the largest scale of block b among the rows; gains[j * nb + b]
// = 255 * row j's block b scale / top[b] (0 where top[b] is 0 and past nt, up to
// PaddedKeys(nt) rows), nb = hd / 32.
void PackValues(const uint8_t* const* rows, int64_t nt, int hd, int8_t* values, float* gains, float* top);

// One key tile's step of the online softmax for rows i < nqp in base 2, as
// avx512_bf16::Softmax (m, l, corr the same), with the weights as bytes for AddValues:
// f = 2^(s[j * nqp + i] - row_max[i]) (to 1e-4 relative); w[4 * ((b * G + g) * nqp + i) + k]
// = round(f * gains[j * nb + b]) for key j = 4g + k (0 past nt), G = PaddedKeys(nt) / 4;
// wscale[b * nqp + i] = 2^(row_max[i] - m_new) * top[b] / 255 (0 where the row sees nothing
// in the tile); l[i] = l[i] * corr[i] + 2^(row_max[i] - m_new) * the sum of f.
void Softmax(const float* s, int64_t nqp, int64_t nt, int hd, const float* row_max, bool finite, const float* gains,
             const float* top, float* m, float* l, float* corr, float* wscale, uint8_t* w);

// ot[d * nqp + i] = ot[d * nqp + i] * corr[i] + wscale[b * nqp + i] * sum_j w_ijb * quant_j[d]
// for rows i < nqp and d < hd, b = d / 32, w_ijb Softmax's byte of row i, key j and block b:
// Softmax's weights against PackValues's tile.
void AddValues(const uint8_t* w, int64_t nqp, const int8_t* values, int64_t nt, int hd, const float* corr,
               const float* wscale, float* ot);

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
