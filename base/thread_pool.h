// Fork-join thread pool for the compute kernels. The calling thread takes part
// in the work, so a pool of N threads runs N-1 workers. Workers spin briefly
// before sleeping: a decode step issues hundreds of small parallel regions and
// a condition-variable wake-up per region would cost more than the work.
//
// Work is split into chunks that every thread claims from a shared counter, so
// a thread the OS has not scheduled (a busy machine, more threads than cores)
// does not hold up a region: whoever runs takes the remaining chunks.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace ps {

class ThreadPool {
 public:
  // num_threads <= 0 selects std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Splits [0, n) into contiguous chunks aligned to `grain` and calls fn(begin, end)
  // once per chunk, on any thread of the pool; returns when all calls have returned.
  // At most chunks_per_thread chunks per thread (fewer when the grains run out): a few
  // let a thread that starts late still find work; more, for long regions, leave less of
  // the last chunk's time to one thread alone.
  // fn must not call back into the pool. Call from one thread at a time.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn,
                   int64_t chunks_per_thread = 4);

 private:
  struct Job {
    const std::function<void(int64_t, int64_t)>* fn = nullptr;
    int64_t n = 0, grain = 1, units = 0;
  };
  // Claims one chunk of generation `gen` and runs it; false when none is left.
  bool RunChunk(uint32_t gen);
  void WorkerLoop();

  int num_threads_;
  std::vector<std::thread> workers_;
  Job job_;                         // written only while no chunk is claimable
  uint32_t generation_ = 0;         // the caller's count of regions
  std::atomic<uint64_t> state_{0};  // generation << 32 | next chunk << 16 | chunks
  std::atomic<uint32_t> done_{0};   // chunks of the current region finished
  std::atomic<bool> stop_{false};
};

}  // namespace ps
