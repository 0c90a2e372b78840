#include "memory/block_pool.h"

#include <algorithm>
#include <new>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace ps {

std::string_view TierName(Tier t) { return t == Tier::kDevice ? "device" : "host"; }

BlockPool::BlockPool(Tier tier, int32_t num_blocks, size_t block_bytes)
    : BlockPool(tier, num_blocks, block_bytes,
                MemoryRegion{.base = static_cast<uint8_t*>(::operator new[](
                                 static_cast<size_t>(std::max(num_blocks, 0)) * block_bytes + 1, std::align_val_t(64))),
                             .release = [](uint8_t* p) { ::operator delete[](p, std::align_val_t(64)); }}) {}

BlockPool::BlockPool(Tier tier, int32_t num_blocks, size_t block_bytes, MemoryRegion memory)
    : tier_(tier),
      block_bytes_(block_bytes),
      blocks_(static_cast<size_t>(std::max(num_blocks, 0))),
      memory_(std::move(memory)) {
  PS_CHECK(num_blocks >= 0 && block_bytes > 0) << "bad pool size";
  PS_CHECK(memory_.base != nullptr) << "a block pool without memory";
  for (int32_t i = 0; i < num_blocks; ++i) PushBack(i);
}

BlockPool::~BlockPool() {
  if (memory_.release) memory_.release(memory_.base);
}

void BlockPool::PushBack(int32_t id) {
  Block& b = blocks_[id];
  b.prev = tail_;
  b.next = -1;
  b.in_free_list = true;
  if (tail_ >= 0) {
    blocks_[tail_].next = id;
  } else {
    head_ = id;
  }
  tail_ = id;
  ++num_free_;
}

void BlockPool::Unlink(int32_t id) {
  Block& b = blocks_[id];
  if (b.prev >= 0)
    blocks_[b.prev].next = b.next;
  else
    head_ = b.next;
  if (b.next >= 0)
    blocks_[b.next].prev = b.prev;
  else
    tail_ = b.prev;
  b.prev = b.next = -1;
  b.in_free_list = false;
  --num_free_;
}

std::optional<int32_t> BlockPool::Allocate() {
  if (head_ < 0) return std::nullopt;
  const int32_t id = head_;
  Unlink(id);
  blocks_[id].ref_count = 1;
  return id;
}

std::optional<std::vector<int32_t>> BlockPool::Allocate(int32_t n) {
  if (n > num_free_) return std::nullopt;
  std::vector<int32_t> ids;
  ids.reserve(n);
  for (int32_t i = 0; i < n; ++i) ids.push_back(*Allocate());
  return ids;
}

void BlockPool::AddRef(int32_t id) {
  Block& b = blocks_.at(id);
  PS_CHECK(b.ref_count > 0) << "AddRef on free block " << id;
  ++b.ref_count;
}

void BlockPool::Release(int32_t id) {
  Block& b = blocks_.at(id);
  PS_CHECK(b.ref_count > 0) << "Release of free block " << id << " in the " << TierName(tier_) << " tier";
  if (--b.ref_count == 0) PushBack(id);
}

std::vector<int32_t> BlockPool::FreeList() const {
  std::vector<int32_t> out;
  for (int32_t id = head_; id >= 0; id = blocks_[id].next) out.push_back(id);
  return out;
}

absl::Status BlockPool::VerifyIntegrity() const {
  const std::string tier(TierName(tier_));
  int32_t count = 0, prev = -1;
  for (int32_t id = head_; id >= 0; id = blocks_[id].next) {
    if (++count > num_blocks()) return absl::InternalError(tier + ": free list has a cycle");
    const Block& b = blocks_[id];
    if (!b.in_free_list || b.ref_count != 0) {
      return absl::InternalError(absl::StrCat(tier, ": block ", id, " listed free with ", b.ref_count, " references"));
    }
    if (b.prev != prev) return absl::InternalError(absl::StrCat(tier, ": broken back link at block ", id));
    prev = id;
  }
  if (prev != tail_) return absl::InternalError(tier + ": tail does not end the free list");
  if (count != num_free_)
    return absl::InternalError(absl::StrCat(tier, ": ", count, " listed, ", num_free_, " counted free"));
  for (int32_t id = 0; id < num_blocks(); ++id) {
    const Block& b = blocks_[id];
    if (!b.in_free_list && b.ref_count <= 0) {
      return absl::InternalError(absl::StrCat(tier, ": block ", id, " is neither free nor owned (lost)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ps
