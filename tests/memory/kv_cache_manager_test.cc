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

std::vector<int32_t> Ids(const LayerTable& t) {
  std::vector<int32_t> out;
  for (const BlockLoc& b : t.blocks) out.push_back(b.id);
  return out;
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
  EXPECT_EQ(Ids(m_.Table(1, 0)), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(Ids(m_.Table(1, 1)), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(m_.BlocksNeeded(1, 12), 0);  // 20 + 12 = 32 fits in 2 blocks
  EXPECT_EQ(m_.BlocksNeeded(1, 13), 2);
  ASSERT_TRUE(m_.Append(2, 0, Positions(0, 16)));
  EXPECT_EQ(Ids(m_.Table(2, 0)), (std::vector<int32_t>{4}));
  // a layer holding a pruned subset of positions
  ASSERT_TRUE(m_.Append(2, 1, std::vector<int32_t>{0, 5, 15}));
  EXPECT_EQ(m_.Table(2, 1).positions, (std::vector<int32_t>{0, 5, 15}));
  EXPECT_EQ(Ids(m_.Table(2, 1)), (std::vector<int32_t>{5}));
  EXPECT_INTACT(m_);
  m_.Free(1);
  EXPECT_EQ(device_.FreeList(), (std::vector<int32_t>{6, 7, 8, 9, 10, 11, 0, 1, 2, 3}));
  EXPECT_FALSE(m_.Contains(1));
  EXPECT_INTACT(m_);
}

TEST_F(KvCacheManagerTest, NoRoomIsAValueAndChangesNothing) {
  ASSERT_TRUE(m_.Append(1, 0, Positions(0, 16 * 11)));  // 11 of 12 blocks
  EXPECT_FALSE(m_.Append(1, 1, Positions(0, 17)));       // needs 2
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

}  // namespace
}  // namespace ps
