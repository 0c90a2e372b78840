// The KV owner's planning face: what the scheduler asks before a step, in block
// counts, with no bytes, no model and no engine. The owner is memory/'s
// KvCacheManager (the tables, the reference counts, the reservations) with KvCache
// (the bytes and the copies) as its executing face: every block is allocated,
// shared, moved and freed there and only there.
//
// A sequence's blocks go back through Release: at once when no copy reads or
// writes them, else when the last such copy completes (until then the sequence
// may not grow again).
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "memory/block_pool.h"
#include "memory/prefix_index.h"
#include "memory/swap_engine.h"

namespace ps {

struct BlockLoc {
  Tier tier = Tier::kDevice;
  int32_t id = 0;
  bool operator==(const BlockLoc&) const = default;
};

// Copies to run and block references to drop once the copies are done (their data
// is being read until then). Built by the owner; the executing face runs the copies
// and hands the plan back (KvCacheManager::Complete).
struct SwapPlan {
  int64_t seq = -1;  // the sequence whose blocks move
  std::vector<BlockCopy> copies;
  std::vector<BlockLoc> release_after;
  // Device blocks of release_after that no table shares: free once the plan completes.
  int64_t device_frees = 0;
  // A sequence whose reservation is credited with the device blocks freed (a
  // strategy's move to the host tier during a step), or -1.
  int64_t credit_seq = -1;
};

// The sequence id of the prefix cache's own plans (PlanEvict).
inline constexpr int64_t kPrefixCacheSeq = std::numeric_limits<int64_t>::min();

// What a new sequence starts from (KvPlanner::AttachPrefix).
struct PrefixHit {
  int64_t tokens = 0;       // leading prompt tokens whose KV the sequence shares with the cache
  int64_t host_tokens = 0;  // of them, in host-tier pages: swap the sequence in before it runs
};

// The prefix cache's totals since start (KvPlanner::prefix_counts).
struct PrefixCacheCounts {
  int64_t queried_tokens = 0;      // prompt tokens of the sequences that looked for a cached prefix
  int64_t hit_tokens[2] = {0, 0};  // of them, found cached, by the tier of their pages (indexed by Tier)
  // Blocks of unreferenced cached pages evicted for room: moved to the host tier, or dropped.
  int64_t evicted_to_host = 0, dropped = 0;
};

class KvPlanner {
 public:
  virtual ~KvPlanner() = default;

  virtual int n_layers() const = 0;
  virtual int block_tokens() const = 0;
  virtual int blocks_per_page() const = 0;
  // Appends draw on reservations (the serving path).
  virtual bool metered() const = 0;

  virtual int64_t TotalBlocks(Tier tier) const = 0;
  virtual int64_t UsedBlocks(Tier tier) const = 0;
  // Device blocks that appending n tokens at every layer of `seq` would take (a
  // shared, partly filled last page copied included).
  virtual int64_t BlocksNeeded(int64_t seq, int64_t n_tokens) const = 0;
  // Blocks the sequence's tables hold in `tier` (a block shared with another
  // sequence counts for each); O(1).
  virtual int64_t BlocksIn(int64_t seq, Tier tier) const = 0;
  // Of those, the blocks no table, cached page or plan shares: what the tier gets
  // back when the sequence lets go of its blocks there (O(blocks)).
  virtual int64_t OwnBlocks(int64_t seq, Tier tier) const = 0;
  // Blocks a reservation (device) or a swap-out (host) can still take: device
  // blocks free or being freed by planned moves, less what is reserved; host blocks
  // free or holding clean copies.
  virtual int64_t Available(Tier tier) const = 0;
  // Reserves n device blocks for `seq` in this step; false (nothing reserved) when
  // fewer are available. Always true when unmetered.
  virtual bool Reserve(int64_t seq, int64_t n) = 0;
  virtual int64_t Reserved(int64_t seq) const = 0;
  // Unused reservations lapse (call after the step).
  virtual void EndStep() = 0;
  // Every device block of `seq` to the host tier (nullopt: host tier full): the
  // tables point at the host blocks from now on and the device blocks count as
  // available; the executing face runs the copies before anything else this step.
  virtual std::optional<SwapPlan> PlanSwapOut(int64_t seq) = 0;
  // The sequence's blocks go back (see above).
  virtual void Release(int64_t seq) = 0;

  // ---- The prefix cache (memory/prefix_index.h): full prompt pages kept after
  // their sequence, keyed by their tokens and `extra` (the salt, and the strategy
  // where it shapes the KV). Cached pages no sequence holds are evicted least
  // recently used first: device -> host tier -> dropped.
  virtual bool prefix_cache() const = 0;
  // A new sequence (no blocks yet) starts from the longest cached prefix of
  // `tokens`, whole pages and at least one token short of the end: its tables share
  // the cached blocks at every layer. Nothing cached: {} and no sequence is made.
  virtual PrefixHit AttachPrefix(int64_t seq, std::span<const int32_t> tokens, std::string_view extra) = 0;
  // The sequence's leading full pages that hold tokens[0, n) unpruned at every layer
  // go into the cache (the pages cached before are marked used); the number of
  // pages of the prefix the cache now holds.
  virtual int64_t CachePrefix(int64_t seq, std::span<const int32_t> tokens, std::string_view extra) = 0;
  // Blocks the cache holds in `tier` (held by sequences too, some of them).
  virtual int64_t CachedBlocks(Tier tier) const = 0;
  // Blocks of cached pages in `tier` no sequence holds (evictable now).
  virtual int64_t Evictable(Tier tier) const = 0;
  // Frees at least n device blocks of unreferenced cached pages (fewer if there are
  // not so many), least recently used first: moved to the host tier where it has
  // room (the copies to run first; the device blocks count as available now),
  // dropped otherwise.
  virtual SwapPlan PlanEvict(int64_t n) = 0;
  // Drops every cached page no sequence holds, in both tiers; the blocks freed.
  virtual int64_t FlushPrefixCache() = 0;
  virtual PrefixCacheCounts prefix_counts() const = 0;
  // Pages stored and removed since the last call (for prefix-aware routers), and
  // every page cached now as stored events.
  virtual std::vector<PrefixEvent> TakePrefixEvents() = 0;
  virtual std::vector<PrefixEvent> PrefixSnapshot() const = 0;

  // The owner's invariants (every block free or accounted for, the counts right).
  virtual absl::Status VerifyIntegrity() const = 0;
};

}  // namespace ps
