// Fixed-size KV blocks of one memory tier. Block objects are metadata only (id,
// reference count, free-list links); the bytes of all blocks live in one buffer
// indexed by block id. The free list is an intrusive doubly linked list: O(1)
// take from the front and return to the back, so the least recently freed block
// is reused first. Not thread-safe: owned by the engine thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "kernels/memory_region.h"

namespace ps {

enum class Tier : uint8_t { kDevice = 0, kHost = 1 };
std::string_view TierName(Tier t);

class BlockPool {
 public:
  // num_blocks blocks of block_bytes each in ordinary memory allocated here (64-byte
  // aligned): both tiers on the CPU backend.
  BlockPool(Tier tier, int32_t num_blocks, size_t block_bytes);
  // The same over memory from a backend (num_blocks * block_bytes bytes at least):
  // device memory for the device tier and pinned host memory for the host tier on a GPU.
  BlockPool(Tier tier, int32_t num_blocks, size_t block_bytes, MemoryRegion memory);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  Tier tier() const { return tier_; }
  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t num_free() const { return num_free_; }
  size_t block_bytes() const { return block_bytes_; }

  // Takes the block at the front of the free list (reference count 1); nullopt when none is free.
  std::optional<int32_t> Allocate();
  // Takes n blocks, all or none.
  std::optional<std::vector<int32_t>> Allocate(int32_t n);
  void AddRef(int32_t id);
  // Drops one reference; at zero the block goes to the back of the free list.
  void Release(int32_t id);
  int32_t ref_count(int32_t id) const { return blocks_.at(id).ref_count; }

  uint8_t* data(int32_t id) { return memory_.base + static_cast<size_t>(id) * block_bytes_; }
  const uint8_t* data(int32_t id) const { return memory_.base + static_cast<size_t>(id) * block_bytes_; }

  // Free-list order, front first (tests and debugging).
  std::vector<int32_t> FreeList() const;
  // Checks the free list against the reference counts: every block is either
  // free (count 0, listed once) or owned (count > 0, not listed).
  absl::Status VerifyIntegrity() const;

 private:
  struct Block {
    int32_t ref_count = 0;
    int32_t prev = -1, next = -1;  // free-list links (-1: none)
    bool in_free_list = false;
  };
  void PushBack(int32_t id);
  void Unlink(int32_t id);

  Tier tier_;
  size_t block_bytes_;
  std::vector<Block> blocks_;
  int32_t head_ = -1, tail_ = -1, num_free_ = 0;
  MemoryRegion memory_;
};

}  // namespace ps
