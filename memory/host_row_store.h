// Rows parked in the host tier: fixed-size rows (e.g. the hidden states of tokens a
// strategy pruned, to be revived later) kept per sequence under a key (the token's
// position) in host-tier blocks, so that they count in the host tier's capacity,
// metrics and GetLoad like swapped KV. A sequence's rows
// lie one after another across its blocks (a row may straddle two blocks); freed
// slots are reused, and the blocks go back when the sequence releases its cache.
// Engine thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

#include "memory/block_pool.h"

namespace ps {

class HostRowStore {
 public:
  // `host` must be the host tier; each row is row_bytes bytes (0: no rows at all).
  HostRowStore(BlockPool& host, size_t row_bytes) : host_(host), row_bytes_(row_bytes) {}

  // Stores the row under `key`, replacing nothing (the key must be absent). False
  // when the host tier has no block for it (the caller keeps the row instead).
  bool Put(int64_t seq, int32_t key, const void* row);
  // Copies the row out and frees its slot; false if the key is absent.
  bool Take(int64_t seq, int32_t key, void* row);
  bool Contains(int64_t seq, int32_t key) const;
  int64_t Rows(int64_t seq) const;
  int64_t Blocks(int64_t seq) const;
  int64_t TotalBlocks() const { return total_blocks_; }
  // Gives back every block of the sequence.
  void Release(int64_t seq);
  size_t row_bytes() const { return row_bytes_; }

 private:
  struct Seq {
    std::vector<int32_t> blocks;                // host block ids, in stream order
    std::unordered_map<int32_t, int64_t> slot;  // key -> slot
    std::vector<int64_t> free_slots;
    int64_t next_slot = 0;  // slots below this were handed out once
  };
  // Calls fn(piece, offset in the row, bytes) for the pieces of slot s of q's byte stream.
  template <typename Fn>
  void ForSlot(Seq& q, int64_t s, Fn&& fn);

  BlockPool& host_;
  size_t row_bytes_;
  std::map<int64_t, Seq> seqs_;
  int64_t total_blocks_ = 0;
};

}  // namespace ps
