// The KV cache of one engine, the KV owner's executing face (the planning face:
// memory/kv_planner.h): both tiers' block pools (memory from the backend), the
// tables and counts (KvCacheManager, with the host row store), the swap engine of
// the backend, and the bytes: K/V rows appended into device blocks,
// views of a layer's rows for attention, whole-sequence swaps, per-page moves that a
// later attention waits for, and keys dropped. A page of a layer (block_tokens
// slots) is a block of K rows per KV head then a block of V rows per KV head:
// [block_tokens, head_dim] each (memory/kv_geometry.h), in F32, F16, BF16 or Q8_0 (rounded
// on append; attention accumulates in F32). Engine thread only.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "memory/kv_cache_manager.h"
#include "memory/kv_geometry.h"
#include "memory/swap_engine.h"

namespace ps {

struct KvCacheOptions {
  KvGeometry geometry;
  int64_t device_blocks = 0;
  int64_t host_blocks = 0;     // 0: no host tier
  size_t host_row_bytes = 0;   // bytes of a parked row (the model's hidden state); 0: none
  bool metered = false;        // appends draw on reservations (the serving path)
  bool prefix_cache = false;   // keep full prompt pages for later sequences (KvCacheManager)
  CpuSwapEngine::CopyFn copy;  // CPU backend: replaces memcpy (tests inject failures)
};

class KvCache {
 public:
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const KvCacheOptions& options, Backend& backend);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvGeometry& geometry() const { return geometry_; }
  KvCacheManager& manager() { return *manager_; }
  const KvCacheManager& manager() const { return *manager_; }
  const SwapEngine& swap() const { return *swap_; }

  // Appends n rows of K and V ([n, kv_dim] F32 each) with their positions to (seq,
  // layer), a shared last page copied first. ResourceExhausted when the sequence's
  // reservation (or the device tier) is short, FailedPrecondition when the layer's
  // last block is in the host tier.
  absl::Status Append(int64_t seq, int layer, std::span<const int32_t> positions, const float* k, const float* v);
  // One sequence's rows for AppendAll: positions.size() rows of K and V from row `row` of k and v on.
  struct Rows {
    int64_t seq = 0;
    std::span<const int32_t> positions;
    int64_t row = 0;
  };
  // Append for several sequences at one layer (the forward pass's batch), the rows of
  // consecutive sequences stored by one backend call; status[i] is rows[i]'s.
  void AppendAll(int layer, std::span<const Rows> rows, const float* k, const float* v, std::span<absl::Status> status);
  // The rows of (seq, layer) for attention (heads in blocks of their own, KvRows::
  // head_cols), once the moves of the layer's blocks in flight are done (the one
  // place a step waits for the copies of the blocks it reads); FailedPrecondition when a page the selection reads
  // (null: all of them) is in the host tier. Dropped keys have null blocks. With key_layer >= 0 the keys come from that
  // layer (its rows must hold the same positions) and the values from `layer` (attention scores shared across layers).
  // The block table is written to `table`, else to the cache's own (valid until the next View); the view is valid until
  // the next Append or Free of the sequence.
  struct BlockTable {
    std::vector<const void*> k, v;
  };
  absl::StatusOr<KvRows> View(int64_t seq, int layer, const KvSelection* selection, int key_layer = -1,
                              BlockTable* table = nullptr);
  // Frees the K blocks of KV head kv_head in `pages` of (seq, layer): keys no
  // attention reads again (keys whose scores a lower layer computes). Their
  // device blocks are credited to the sequence's reservation.
  absl::Status DropKeys(int64_t seq, int layer, int kv_head, std::span<const int32_t> pages);
  // Frees the K and the V blocks of KV head kv_head in `pages` of (seq, layer): rows
  // that head's attention never reads again (KV eviction). Credited as DropKeys.
  absl::Status DropHead(int64_t seq, int layer, int kv_head, std::span<const int32_t> pages);
  // Frees everything the sequence holds, once its moves are done: the engine's own
  // scratch passes and offline generation (the scheduler releases its sequences
  // through the planning face).
  void Free(int64_t seq);
  // `child` shares every block of `parent` (the basis of n > 1), once the parent's
  // moves are done; appends copy a shared last page first.
  void Fork(int64_t parent, int64_t child);
  // Frees the sequence's KV of one layer, once its moves there are done: a scratch
  // pass's layer that no later layer reads.
  void FreeLayer(int64_t seq, int layer);

  // Whole-sequence moves (preemption): submit the plan's copies, then Finish waits
  // for them and releases the source blocks (also on failure, DataLoss: the
  // destination then holds no valid data and the caller frees the sequence; a
  // failed per-page move below reaches View and WaitMoves the same way).
  SwapTicket Submit(const SwapPlan& plan) { return swap_->Submit(plan.copies); }
  absl::Status Finish(SwapTicket ticket, const SwapPlan& plan);

  // Per-page moves during a step: pages (indices into the layer's table) of (seq,
  // layer) to `to`, queued now; the next View of the layer waits for them. Waits first only for a move of the same
  // pages still in flight, or, when the reservation is short, for the sequence's moves to the host tier (their device
  // blocks are credited back). ResourceExhausted when the destination tier (or reservation) is still short.
  absl::Status Move(int64_t seq, int layer, std::span<const int32_t> pages, Tier to);
  // Waits for the moves of (seq, layer), or of every layer when layer < 0.
  absl::Status WaitMoves(int64_t seq, int layer);
  // Waits for every move in flight (end of a step); the first error.
  absl::Status WaitAllMoves();
  // Seconds the engine thread spent waiting for per-block moves, in all.
  double move_wait_seconds() const { return move_wait_seconds_; }

 private:
  KvCache(const KvGeometry& g, Backend& backend) : geometry_(g), backend_(backend) {}
  struct PendingMove {
    int64_t seq = 0;
    int layer = 0;
    std::vector<int32_t> pages;  // indices into the layer's table
    SwapTicket ticket = 0;
    SwapPlan plan;
  };
  // Waits for the pending moves matching `pick`; the first error.
  template <typename Pick>
  absl::Status WaitWhere(Pick&& pick);

  KvGeometry geometry_;
  Backend& backend_;
  std::unique_ptr<BlockPool> device_, host_;
  std::unique_ptr<KvCacheManager> manager_;
  std::unique_ptr<SwapEngine> swap_;
  std::vector<PendingMove> moves_;
  double move_wait_seconds_ = 0;
  // Scratch reused across calls: the last View's block table and StoreKv's row pointers.
  BlockTable table_;
  std::vector<uint8_t*> k_rows_, v_rows_;
  std::vector<BlockCopy> cow_;  // an append's copies of shared pages
};

}  // namespace ps
