// The prefix cache's index and LRU: full pages of prompt KV (block_tokens tokens at
// every layer) kept after their sequence ends, found again by the tokens they hold.
//
// Keys form a hash chain, so that one key names the whole prefix up to and
// including its page: the root is H(extra), page i's key is H(key of page i-1,
// tokens of page i). `extra` is whatever else shapes the KV or must keep prefixes
// apart: the tenant's salt, the strategy and its parameters where they change the
// KV. The hash is fixed (not seeded per process) so that replicas agree on keys (a
// prefix-aware router compares them). An entry keeps its parent key and tokens (and
// a first page its extra) and a lookup compares them, so a collision costs a miss,
// never another prefix's KV.
//
// Every entry has a place in one LRU per tier. A hit stamps its chain with the
// deepest page oldest, so eviction takes a prefix's tail before its head (a page
// whose parent is gone can no longer be reached, and ages out).
//
// Holds block ids, not references: the KV owner (KvCacheManager) takes one
// reference per block of an entry and decides what may be evicted. Engine thread only.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "memory/block_pool.h"

namespace ps {

struct PrefixEntry {
  uint64_t key = 0;
  uint64_t parent = 0;          // the previous page's key, or the root key
  std::string extra;            // a first page only: what its root key hashes
  std::vector<int32_t> tokens;  // block_tokens token ids
  Tier tier = Tier::kDevice;
  std::vector<int32_t> blocks;  // [n_layers * blocks_per_page], every layer's page
  uint64_t stamp = 0;           // LRU position (larger: used more recently)
};

// A change of the index, for prefix-aware routers (KvPlanner::TakePrefixEvents): a
// page stored in a tier, or removed from it (a move between tiers is both).
struct PrefixEvent {
  bool stored = true;
  Tier tier = Tier::kDevice;
  uint64_t key = 0, parent = 0;
  std::vector<int32_t> tokens;  // stored: the page's
};

class PrefixIndex {
 public:
  explicit PrefixIndex(int block_tokens);

  static uint64_t RootKey(std::string_view extra);
  static uint64_t PageKey(uint64_t parent, std::span<const int32_t> tokens);

  // Entries in `tier`.
  int64_t size(Tier tier) const { return static_cast<int64_t>(lru_[static_cast<int>(tier)].size()); }

  // The entries of the longest cached prefix of `tokens` under `extra` (whole pages,
  // at most max_pages), first page first. Does not stamp them (Touch).
  std::vector<PrefixEntry*> Match(std::string_view extra, std::span<const int32_t> tokens, int64_t max_pages);
  // The entry of the page after `parent` holding `tokens` (extra: the first page's),
  // or nullptr.
  PrefixEntry* Find(uint64_t parent, std::string_view extra, std::span<const int32_t> tokens);
  // A new entry, stamped as most recently used (Find first: there is none for the
  // page); nullptr when another prefix's entry has its key (a hash collision).
  PrefixEntry* Insert(uint64_t parent, std::string_view extra, std::span<const int32_t> tokens, Tier tier,
                      std::vector<int32_t> blocks);
  // Stamps a chain (first page first) as most recently used, its last page oldest.
  void Touch(std::span<PrefixEntry* const> chain);
  // The entry changes tier (its blocks replaced); it keeps its LRU stamp.
  void Move(PrefixEntry& e, Tier tier, std::vector<int32_t> blocks);
  void Erase(const PrefixEntry& e);
  // The entries of `tier`, least recently used first.
  std::vector<PrefixEntry*> Oldest(Tier tier);
  // Every entry, in key order (integrity checks).
  std::vector<const PrefixEntry*> All() const;
  // The changes since the last call, in order.
  std::vector<PrefixEvent> TakeEvents() { return std::exchange(events_, {}); }
  // Every entry as a stored event, parents before their children.
  std::vector<PrefixEvent> Snapshot() const;

 private:
  int block_tokens_;
  uint64_t clock_ = 0;
  std::unordered_map<uint64_t, PrefixEntry> entries_;  // by key
  std::map<uint64_t, uint64_t> lru_[2];                // per tier: stamp -> key
  std::vector<PrefixEvent> events_;                    // since TakeEvents
};

}  // namespace ps
