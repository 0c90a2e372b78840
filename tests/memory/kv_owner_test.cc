// The KV owner without a model: shared blocks (a fork, the basis of n > 1), copy on
// write of a shared last page, a shared block moved while both hold it, a release
// while copies are in flight, a read waiting for the copies of its blocks, the bytes
// each sequence reads, and every block back in the free lists at the end; then 10,000 random operations against a
// reference model of the counts (tests/memory/kv_owner_ops.h, also the libFuzzer target's).
#include <memory>
#include <random>
#include <vector>

#include "base/thread_pool.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "memory/kv_cache.h"
#include "tests/memory/kv_owner_ops.h"

namespace ps {
namespace {

#define EXPECT_INTACT(m) EXPECT_TRUE((m).VerifyIntegrity().ok()) << (m).VerifyIntegrity()

constexpr int kLayers = 2, kBlockTokens = 4, kKvDim = 8;
constexpr int kPerPage = 2;  // one KV head: its K block and its V block

class KvOwnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto kv = KvCache::Create(KvCacheOptions{.geometry = {.n_layers = kLayers,
                                                          .block_tokens = kBlockTokens,
                                                          .kv_dim = kKvDim,
                                                          .n_kv_heads = 1,
                                                          .dtype = DType::kF32},
                                             .device_blocks = 48,
                                             .host_blocks = 32},
                              backend_);
    ASSERT_TRUE(kv.ok()) << kv.status();
    kv_ = std::move(*kv);
  }
  void TearDown() override {
    EXPECT_INTACT(m());
    EXPECT_EQ(m().UsedBlocks(Tier::kDevice), 0) << "every block back in the free lists";
    EXPECT_EQ(m().UsedBlocks(Tier::kHost), 0);
  }
  KvCacheManager& m() { return kv_->manager(); }

  // The value of a row's element: its sequence's mark and its position.
  static float Value(int mark, int32_t position, int col, bool key) {
    return static_cast<float>(mark * 1000 + position * 10 + col) * (key ? 1.0f : -1.0f);
  }
  // Positions [from, from + n) at every layer, rows marked `mark`.
  void Append(int64_t seq, int32_t from, int n, int mark) {
    std::vector<int32_t> positions(n);
    std::vector<float> k(n * kKvDim), v(n * kKvDim);
    for (int i = 0; i < n; ++i) {
      positions[i] = from + i;
      for (int c = 0; c < kKvDim; ++c) {
        k[i * kKvDim + c] = Value(mark, from + i, c, true);
        v[i * kKvDim + c] = Value(mark, from + i, c, false);
      }
    }
    for (int l = 0; l < kLayers; ++l) ASSERT_TRUE(kv_->Append(seq, l, positions, k.data(), v.data()).ok());
  }
  // The marks of the sequence's rows at every layer, one per position (-1: a row
  // whose elements are not one mark's), as attention reads them.
  std::vector<int> Marks(int64_t seq) {
    std::vector<int> marks;
    for (int l = 0; l < kLayers; ++l) {
      absl::StatusOr<KvRows> rows = kv_->View(seq, l, nullptr);
      EXPECT_TRUE(rows.ok()) << rows.status();
      if (!rows.ok()) return {};
      std::vector<int> layer;
      for (int64_t j = 0; j < rows->n; ++j) {
        const int32_t pos = rows->positions[j];
        const int mark = static_cast<int>(*static_cast<const float*>(rows->k(j, 0)) / 1000);
        bool whole = true;
        for (int c = 0; c < kKvDim; ++c) {
          whole = whole && *static_cast<const float*>(rows->k(j, c)) == Value(mark, pos, c, true) &&
                  *static_cast<const float*>(rows->v(j, c)) == Value(mark, pos, c, false);
        }
        layer.push_back(whole ? mark : -1);
      }
      if (l == 0) {
        marks = layer;
      } else {
        EXPECT_EQ(layer, marks) << "layer " << l;
      }
    }
    return marks;
  }
  static std::vector<int> Runs(std::initializer_list<std::pair<int, int>> runs) {  // (mark, count)...
    std::vector<int> out;
    for (auto [mark, n] : runs) out.insert(out.end(), n, mark);
    return out;
  }
  // Runs the whole-sequence move of `plan` to completion.
  void Finish(const SwapPlan& plan) { ASSERT_TRUE(kv_->Finish(kv_->Submit(plan), plan).ok()); }

  ThreadPool pool_{1};
  CpuBackend backend_{pool_};
  std::unique_ptr<KvCache> kv_;
};

TEST_F(KvOwnerTest, SharedPrefixOutlivesTheCancelOfOneSharer) {
  Append(1, 0, 6, 1);  // 6 tokens: a full page and a half-filled one per layer
  kv_->Fork(1, 2);
  EXPECT_EQ(m().UsedBlocks(Tier::kDevice), kLayers * 2 * kPerPage) << "the fork shares every block";
  EXPECT_EQ(m().BlocksIn(2, Tier::kDevice), kLayers * 2 * kPerPage);
  EXPECT_EQ(m().BlocksNeeded(2, 1), kLayers * kPerPage) << "its shared half-filled page is copied first";
  EXPECT_EQ(m().BlocksNeeded(2, 3), kLayers * 2 * kPerPage) << "the copy and one new page";
  Append(2, 6, 1, 2);  // the shared last page is copied, then written
  EXPECT_EQ(m().UsedBlocks(Tier::kDevice), kLayers * 3 * kPerPage);
  EXPECT_EQ(m().BlocksNeeded(1, 1), 0) << "its last page is its own again";
  Append(1, 6, 1, 1);
  EXPECT_EQ(m().UsedBlocks(Tier::kDevice), kLayers * 3 * kPerPage);
  EXPECT_INTACT(m());
  EXPECT_EQ(Marks(1), Runs({{1, 7}}));
  EXPECT_EQ(Marks(2), Runs({{1, 6}, {2, 1}}));

  m().Release(1);  // the first sharer is cancelled
  EXPECT_EQ(m().UsedBlocks(Tier::kDevice), kLayers * 2 * kPerPage) << "the shared page stays, held by 2";
  Append(2, 7, 5, 2);  // into a third page
  EXPECT_EQ(Marks(2), Runs({{1, 6}, {2, 6}}));
  EXPECT_INTACT(m());
  m().Release(2);
}

TEST_F(KvOwnerTest, SharedBlocksMovedToTheHostTierWhileBothHoldThem) {
  Append(1, 0, 8, 1);  // two full pages per layer
  kv_->Fork(1, 2);
  const int64_t held = kLayers * 2 * kPerPage;
  const int64_t available = m().Available(Tier::kDevice);
  std::optional<SwapPlan> out = m().PlanSwapOut(1);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->copies.size(), static_cast<size_t>(held));
  EXPECT_EQ(out->device_frees, 0) << "sequence 2 still holds every block";
  EXPECT_EQ(m().Available(Tier::kDevice), available) << "no device block is freed by this move";
  EXPECT_INTACT(m());
  Finish(*out);
  EXPECT_EQ(m().BlocksIn(1, Tier::kHost), held);
  EXPECT_EQ(m().BlocksIn(2, Tier::kDevice), held);
  EXPECT_EQ(m().UsedBlocks(Tier::kDevice), held);
  EXPECT_EQ(m().UsedBlocks(Tier::kHost), held);
  EXPECT_EQ(Marks(2), Runs({{1, 8}})) << "the holder that stayed reads its rows";

  std::optional<SwapPlan> in = m().PlanSwapIn(1);
  ASSERT_TRUE(in.has_value());
  Finish(*in);
  EXPECT_EQ(Marks(1), Runs({{1, 8}})) << "the one that moved out and back reads the same rows";
  EXPECT_EQ(m().UsedBlocks(Tier::kDevice), 2 * held) << "no longer shared";
  EXPECT_EQ(m().UsedBlocks(Tier::kHost), 0);

  // Now sequence 2's blocks are its own: moving them out frees them, but only once
  // the copy is done, and a release meanwhile waits for that copy.
  std::optional<SwapPlan> out2 = m().PlanSwapOut(2);
  ASSERT_TRUE(out2.has_value());
  EXPECT_EQ(out2->device_frees, held);
  const SwapTicket ticket = kv_->Submit(*out2);
  m().Release(2);  // cancelled while its copy is in flight
  EXPECT_EQ(m().InFlight(2), 1);
  EXPECT_EQ(m().UsedBlocks(Tier::kDevice), 2 * held) << "the copy still reads them";
  EXPECT_INTACT(m());
  ASSERT_TRUE(kv_->Finish(ticket, *out2).ok());
  EXPECT_EQ(m().UsedBlocks(Tier::kDevice), held);
  EXPECT_EQ(m().UsedBlocks(Tier::kHost), 0) << "its host blocks went with its release";
  EXPECT_FALSE(m().Contains(2));
  m().Release(1);
}

TEST_F(KvOwnerTest, ForkThenFreeInEitherOrder) {
  Append(1, 0, 5, 1);
  kv_->Fork(1, 2);
  kv_->Fork(2, 3);
  EXPECT_EQ(m().UsedBlocks(Tier::kDevice), kLayers * 2 * kPerPage);
  m().Release(1);  // the parent first
  EXPECT_EQ(m().UsedBlocks(Tier::kDevice), kLayers * 2 * kPerPage);
  EXPECT_EQ(Marks(2), Runs({{1, 5}}));
  Append(3, 5, 1, 3);
  Append(2, 5, 2, 2);
  EXPECT_EQ(m().UsedBlocks(Tier::kDevice), kLayers * 3 * kPerPage)
      << "the shared first page, 3's copy of the last one, 2's own last one (1 let go of it)";
  EXPECT_EQ(Marks(3), Runs({{1, 5}, {3, 1}}));
  EXPECT_EQ(Marks(2), Runs({{1, 5}, {2, 2}}));
  m().Release(3);  // then a child, then the other
  EXPECT_EQ(Marks(2), Runs({{1, 5}, {2, 2}}));
  m().Release(2);
}

// The owner's rule: a read (View) waits for the copies of the blocks it reads, and
// only for those: a move's plan stays in flight until a read of its layer.
TEST_F(KvOwnerTest, AReadWaitsForTheCopiesOfTheBlocksItReads) {
  Append(1, 0, 8, 1);
  const int32_t page = 0;
  ASSERT_TRUE(kv_->Move(1, 0, {&page, 1}, Tier::kHost).ok());
  EXPECT_EQ(m().InFlight(1), 1);
  ASSERT_TRUE(kv_->View(1, 1, nullptr).ok());
  EXPECT_EQ(m().InFlight(1), 1) << "layer 1 reads none of the blocks being copied";
  EXPECT_EQ(kv_->View(1, 0, nullptr).status().code(), absl::StatusCode::kFailedPrecondition)
      << "page 0 of layer 0 is in the host tier";
  EXPECT_EQ(m().InFlight(1), 0) << "the read of layer 0 waited for its copy first";
  ASSERT_TRUE(kv_->Move(1, 0, {&page, 1}, Tier::kDevice).ok());
  EXPECT_EQ(m().InFlight(1), 1);
  EXPECT_EQ(Marks(1), Runs({{1, 8}})) << "the rows that came back";
  EXPECT_EQ(m().InFlight(1), 0);
  m().Release(1);
}

TEST(KvOwnerOps, TenThousandRandomOperationsMatchTheReference) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    testing::KvOwnerOps ops;
    std::mt19937 rng(seed);
    for (int i = 0; i < 10000; ++i) {
      const auto op = static_cast<uint8_t>(rng()), a = static_cast<uint8_t>(rng()), b = static_cast<uint8_t>(rng());
      const absl::Status st = ops.Apply(op, a, b);
      ASSERT_TRUE(st.ok()) << "seed " << seed << ", operation " << i << ": " << st;
    }
    const absl::Status drained = ops.Drain();
    ASSERT_TRUE(drained.ok()) << "seed " << seed << ": " << drained;
    const testing::KvOwnerOps::Counts& n = ops.counts();
    EXPECT_GT(n.forks, 100);
    EXPECT_GT(n.copies_on_write, 10);
    EXPECT_GT(n.refused, 100) << "operations the tiers had no room for";
    EXPECT_GT(n.shared_moved, 100) << "shared blocks moved by one holder";
    EXPECT_GT(n.cancels_in_flight, 100) << "releases while copies were in flight";
    EXPECT_GT(n.drops, 100);
  }
}

}  // namespace
}  // namespace ps
