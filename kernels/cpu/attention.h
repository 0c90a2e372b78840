// Causal attention of one sequence's query rows over an arbitrary set of cached
// key/value rows, masked by position (key position <= query position).
#pragma once

#include <cstdint>

#include "base/thread_pool.h"
#include "kernels/dtype.h"

namespace ps {

struct AttentionShape {
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 1.0f;  // usually 1/sqrt(head_dim)
};

// Cached keys and values of one sequence at one layer: n rows of n_kv_heads*head_dim
// elements of `dtype` (F32, F16 or BF16). Rows live in blocks of `block_rows` rows
// (paged KV): row j's key starts `(j % block_rows) * stride` elements into
// k_blocks[j / block_rows], its value likewise in v_blocks. A contiguous cache is
// one block. positions[j] is row j's token position.
struct KvRows {
  const void* const* k_blocks = nullptr;
  const void* const* v_blocks = nullptr;
  int64_t block_rows = 0;
  const int32_t* positions = nullptr;
  int64_t n = 0;
  int64_t stride = 0;
  bool positions_ascending = false;  // lets the kernel skip keys past the last query
  DType dtype = DType::kF32;

  size_t elem_bytes() const { return dtype == DType::kF32 ? 4 : 2; }
  // Element `col` of row j's key / value.
  const void* k(int64_t j, int64_t col) const { return Elem(k_blocks, j, col); }
  const void* v(int64_t j, int64_t col) const { return Elem(v_blocks, j, col); }

 private:
  const void* Elem(const void* const* blocks, int64_t j, int64_t col) const {
    return static_cast<const uint8_t*>(blocks[j / block_rows]) + ((j % block_rows) * stride + col) * elem_bytes();
  }
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
  // Optional [kv.n]: the last query row's scaled pre-softmax scores q·k summed over
  // heads (each query head against its GQA key head), -inf for masked keys.
  float* last_query_logits = nullptr;
};

void Attention(const AttentionShape& shape, const KvRows& kv, const AttentionArgs& args, ThreadPool& pool);

}  // namespace ps
