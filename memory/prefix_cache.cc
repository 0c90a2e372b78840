// KvCacheManager's prefix cache (declared in kv_cache_manager.h): full prompt pages
// kept after their sequence, as entries of a PrefixIndex holding one reference on
// each of their blocks. A sequence that starts from cached pages shares their
// blocks like a fork; pages no sequence or plan holds are what eviction takes.
#include <algorithm>
#include <utility>

#include "base/status.h"
#include "memory/kv_cache_manager.h"

namespace ps {

bool KvCacheManager::Unreferenced(const PrefixEntry& e) const {
  const BlockPool& p = pool(e.tier);
  return std::ranges::all_of(e.blocks, [&](int32_t id) { return p.ref_count(id) == 1; });
}

void KvCacheManager::DropEntry(PrefixEntry& e) {
  for (int32_t id : e.blocks) Unref(e.tier, id);
  prefix_.Erase(e);  // e is gone from here on
}

void KvCacheManager::EvictEntry(PrefixEntry& e) {
  prefix_counts_.dropped += static_cast<int64_t>(e.blocks.size());
  DropEntry(e);
}

bool KvCacheManager::FreeHostFromCache(int64_t n, uint64_t stamp) {
  if (host_.num_free() >= n) return true;
  for (PrefixEntry* e : prefix_.Oldest(Tier::kHost)) {
    if (e->stamp >= stamp) break;
    if (!Unreferenced(*e)) continue;
    EvictEntry(*e);
    if (host_.num_free() >= n) return true;
  }
  return false;
}

int64_t KvCacheManager::Evictable(Tier tier) const {
  int64_t n = 0;
  for (const PrefixEntry* e : prefix_.All()) {
    if (e->tier == tier && Unreferenced(*e)) n += static_cast<int64_t>(e->blocks.size());
  }
  return n;
}

PrefixHit KvCacheManager::AttachPrefix(int64_t seq, std::span<const int32_t> tokens, std::string_view extra) {
  PS_CHECK(seq >= 0 && !seqs_.contains(seq) && !released_.contains(seq))
      << "a cached prefix for sequence " << seq << ", which exists";
  if (!prefix_enabled_ || tokens.empty()) return {};
  prefix_counts_.queried_tokens += static_cast<int64_t>(tokens.size());
  const int64_t max_pages = (static_cast<int64_t>(tokens.size()) - 1) / block_tokens_;
  std::vector<PrefixEntry*> chain = prefix_.Match(extra, tokens, max_pages);
  // A page being moved to the host tier is found again once its copy has landed
  // (until then it may yet be lost: ForgetEvicted).
  auto moving = std::ranges::find_if(chain, [&](const PrefixEntry* e) {
    return std::ranges::any_of(e->blocks, [&](int32_t id) { return pending_[static_cast<int>(e->tier)][id] > 0; });
  });
  chain.erase(moving, chain.end());
  if (chain.empty()) return {};
  prefix_.Touch(chain);
  SeqKv& s = Seq(seq);
  PrefixHit hit{.tokens = static_cast<int64_t>(chain.size()) * block_tokens_};
  for (int l = 0; l < n_layers_; ++l) {
    LayerTable& t = s.layers[l];
    for (const PrefixEntry* e : chain) {
      t.tiers.push_back(e->tier);
      for (int i = 0; i < blocks_per_page_; ++i) {
        const int32_t id = e->blocks[l * blocks_per_page_ + i];
        pool(e->tier).AddRef(id);
        t.blocks.push_back(id);
      }
      s.held[static_cast<int>(e->tier)] += blocks_per_page_;
    }
    t.positions.resize(hit.tokens);
    for (int32_t p = 0; p < static_cast<int32_t>(hit.tokens); ++p) t.positions[p] = p;
  }
  for (const PrefixEntry* e : chain) {
    if (e->tier == Tier::kHost) hit.host_tokens += block_tokens_;
  }
  prefix_counts_.hit_tokens[static_cast<int>(Tier::kDevice)] += hit.tokens - hit.host_tokens;
  prefix_counts_.hit_tokens[static_cast<int>(Tier::kHost)] += hit.host_tokens;
  NotePeak(seq);
  return hit;
}

int64_t KvCacheManager::CachePrefix(int64_t seq, std::span<const int32_t> tokens, std::string_view extra) {
  auto it = seqs_.find(seq);
  // A plan in flight may be writing the blocks the tables point at.
  if (!prefix_enabled_ || it == seqs_.end() || InFlight(seq) > 0) return 0;
  SeqKv& s = it->second;
  const int64_t bt = block_tokens_, pages = static_cast<int64_t>(tokens.size()) / bt;
  // Page p is the prompt's, unpruned and whole, in one tier at every layer.
  auto whole = [&](int64_t p, Tier* tier) {
    for (int l = 0; l < n_layers_; ++l) {
      const LayerTable& t = s.layers[l];
      if (static_cast<int64_t>(t.positions.size()) < (p + 1) * bt || (l > 0 && t.tiers[p] != *tier)) return false;
      *tier = t.tiers[p];
      for (int64_t k = p * bt; k < (p + 1) * bt; ++k) {
        if (t.positions[k] != k) return false;
      }
      for (int64_t i = p * blocks_per_page_; i < (p + 1) * blocks_per_page_; ++i) {
        if (t.blocks[i] == LayerTable::kDropped) return false;
      }
    }
    return true;
  };
  auto blocks_of = [&](int64_t p) {
    std::vector<int32_t> ids;
    ids.reserve(static_cast<size_t>(n_layers_) * blocks_per_page_);
    for (const LayerTable& t : s.layers) {
      ids.insert(ids.end(), t.blocks.begin() + p * blocks_per_page_, t.blocks.begin() + (p + 1) * blocks_per_page_);
    }
    return ids;
  };
  std::vector<PrefixEntry*> chain;
  uint64_t parent = PrefixIndex::RootKey(extra);
  for (int64_t p = 0; p < pages; ++p) {
    Tier tier = Tier::kDevice;
    if (!whole(p, &tier)) break;
    const std::string_view first_extra = p == 0 ? extra : std::string_view();
    const std::span<const int32_t> page = tokens.subspan(p * bt, bt);
    PrefixEntry* e = prefix_.Find(parent, first_extra, page);
    if (e != nullptr && e->tier == Tier::kHost && tier == Tier::kDevice) {
      // The sequence holds the same KV in the device tier: the cache keeps that.
      std::vector<int32_t> ids = blocks_of(p);
      for (int32_t id : ids) device_.AddRef(id);
      for (int32_t id : e->blocks) Unref(Tier::kHost, id);
      prefix_.Move(*e, Tier::kDevice, std::move(ids));
    } else if (e == nullptr) {
      std::vector<int32_t> ids = blocks_of(p);
      e = prefix_.Insert(parent, first_extra, page, tier, ids);
      if (e == nullptr) break;  // another prefix has the key
      for (int32_t id : ids) pool(tier).AddRef(id);
    }
    chain.push_back(e);
    parent = e->key;
  }
  prefix_.Touch(chain);
  return static_cast<int64_t>(chain.size());
}

SwapPlan KvCacheManager::PlanEvict(int64_t n) {
  SwapPlan plan{.seq = kPrefixCacheSeq};
  int64_t freed = 0;
  for (PrefixEntry* e : prefix_.Oldest(Tier::kDevice)) {
    if (freed >= n) break;
    if (!Unreferenced(*e)) continue;
    const int64_t k = static_cast<int64_t>(e->blocks.size());
    freed += k;
    if (!FreeHostFromCache(k, e->stamp)) {
      EvictEntry(*e);
      continue;
    }
    prefix_counts_.evicted_to_host += k;
    std::optional<std::vector<int32_t>> host = host_.Allocate(static_cast<int32_t>(k));
    PS_CHECK(host.has_value()) << k << " free host blocks not there";
    for (int64_t i = 0; i < k; ++i) {
      const int32_t src = e->blocks[i], dst = (*host)[i];
      plan.copies.push_back({Tier::kDevice, src, Tier::kHost, dst});
      ReleaseAfter(&plan, Tier::kDevice, src);  // the cache's reference: read until the copy is done
      host_.AddRef(dst);                        // and the destination kept until it is written
      ReleaseAfter(&plan, Tier::kHost, dst);
    }
    prefix_.Move(*e, Tier::kHost, std::move(*host));
  }
  return Issue(plan);
}

void KvCacheManager::ForgetEvicted(const SwapPlan& plan) {
  std::vector<PrefixEntry*> lost;
  for (PrefixEntry* e : prefix_.Oldest(Tier::kHost)) {
    const bool written = std::ranges::any_of(e->blocks, [&](int32_t id) {
      return std::ranges::any_of(plan.copies,
                                 [&](const BlockCopy& c) { return c.dst_tier == Tier::kHost && c.dst == id; });
    });
    if (written) lost.push_back(e);
  }
  for (PrefixEntry* e : lost) EvictEntry(*e);
}

int64_t KvCacheManager::FlushPrefixCache() {
  int64_t freed = 0;
  for (Tier tier : {Tier::kDevice, Tier::kHost}) {
    for (PrefixEntry* e : prefix_.Oldest(tier)) {
      if (!Unreferenced(*e)) continue;
      freed += static_cast<int64_t>(e->blocks.size());
      DropEntry(*e);
    }
  }
  return freed;
}

}  // namespace ps
