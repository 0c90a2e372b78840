// CUDA kernels against the CPU kernels, by relative error, and the CUDA swap
// engine. Skips without a GPU.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/thread_pool.h"
#include "gtest/gtest.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/vec.h"
#include "kernels/cuda/cuda_kernels.h"
#include "memory/cuda_swap_engine.h"
#include "tests/kernels/random.h"

namespace ps {
namespace {

using testing::Randn;

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(CudaTest, GemmMatchesCpu) {
  const int m = 17, n = 300, k = 576;
  auto x = Randn(m * k, 1), w = Randn(n * k, 2);
  std::vector<float> gpu(m * n), cpu(m * n);
  ASSERT_TRUE(cuda::Gemm(x.data(), w.data(), gpu.data(), m, n, k).ok());
  ThreadPool pool(2);
  MatMul(MatrixView{.type = DType::kF32, .data = reinterpret_cast<const uint8_t*>(w.data()), .rows = n, .cols = k},
         x.data(), m, cpu.data(), pool);
  for (int i = 0; i < m * n; ++i) EXPECT_NEAR(gpu[i], cpu[i], 1e-3f * (1 + std::fabs(cpu[i])));
}

TEST_F(CudaTest, RmsNormAndSiluMatchCpu) {
  const int rows = 5, n = 576;
  auto x = Randn(rows * n, 3), w = Randn(n, 4);
  std::vector<float> gpu(rows * n), cpu(rows * n);
  ASSERT_TRUE(cuda::RmsNorm(x.data(), w.data(), gpu.data(), rows, n, 1e-5f).ok());
  for (int r = 0; r < rows; ++r) RmsNorm(x.data() + r * n, w.data(), cpu.data() + r * n, n, 1e-5f);
  for (int i = 0; i < rows * n; ++i) EXPECT_NEAR(gpu[i], cpu[i], 1e-4f * (1 + std::fabs(cpu[i])));
  auto g1 = Randn(4097, 5), up = Randn(4097, 6);
  auto g2 = g1;
  ASSERT_TRUE(cuda::SiluMul(g1.data(), up.data(), 4097).ok());
  SiluMul(g2.data(), up.data(), 4097);
  for (int i = 0; i < 4097; ++i) EXPECT_NEAR(g1[i], g2[i], 1e-5f * (1 + std::fabs(g2[i])));
}

// Random blocks survive host -> device -> host bit for bit through the CUDA swap
// engine, with many tickets in flight (waited in reverse order) and coalesced runs;
// a bad block id is an error, not a copy.
TEST_F(CudaTest, SwapEngineRoundTripsBlocks) {
  constexpr int32_t kBlocks = 64;
  constexpr size_t kBlockBytes = 4096;
  auto device_mem = cuda::AllocateDevice(kBlocks * kBlockBytes);
  auto host_mem = cuda::AllocatePinned(kBlocks * kBlockBytes);
  ASSERT_TRUE(device_mem.ok() && host_mem.ok());
  BlockPool device(Tier::kDevice, kBlocks, kBlockBytes, std::move(*device_mem));
  BlockPool host(Tier::kHost, kBlocks, kBlockBytes, std::move(*host_mem));
  std::mt19937 rng(5);
  std::vector<uint8_t> want(kBlocks * kBlockBytes);
  for (auto& b : want) b = static_cast<uint8_t>(rng());
  std::memcpy(host.data(0), want.data(), want.size());
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

}  // namespace
}  // namespace ps
