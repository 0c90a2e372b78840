// KV accounting's units: how many bytes a block takes and how many blocks a
// number of tokens or bytes makes, for one model and cache configuration. The one
// place where bytes become blocks (server flags, the engine's tiers, the
// scheduler's admission messages).
//
// A page is `block_tokens` slots of one layer. It is backed by 2 * n_kv_heads
// blocks: the K rows of each KV head, then the V rows of each ([block_tokens,
// head_dim] each), so that keys one head no longer reads can be freed on their own
// (keys whose scores another layer computes: KvCache::DropKeys).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"

namespace ps {

struct KvGeometry {
  int n_layers = 0;
  int block_tokens = 16;  // tokens per page
  int kv_dim = 0;         // K (or V) values per token and layer, all KV heads
  int n_kv_heads = 1;     // kv_dim / n_kv_heads values per head
  DType dtype = DType::kF32;

  // Positive sizes, whole heads, and heads of whole blocks of a block type (Q8_0: 32
  // values); the reason otherwise.
  absl::Status Validate() const {
    if (n_layers <= 0 || block_tokens <= 0 || kv_dim <= 0 || n_kv_heads <= 0 || kv_dim % n_kv_heads != 0) {
      return absl::InvalidArgumentError("bad KV geometry");
    }
    if (const int64_t block = Traits(dtype).block_elems; head_dim() % block != 0) {
      return absl::InvalidArgumentError("a " + std::string(DTypeName(dtype)) +
                                        " KV cache needs heads of a multiple of " + std::to_string(block) +
                                        " values, not " + std::to_string(head_dim()));
    }
    return absl::OkStatus();
  }
  int head_dim() const { return kv_dim / n_kv_heads; }
  int blocks_per_page() const { return 2 * n_kv_heads; }
  // One KV head's K (or V) row.
  size_t head_row_bytes() const { return RowBytes(dtype, head_dim()); }
  size_t block_bytes() const { return static_cast<size_t>(block_tokens) * head_row_bytes(); }
  // Whole blocks in `bytes`.
  int64_t BlocksInBytes(int64_t bytes) const { return bytes / static_cast<int64_t>(block_bytes()); }
  // Blocks one layer needs for `tokens` tokens, and all layers together.
  int64_t BlocksPerLayer(int64_t tokens) const {
    return (tokens + block_tokens - 1) / block_tokens * blocks_per_page();
  }
  int64_t BlocksForTokens(int64_t tokens) const { return n_layers * BlocksPerLayer(tokens); }
};

// The KV element type unless told otherwise (server, engine, offline generation,
// benchmarks): BF16 halves F32's bytes per token, decodes faster at depth on the CPU
// (bench/attention_bench) and keeps F32's range (F16 overflows past 65504).
inline constexpr DType kDefaultKvDType = DType::kBF16;
inline constexpr const char* kDefaultKvDTypeName = "bf16";

// The KV element type a `--kv-dtype` value names: "f32", "f16", "bf16" or "q8_0"
// (GGUF's Q8_0 blocks: 34 bytes per 32 values, 8.5 bits a value; CPU only).
inline absl::StatusOr<DType> ParseKvDType(const std::string& name) {
  if (name == "f32") return DType::kF32;
  if (name == "f16") return DType::kF16;
  if (name == "bf16") return DType::kBF16;
  if (name == "q8_0") return DType::kQ8_0;
  return absl::InvalidArgumentError("--kv-dtype must be f32, f16, bf16 or q8_0, not '" + name + "'");
}

}  // namespace ps
