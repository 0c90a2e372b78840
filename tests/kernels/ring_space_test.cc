// RingSpace (kernels/ring_space.h): the CUDA backend's pinned staging hands out ring
// space that no copy still in flight reads, and waits for the device in bulk.
#include "kernels/ring_space.h"

#include <deque>
#include <random>
#include <utility>

#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(RingSpace, NeverHandsOutSpaceACopyInFlightStillReads) {
  constexpr size_t kCapacity = 4096;
  RingSpace ring(kCapacity);
  std::deque<std::pair<size_t, size_t>> live;  // [begin, end) of the copies in flight, oldest first
  std::mt19937 rng(3);
  size_t total = 0, waits = 0;
  for (int i = 0; i < 20000; ++i) {
    // Mostly small copies, now and then one of a quarter of the ring.
    const size_t bytes = rng() % 50 == 0 ? kCapacity / 4 : 64 * (1 + rng() % 4);
    const RingSpace::Slot slot = ring.Allocate(bytes);
    ASSERT_LE(slot.retire, live.size());
    for (size_t r = 0; r < slot.retire; ++r) live.pop_front();  // finished before the copy is written
    waits += slot.retire > 0;
    ASSERT_LE(slot.begin + bytes, kCapacity) << "allocation " << i;
    for (const auto& [b, e] : live) {
      ASSERT_TRUE(slot.begin + bytes <= b || e <= slot.begin)
          << "allocation " << i << " at [" << slot.begin << ", " << slot.begin + bytes << ") overlaps [" << b << ", "
          << e << ")";
    }
    live.emplace_back(slot.begin, slot.begin + bytes);
    ASSERT_EQ(ring.live().size(), live.size());
    total += bytes;
  }
  // A wait frees at least a quarter of the ring: about four waits a lap (wraps add some).
  EXPECT_GT(waits, 0u);
  EXPECT_LE(waits, 2 * total / (kCapacity / 4) + 2) << total << " bytes";
}

TEST(RingSpace, AllocationsLineUpUntilTheRingWraps) {
  RingSpace ring(1024);
  EXPECT_EQ(ring.Allocate(256).begin, 0u);
  EXPECT_EQ(ring.Allocate(256).begin, 256u);
  EXPECT_EQ(ring.Allocate(256).begin, 512u);
  const RingSpace::Slot fourth = ring.Allocate(256);
  EXPECT_EQ(fourth.begin, 768u);
  EXPECT_EQ(fourth.retire, 0u) << "the ring is not full yet";
  // The fifth starts the ring again over the first: the first must be finished.
  const RingSpace::Slot fifth = ring.Allocate(128);
  EXPECT_EQ(fifth.begin, 0u);
  EXPECT_EQ(fifth.retire, 1u);
  EXPECT_EQ(ring.live().size(), 4u);
}

}  // namespace
}  // namespace ps
