// The forward pass's KvStore over paged blocks: slots come from a KvCacheManager,
// K and V bytes live in the device-tier BlockPool. A block holds one layer's K rows
// then its V rows: [block_tokens, kv_dim] F32 each. Engine thread only.
#pragma once

#include <vector>

#include "memory/kv_cache_manager.h"
#include "memory/kv_store.h"

namespace ps {

class PagedKvStore final : public KvStore {
 public:
  // `device` must be the pool the manager allocates device blocks from, with
  // blocks of BlockBytes(block_tokens, kv_dim).
  PagedKvStore(KvCacheManager& manager, BlockPool& device, int kv_dim);
  static size_t BlockBytes(int block_tokens, int kv_dim) {
    return 2 * static_cast<size_t>(block_tokens) * kv_dim * sizeof(float);
  }

  // ResourceExhausted when the device tier has no room (nothing is written then).
  absl::Status Append(int64_t seq_id, int layer, std::span<const int32_t> positions, const float* k,
                      const float* v) override;
  // All of the sequence's blocks for this layer must be in the device tier.
  KvRows View(int64_t seq_id, int layer) override;
  void Release(int64_t seq_id) override { manager_.Free(seq_id); }

 private:
  float* K(const BlockLoc& b) { return reinterpret_cast<float*>(device_.data(b.id)); }

  KvCacheManager& manager_;
  BlockPool& device_;
  int kv_dim_;
  int block_tokens_;
  std::vector<const float*> k_blocks_, v_blocks_;  // the last View's block table
};

}  // namespace ps
