// The KV owner's tables and counts (its planning face: memory/kv_planner.h): for
// each sequence and layer, a table of pages
// (block_tokens slots each, in slot order; a page's blocks are all in the device or
// all in the host tier) and the token position of every filled slot; layers may
// hold different token subsets (pruning). A page is blocks_per_page blocks (the KV
// cache's layout: memory/kv_geometry.h); a block may be dropped from its page (data
// no longer read), the rest of the page staying. Counts are in blocks. Owns no
// KV bytes: those live in the two BlockPools. Also holds the host row store, so that
// freeing a sequence frees everything it holds.
//
// Blocks are reference-counted: Fork makes a sequence that shares every block of
// another, and an append to a shared, partly filled last page first copies that
// page (copy on write: the copies come back to the caller, who runs them before
// writing). A move of a shared block to the other tier moves the mover's reference
// only (a copy of its own); the block is freed when its last holder lets go.
//
// Reservations: in metered mode (the serving path) the scheduler reserves device
// blocks for each sequence before a step (Reserve) and the step's appends and
// swap-ins draw on that reservation only, so a step never runs out of blocks half
// way; a shortfall is that one sequence's error. Blocks a sequence gives back
// during the step (a scratch pass released, a block moved to the host tier) are
// credited to its reservation. Unused reservations lapse at EndStep. Unmetered
// mode (offline generation, tests) allocates on demand.
//
// Running out of blocks is a value (false / nullopt), never an exception. Engine
// thread only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "memory/block_pool.h"
#include "memory/host_row_store.h"
#include "memory/kv_planner.h"
#include "memory/prefix_index.h"
#include "memory/swap_engine.h"

namespace ps {

struct LayerTable {
  static constexpr int32_t kDropped = -1;  // a block id: dropped from its page
  std::vector<Tier> tiers;                 // per page: slot s lives in page s / block_tokens at s % block_tokens
  std::vector<int32_t> blocks;             // [pages, blocks_per_page]: the pages' block ids
  std::vector<int32_t> positions;          // [filled slots]
  bool ascending = true;                   // positions strictly ascending in slot order
  // [pages, blocks_per_page] once a page has come back from the host tier (PlanMove):
  // for a device block, the host block still holding the same bytes (kDropped: none),
  // so that moving it out again releases the device block without a copy. Empty: none.
  std::vector<int32_t> host_copies;

  int64_t pages() const { return static_cast<int64_t>(tiers.size()); }
};

class KvCacheManager final : public KvPlanner {
 public:
  struct Options {
    int n_layers = 0;
    int block_tokens = 16;
    bool metered = false;       // appends and swap-ins draw on reservations
    size_t host_row_bytes = 0;  // bytes of one parked row (0: none)
    int blocks_per_page = 1;
    bool prefix_cache = false;  // keep full prompt pages for later sequences (prefix_cache.cc)
  };
  KvCacheManager(BlockPool& device, BlockPool& host, const Options& options);
  KvCacheManager(BlockPool& device, BlockPool& host, int n_layers, int block_tokens)
      : KvCacheManager(device, host, Options{.n_layers = n_layers, .block_tokens = block_tokens}) {}

  int block_tokens() const override { return block_tokens_; }
  int blocks_per_page() const override { return blocks_per_page_; }
  int n_layers() const override { return n_layers_; }
  bool metered() const override { return metered_; }

  // ---- The planning face (memory/kv_planner.h).
  int64_t BlocksNeeded(int64_t seq, int64_t n_tokens) const override;
  // The host row store not included.
  int64_t BlocksIn(int64_t seq, Tier tier) const override;
  int64_t OwnBlocks(int64_t seq, Tier tier) const override;
  // The most blocks `seq` (>= 0) has held at once since its first block, its scratch
  // passes' and clean host copies included: in the device tier, and in both tiers.
  // Forgotten when the sequence is freed.
  struct Peak {
    int64_t device = 0;
    int64_t total = 0;
  };
  Peak PeakBlocks(int64_t seq) const;
  int64_t TotalBlocks(Tier tier) const override { return pool(tier).num_blocks(); }
  int64_t UsedBlocks(Tier tier) const override { return pool(tier).num_blocks() - pool(tier).num_free(); }
  int64_t Available(Tier tier) const override;
  bool Reserve(int64_t seq, int64_t n) override;
  int64_t Reserved(int64_t seq) const override;
  void EndStep() override;
  std::optional<SwapPlan> PlanSwapOut(int64_t seq) override;
  // Frees every block of the sequence (Free) once no copy of a plan of its is in
  // flight; until then it may not append, move or fork.
  void Release(int64_t seq) override;

  // ---- The prefix cache (its part of this class is in prefix_cache.cc).
  bool prefix_cache() const override { return prefix_enabled_; }
  PrefixHit AttachPrefix(int64_t seq, std::span<const int32_t> tokens, std::string_view extra) override;
  int64_t CachePrefix(int64_t seq, std::span<const int32_t> tokens, std::string_view extra) override;
  int64_t Evictable(Tier tier) const override;
  int64_t CachedBlocks(Tier tier) const override { return prefix_.size(tier) * n_layers_ * blocks_per_page_; }
  SwapPlan PlanEvict(int64_t n) override;
  // The copies of an eviction plan failed: the pages they were to hold are dropped.
  void ForgetEvicted(const SwapPlan& plan);
  int64_t FlushPrefixCache() override;
  PrefixCacheCounts prefix_counts() const override { return prefix_counts_; }
  std::vector<PrefixEvent> TakePrefixEvents() override { return prefix_.TakeEvents(); }
  std::vector<PrefixEvent> PrefixSnapshot() const override { return prefix_.Snapshot(); }
  // Pages the cache holds per tier.
  int64_t CachedPages(Tier tier) const { return prefix_.size(tier); }

  // ---- Moves between tiers. The plans take destination blocks now and re-point
  // the tables; the caller runs the copies, then Complete(plan).
  // Every host block of `seq` back to the device tier, on its reservation
  // (nullopt: not enough reserved / free).
  std::optional<SwapPlan> PlanSwapIn(int64_t seq);
  // Pages `pages` (indices into the layer's table) of (seq, layer) to `to`; those
  // already there are skipped. Device blocks come from the sequence's reservation.
  // Pages brought to the device tier keep their host blocks as clean copies (until
  // an append writes the page), so a later move back to the host tier copies nothing
  // (offload without re-copying); both this and PlanSwapOut use such copies.
  std::optional<SwapPlan> PlanMove(int64_t seq, int layer, std::span<const int32_t> pages, Tier to);
  // The copies of `plan` are done: its source blocks are released (freed where no
  // table shares them), and a sequence released meanwhile is freed.
  void Complete(const SwapPlan& plan);
  // Plans of `seq` not yet completed.
  int InFlight(int64_t seq) const;

  // ---- Execution.
  // Adds slots for `positions` at one layer, taking device blocks as needed. False
  // (and nothing changed) when the device blocks are not there (not reserved, or
  // the tier is full) or when the layer's last, partly filled page is not in the
  // device tier. A shared last page is copied first: the device-to-device copies
  // to run before the rows are written are appended to *cow (required then).
  bool Append(int64_t seq, int layer, std::span<const int32_t> positions, std::vector<BlockCopy>* cow = nullptr);
  // `child` (new) shares every block of `parent` (no plan of the parent's in
  // flight): the same tables, each block's reference count one higher; clean host
  // copies stay the parent's.
  void Fork(int64_t parent, int64_t child);
  // Frees block `index` (< blocks_per_page) of each of `pages` of (seq, layer), now
  // (no copy may be reading or writing it); those dropped already are skipped.
  // Device blocks are credited to the sequence's reservation. The number freed.
  int64_t Drop(int64_t seq, int layer, std::span<const int32_t> pages, int index);
  // Frees every block of (seq, layer), now (no copy may be reading or writing them),
  // and empties its table: a scratch pass's layer whose KV no later layer reads.
  // Device blocks are credited to the sequence's (or scratch owner's) reservation.
  void FreeLayer(int64_t seq, int layer);
  // The table of (seq, layer); empty if the sequence holds nothing there.
  const LayerTable& Table(int64_t seq, int layer) const;
  bool Contains(int64_t seq) const { return seqs_.count(seq) != 0; }
  // Frees every block of the sequence, in both tiers and the host row store, at once
  // (no plan of its may be in flight: Release waits for them). A scratch sequence
  // (id < 0, see ScratchOwner) credits its owner's reservation.
  void Free(int64_t seq);
  HostRowStore& host_rows() { return host_rows_; }
  const HostRowStore& host_rows() const { return host_rows_; }

  // Pools intact, every block's reference count the number of table entries and
  // in-flight releases naming it, the rest free or in the host row store, the
  // per-sequence counts right. Valid at any point on the engine thread.
  absl::Status VerifyIntegrity() const override;

  // Scratch sequences (a strategy's prefix pass) use ~owner as their id and draw on
  // the owner's reservation.
  static int64_t ScratchOwner(int64_t seq) { return seq < 0 ? ~seq : seq; }

 private:
  BlockPool& pool(Tier t) { return t == Tier::kDevice ? device_ : host_; }
  const BlockPool& pool(Tier t) const { return t == Tier::kDevice ? device_ : host_; }
  // n device blocks for `seq`: from its reservation when metered.
  std::optional<std::vector<int32_t>> TakeDevice(int64_t seq, int64_t n);
  void Credit(int64_t seq, int64_t n);
  std::optional<SwapPlan> PlanMoveAll(int64_t seq, Tier from, Tier to);
  // Drops one reference to a block; true when that freed it.
  bool Unref(Tier tier, int32_t id);
  // A plan's source reference, dropped when it completes.
  void ReleaseAfter(SwapPlan* plan, Tier tier, int32_t id);
  // The plan is handed out: counted in flight for its sequence.
  SwapPlan& Issue(SwapPlan& plan);
  // The sequence may still grow (not released).
  void CheckLive(int64_t seq) const;
  // Re-points the live blocks of page p of t to tier `to`: a device block with a
  // clean host copy to that copy (no copy planned), the others to `ids` (from *next
  // on), planning their copies; with keep_clean, host blocks stay as clean copies.
  void MovePage(LayerTable& t, int64_t p, Tier to, const std::vector<int32_t>& ids, size_t* next, bool keep_clean,
                SwapPlan* plan);
  // Blocks of page p of t not dropped; *to_copy: those of them a move to `to` must
  // copy (not those with a clean copy there).
  int64_t LiveBlocks(const LayerTable& t, int64_t p, Tier to, int64_t* to_copy) const;

  BlockPool& device_;
  BlockPool& host_;
  int n_layers_;
  int block_tokens_;
  int blocks_per_page_;
  bool metered_;
  struct SeqKv {
    std::vector<LayerTable> layers;
    int64_t held[2] = {0, 0};  // table blocks per tier
    int64_t host_copies = 0;   // clean host copies (LayerTable::host_copies)
  };
  SeqKv& Seq(int64_t seq);  // created on first use
  // Releases every block of table t of s (clean copies included) and empties it;
  // the device blocks released.
  int64_t ReleaseLayer(SeqKv& s, LayerTable& t);
  // Releases the clean host copy of block i of t's flat block array (a table of s),
  // if it has one.
  void ReleaseHostCopy(SeqKv& s, LayerTable& t, int64_t i);
  void AddHostCopies(SeqKv& s, int64_t n) {
    s.host_copies += n;
    host_copies_ += n;
  }
  // n host blocks, releasing clean copies (of sequences other than `except`) when
  // the free ones are too few: a copy only saves a later copy, a free block is needed now.
  std::optional<std::vector<int32_t>> TakeHost(int64_t n, int64_t except);
  int64_t host_copies_ = 0;  // clean host copies, every sequence's
  // Updates the peak of seq's owner (ScratchOwner) after blocks were taken.
  void NotePeak(int64_t seq);
  std::map<int64_t, Peak> peaks_;        // by owner
  std::map<int64_t, SeqKv> seqs_;        // ordered: deterministic iteration
  std::map<int64_t, int64_t> reserved_;  // seq -> device blocks it may still take this step
  int64_t reserved_total_ = 0;
  int64_t releasing_ = 0;             // device blocks that planned moves free once they complete
  std::vector<int32_t> pending_[2];   // per tier and block: references held by plans in flight
  std::map<int64_t, int> in_flight_;  // seq -> plans not yet completed
  std::set<int64_t> released_;        // sequences released with plans in flight
  HostRowStore host_rows_;

  // The prefix cache: each entry holds one reference on each of its blocks.
  bool prefix_enabled_;
  PrefixIndex prefix_;
  PrefixCacheCounts prefix_counts_;
  // No sequence or plan holds the entry's blocks: only the cache.
  bool Unreferenced(const PrefixEntry& e) const;
  // Drops the entry (its blocks unreferenced, now).
  void DropEntry(PrefixEntry& e);
  // DropEntry, counted among the prefix cache's dropped blocks (evicted for room or lost).
  void EvictEntry(PrefixEntry& e);
  // Drops unreferenced host-tier entries used before `stamp`, least recently used
  // first, until n host blocks are free; whether they are.
  bool FreeHostFromCache(int64_t n, uint64_t stamp);
};

}  // namespace ps
