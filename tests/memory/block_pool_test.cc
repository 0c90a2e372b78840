// BlockPool without a model: exact block ids and free-list order after sequences
// of allocations and releases, reference counts, integrity after every operation.
#include "memory/block_pool.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

#define EXPECT_INTACT(pool) EXPECT_TRUE((pool).VerifyIntegrity().ok()) << (pool).VerifyIntegrity()

TEST(BlockPool, AllocatesFromTheFrontAndReturnsToTheBack) {
  BlockPool pool(Tier::kDevice, 10, 64);
  EXPECT_INTACT(pool);
  EXPECT_EQ(pool.FreeList(), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  auto a = pool.Allocate(3);
  ASSERT_TRUE(a);
  EXPECT_EQ(*a, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_INTACT(pool);
  auto b = pool.Allocate(4);
  EXPECT_EQ(*b, (std::vector<int32_t>{3, 4, 5, 6}));
  EXPECT_EQ(pool.num_free(), 3);
  // Release a in reverse order: they go to the back in that order.
  for (auto it = a->rbegin(); it != a->rend(); ++it) {
    pool.Release(*it);
    EXPECT_INTACT(pool);
  }
  EXPECT_EQ(pool.FreeList(), (std::vector<int32_t>{7, 8, 9, 2, 1, 0}));
  // The next allocation takes the least recently freed blocks first.
  auto c = pool.Allocate(4);
  EXPECT_EQ(*c, (std::vector<int32_t>{7, 8, 9, 2}));
  EXPECT_EQ(pool.FreeList(), (std::vector<int32_t>{1, 0}));
  EXPECT_FALSE(pool.Allocate(3).has_value());  // all or none
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_INTACT(pool);
}

TEST(BlockPool, ReferenceCountsDelayTheReturn) {
  BlockPool pool(Tier::kHost, 4, 16);
  const int32_t id = *pool.Allocate();
  pool.AddRef(id);
  EXPECT_EQ(pool.ref_count(id), 2);
  pool.Release(id);
  EXPECT_EQ(pool.ref_count(id), 1);
  EXPECT_EQ(pool.FreeList(), (std::vector<int32_t>{1, 2, 3}));
  pool.Release(id);
  EXPECT_EQ(pool.FreeList(), (std::vector<int32_t>{1, 2, 3, 0}));
  EXPECT_INTACT(pool);
}

TEST(BlockPool, EmptyPoolAndExhaustion) {
  BlockPool empty(Tier::kDevice, 0, 8);
  EXPECT_FALSE(empty.Allocate().has_value());
  EXPECT_INTACT(empty);
  BlockPool pool(Tier::kDevice, 2, 8);
  EXPECT_TRUE(pool.Allocate());
  EXPECT_TRUE(pool.Allocate());
  EXPECT_FALSE(pool.Allocate().has_value());
  EXPECT_TRUE(pool.FreeList().empty());
  EXPECT_INTACT(pool);
}

TEST(BlockPool, DataIsIndexedByBlockId) {
  BlockPool pool(Tier::kDevice, 3, 100);
  EXPECT_EQ(pool.data(2) - pool.data(0), 200);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pool.data(0)) % 64, 0u);
}

TEST(BlockPoolDeathTest, DoubleReleaseIsCaughtInReleaseBuilds) {
  BlockPool pool(Tier::kDevice, 2, 8);
  const int32_t id = *pool.Allocate();
  pool.Release(id);
  EXPECT_DEATH(pool.Release(id), "Release of free block 0 in the device tier");
}

// Random operations keep the pool consistent: every block free xor owned.
TEST(BlockPool, RandomOperationsKeepIntegrity) {
  BlockPool pool(Tier::kDevice, 12, 8);
  std::vector<int32_t> owned;
  uint32_t state = 7;
  auto rnd = [&] { return (state = state * 1103515245u + 12345u) >> 16; };
  for (int step = 0; step < 2000; ++step) {
    if (owned.empty() || (rnd() % 2 == 0 && pool.num_free() > 0)) {
      owned.push_back(*pool.Allocate());
    } else {
      const size_t i = rnd() % owned.size();
      pool.Release(owned[i]);
      owned.erase(owned.begin() + static_cast<std::ptrdiff_t>(i));
    }
    ASSERT_TRUE(pool.VerifyIntegrity().ok()) << "step " << step;
    ASSERT_EQ(pool.num_free() + static_cast<int32_t>(owned.size()), 12);
  }
}

}  // namespace
}  // namespace ps
