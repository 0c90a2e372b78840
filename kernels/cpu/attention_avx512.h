// Attention's inner loops over a BF16 cache on AVX-512 (kernels/cpu/attention.cc).
// Prefill's query-tile products run on AVX-512 BF16 dot products (vdpbf16ps: two BF16
// products summed into each F32 lane), key-major: a tile's scores are held transposed,
// S^T[j][i] for key j and query row i, 16 rows to a vector, so that every row's softmax
// state (maximum, sum, output rescaling) is a lane and the keys are read from the paged
// cache in place (a key's pair of values broadcast against 16 query rows). Queries and
// the softmax weights P are rounded to BF16, as the keys and values are (as on a GPU's
// tensor cores, and as the CUDA backend, vLLM and llama.cpp do); sums are F32. Decode's
// kernels (DecodeScores, DecodeValues, at the end) round the same two. Call only at
// CpuIsa::kAvx512Bf16 and with head sizes a multiple of kHeadAlign.
#pragma once

#include <cstdint>

namespace ps::avx512_bf16 {

constexpr int kHeadAlign = 32;        // head sizes these kernels take: multiples of this
constexpr int64_t kKeyAlign = 32;     // packed value tiles hold a multiple of this many keys (zeros after the last)
constexpr int64_t kRowAlign = 16;     // query rows of a tile: a multiple of this (one vector of a key's scores)
constexpr int64_t kMaxTileRows = 64;  // query rows of a tile, at most

// Keys rounded up to kKeyAlign; query rows rounded up to kRowAlign.
constexpr int64_t PaddedKeys(int64_t nt) { return (nt + kKeyAlign - 1) / kKeyAlign * kKeyAlign; }
constexpr int64_t PaddedRows(int64_t nq) { return (nq + kRowAlign - 1) / kRowAlign * kRowAlign; }

// nq query rows (hd F32 values each, q_stride apart) as Scores reads them: 32-bit lane
// p * nqp + i of qt holds row i's values 2p and 2p + 1 rounded to BF16; rows nq <= i <
// nqp = PaddedRows(nq) zero. hd * nqp values.
void PackQueries(const float* q, int64_t q_stride, int64_t nq, int hd, uint16_t* qt);

// out[i * out_stride + d] = ot[d * nqp + i] for rows i < nq <= nqp (a multiple of
// kRowAlign) and d < hd: AddValues's transposed outputs back to rows.
void UnpackOutputs(const float* ot, int64_t nqp, int64_t nq, int hd, float* out, int64_t out_stride);

// Packs nt value rows (rows[r]: hd BF16 values) into `values` (PaddedKeys(nt) * hd values),
// keys paired: lane d of pair u holds value d of keys 2u and 2u + 1 (zeros past the last).
void PackValues(const uint16_t* const* rows, int64_t nt, int hd, uint16_t* values);

// s[j * nqp + i] = scale * (q_i · k_j) for keys j < nt (keys[j]: hd BF16 values, read in
// place) and rows i < nqp of PackQueries's qt; row_max[i] = the largest of row i's.
void Scores(const uint16_t* qt, int64_t nqp, const uint16_t* const* keys, int64_t nt, int hd, float scale, float* s,
            float* row_max);

// Hides key j (position key_pos[j]) from row i (position q_pos[i], i < nqp) where the
// window does not show it (WindowSees's part, sinks, recent): s[j * nqp + i] = -inf;
// row_max[i] = the largest of what row i still sees (-inf: nothing).
void Mask(int part, int32_t sinks, int32_t recent, const int32_t* key_pos, int64_t nt, const int32_t* q_pos,
          int64_t nqp, float* s, float* row_max);

// One key tile's step of the online softmax for rows i < nqp, in base 2 (scores, m and
// row_max in units of log2 e: Scores with the scale times log2 e): m_new = max(m[i],
// row_max[i]); the weights 2^(s[j * nqp + i] - m_new) (to 1e-4 relative) rounded to BF16
// into p, keys paired (p[u * nqp + i]: keys 2u, 2u + 1 of row i; zeros for keys past nt,
// up to PaddedKeys(nt)); l[i] = l[i] * corr[i] + the weights' sum before rounding, with
// corr[i] = 2^(m[i] - m_new) (the factor the row's output so far takes); m[i] = m_new.
// Rows that see nothing yet (m_new = -inf) keep l = 0 with weights 0.
// finite: no score is -inf (nothing masked), which takes a shorter exp.
void Softmax(const float* s, int64_t nqp, int64_t nt, const float* row_max, bool finite, float* m, float* l,
             float* corr, uint16_t* p);

// ot[d * nqp + i] = ot[d * nqp + i] * corr[i] + sum_j p_i[j] v_j[d] for rows i < nqp and
// d < hd: Softmax's weights against a packed value tile of nt keys.
void AddValues(const uint16_t* p, int64_t nqp, const uint16_t* values, int64_t nt, int hd, const float* corr,
               float* ot);

// Decode (one query row) over BF16 rows read in place, all query heads of a GQA group at
// once, on BF16 dot products: scores take 16 rows at a time transposed in registers (a
// row to a lane) against each head's query pairs broadcast, so no lane sums are reduced;
// outputs take the rows in pairs, a pair's two rows interleaved (a column's two values to
// a lane) against each head's two weights broadcast.
constexpr int kMaxDecodeHeads = 8;       // query heads per KV head these kernels take
constexpr int kMaxDecodeHeadSize = 256;  // and values a head

// `n` rows of one head, `stride` elements apart from `rows` on.
template <class T>
struct Run {
  const T* rows = nullptr;
  int64_t n = 0;
};
using RowRun = Run<uint16_t>;  // BF16 rows

// out[h * out_step + j] = scale * (q_h · k_j) for heads h < n_heads (q_h = q + h * hd,
// rounded to BF16) and the runs' rows j, numbered across the runs in order. Meanwhile the
// rows `ahead` on are fetched into L2 (past the last run, `then`'s).
void DecodeScores(const float* q, int n_heads, const RowRun* runs, int64_t n_runs, const RowRun* then, int64_t n_then,
                  int64_t stride, int hd, float scale, float* out, int64_t out_step, int64_t ahead);

// out_h[0, hd) += sum_j p[h * p_step + j] v_j for heads h < n_heads (out_h = out + h * hd;
// the weights rounded to BF16) over the runs' rows j, as DecodeScores numbers them and
// fetches ahead.
void DecodeValues(const float* p, int64_t p_step, int n_heads, const RowRun* runs, int64_t n_runs, int64_t stride,
                  int hd, float* out, int64_t ahead);

// x[j] = exp(x[j] - m) for j < n (m at least every x[j]; -inf gives 0); returns their sum.
float ExpShifted(float* x, int64_t n, float m);

}  // namespace ps::avx512_bf16
