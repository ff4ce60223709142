#include "server/rendezvous_store.h"

#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace tessera::server {
namespace {

using std::chrono::milliseconds;

TEST(RendezvousStore, GetWaitsForEveryKeyAndReturnsTheValuesInOrder) {
  RendezvousStore store;
  ASSERT_TRUE(store.Set("a", "1").ok());
  std::thread later([&] {
    std::this_thread::sleep_for(milliseconds(50));
    ASSERT_TRUE(store.Set("b", "2").ok());
  });
  absl::StatusOr<std::vector<std::string>> got = store.Get({"b", "a"}, milliseconds(10000));
  later.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (std::vector<std::string>{"2", "1"}));
  // A key set again holds its new value.
  ASSERT_TRUE(store.Set("a", "3").ok());
  EXPECT_EQ(store.Get({"a"}, milliseconds(0)).value(), std::vector<std::string>{"3"});
}

TEST(RendezvousStore, GetNamesTheKeysStillMissingAfterItsTimeout) {
  RendezvousStore store;
  ASSERT_TRUE(store.Set("here", "x").ok());
  absl::StatusOr<std::vector<std::string>> got =
      store.Get({"here", "worker/1", "worker/2"}, milliseconds(20));
  ASSERT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(got.status().message().find("worker/1, worker/2"), std::string::npos) << got.status();
  EXPECT_EQ(got.status().message().find("here"), std::string::npos) << got.status();
}

TEST(RendezvousStore, AddCountsFromZeroAndRefusesANonCounter) {
  RendezvousStore store;
  EXPECT_EQ(store.Add("joined", 1).value(), 1);
  EXPECT_EQ(store.Add("joined", 1).value(), 2);
  EXPECT_EQ(store.Add("joined", -2).value(), 0);
  ASSERT_TRUE(store.Set("text", "abc").ok());
  EXPECT_EQ(store.Add("text", 1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.Get({"text"}, milliseconds(0)).value(), std::vector<std::string>{"abc"});
}

TEST(RendezvousStore, BadInputIsRefusedWithoutChangingTheStore) {
  RendezvousLimits limits;
  limits.max_key_bytes = 8;
  limits.max_value_bytes = 4;
  limits.max_keys = 2;
  RendezvousStore store(limits);
  EXPECT_EQ(store.Set("", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Set("123456789", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Set("k", "12345").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.size(), 0u);
  ASSERT_TRUE(store.Set("k1", "v").ok());
  ASSERT_TRUE(store.Set("k2", "v").ok());
  EXPECT_EQ(store.Set("k3", "v").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store.Add("k3", 1).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(store.Set("k1", "w").ok());  // replacing a key needs no room
  EXPECT_EQ(store.size(), 2u);
  EXPECT_EQ(store.Get({"k1"}, milliseconds(0)).value(), std::vector<std::string>{"w"});
}

}  // namespace
}  // namespace tessera::server
