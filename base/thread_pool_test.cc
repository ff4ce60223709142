#include "base/thread_pool.h"

#include <sched.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace tessera::base {
namespace {

TEST(ThreadPoolTest, RunsEveryIterationOnceForAnyThreadCount) {
  for (const int threads : {1, 2, 7}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (const int n : {0, 1, 5, 1000}) {
      std::vector<std::atomic<int>> runs(n);
      pool.ParallelFor(n, [&](int i) { runs[i].fetch_add(1); });
      for (int i = 0; i < n; ++i) EXPECT_EQ(runs[i].load(), 1) << threads << " threads, i=" << i;
    }
  }
}

TEST(ThreadPoolTest, IterationsRunAtTheSameTime) {
  // Each iteration waits until all three have started: a pool that ran them one after
  // another would see the wait run out.
  ThreadPool pool(3);
  absl::Mutex mu;
  int started = 0;
  std::atomic<int> met{0};
  pool.ParallelFor(3, [&](int) {
    absl::MutexLock lock(&mu);
    ++started;
    const bool all = mu.AwaitWithTimeout(
        absl::Condition(+[](int* s) { return *s == 3; }, &started), absl::Seconds(30));
    if (all) met.fetch_add(1);
  });
  EXPECT_EQ(met.load(), 3);
}

TEST(ThreadPoolTest, CallsFromSeveralThreadsAndNestedCallsAllFinish) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 50; ++round) {
        pool.ParallelFor(4, [&](int i) {
          pool.ParallelFor(3, [&](int j) { sum.fetch_add(i * 3 + j + 1); });
        });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  // Each nested call adds 1 + 2 + ... + 12 = 78.
  EXPECT_EQ(sum.load(), 4 * 50 * 78);
}

TEST(ThreadPoolTest, StatusIsTheLowestFailingIterationAndEveryIterationRuns) {
  for (const int threads : {1, 2, 7}) {
    ThreadPool pool(threads);
    std::atomic<int> ran{0};
    absl::Status s = pool.ParallelForStatus(20, [&](int i) {
      ran.fetch_add(1);
      if (i == 6 || i == 13) return absl::InvalidArgumentError(absl::StrCat("part ", i));
      return absl::OkStatus();
    });
    EXPECT_EQ(s, absl::InvalidArgumentError("part 6")) << threads << " threads";
    EXPECT_EQ(ran.load(), 20);
    EXPECT_TRUE(pool.ParallelForStatus(3, [](int) { return absl::OkStatus(); }).ok());
  }
}

TEST(ThreadPoolTest, SmallWorkStaysOnTheCallingThread) {
  ThreadPool pool(4);
  EXPECT_EQ(&pool.For(100, 100), &pool);
  ThreadPool& small = pool.For(99, 100);
  EXPECT_EQ(&small, &ThreadPool::CallingThread());
  EXPECT_EQ(small.threads(), 1);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> elsewhere{0};
  small.ParallelFor(8, [&](int) {
    if (std::this_thread::get_id() != caller) elsewhere.fetch_add(1);
  });
  EXPECT_EQ(elsewhere.load(), 0);
}

TEST(ThreadPoolTest, ThreadsDefaultToTheCpusTheProcessMayUse) {
  int threads = -1;
  ASSERT_TRUE(ResolveThreads(0, &threads).ok());
  EXPECT_EQ(threads, AvailableCpus());
  ASSERT_TRUE(ResolveThreads(5, &threads).ok());
  EXPECT_EQ(threads, 5);
  EXPECT_EQ(ResolveThreads(-1, &threads).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveThreads(5000, &threads).code(), absl::StatusCode::kInvalidArgument);

  // Pinned to one CPU (as `taskset -c 0` would), the count is 1.
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof(before), &before), 0);
  int first = 0;
  while (!CPU_ISSET(first, &before)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  EXPECT_EQ(AvailableCpus(), 1);
  ASSERT_EQ(sched_setaffinity(0, sizeof(before), &before), 0);
  EXPECT_EQ(AvailableCpus(), CPU_COUNT(&before));
}

}  // namespace
}  // namespace tessera::base
