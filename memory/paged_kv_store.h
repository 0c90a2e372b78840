// The forward pass's KvStore over paged blocks: slots come from a KvCacheManager,
// K and V bytes live in the device-tier BlockPool. A block holds one layer's K rows
// then its V rows: [block_tokens, kv_dim] each, in F32, F16 or BF16 (rounded on
// append; attention accumulates in F32). Engine thread only.
#pragma once

#include <vector>

#include "memory/kv_cache_manager.h"
#include "memory/kv_store.h"

namespace ps {

class PagedKvStore final : public KvStore {
 public:
  // `device` must be the pool the manager allocates device blocks from, with
  // blocks of BlockBytes(block_tokens, kv_dim, dtype).
  PagedKvStore(KvCacheManager& manager, BlockPool& device, int kv_dim, DType dtype = DType::kF32);
  static size_t BlockBytes(int block_tokens, int kv_dim, DType dtype = DType::kF32) {
    return 2 * static_cast<size_t>(block_tokens) * RowBytes(dtype, kv_dim);
  }

  // ResourceExhausted when the device tier has no room (nothing is written then).
  absl::Status Append(int64_t seq_id, int layer, std::span<const int32_t> positions, const float* k,
                      const float* v) override;
  // All of the sequence's blocks for this layer must be in the device tier.
  KvRows View(int64_t seq_id, int layer) override;
  void Release(int64_t seq_id) override { manager_.Free(seq_id); }

 private:
  // Bytes of one row (token) of K or V.
  size_t row_bytes() const { return RowBytes(dtype_, kv_dim_); }
  void Store(const float* src, uint8_t* dst) const;

  KvCacheManager& manager_;
  BlockPool& device_;
  int kv_dim_;
  int block_tokens_;
  DType dtype_;
  std::vector<const void*> k_blocks_, v_blocks_;  // the last View's block table (one for all Views)
};

}  // namespace ps
