#include "memory/kv_cache_manager.h"

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace ps {

KvCacheManager::KvCacheManager(BlockPool& device, BlockPool& host, int n_layers, int block_tokens)
    : device_(device), host_(host), n_layers_(n_layers), block_tokens_(block_tokens) {
  PS_CHECK(n_layers > 0 && block_tokens > 0) << "bad KV geometry";
}

const LayerTable& KvCacheManager::Table(int64_t seq, int layer) const {
  static const LayerTable kEmpty;
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? kEmpty : it->second.at(layer);
}

int32_t KvCacheManager::BlocksNeeded(int64_t seq, int n_tokens) const {
  int32_t need = 0;
  for (int l = 0; l < n_layers_; ++l) {
    const LayerTable& t = Table(seq, l);
    const int64_t capacity = static_cast<int64_t>(t.blocks.size()) * block_tokens_;
    const int64_t after = static_cast<int64_t>(t.positions.size()) + n_tokens;
    if (after > capacity) need += static_cast<int32_t>((after - capacity + block_tokens_ - 1) / block_tokens_);
  }
  return need;
}

bool KvCacheManager::Append(int64_t seq, int layer, std::span<const int32_t> positions) {
  PS_CHECK(layer >= 0 && layer < n_layers_) << "layer " << layer;
  auto& layers = seqs_[seq];
  if (layers.empty()) layers.resize(n_layers_);
  LayerTable& t = layers[layer];
  const int64_t capacity = static_cast<int64_t>(t.blocks.size()) * block_tokens_;
  const int64_t filled = static_cast<int64_t>(t.positions.size());
  const int64_t after = filled + static_cast<int64_t>(positions.size());
  if (filled < capacity && t.blocks.back().tier != Tier::kDevice) return false;  // swapped out
  const int32_t need = after > capacity ? static_cast<int32_t>((after - capacity + block_tokens_ - 1) / block_tokens_) : 0;
  auto ids = device_.Allocate(need);
  if (!ids) return false;
  for (int32_t id : *ids) t.blocks.push_back({Tier::kDevice, id});
  t.positions.insert(t.positions.end(), positions.begin(), positions.end());
  return true;
}

std::optional<SwapPlan> KvCacheManager::PlanMove(int64_t seq, Tier from, Tier to) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return SwapPlan{};
  const int64_t n = BlocksIn(seq, from);
  auto ids = pool(to).Allocate(static_cast<int32_t>(n));
  if (!ids) return std::nullopt;
  SwapPlan plan;
  size_t k = 0;
  for (LayerTable& t : it->second) {
    for (BlockLoc& b : t.blocks) {
      if (b.tier != from) continue;
      const BlockLoc dst{to, (*ids)[k++]};
      plan.copies.push_back({b.tier, b.id, dst.tier, dst.id});
      plan.release_after.push_back(b);
      b = dst;
    }
  }
  return plan;
}

std::optional<SwapPlan> KvCacheManager::PlanSwapOut(int64_t seq) { return PlanMove(seq, Tier::kDevice, Tier::kHost); }
std::optional<SwapPlan> KvCacheManager::PlanSwapIn(int64_t seq) { return PlanMove(seq, Tier::kHost, Tier::kDevice); }

void KvCacheManager::Release(const std::vector<BlockLoc>& blocks) {
  for (const BlockLoc& b : blocks) pool(b.tier).Release(b.id);
}

void KvCacheManager::Free(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (const LayerTable& t : it->second) Release(t.blocks);
  seqs_.erase(it);
}

int64_t KvCacheManager::BlocksIn(int64_t seq, Tier tier) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return 0;
  int64_t n = 0;
  for (const LayerTable& t : it->second)
    for (const BlockLoc& b : t.blocks) n += b.tier == tier;
  return n;
}

absl::Status KvCacheManager::VerifyIntegrity() const {
  PS_RETURN_IF_ERROR(device_.VerifyIntegrity());
  PS_RETURN_IF_ERROR(host_.VerifyIntegrity());
  std::map<std::pair<Tier, int32_t>, int> refs;
  for (const auto& [seq, layers] : seqs_) {
    for (size_t l = 0; l < layers.size(); ++l) {
      const LayerTable& t = layers[l];
      // Blocks are taken only as slots need them: exactly ceil(tokens / block_tokens).
      if (t.blocks.size() != (t.positions.size() + block_tokens_ - 1) / block_tokens_) {
        return absl::InternalError(absl::StrCat("sequence ", seq, " layer ", l, ": ", t.blocks.size(), " blocks for ",
                                                t.positions.size(), " tokens"));
      }
      for (const BlockLoc& b : t.blocks) ++refs[{b.tier, b.id}];
    }
  }
  int64_t owned[2] = {0, 0};
  for (const auto& [loc, n] : refs) {
    const BlockPool& p = loc.first == Tier::kDevice ? device_ : host_;
    if (p.ref_count(loc.second) != n) {
      return absl::InternalError(absl::StrCat(std::string(TierName(loc.first)), " block ", loc.second, " has ",
                                              p.ref_count(loc.second), " references but ", n, " table entries"));
    }
    ++owned[static_cast<int>(loc.first)];
  }
  if (owned[0] + device_.num_free() != device_.num_blocks() || owned[1] + host_.num_free() != host_.num_blocks()) {
    return absl::InternalError("tier accounting: blocks owned outside the tables, or lost");
  }
  return absl::OkStatus();
}

}  // namespace ps
