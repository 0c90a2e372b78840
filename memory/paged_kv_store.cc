#include "memory/paged_kv_store.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "kernels/cpu/half_rows.h"

namespace ps {

PagedKvStore::PagedKvStore(KvCacheManager& manager, BlockPool& device, int kv_dim, DType dtype)
    : manager_(manager), device_(device), kv_dim_(kv_dim), block_tokens_(manager.block_tokens()), dtype_(dtype) {
  PS_CHECK(dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16)
      << "KV element type must be F32, F16 or BF16";
  PS_CHECK(device.tier() == Tier::kDevice && device.block_bytes() == BlockBytes(block_tokens_, kv_dim, dtype))
      << "device pool blocks do not match the KV geometry";
}

void PagedKvStore::Store(const float* src, uint8_t* dst) const {
  if (dtype_ == DType::kF32) {
    std::memcpy(dst, src, row_bytes());
  } else {
    F32ToHalf(dtype_, src, reinterpret_cast<uint16_t*>(dst), kv_dim_);
  }
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
    uint8_t* block = device_.data(t.blocks[slot / block_tokens_].id);
    const size_t off = slot % block_tokens_;
    Store(k + i * kv_dim_, block + off * row_bytes());
    Store(v + i * kv_dim_, block + (block_tokens_ + off) * row_bytes());
  }
  return absl::OkStatus();
}

KvRows PagedKvStore::View(int64_t seq_id, int layer) {
  const LayerTable& t = manager_.Table(seq_id, layer);
  k_blocks_.clear();
  v_blocks_.clear();
  for (const BlockLoc& b : t.blocks) {
    PS_CHECK(b.tier == Tier::kDevice) << "attention over a block of sequence " << seq_id << " in the host tier";
    k_blocks_.push_back(device_.data(b.id));
    v_blocks_.push_back(device_.data(b.id) + block_tokens_ * row_bytes());
  }
  return KvRows{.k_blocks = k_blocks_.data(),
                .v_blocks = v_blocks_.data(),
                .block_rows = block_tokens_,
                .positions = t.positions.data(),
                .n = static_cast<int64_t>(t.positions.size()),
                .stride = kv_dim_,
                .positions_ascending = std::is_sorted(t.positions.begin(), t.positions.end()),
                .dtype = dtype_};
}

}  // namespace ps
