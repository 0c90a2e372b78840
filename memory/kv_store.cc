#include "memory/kv_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace ps {

absl::Status ContiguousKvStore::Append(int64_t seq_id, int layer, std::span<const int32_t> positions,
                                       const float* k, const float* v) {
  PS_CHECK(layer >= 0 && layer < n_layers_) << "layer " << layer;
  auto& layers = seqs_[seq_id];
  if (layers.empty()) layers.resize(n_layers_);
  Layer& l = layers[layer];
  const int64_t size = static_cast<int64_t>(l.positions.size());
  const int64_t n = static_cast<int64_t>(positions.size());
  if (size + n > max_tokens_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache full for sequence ", seq_id, ": ", size, " + ", n, " > ", max_tokens_, " tokens"));
  }
  l.k.insert(l.k.end(), k, k + n * kv_dim_);
  l.v.insert(l.v.end(), v, v + n * kv_dim_);
  for (int32_t p : positions) {
    if (!l.positions.empty() && p <= l.positions.back()) l.ascending = false;
    l.positions.push_back(p);
  }
  return absl::OkStatus();
}

KvRows ContiguousKvStore::View(int64_t seq_id, int layer) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return KvRows{.block_rows = 1, .stride = kv_dim_};
  Layer& l = it->second[layer];
  l.k_block = l.k.data();
  l.v_block = l.v.data();
  return KvRows{.k_blocks = &l.k_block,
                .v_blocks = &l.v_block,
                .block_rows = std::max<int64_t>(1, static_cast<int64_t>(l.positions.size())),
                .positions = l.positions.data(),
                .n = static_cast<int64_t>(l.positions.size()),
                .stride = kv_dim_,
                .positions_ascending = l.ascending};
}

}  // namespace ps
