// Space in a ring buffer for copies that finish in the order they were issued (one
// stream's): the CUDA backend's pinned staging of index arrays. Each allocation is
// contiguous; the ring hands out space ahead of the newest allocation and, when that
// space is still read by earlier copies, says how many of the oldest must be finished
// first: at least a quarter of the ring's worth at a time, so that the host waits for
// the device rarely rather than in step with it. Bookkeeping only (offsets); C++17
// (the CUDA backend includes it).
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>

#include "base/status.h"

namespace ps {

class RingSpace {
 public:
  explicit RingSpace(size_t capacity) : capacity_(capacity) {}

  struct Slot {
    size_t begin = 0;   // offset of the allocation
    size_t retire = 0;  // the oldest allocations that must be finished before it is written
  };
  // Room for `bytes` (at most a quarter of the ring; the caller makes a larger ring
  // otherwise). The allocations named by `retire` are forgotten.
  Slot Allocate(size_t bytes) {
    PS_CHECK(bytes > 0 && bytes <= capacity_ / 4) << "ring allocation of " << bytes << " in " << capacity_;
    Slot slot;
    // Live allocations run from the oldest one's start, ahead of head_, round to head_.
    // Past the end of the ring, the previous lap's allocations there go first.
    if (head_ + bytes > capacity_) {
      slot.retire += RetireFrom(head_, capacity_);
      head_ = 0;
    }
    if (!begins_.empty() && begins_.front() >= head_ && begins_.front() < head_ + bytes) {
      slot.retire += RetireFrom(head_, head_ + std::max(bytes, capacity_ / 4));
    }
    slot.begin = head_;
    begins_.push_back(head_);
    head_ += bytes;
    return slot;
  }
  // Allocations not yet retired, oldest first (their offsets).
  const std::deque<size_t>& live() const { return begins_; }
  size_t capacity() const { return capacity_; }

 private:
  // Forgets the oldest allocations that start in [from, to); returns how many.
  size_t RetireFrom(size_t from, size_t to) {
    size_t n = 0;
    while (!begins_.empty() && begins_.front() >= from && begins_.front() < to) {
      begins_.pop_front();
      ++n;
    }
    return n;
  }

  size_t capacity_;
  size_t head_ = 0;
  std::deque<size_t> begins_;
};

}  // namespace ps
