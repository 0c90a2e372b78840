#include "base/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ps {
namespace {
inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}
constexpr int kSpinIterations = 20000;
constexpr uint32_t kMaxChunks = 0xffff;

constexpr uint32_t Generation(uint64_t s) { return static_cast<uint32_t>(s >> 32); }
constexpr uint32_t NextChunk(uint64_t s) { return static_cast<uint32_t>(s >> 16) & 0xffff; }
constexpr uint32_t Chunks(uint64_t s) { return static_cast<uint32_t>(s) & 0xffff; }
constexpr uint64_t State(uint32_t gen, uint32_t next, uint32_t chunks) {
  return static_cast<uint64_t>(gen) << 32 | static_cast<uint64_t>(next) << 16 | chunks;
}
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  num_threads_ = num_threads;
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  state_.store(State(++generation_, 0, 0), std::memory_order_release);
  state_.notify_all();
  for (auto& t : workers_) t.join();
}

bool ThreadPool::RunChunk(uint32_t gen) {
  uint64_t s = state_.load(std::memory_order_acquire);
  while (Generation(s) == gen && NextChunk(s) < Chunks(s)) {
    if (!state_.compare_exchange_weak(s, s + (uint64_t{1} << 16), std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
      continue;
    }
    // The claim keeps the caller waiting, so job_ stays valid until done_ counts it.
    const int64_t c = NextChunk(s), chunks = Chunks(s);
    const int64_t ub = job_.units * c / chunks, ue = job_.units * (c + 1) / chunks;
    const int64_t b = ub * job_.grain, e = std::min(job_.n, ue * job_.grain);
    if (b < e) (*job_.fn)(b, e);
    done_.fetch_add(1, std::memory_order_acq_rel);
    return true;
  }
  return false;
}

void ThreadPool::WorkerLoop() {
  uint32_t seen = 0;
  while (true) {
    uint64_t s = state_.load(std::memory_order_acquire);
    for (int spin = 0; Generation(s) == seen && spin < kSpinIterations; ++spin) {
      CpuRelax();
      s = state_.load(std::memory_order_acquire);
    }
    if (Generation(s) == seen) {
      state_.wait(s, std::memory_order_acquire);
      continue;
    }
    seen = Generation(s);
    if (stop_.load(std::memory_order_acquire)) return;
    while (RunChunk(seen)) {
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn,
                             int64_t chunks_per_thread) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t units = (n + grain - 1) / grain;
  const auto chunks = static_cast<uint32_t>(
      std::min<int64_t>({units, num_threads_ * std::max<int64_t>(1, chunks_per_thread), kMaxChunks}));
  if (num_threads_ == 1 || chunks <= 1) {
    fn(0, n);
    return;
  }
  job_ = Job{.fn = &fn, .n = n, .grain = grain, .units = units};
  done_.store(0, std::memory_order_relaxed);
  const uint32_t gen = ++generation_;
  state_.store(State(gen, 0, chunks), std::memory_order_release);
  state_.notify_all();
  while (RunChunk(gen)) {
  }
  // Chunks claimed by workers may still be running; yield to them once spinning
  // has not been enough (they may be waiting for this core).
  for (int spin = 0; done_.load(std::memory_order_acquire) != chunks; ++spin) {
    if (spin < kSpinIterations) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
}

}  // namespace ps
