// SwapEngine on a GPU: block copies run on a dedicated non-blocking CUDA stream,
// ordered after the compute stream's earlier work by an event, so a swap-out reads
// KV only once the kernels that wrote it are done; each ticket is a CUDA event the
// engine waits on right before it needs the data. The device tier lives in device
// memory and the host tier in pinned memory (cudaHostAlloc), so copies go straight
// between the two (no staging buffer needed) and overlap with compute. Runs of
// consecutive block ids become one copy. Every CUDA return code is checked.
//
// Part of the CUDA plug-in (libps_cuda.so, kernels/plugin.h); the tests skip
// without a GPU. CUDA types are kept out of this header so that C++ code can include it.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>

#include "absl/status/statusor.h"
#include "memory/swap_engine.h"

namespace ps::cuda {

class CudaSwapEngine final : public SwapEngine {
 public:
  // Runs before each copy is queued; an error stands in for that copy's failure (tests
  // inject failures with it).
  using CopyHook = std::function<absl::Status()>;
  // `device` and `host` must use cuda::AllocateDevice / AllocatePinned memory. `compute_stream`
  // (a cudaStream_t; null = the legacy default stream) is the stream writing the KV.
  static absl::StatusOr<std::unique_ptr<CudaSwapEngine>> Create(BlockPool& device, BlockPool& host,
                                                                void* compute_stream = nullptr,
                                                                CopyHook before_copy = nullptr);
  ~CudaSwapEngine() override;

  SwapTicket Submit(std::vector<BlockCopy> copies) override;
  absl::Status Wait(SwapTicket ticket) override;
  uint64_t bytes_to_host() const override;
  uint64_t bytes_to_device() const override;

 private:
  struct Pending {
    void* done = nullptr;  // cudaEvent_t recorded after the copies
    absl::Status status;   // an error while queueing the copies
    uint64_t bytes_to_host = 0, bytes_to_device = 0;
  };
  CudaSwapEngine(BlockPool& device, BlockPool& host, void* compute_stream, CopyHook before_copy)
      : device_(device), host_(host), compute_stream_(compute_stream), before_copy_(std::move(before_copy)) {}
  absl::Status Queue(const std::vector<BlockCopy>& copies, Pending& p);

  BlockPool& device_;
  BlockPool& host_;
  void* compute_stream_;
  CopyHook before_copy_;
  void* copy_stream_ = nullptr;    // cudaStream_t
  void* compute_event_ = nullptr;  // cudaEvent_t: the compute stream's progress at Submit()
  mutable std::mutex mu_;
  std::map<SwapTicket, Pending> pending_;
  SwapTicket next_ticket_ = 1;
  uint64_t to_host_ = 0, to_device_ = 0;
};

}  // namespace ps::cuda

// The plug-in's entry point (kernels/plugin.h): a CudaSwapEngine over the two tiers,
// or null with the reason in `error`.
extern "C" ps::SwapEngine* ps_cuda_create_swap_engine(ps::BlockPool* device, ps::BlockPool* host, char* error,
                                                      size_t error_size);
