// Attention's inner loops over a BF16 cache on AVX-512 (kernels/cpu/attention.cc).
// Prefill's query-tile products run on AVX-512 BF16 dot products (vdpbf16ps: two BF16
// products summed into each F32 lane): S = scale Q Kᵀ and O += P V for a tile of query
// rows against a tile of BF16 keys and values, read from the paged cache and packed once
// per tile for every query row of every head of their GQA group. A query is split into two
// BF16 parts (its rounding and the rounding of the remainder: the scores are as exact as
// F32's, the keys being BF16 already); the softmax weights P are rounded to BF16 (as on a
// GPU's tensor cores); sums are F32. Decode's (DecodeScores, DecodeValues, at the end) are
// F32 throughout. Call only at CpuIsa::kAvx512Bf16 and with head sizes a multiple of
// kHeadAlign.
#pragma once

#include <cstdint>

namespace ps::avx512_bf16 {

constexpr int kHeadAlign = 32;     // head sizes these kernels take: multiples of this
constexpr int64_t kKeyAlign = 32;  // packed tiles hold a multiple of this many keys (zeros after the last)

// Keys rounded up to kKeyAlign.
constexpr int64_t PaddedKeys(int64_t nt) { return (nt + kKeyAlign - 1) / kKeyAlign * kKeyAlign; }

// Packs nt key rows (rows[r]: hd BF16 values) into `keys` (PaddedKeys(nt) * hd values).
void PackKeys(const uint16_t* const* rows, int64_t nt, int hd, uint16_t* keys);
// Packs nt value rows (rows[r]: hd BF16 values) into `values` (PaddedKeys(nt) * hd values),
// keys paired: lane d of pair u holds value d of keys 2u and 2u + 1 (zeros past the last).
void PackValues(const uint16_t* const* rows, int64_t nt, int hd, uint16_t* values);

// A query row of hd F32 values as Scores reads it: out[0, hd) = its BF16 rounding, out[hd,
// 2 hd) = the rounding of what that leaves.
void SplitQuery(const float* x, int hd, uint16_t* out);

// s[i * s_stride + j] = scale * (q_i · k_j) for query rows i < nq (q_i: SplitQuery's 2 hd
// values, q_stride apart) and keys j < nt of a packed key tile.
void Scores(const uint16_t* q, int64_t q_stride, int64_t nq, const uint16_t* keys, int64_t nt, int hd, float scale,
            float* s, int64_t s_stride);

// A row's softmax weights: p[j] = exp(s[j] - m) rounded to BF16 for j < nt (0 where s[j] is
// more than 87.3 below m, -inf included), zeros up to PaddedKeys(nt); returns the sum of the
// weights before rounding (the row's log-sum-exp stays F32's).
float ExpToBf16(const float* s, int64_t nt, float m, uint16_t* p);

// o_i[0, hd) += sum_j p_i[j] v_j for rows i < nq (p_i: PaddedKeys(nt) BF16 weights, p_stride
// apart, zero after the nt-th; o_i o_stride apart) over a packed value tile.
void AddWeightedValues(const uint16_t* p, int64_t p_stride, int64_t nq, const uint16_t* values, int64_t nt, int hd,
                       float* o, int64_t o_stride);

// Decode (one query row) over BF16 rows read in place, all query heads of a GQA group at
// once, in F32: a row's 32 values at a time are widened to F32 as two vectors (its even
// values, its odd ones: a shift and a mask, no shuffle), which meet the query's values
// arranged the same way, or accumulate outputs arranged so (put back in order once).
constexpr int kMaxDecodeHeads = 8;  // query heads per KV head these kernels take

// `n` rows of one head, `stride` BF16 values apart from `rows` on.
struct RowRun {
  const uint16_t* rows = nullptr;
  int64_t n = 0;
};

// out[h * out_step + j] = scale * (q_h · k_j) for heads h < n_heads (q_h = q + h * hd) and
// the runs' rows j, numbered across the runs in order. Meanwhile the rows `ahead` runs on
// are fetched into L2 (past the last run, `then`'s).
void DecodeScores(const float* q, int n_heads, const RowRun* runs, int64_t n_runs, const RowRun* then, int64_t n_then,
                  int64_t stride, int hd, float scale, float* out, int64_t out_step, int64_t ahead);

// out_h[0, hd) += sum_j p[h * p_step + j] v_j for heads h < n_heads (out_h = out + h * hd)
// over the runs' rows j, as DecodeScores numbers them and fetches ahead.
void DecodeValues(const float* p, int64_t p_step, int n_heads, const RowRun* runs, int64_t n_runs, int64_t stride,
                  int hd, float* out, int64_t ahead);

}  // namespace ps::avx512_bf16
