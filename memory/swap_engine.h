// Asynchronous block copies between the device and host tiers (or within one). Callers submit a
// batch of block copies and get a ticket; they wait on the ticket right before
// they need the data. The CPU implementation runs the copies on its own thread;
// the CUDA one (later) uses a dedicated stream and events with the same interface.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "memory/block_pool.h"

namespace ps {

struct BlockCopy {
  Tier src_tier = Tier::kDevice;
  int32_t src = 0;
  Tier dst_tier = Tier::kHost;
  int32_t dst = 0;
};

using SwapTicket = uint64_t;

class SwapEngine {
 public:
  virtual ~SwapEngine() = default;
  // Queues the copies (run in order after earlier submissions); thread-safe.
  virtual SwapTicket Submit(std::vector<BlockCopy> copies) = 0;
  // Blocks until the ticket's copies are done and returns their status (once per
  // ticket). On an error the destination blocks hold no valid data.
  virtual absl::Status Wait(SwapTicket ticket) = 0;
  // Bytes moved so far, device -> host and host -> device (copies within a tier,
  // a shared page copied before a write, not counted).
  virtual uint64_t bytes_to_host() const = 0;
  virtual uint64_t bytes_to_device() const = 0;
};

class CpuSwapEngine final : public SwapEngine {
 public:
  // Copies one block; replaceable so tests can inject failures.
  using CopyFn = std::function<absl::Status(uint8_t* dst, const uint8_t* src, size_t bytes)>;
  CpuSwapEngine(BlockPool& device, BlockPool& host, CopyFn copy = nullptr);
  ~CpuSwapEngine() override;

  SwapTicket Submit(std::vector<BlockCopy> copies) override;
  absl::Status Wait(SwapTicket ticket) override;
  uint64_t bytes_to_host() const override { return to_host_.load(); }
  uint64_t bytes_to_device() const override { return to_device_.load(); }

 private:
  void Loop();
  absl::Status Run(const std::vector<BlockCopy>& copies);
  BlockPool& pool(Tier t) { return t == Tier::kDevice ? device_ : host_; }

  BlockPool& device_;
  BlockPool& host_;
  CopyFn copy_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<SwapTicket, std::vector<BlockCopy>>> queue_;
  std::map<SwapTicket, absl::Status> done_;
  SwapTicket next_ticket_ = 1;
  bool stop_ = false;
  std::atomic<uint64_t> to_host_{0}, to_device_{0};
  std::thread thread_;
};

}  // namespace ps
