// The CUDA swap engine: random blocks survive host -> device -> host bit for bit,
// with many tickets in flight (waited in reverse order) and coalesced runs; a bad
// block id is an error, not a copy. Skips without a GPU.
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "base/status.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_kernels.h"
#include "memory/cuda_swap_engine.h"

namespace ps {
namespace {

class CudaSwapEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

// Both tiers of `blocks` blocks on the GPU (device memory, pinned host memory), the host
// tier holding random bytes (`want`).
struct SwapTiers {
  SwapTiers(int32_t blocks, size_t block_bytes, uint32_t seed) : want(blocks * block_bytes) {
    auto device_mem = cuda::AllocateDevice(blocks * block_bytes);
    auto host_mem = cuda::AllocatePinned(blocks * block_bytes);
    PS_CHECK(device_mem.ok() && host_mem.ok()) << "tier memory";
    device = std::make_unique<BlockPool>(Tier::kDevice, blocks, block_bytes, std::move(*device_mem));
    host = std::make_unique<BlockPool>(Tier::kHost, blocks, block_bytes, std::move(*host_mem));
    std::mt19937 rng(seed);
    for (auto& b : want) b = static_cast<uint8_t>(rng());
    std::memcpy(host->data(0), want.data(), want.size());
  }
  std::vector<uint8_t> want;
  std::unique_ptr<BlockPool> device, host;
};

TEST_F(CudaSwapEngineTest, SwapEngineRoundTripsBlocks) {
  constexpr int32_t kBlocks = 64;
  constexpr size_t kBlockBytes = 4096;
  SwapTiers tiers(kBlocks, kBlockBytes, 5);
  BlockPool &device = *tiers.device, &host = *tiers.host;
  const std::vector<uint8_t>& want = tiers.want;
  auto engine = cuda::CudaSwapEngine::Create(device, host);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<SwapTicket> tickets;
  for (int32_t i = 0; i < kBlocks; i += 4) {  // host block i -> device block 63 - i, in runs and single blocks
    std::vector<BlockCopy> copies;
    for (int32_t j = i; j < i + 4; ++j) copies.push_back({Tier::kHost, j, Tier::kDevice, j});
    tickets.push_back((*engine)->Submit(copies));
  }
  for (auto it = tickets.rbegin(); it != tickets.rend(); ++it) ASSERT_TRUE((*engine)->Wait(*it).ok());
  std::memset(host.data(0), 0, want.size());
  std::vector<BlockCopy> back;
  for (int32_t j = kBlocks - 1; j >= 0; --j) back.push_back({Tier::kDevice, j, Tier::kHost, j});
  ASSERT_TRUE((*engine)->Wait((*engine)->Submit(back)).ok());
  EXPECT_EQ(std::memcmp(host.data(0), want.data(), want.size()), 0);
  EXPECT_EQ((*engine)->bytes_to_device(), kBlocks * kBlockBytes);
  EXPECT_EQ((*engine)->bytes_to_host(), kBlocks * kBlockBytes);
  const SwapTicket bad = (*engine)->Submit({{Tier::kDevice, 0, Tier::kHost, kBlocks}});
  EXPECT_EQ((*engine)->Wait(bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*engine)->Wait(12345).code(), absl::StatusCode::kInvalidArgument);
}

// A copy that fails after others of its batch were queued: the error returns only once
// those are done (the caller then reuses the blocks). The first copy is 64 MiB from
// device to pinned host memory, in flight for milliseconds when the second fails.
TEST_F(CudaSwapEngineTest, SwapEngineErrorWaitsForTheBatchsCopiesInFlight) {
  constexpr int32_t kBlocks = 33;
  constexpr size_t kBlockBytes = 2 << 20;
  SwapTiers tiers(kBlocks, kBlockBytes, 6);
  BlockPool &device = *tiers.device, &host = *tiers.host;
  const std::vector<uint8_t>& want = tiers.want;
  int copies = 0;
  auto engine = cuda::CudaSwapEngine::Create(device, host, nullptr, [&]() -> absl::Status {
    ++copies;
    return copies == 3 ? absl::DataLossError("injected copy failure") : absl::OkStatus();
  });
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<BlockCopy> up;
  for (int32_t j = 0; j < kBlocks; ++j) up.push_back({Tier::kHost, j, Tier::kDevice, j});
  ASSERT_TRUE((*engine)->Wait((*engine)->Submit(up)).ok());  // one copy
  std::memset(host.data(0), 0, want.size());
  // Blocks 0-31 back as one copy, then block 32 to host block 32 fails.
  std::vector<BlockCopy> down;
  for (int32_t j = 0; j < kBlocks - 1; ++j) down.push_back({Tier::kDevice, j, Tier::kHost, j});
  down.push_back({Tier::kDevice, kBlocks - 1, Tier::kHost, kBlocks - 1});
  down[kBlocks - 1].src = 0;  // not consecutive: a copy of its own
  const SwapTicket bad = (*engine)->Submit(down);
  EXPECT_EQ(std::memcmp(host.data(0), want.data(), (kBlocks - 1) * kBlockBytes), 0)
      << "Submit returned with the batch's first copy still in flight";
  const absl::Status s = (*engine)->Wait(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(copies, 3);
  EXPECT_TRUE((*engine)->Wait((*engine)->Submit({{Tier::kDevice, 1, Tier::kHost, 1}})).ok()) << "later batches run";
}

}  // namespace
}  // namespace ps
