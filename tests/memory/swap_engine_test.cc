// CPU swap engine: contents survive device -> host -> device bit for bit, many
// concurrent submissions complete, and a failing copy surfaces as an error.
#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "memory/swap_engine.h"

namespace ps {
namespace {

void Fill(BlockPool& pool, int32_t id, uint32_t seed) {
  std::mt19937 rng(seed);
  for (size_t i = 0; i < pool.block_bytes(); ++i) pool.data(id)[i] = static_cast<uint8_t>(rng());
}

TEST(CpuSwapEngine, RoundTripIsBitExact) {
  BlockPool device(Tier::kDevice, 8, 4096), host(Tier::kHost, 8, 4096);
  CpuSwapEngine swap(device, host);
  std::vector<BlockCopy> out, in;
  for (int32_t i = 0; i < 8; ++i) {
    Fill(device, i, 100 + i);
    out.push_back({Tier::kDevice, i, Tier::kHost, 7 - i});
  }
  std::vector<uint8_t> original(device.data(0), device.data(0) + 8 * 4096);
  ASSERT_TRUE(swap.Wait(swap.Submit(out)).ok());
  std::memset(device.data(0), 0, 8 * 4096);  // the device blocks get reused meanwhile
  for (int32_t i = 0; i < 8; ++i) in.push_back({Tier::kHost, 7 - i, Tier::kDevice, i});
  ASSERT_TRUE(swap.Wait(swap.Submit(in)).ok());
  EXPECT_EQ(0, std::memcmp(original.data(), device.data(0), original.size()));
  EXPECT_EQ(swap.bytes_to_host(), 8u * 4096);
  EXPECT_EQ(swap.bytes_to_device(), 8u * 4096);
}

TEST(CpuSwapEngine, ManyConcurrentSubmissions) {
  BlockPool device(Tier::kDevice, 64, 1024), host(Tier::kHost, 64, 1024);
  CpuSwapEngine swap(device, host);
  for (int32_t i = 0; i < 64; ++i) Fill(device, i, static_cast<uint32_t>(i));
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int32_t k = 0; k < 8; ++k) {
        const int32_t id = t * 8 + k;
        const SwapTicket ticket = swap.Submit({{Tier::kDevice, id, Tier::kHost, id}});
        if (!swap.Wait(ticket).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(0, std::memcmp(device.data(0), host.data(0), 64 * 1024));
}

TEST(CpuSwapEngine, FailingCopySurfacesAsError) {
  BlockPool device(Tier::kDevice, 4, 256), host(Tier::kHost, 4, 256);
  int calls = 0;
  CpuSwapEngine swap(device, host, [&](uint8_t* dst, const uint8_t* src, size_t n) {
    if (++calls == 2) return absl::DataLossError("injected copy failure");
    std::memcpy(dst, src, n);
    return absl::OkStatus();
  });
  const SwapTicket bad = swap.Submit({{Tier::kDevice, 0, Tier::kHost, 0}, {Tier::kDevice, 1, Tier::kHost, 1}});
  const SwapTicket good = swap.Submit({{Tier::kDevice, 2, Tier::kHost, 2}});
  const absl::Status s = swap.Wait(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("injected"), std::string::npos);
  EXPECT_TRUE(swap.Wait(good).ok());  // later tickets are unaffected
  const SwapTicket out_of_range = swap.Submit({{Tier::kDevice, 9, Tier::kHost, 0}});
  EXPECT_EQ(swap.Wait(out_of_range).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(swap.Wait(12345).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps
