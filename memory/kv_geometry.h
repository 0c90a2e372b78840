// KV accounting's units: how many bytes a block takes and how many blocks a
// number of tokens or bytes makes, for one model and cache configuration. The one
// place where bytes become blocks (server flags, the engine's tiers, the
// scheduler's admission messages).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"

namespace ps {

struct KvGeometry {
  int n_layers = 0;
  int block_tokens = 16;  // tokens per block; a block holds one layer's K rows, then its V rows
  int kv_dim = 0;         // K (or V) values per token and layer
  DType dtype = DType::kF32;

  size_t row_bytes() const { return RowBytes(dtype, kv_dim); }
  size_t block_bytes() const { return 2 * static_cast<size_t>(block_tokens) * row_bytes(); }
  // Whole blocks in `bytes`.
  int64_t BlocksInBytes(int64_t bytes) const { return bytes / static_cast<int64_t>(block_bytes()); }
  // Blocks one layer needs for `tokens` tokens, and all layers together.
  int64_t BlocksPerLayer(int64_t tokens) const { return (tokens + block_tokens - 1) / block_tokens; }
  int64_t BlocksForTokens(int64_t tokens) const { return n_layers * BlocksPerLayer(tokens); }
};

}  // namespace ps
