#include "server/call_executor.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace tessera::server {
namespace {

// Tasks never wait for one another: a task that blocks does not hold back the next (a
// fixed pool of one thread would).
TEST(CallExecutor, StartsEveryTaskAtOnceOnAThreadOfItsOwnWhenNoneIsIdle) {
  CallExecutor executor;
  absl::Notification release;
  std::atomic<int> started{0};
  for (int i = 0; i < 8; ++i) {
    executor.Schedule([&] {
      ++started;
      release.WaitForNotification();
    });
  }
  while (started.load() < 8) std::this_thread::yield();
  EXPECT_EQ(executor.busy(), 8);
  EXPECT_EQ(executor.threads(), 8);
  release.Notify();
  while (executor.busy() > 0) std::this_thread::yield();
  // Idle threads take the next tasks: none is added.
  std::atomic<int> ran{0};
  for (int i = 0; i < 8; ++i) executor.Schedule([&] { ++ran; });
  while (ran.load() < 8) std::this_thread::yield();
  EXPECT_EQ(executor.threads(), 8);
}

TEST(CallExecutor, IdleThreadsLeaveAndTheDestructorRunsWhatIsQueued) {
  std::atomic<int> ran{0};
  {
    CallExecutor executor(absl::Milliseconds(20));
    executor.Schedule([&] { ++ran; });
    while (executor.threads() > 0) std::this_thread::yield();  // left after 20 ms idle
    EXPECT_EQ(ran.load(), 1);
    for (int i = 0; i < 100; ++i) executor.Schedule([&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 101);
}

}  // namespace
}  // namespace tessera::server
