// Attention on the GPU over paged KV (device pointers throughout), with everything
// Backend::Attention takes: GQA, KV selections (segments of query rows over row
// ranges, per KV head or for all), position windows, per-row log-sum-exps and
// the last query row's statistics. Two kernels: a tiled one on the tensor cores (F16
// or BF16 KV, head_dim a multiple of 16 up to 128: a thread block per KV head and
// tile of query rows, K and V tiles shared by the GQA group, Q and P rounded to the
// KV's type) and, for everything else, one thread block per (query row, head) in F32
// ($PS_CUDA_ATTENTION=naive sends every call there). Several sequences' calls run as
// one launch; calls with few query tiles over many keys (decode) split the keys across
// thread blocks and merge. C++17 (nvcc).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/dtype.h"

namespace ps::cuda {

// A query segment: rows [q_begin, q_end) attend to ranges [range_begin, range_end)
// of AttentionDeviceArgs::ranges (row ranges [begin, end) of the KV), for the query
// heads of KV head kv_head (-1: every head).
struct AttentionSegment {
  int32_t q_begin = 0, q_end = 0, kv_head = -1, range_begin = 0, range_end = 0;
};

struct AttentionDeviceArgs {
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
  // Queries and output ([n_q, n_heads * head_dim], strided), query positions [n_q].
  const float* q = nullptr;
  const int32_t* q_pos = nullptr;
  int64_t n_q = 0, q_stride = 0;
  float* out = nullptr;
  int64_t out_stride = 0;
  // KV rows: row j in blocks[j / block_rows] at (j % block_rows) * stride elements;
  // with head_blocks > 0 each KV head's in blocks of its own, head h's from
  // blocks[h * head_blocks] on (KvRows, kernels/types.h).
  const void* const* k_blocks = nullptr;
  const void* const* v_blocks = nullptr;
  int64_t block_rows = 0, stride = 0, n = 0, head_blocks = 0;
  const int32_t* positions = nullptr;
  DType dtype = DType::kF32;
  bool rows_aligned16 = false;  // every block pointer 16-byte aligned (the tiled kernel's loads)
  // At least one segment (a selection of everything: {0, n_q, -1} over {0, n}).
  const AttentionSegment* segments = nullptr;
  int n_segments = 0;
  const int32_t* ranges = nullptr;  // [2 * ranges]: begin, end
  int window_part = 0;              // WindowSees (kernels/shared_math.h)
  int32_t sinks = 0, recent = 0;
  float* lse = nullptr;  // optional [n_q, n_heads], lse_stride apart
  int64_t lse_stride = 0;
  // Optional [n_heads, n], filled with -inf by the caller: the last query row's scaled
  // scores (-inf where masked); [n_heads, 2]: its final maximum and sum.
  float* last_logits = nullptr;
  float* last_norm = nullptr;
  // The tiled kernel's split of the keys (AttentionSplits): each of `splits` thread
  // blocks per tile takes every splits-th key tile, writes its partial softmax into
  // split_out ([splits, n_q, n_heads, head_dim + 2] floats) and a second kernel merges.
  int splits = 1;
  float* split_out = nullptr;
};

// Whether the tiled kernel takes a call (else the F32 one does).
bool TiledApplies(const AttentionDeviceArgs& a);
// Thread blocks of a call on the tiled kernel before any split of its keys (0 when the
// tiled kernel does not take it).
int64_t TiledBlocks(const AttentionDeviceArgs& a);
// How many ways to split the keys of a call that runs with others of `batch_blocks`
// thread blocks in all (TiledBlocks, this call's included) so that together they fill
// `multiprocessors` (few query tiles over many keys: decode); 1 when not split (or not
// on the tiled kernel).
int AttentionSplits(const AttentionDeviceArgs& a, int64_t batch_blocks, int multiprocessors);

// Runs n calls' attentions, a launch per kernel for all (the decode batch's sequences):
// `calls` on the host, the same n structs at `device_calls` in device memory (what the
// kernels read). The calls share their shape and KV type, and those the tiled kernel
// takes come first.
absl::Status AttentionDevice(const AttentionDeviceArgs* calls, const AttentionDeviceArgs* device_calls, int n);

// Fills n floats with v.
absl::Status FillDevice(float* x, int64_t n, float v);

// The last query row's statistics from AttentionDevice's last_logits / last_norm:
// probs[j] = mean over heads of exp(logit - m) / l (0 where masked; null: skipped),
// logits[j] = sum over heads of the logits (null: skipped).
absl::Status LastQueryStatsDevice(const float* last_logits, const float* last_norm, int n_heads, int64_t n,
                                  float* probs, float* logits);

}  // namespace ps::cuda
