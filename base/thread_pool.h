// Fork-join thread pool for the compute kernels. The calling thread takes part
// in the work, so a pool of N threads runs N-1 workers. Workers spin briefly
// before sleeping: a decode step issues hundreds of small parallel regions and
// a condition-variable wake-up per region would cost more than the work.
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

  // Calls fn(thread_index, num_threads) once on every thread of the pool and
  // returns when all calls have returned. Not re-entrant; call from one thread.
  void Run(const std::function<void(int, int)>& fn);

  // Splits [0, n) into contiguous chunks, one per thread (chunks aligned to `grain`),
  // and calls fn(begin, end) for the non-empty ones.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop(int index);

  int num_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace ps
