// The compute thread pool: coverage of every range, on pools larger than the machine.
#include "base/thread_pool.h"

#include <array>
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

// A region splits into chunks_per_thread chunks a thread (4 by default), aligned to the
// grain and fewer when the grains run out; together they cover the range once.
TEST(ThreadPool, ChunksPerThreadSetsTheSplit) {
  ThreadPool pool(2);
  for (const auto& [grain, per_thread, want] : std::vector<std::array<int64_t, 3>>{
           {1, 4, 8}, {1, 16, 32}, {1, 0, 2}, {100, 16, 10}, {3, 16, 32}}) {
    std::vector<std::atomic<int>> hits(1000);
    std::atomic<int> calls{0};
    std::atomic<bool> aligned{true};
    pool.ParallelFor(
        1000, grain,
        [&](int64_t b, int64_t e) {
          calls.fetch_add(1, std::memory_order_relaxed);
          if (b % grain != 0) aligned.store(false, std::memory_order_relaxed);
          for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
        },
        per_thread);
    EXPECT_EQ(calls.load(), want) << "grain " << grain << ", " << per_thread << " a thread";
    EXPECT_TRUE(aligned.load()) << "grain " << grain;
    for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
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
