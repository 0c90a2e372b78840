// Causal attention of one sequence's query rows over an arbitrary set of cached
// key/value rows, masked by position (key position <= query position).
#pragma once

#include <cstdint>

#include "base/thread_pool.h"

namespace ps {

struct AttentionShape {
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 1.0f;  // usually 1/sqrt(head_dim)
};

// Cached keys and values of one sequence at one layer: n rows of n_kv_heads*head_dim
// floats. Rows live in blocks of `block_rows` rows (paged KV); row j's key is at
// k_blocks[j / block_rows] + (j % block_rows) * stride, its value likewise in
// v_blocks. A contiguous cache is one block. positions[j] is row j's token position.
struct KvRows {
  const float* const* k_blocks = nullptr;
  const float* const* v_blocks = nullptr;
  int64_t block_rows = 0;
  const int32_t* positions = nullptr;
  int64_t n = 0;
  int64_t stride = 0;
  bool positions_ascending = false;  // lets the kernel skip keys past the last query

  const float* k(int64_t j) const { return k_blocks[j / block_rows] + (j % block_rows) * stride; }
  const float* v(int64_t j) const { return v_blocks[j / block_rows] + (j % block_rows) * stride; }
};

struct AttentionArgs {
  const float* q = nullptr;        // [n_q, n_heads*head_dim], rows `q_stride` floats apart
  const int32_t* q_pos = nullptr;  // [n_q]
  int64_t n_q = 0;
  int64_t q_stride = 0;
  float* out = nullptr;            // [n_q, n_heads*head_dim], rows `out_stride` floats apart
  int64_t out_stride = 0;
  // Optional [kv.n]: receives the attention probabilities of the last query row,
  // averaged over heads (what LazyLLM-style pruning scores tokens by).
  float* last_query_probs = nullptr;
};

void Attention(const AttentionShape& shape, const KvRows& kv, const AttentionArgs& args, ThreadPool& pool);

}  // namespace ps
