#include "memory/cuda_swap_engine.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"

namespace ps::cuda {
namespace {

absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

#define PS_CUDA_RETURN_IF_ERROR(expr)                             \
  do {                                                            \
    const cudaError_t ps_err_ = (expr);                           \
    if (ps_err_ != cudaSuccess) return CudaError(ps_err_, #expr); \
  } while (0)

cudaStream_t Stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t Event(void* e) { return static_cast<cudaEvent_t>(e); }

}  // namespace

absl::StatusOr<std::unique_ptr<CudaSwapEngine>> CudaSwapEngine::Create(BlockPool& device, BlockPool& host,
                                                                       void* compute_stream, CopyHook before_copy) {
  if (device.block_bytes() != host.block_bytes()) return absl::InvalidArgumentError("tiers with different block sizes");
  std::unique_ptr<CudaSwapEngine> e(new CudaSwapEngine(device, host, compute_stream, std::move(before_copy)));
  cudaStream_t stream = nullptr;
  PS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  e->copy_stream_ = stream;
  cudaEvent_t ev = nullptr;
  PS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  e->compute_event_ = ev;
  return e;
}

CudaSwapEngine::~CudaSwapEngine() {
  if (copy_stream_ != nullptr) cudaStreamSynchronize(Stream(copy_stream_));
  for (auto& [ticket, p] : pending_) {
    if (p.done != nullptr) cudaEventDestroy(Event(p.done));
  }
  if (compute_event_ != nullptr) cudaEventDestroy(Event(compute_event_));
  if (copy_stream_ != nullptr) cudaStreamDestroy(Stream(copy_stream_));
}

absl::Status CudaSwapEngine::Queue(const std::vector<BlockCopy>& copies, Pending& p) {
  auto pool = [&](Tier t) -> BlockPool& { return t == Tier::kDevice ? device_ : host_; };
  for (const BlockCopy& c : copies) {
    if (c.src < 0 || c.src >= pool(c.src_tier).num_blocks() || c.dst < 0 || c.dst >= pool(c.dst_tier).num_blocks()) {
      return absl::InvalidArgumentError(
          absl::StrCat("swap of block ", c.src, " to ", c.dst, ": block id out of range"));
    }
  }
  // The copies read what the compute stream wrote before this point.
  PS_CUDA_RETURN_IF_ERROR(cudaEventRecord(Event(compute_event_), Stream(compute_stream_)));
  PS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(Stream(copy_stream_), Event(compute_event_), 0));
  const size_t bb = device_.block_bytes();
  for (size_t i = 0; i < copies.size();) {
    const BlockCopy& c = copies[i];
    size_t run = 1;  // consecutive ids on both sides: one copy
    while (i + run < copies.size() && copies[i + run].src_tier == c.src_tier &&
           copies[i + run].dst_tier == c.dst_tier && copies[i + run].src == c.src + static_cast<int32_t>(run) &&
           copies[i + run].dst == c.dst + static_cast<int32_t>(run)) {
      ++run;
    }
    absl::Status failed;
    if (before_copy_) failed.Update(before_copy_());
    if (failed.ok()) {
      const cudaError_t e = cudaMemcpyAsync(pool(c.dst_tier).data(c.dst), pool(c.src_tier).data(c.src), run * bb,
                                            cudaMemcpyDefault, Stream(copy_stream_));
      if (e != cudaSuccess) failed.Update(CudaError(e, "cudaMemcpyAsync"));
    }
    if (!failed.ok()) {
      // The copies queued before this one still read and write the batch's blocks: the
      // error returns (and the caller reuses the blocks) only once they are done.
      cudaStreamSynchronize(Stream(copy_stream_));
      return failed;
    }
    if (c.src_tier != c.dst_tier) (c.dst_tier == Tier::kHost ? p.bytes_to_host : p.bytes_to_device) += run * bb;
    i += run;
  }
  cudaEvent_t done = nullptr;
  cudaError_t e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  if (e == cudaSuccess) {
    p.done = done;
    e = cudaEventRecord(done, Stream(copy_stream_));
  }
  if (e != cudaSuccess) {
    cudaStreamSynchronize(Stream(copy_stream_));  // as above: no error while copies are in flight
    return CudaError(e, "recording the end of a swap");
  }
  return absl::OkStatus();
}

SwapTicket CudaSwapEngine::Submit(std::vector<BlockCopy> copies) {
  std::lock_guard<std::mutex> lock(mu_);
  const SwapTicket t = next_ticket_++;
  Pending& p = pending_[t];
  p.status.Update(Queue(copies, p));
  return t;
}

absl::Status CudaSwapEngine::Wait(SwapTicket ticket) {
  Pending p;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(ticket);
    if (it == pending_.end()) return absl::InvalidArgumentError(absl::StrCat("unknown swap ticket ", ticket));
    p = std::move(it->second);
    pending_.erase(it);
  }
  absl::Status st = p.status;
  if (p.done != nullptr) {
    const cudaError_t e = cudaEventSynchronize(Event(p.done));
    if (e != cudaSuccess) st.Update(CudaError(e, "cudaEventSynchronize"));
    cudaEventDestroy(Event(p.done));
  }
  if (st.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    to_host_ += p.bytes_to_host;
    to_device_ += p.bytes_to_device;
  }
  return st;
}

uint64_t CudaSwapEngine::bytes_to_host() const {
  std::lock_guard<std::mutex> lock(mu_);
  return to_host_;
}

uint64_t CudaSwapEngine::bytes_to_device() const {
  std::lock_guard<std::mutex> lock(mu_);
  return to_device_;
}

}  // namespace ps::cuda

extern "C" ps::SwapEngine* ps_cuda_create_swap_engine(ps::BlockPool* device, ps::BlockPool* host, char* error,
                                                      size_t error_size) {
  absl::StatusOr<std::unique_ptr<ps::cuda::CudaSwapEngine>> e = ps::cuda::CudaSwapEngine::Create(*device, *host);
  if (e.ok()) return e->release();
  std::snprintf(error, error_size, "%s", std::string(e.status().message()).c_str());
  return nullptr;
}
