#include "client/object_pool.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tessera::client {
namespace {

TEST(ObjectPoolTest, ReturnsReleasedObjectsWithTheirState) {
  int made = 0;
  ObjectPool<std::vector<int>> pool([&] {
    ++made;
    return std::make_unique<std::vector<int>>();
  });
  std::vector<int>* first = nullptr;
  {
    auto lease = pool.Acquire();
    lease->assign(1000, 7);
    first = lease.get();
  }
  auto again = pool.Acquire();
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(again->size(), 1000u);  // capacity and contents kept: the caller clears
  EXPECT_EQ(made, 1);
}

TEST(ObjectPoolTest, ConcurrentLeasesAreDistinctAndIdleCountIsBounded) {
  int made = 0;
  ObjectPool<int> pool(
      [&] {
        ++made;
        return std::make_unique<int>(0);
      },
      /*max_idle=*/2);
  {
    auto a = pool.Acquire();
    auto b = pool.Acquire();
    auto c = pool.Acquire();
    EXPECT_NE(a.get(), b.get());
    EXPECT_NE(b.get(), c.get());
    EXPECT_EQ(made, 3);
  }
  // Only two were kept: three leases now need one fresh object.
  auto a = pool.Acquire();
  auto b = pool.Acquire();
  auto c = pool.Acquire();
  EXPECT_EQ(made, 4);
}

TEST(ObjectPoolTest, ThreadsNeverShareAnObject) {
  ObjectPool<int> pool([] { return std::make_unique<int>(0); });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool] {
      for (int i = 0; i < 2000; ++i) {
        auto lease = pool.Acquire();
        ++*lease;
        const int seen = *lease;
        std::this_thread::yield();
        ASSERT_EQ(*lease, seen);  // nobody else touched it while leased
      }
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace tessera::client
