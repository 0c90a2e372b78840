// Which KV blocks hold what: for each sequence and layer, a block table (blocks in
// slot order, each in the device or host tier) and the token position of every
// filled slot. Layers may hold different token subsets (pruning). Owns no KV bytes:
// those live in the two BlockPools. Running out of device blocks is a value
// (false / nullopt), never an exception: the scheduler decides what to do.
// Engine thread only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "memory/block_pool.h"
#include "memory/swap_engine.h"

namespace ps {

struct BlockLoc {
  Tier tier = Tier::kDevice;
  int32_t id = 0;
  bool operator==(const BlockLoc&) const = default;
};

struct LayerTable {
  std::vector<BlockLoc> blocks;    // slot s lives in blocks[s / block_tokens] at offset s % block_tokens
  std::vector<int32_t> positions;  // [filled slots]
};

// Copies to run and blocks to release once the copies are done (their data is
// being read until then).
struct SwapPlan {
  std::vector<BlockCopy> copies;
  std::vector<BlockLoc> release_after;
};

class KvCacheManager {
 public:
  KvCacheManager(BlockPool& device, BlockPool& host, int n_layers, int block_tokens);

  int block_tokens() const { return block_tokens_; }
  // Device blocks that appending n tokens at every layer of `seq` would take.
  int32_t BlocksNeeded(int64_t seq, int n_tokens) const;
  // Adds slots for `positions` at one layer, taking device blocks as needed. False
  // (and nothing changed) when the device tier is short of blocks or when the
  // sequence's last block for this layer is not in the device tier.
  bool Append(int64_t seq, int layer, std::span<const int32_t> positions);
  // The table of (seq, layer); empty if the sequence holds nothing there.
  const LayerTable& Table(int64_t seq, int layer) const;
  bool Contains(int64_t seq) const { return seqs_.count(seq) != 0; }

  // Moves every device block of `seq` to the host tier (nullopt: host tier full).
  std::optional<SwapPlan> PlanSwapOut(int64_t seq);
  // Brings every host block of `seq` back to the device tier (nullopt: device tier full).
  std::optional<SwapPlan> PlanSwapIn(int64_t seq);
  void Release(const std::vector<BlockLoc>& blocks);
  // Frees every block of the sequence, in both tiers, at once.
  void Free(int64_t seq);

  int64_t BlocksIn(int64_t seq, Tier tier) const;
  // Pools intact, and every block referenced by a table is owned exactly once.
  absl::Status VerifyIntegrity() const;

 private:
  BlockPool& pool(Tier t) { return t == Tier::kDevice ? device_ : host_; }
  std::optional<SwapPlan> PlanMove(int64_t seq, Tier from, Tier to);

  BlockPool& device_;
  BlockPool& host_;
  int n_layers_;
  int block_tokens_;
  std::map<int64_t, std::vector<LayerTable>> seqs_;  // ordered: deterministic iteration
};

}  // namespace ps
