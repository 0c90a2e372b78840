#include "memory/paged_kv_store.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace ps {

PagedKvStore::PagedKvStore(KvCacheManager& manager, BlockPool& device, int kv_dim)
    : manager_(manager), device_(device), kv_dim_(kv_dim), block_tokens_(manager.block_tokens()) {
  PS_CHECK(device.tier() == Tier::kDevice && device.block_bytes() == BlockBytes(block_tokens_, kv_dim))
      << "device pool blocks do not match the KV geometry";
}

absl::Status PagedKvStore::Append(int64_t seq_id, int layer, std::span<const int32_t> positions, const float* k,
                                  const float* v) {
  const size_t first = manager_.Table(seq_id, layer).positions.size();
  if (!manager_.Append(seq_id, layer, positions)) {
    return absl::ResourceExhaustedError(absl::StrCat("no free KV blocks in the device tier for sequence ", seq_id,
                                                     " (", positions.size(), " tokens at layer ", layer, ")"));
  }
  const LayerTable& t = manager_.Table(seq_id, layer);
  for (size_t i = 0; i < positions.size(); ++i) {
    const size_t slot = first + i;
    const BlockLoc& b = t.blocks[slot / block_tokens_];
    float* base = K(b);
    const size_t off = slot % block_tokens_;
    std::memcpy(base + off * kv_dim_, k + i * kv_dim_, kv_dim_ * sizeof(float));
    std::memcpy(base + (block_tokens_ + off) * kv_dim_, v + i * kv_dim_, kv_dim_ * sizeof(float));
  }
  return absl::OkStatus();
}

KvRows PagedKvStore::View(int64_t seq_id, int layer) {
  const LayerTable& t = manager_.Table(seq_id, layer);
  k_blocks_.clear();
  v_blocks_.clear();
  for (const BlockLoc& b : t.blocks) {
    PS_CHECK(b.tier == Tier::kDevice) << "attention over a block of sequence " << seq_id << " in the host tier";
    k_blocks_.push_back(K(b));
    v_blocks_.push_back(K(b) + static_cast<size_t>(block_tokens_) * kv_dim_);
  }
  return KvRows{.k_blocks = k_blocks_.data(),
                .v_blocks = v_blocks_.data(),
                .block_rows = block_tokens_,
                .positions = t.positions.data(),
                .n = static_cast<int64_t>(t.positions.size()),
                .stride = kv_dim_,
                .positions_ascending = std::is_sorted(t.positions.begin(), t.positions.end())};
}

}  // namespace ps
