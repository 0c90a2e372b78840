#include "memory/swap_engine.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace ps {

CpuSwapEngine::CpuSwapEngine(BlockPool& device, BlockPool& host, CopyFn copy)
    : device_(device), host_(host), copy_(std::move(copy)) {
  PS_CHECK(device.block_bytes() == host.block_bytes()) << "tiers with different block sizes";
  if (!copy_) {
    copy_ = [](uint8_t* dst, const uint8_t* src, size_t n) {
      std::memcpy(dst, src, n);
      return absl::OkStatus();
    };
  }
  thread_ = std::thread([this] { Loop(); });
}

CpuSwapEngine::~CpuSwapEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

SwapTicket CpuSwapEngine::Submit(std::vector<BlockCopy> copies) {
  std::lock_guard<std::mutex> lock(mu_);
  const SwapTicket t = next_ticket_++;
  queue_.emplace_back(t, std::move(copies));
  cv_.notify_all();
  return t;
}

absl::Status CpuSwapEngine::Wait(SwapTicket ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  if (ticket == 0 || ticket >= next_ticket_)
    return absl::InvalidArgumentError(absl::StrCat("unknown swap ticket ", ticket));
  cv_.wait(lock, [&] { return done_.count(ticket) != 0; });
  absl::Status s = std::move(done_[ticket]);
  done_.erase(ticket);
  return s;
}

absl::Status CpuSwapEngine::Run(const std::vector<BlockCopy>& copies) {
  for (const BlockCopy& c : copies) {
    BlockPool& src = pool(c.src_tier);
    BlockPool& dst = pool(c.dst_tier);
    if (c.src < 0 || c.src >= src.num_blocks() || c.dst < 0 || c.dst >= dst.num_blocks()) {
      return absl::InvalidArgumentError(absl::StrCat("swap of block ", c.src, " (", std::string(TierName(c.src_tier)),
                                                     ") to ", c.dst, " (", std::string(TierName(c.dst_tier)),
                                                     "): block id out of range"));
    }
    PS_RETURN_IF_ERROR(copy_(dst.data(c.dst), src.data(c.src), src.block_bytes()));
    if (c.src_tier != c.dst_tier) (c.dst_tier == Tier::kHost ? to_host_ : to_device_).fetch_add(src.block_bytes());
  }
  return absl::OkStatus();
}

void CpuSwapEngine::Loop() {
  while (true) {
    std::pair<SwapTicket, std::vector<BlockCopy>> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything submitted has run
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    absl::Status s = Run(job.second);
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_[job.first] = std::move(s);
    }
    cv_.notify_all();
  }
}

}  // namespace ps
