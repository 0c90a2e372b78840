// The compute thread pool: coverage of every range, on pools larger than the machine.
#include "base/thread_pool.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(ThreadPool, ParallelForCoversRangeOnce) {
  ThreadPool pool(3);
  for (int64_t n : {1, 7, 1000}) {
    std::vector<int> hits(n, 0);
    pool.ParallelFor(n, 4, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ++hits[i];
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << i;
  }
}

// More threads than cores, many short regions back to back: chunks are claimed by
// whichever thread runs, and every region still covers its range exactly once.
TEST(ThreadPool, ManyShortRegionsOnAnOversubscribedPool) {
  ThreadPool pool(8);
  std::vector<std::atomic<int>> hits(300);
  for (int round = 0; round < 2000; ++round) {
    const int64_t n = 1 + round % 300;
    pool.ParallelFor(n, 1 + round % 5, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
    });
  }
  for (int64_t i = 0; i < 300; ++i) {
    int want = 0;
    for (int round = 0; round < 2000; ++round) want += i < 1 + round % 300 ? 1 : 0;
    ASSERT_EQ(hits[i].load(), want) << i;
  }
}

}  // namespace
}  // namespace ps
