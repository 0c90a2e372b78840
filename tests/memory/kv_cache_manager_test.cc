// KvCacheManager without a model: block tables per sequence and layer, exact
// block ids, swap plans between tiers, freeing both tiers, integrity after every
// operation.
#include <numeric>

#include "gtest/gtest.h"
#include "memory/kv_cache_manager.h"

namespace ps {
namespace {

#define EXPECT_INTACT(m) EXPECT_TRUE((m).VerifyIntegrity().ok()) << (m).VerifyIntegrity()

std::vector<int32_t> Positions(int from, int n) {
  std::vector<int32_t> p(n);
  std::iota(p.begin(), p.end(), from);
  return p;
}

class KvCacheManagerTest : public ::testing::Test {
 protected:
  BlockPool device_{Tier::kDevice, 12, 64};  // a dozen 16-token blocks
  BlockPool host_{Tier::kHost, 8, 64};
  KvCacheManager m_{device_, host_, /*n_layers=*/2, /*block_tokens=*/16};
};

TEST_F(KvCacheManagerTest, BlocksAreTakenAsSlotsNeedThem) {
  EXPECT_EQ(m_.BlocksNeeded(1, 20), 4);  // 2 blocks x 2 layers
  ASSERT_TRUE(m_.Append(1, 0, Positions(0, 20)));
  ASSERT_TRUE(m_.Append(1, 1, Positions(0, 20)));
  EXPECT_INTACT(m_);
  EXPECT_EQ(m_.Table(1, 0).blocks, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(m_.Table(1, 1).blocks, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(m_.BlocksNeeded(1, 12), 0);  // 20 + 12 = 32 fits in 2 blocks
  EXPECT_EQ(m_.BlocksNeeded(1, 13), 2);
  ASSERT_TRUE(m_.Append(2, 0, Positions(0, 16)));
  EXPECT_EQ(m_.Table(2, 0).blocks, (std::vector<int32_t>{4}));
  // a layer holding a pruned subset of positions
  ASSERT_TRUE(m_.Append(2, 1, std::vector<int32_t>{0, 5, 15}));
  EXPECT_EQ(m_.Table(2, 1).positions, (std::vector<int32_t>{0, 5, 15}));
  EXPECT_EQ(m_.Table(2, 1).blocks, (std::vector<int32_t>{5}));
  EXPECT_INTACT(m_);
  m_.Free(1);
  EXPECT_EQ(device_.FreeList(), (std::vector<int32_t>{6, 7, 8, 9, 10, 11, 0, 1, 2, 3}));
  EXPECT_FALSE(m_.Contains(1));
  EXPECT_INTACT(m_);
}

TEST_F(KvCacheManagerTest, NoRoomIsAValueAndChangesNothing) {
  ASSERT_TRUE(m_.Append(1, 0, Positions(0, 16 * 11)));  // 11 of 12 blocks
  EXPECT_FALSE(m_.Append(1, 1, Positions(0, 17)));      // needs 2
  EXPECT_TRUE(m_.Table(1, 1).positions.empty());
  EXPECT_EQ(device_.num_free(), 1);
  EXPECT_INTACT(m_);
  EXPECT_TRUE(m_.Append(1, 1, Positions(0, 16)));
  EXPECT_EQ(device_.num_free(), 0);
  EXPECT_INTACT(m_);
}

TEST_F(KvCacheManagerTest, SwapOutAndInPlanBlockCopies) {
  ASSERT_TRUE(m_.Append(7, 0, Positions(0, 30)));  // device 0, 1
  ASSERT_TRUE(m_.Append(7, 1, Positions(0, 30)));  // device 2, 3
  auto out = m_.PlanSwapOut(7);
  ASSERT_TRUE(out);
  ASSERT_EQ(out->copies.size(), 4u);
  EXPECT_EQ(out->copies[0].src, 0);
  EXPECT_EQ(out->copies[0].dst, 0);
  EXPECT_EQ(out->copies[3].src, 3);
  EXPECT_EQ(out->copies[3].dst_tier, Tier::kHost);
  EXPECT_EQ(m_.BlocksIn(7, Tier::kHost), 4);
  EXPECT_EQ(m_.BlocksIn(7, Tier::kDevice), 0);
  // While the copies run the device blocks stay owned by the plan.
  EXPECT_EQ(device_.num_free(), 8);
  EXPECT_FALSE(m_.Append(7, 0, Positions(30, 1)));  // its last block is on the host
  m_.Complete(*out);
  EXPECT_EQ(device_.num_free(), 12);
  EXPECT_INTACT(m_);
  auto in = m_.PlanSwapIn(7);
  ASSERT_TRUE(in);
  EXPECT_EQ(in->copies.size(), 4u);
  EXPECT_EQ(in->copies[0].dst_tier, Tier::kDevice);
  EXPECT_EQ(in->copies[0].dst, 4);  // the least recently freed device blocks come last
  m_.Complete(*in);
  EXPECT_EQ(m_.BlocksIn(7, Tier::kDevice), 4);
  EXPECT_EQ(host_.num_free(), 8);
  EXPECT_TRUE(m_.Append(7, 0, Positions(30, 1)));
  EXPECT_INTACT(m_);
}

TEST_F(KvCacheManagerTest, SwapOutFailsCleanlyWhenTheHostIsFull) {
  ASSERT_TRUE(m_.Append(1, 0, Positions(0, 16 * 9)));  // 9 blocks > 8 host blocks
  EXPECT_FALSE(m_.PlanSwapOut(1).has_value());
  EXPECT_EQ(host_.num_free(), 8);
  EXPECT_EQ(m_.BlocksIn(1, Tier::kDevice), 9);
  EXPECT_INTACT(m_);
}

TEST_F(KvCacheManagerTest, FreeReturnsBothTiersAtOnce) {
  ASSERT_TRUE(m_.Append(3, 0, Positions(0, 40)));
  auto out = m_.PlanSwapOut(3);
  ASSERT_TRUE(out);
  m_.Complete(*out);
  ASSERT_TRUE(m_.Append(3, 1, Positions(0, 20)));  // layer 1 on the device tier
  EXPECT_EQ(m_.BlocksIn(3, Tier::kHost), 3);
  EXPECT_EQ(m_.BlocksIn(3, Tier::kDevice), 2);
  m_.Free(3);
  EXPECT_EQ(device_.num_free(), 12);
  EXPECT_EQ(host_.num_free(), 8);
  EXPECT_INTACT(m_);
}

// Metered (the serving path): appends and swap-ins draw on the step's reservation
// only; reservations cannot exceed what is available (counting the device blocks of
// planned swap-outs), and lapse at EndStep.
TEST(KvCacheManagerMetered, AppendsDrawOnReservationsOnly) {
  BlockPool device(Tier::kDevice, 12, 64), host(Tier::kHost, 8, 64);
  KvCacheManager m(device, host, {.n_layers = 2, .block_tokens = 16, .metered = true});
  EXPECT_FALSE(m.Append(1, 0, Positions(0, 4))) << "no reservation, no block";
  EXPECT_EQ(device.num_free(), 12);
  ASSERT_TRUE(m.Reserve(1, 2));
  EXPECT_EQ(m.Available(Tier::kDevice), 10);
  ASSERT_TRUE(m.Append(1, 0, Positions(0, 20)));  // 2 blocks
  EXPECT_FALSE(m.Append(1, 1, Positions(0, 4))) << "the reservation is spent";
  EXPECT_EQ(m.Reserved(1), 0);
  EXPECT_FALSE(m.Reserve(2, 11)) << "10 free blocks, not 11";
  ASSERT_TRUE(m.Reserve(2, 10));
  EXPECT_EQ(m.Available(Tier::kDevice), 0);
  m.EndStep();
  EXPECT_EQ(m.Available(Tier::kDevice), 10);
  EXPECT_EQ(m.Reserved(2), 0);
  // A planned swap-out makes its device blocks available to this step's reservations.
  auto out = m.PlanSwapOut(1);
  ASSERT_TRUE(out);
  EXPECT_EQ(device.num_free(), 10) << "read by the copy until it completes";
  EXPECT_EQ(m.Available(Tier::kDevice), 12);
  ASSERT_TRUE(m.Reserve(2, 12));
  m.Complete(*out);
  EXPECT_EQ(device.num_free(), 12);
  ASSERT_TRUE(m.Append(2, 0, Positions(0, 16 * 6)));
  ASSERT_TRUE(m.Append(2, 1, Positions(0, 16 * 6)));
  EXPECT_EQ(device.num_free(), 0);
  m.EndStep();
  // Swapping back in needs a reservation too.
  m.Free(2);
  EXPECT_FALSE(m.PlanSwapIn(1).has_value());
  ASSERT_TRUE(m.Reserve(1, 2));
  auto in = m.PlanSwapIn(1);
  ASSERT_TRUE(in);
  m.Complete(*in);
  EXPECT_EQ(m.BlocksIn(1, Tier::kDevice), 2);
  EXPECT_INTACT(m);
}

// A scratch sequence (a prefix pass: ~owner) draws on its owner's reservation, and
// what it frees goes back to the owner in the same step.
TEST(KvCacheManagerMetered, ScratchPassesShareTheOwnersReservation) {
  BlockPool device(Tier::kDevice, 12, 64), host(Tier::kHost, 8, 64);
  KvCacheManager m(device, host, {.n_layers = 2, .block_tokens = 16, .metered = true});
  ASSERT_TRUE(m.Reserve(5, 4));
  ASSERT_TRUE(m.Append(~int64_t{5}, 0, Positions(0, 32)));
  ASSERT_TRUE(m.Append(~int64_t{5}, 1, Positions(0, 32)));
  EXPECT_EQ(m.Reserved(5), 0);
  m.Free(~int64_t{5});
  EXPECT_EQ(m.Reserved(5), 4);
  ASSERT_TRUE(m.Append(5, 0, Positions(0, 32)));
  ASSERT_TRUE(m.Append(5, 1, Positions(0, 32)));
  EXPECT_INTACT(m);
}

// Single blocks move between tiers (a strategy's offload): the table points at the
// new block at once, the old one is released when the copy completes and, for the
// device tier, credited to the sequence's reservation, so it can come back.
TEST(KvCacheManagerMetered, PerBlockMovesAndBack) {
  BlockPool device(Tier::kDevice, 12, 64), host(Tier::kHost, 8, 64);
  KvCacheManager m(device, host, {.n_layers = 2, .block_tokens = 16, .metered = true});
  ASSERT_TRUE(m.Reserve(1, 4));
  ASSERT_TRUE(m.Append(1, 0, Positions(0, 32)));  // device 0, 1
  ASSERT_TRUE(m.Append(1, 1, Positions(0, 32)));  // device 2, 3
  EXPECT_EQ(m.Reserved(1), 0);
  const int32_t first[] = {0};
  auto out = m.PlanMove(1, 0, first, Tier::kHost);
  ASSERT_TRUE(out);
  ASSERT_EQ(out->copies.size(), 1u);
  EXPECT_EQ(out->copies[0].src, 0);
  EXPECT_EQ(out->copies[0].dst, 0);
  EXPECT_EQ(m.Table(1, 0).tiers[0], Tier::kHost);
  EXPECT_EQ(m.Table(1, 0).blocks[0], 0);
  EXPECT_EQ(m.BlocksIn(1, Tier::kHost), 1);
  EXPECT_FALSE(m.PlanMove(1, 0, first, Tier::kDevice).has_value()) << "no reserved block to come back to yet";
  m.Complete(*out);
  EXPECT_EQ(m.Reserved(1), 1) << "the released device block is the sequence's again";
  auto back = m.PlanMove(1, 0, first, Tier::kDevice);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->copies[0].dst, 4) << "the front of the free list (block 0 went to its back)";
  m.Complete(*back);
  EXPECT_EQ(m.Table(1, 0).tiers[0], Tier::kDevice);
  EXPECT_EQ(m.Table(1, 0).blocks[0], 4);
  EXPECT_EQ(host.num_free(), 7) << "host block 0 stays as the page's clean copy";
  EXPECT_INTACT(m);
  // The second offload of the page copies nothing: the device block is released and
  // the table points at the clean copy again.
  auto again = m.PlanMove(1, 0, first, Tier::kHost);
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->copies.empty());
  ASSERT_EQ(again->release_after.size(), 1u);
  EXPECT_EQ(again->release_after[0], (BlockLoc{Tier::kDevice, 4}));
  EXPECT_EQ(m.Table(1, 0).tiers[0], Tier::kHost);
  EXPECT_EQ(m.Table(1, 0).blocks[0], 0);
  EXPECT_EQ(host.num_free(), 7);
  m.Complete(*again);
  EXPECT_EQ(m.Reserved(1), 1) << "the released device block is credited as after a copy";
  EXPECT_INTACT(m);
  const int32_t out_of_range[] = {5};
  EXPECT_FALSE(m.PlanMove(1, 0, out_of_range, Tier::kHost).has_value());
  m.EndStep();
  EXPECT_INTACT(m);
}

// A clean copy goes stale when an append writes its page, and is freed with the
// sequence; a swap-out of the whole sequence uses the copies it finds.
TEST(KvCacheManagerMetered, HostCopiesGoStaleOnAppendAndFreeWithTheSequence) {
  BlockPool device(Tier::kDevice, 12, 64), host(Tier::kHost, 8, 64);
  KvCacheManager m(device, host, {.n_layers = 1, .block_tokens = 16, .metered = true});
  ASSERT_TRUE(m.Reserve(1, 6));
  ASSERT_TRUE(m.Append(1, 0, Positions(0, 40)));  // pages 0, 1 full; page 2 holds 8 of 16
  const int32_t pages[] = {1, 2};
  for (Tier to : {Tier::kHost, Tier::kDevice}) {
    auto plan = m.PlanMove(1, 0, pages, to);
    ASSERT_TRUE(plan);
    EXPECT_EQ(plan->copies.size(), 2u);
    m.Complete(*plan);
  }
  EXPECT_EQ(host.num_free(), 6) << "two clean copies";
  ASSERT_TRUE(m.Append(1, 0, Positions(40, 4)));  // writes page 2
  EXPECT_EQ(host.num_free(), 7) << "page 2's copy is stale and freed";
  EXPECT_INTACT(m);
  auto swap = m.PlanSwapOut(1);
  ASSERT_TRUE(swap);
  EXPECT_EQ(swap->copies.size(), 2u) << "pages 0 and 2; page 1 uses its clean copy";
  EXPECT_EQ(swap->release_after.size(), 3u);
  m.Complete(*swap);
  EXPECT_EQ(m.BlocksIn(1, Tier::kHost), 3);
  EXPECT_EQ(host.num_free(), 5);
  EXPECT_INTACT(m);
  auto in = m.PlanSwapIn(1);
  ASSERT_TRUE(in);
  EXPECT_EQ(in->copies.size(), 3u);
  m.Complete(*in);
  EXPECT_EQ(host.num_free(), 8) << "a swap-in keeps no copies";
  const int32_t page0[] = {0};
  for (Tier to : {Tier::kHost, Tier::kDevice}) {
    auto plan = m.PlanMove(1, 0, page0, to);
    ASSERT_TRUE(plan);
    m.Complete(*plan);
  }
  EXPECT_EQ(host.num_free(), 7);
  EXPECT_INTACT(m);
  m.Free(1);
  EXPECT_EQ(host.num_free(), 8);
  EXPECT_EQ(device.num_free(), 12);
  m.EndStep();
  EXPECT_INTACT(m);
}

// Pages of several blocks (K and V here): a block dropped from a page is freed at
// once and credited to the reservation; moves, swaps and Free skip it; the rest of
// the page stays.
TEST(KvCacheManagerMetered, BlocksDroppedFromPages) {
  BlockPool device(Tier::kDevice, 12, 64), host(Tier::kHost, 8, 64);
  KvCacheManager m(device, host, {.n_layers = 1, .block_tokens = 16, .metered = true, .blocks_per_page = 2});
  EXPECT_EQ(m.BlocksNeeded(1, 40), 6) << "3 pages of 2 blocks";
  ASSERT_TRUE(m.Reserve(1, 6));
  ASSERT_TRUE(m.Append(1, 0, Positions(0, 40)));
  // Each of a page's blocks (K, V) from its own run of the pool's ids: page after page,
  // the K blocks are 0, 1, 2 and the V blocks 3, 4, 5.
  EXPECT_EQ(m.Table(1, 0).blocks, (std::vector<int32_t>{0, 3, 1, 4, 2, 5}));
  const int32_t first_two[] = {0, 1};
  EXPECT_EQ(m.Drop(1, 0, first_two, 0), 2);
  EXPECT_EQ(m.Drop(1, 0, first_two, 0), 0) << "dropped already";
  constexpr int32_t kNone = LayerTable::kDropped;
  EXPECT_EQ(m.Table(1, 0).blocks, (std::vector<int32_t>{kNone, 3, kNone, 4, 2, 5}));
  EXPECT_EQ(m.BlocksIn(1, Tier::kDevice), 4);
  EXPECT_EQ(m.Reserved(1), 2) << "the freed device blocks fund this step's appends";
  EXPECT_EQ(device.num_free(), 8);
  EXPECT_INTACT(m);
  // A page moves with the blocks it has left.
  const int32_t page0[] = {0};
  auto out = m.PlanMove(1, 0, page0, Tier::kHost);
  ASSERT_TRUE(out);
  ASSERT_EQ(out->copies.size(), 1u);
  EXPECT_EQ(out->copies[0].src, 3);
  m.Complete(*out);
  EXPECT_EQ(m.Table(1, 0).tiers[0], Tier::kHost);
  EXPECT_EQ(m.BlocksIn(1, Tier::kHost), 1);
  EXPECT_INTACT(m);
  auto swap = m.PlanSwapOut(1);
  ASSERT_TRUE(swap);
  EXPECT_EQ(swap->copies.size(), 3u) << "pages 1 and 2: one block and two";
  m.Complete(*swap);
  EXPECT_EQ(m.BlocksIn(1, Tier::kHost), 4);
  const int32_t page2[] = {2};
  EXPECT_EQ(m.Drop(1, 0, page2, 1), 1) << "a host block is dropped too";
  EXPECT_EQ(host.num_free(), 5);
  EXPECT_INTACT(m);
  m.Free(1);
  EXPECT_EQ(device.num_free(), 12);
  EXPECT_EQ(host.num_free(), 8);
  m.EndStep();
  EXPECT_INTACT(m);
}

// The Aux Cache: rows by key in host-tier blocks, straddling blocks, slots reused,
// every block back on release; a full host tier is a value.
TEST(HostRowStore, RowsInHostBlocks) {
  BlockPool device(Tier::kDevice, 4, 64), host(Tier::kHost, 3, 64);
  KvCacheManager m(device, host, {.n_layers = 1, .block_tokens = 16, .host_row_bytes = 24});
  HostRowStore& aux = m.host_rows();
  std::vector<uint8_t> row(24), got(24);
  for (int k = 0; k < 8; ++k) {  // 8 rows x 24 bytes = 192 bytes: all three 64-byte blocks, rows straddling them
    for (int i = 0; i < 24; ++i) row[i] = static_cast<uint8_t>(k * 24 + i);
    ASSERT_TRUE(aux.Put(7, 100 + k, row.data())) << k;
  }
  EXPECT_EQ(aux.Blocks(7), 3);
  EXPECT_EQ(host.num_free(), 0);
  EXPECT_FALSE(aux.Put(7, 200, row.data())) << "the host tier is full";
  EXPECT_FALSE(aux.Put(8, 200, row.data()));
  for (int k : {2, 5}) {  // row 2 straddles blocks 0 and 1, row 5 blocks 1 and 2
    ASSERT_TRUE(aux.Take(7, 100 + k, got.data()));
    for (int i = 0; i < 24; ++i) EXPECT_EQ(got[i], static_cast<uint8_t>(k * 24 + i)) << k << " " << i;
  }
  EXPECT_FALSE(aux.Contains(7, 102));
  EXPECT_FALSE(aux.Take(7, 102, got.data()));
  EXPECT_TRUE(aux.Put(7, 300, row.data())) << "a freed slot is reused";
  EXPECT_EQ(aux.Rows(7), 7);
  EXPECT_INTACT(m);
  m.Free(7);  // the sequence's tables and Aux Cache together
  EXPECT_EQ(host.num_free(), 3);
  EXPECT_EQ(aux.Rows(7), 0);
  EXPECT_INTACT(m);
}

}  // namespace
}  // namespace ps
