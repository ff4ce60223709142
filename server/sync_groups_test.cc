#include "server/sync_groups.h"

#include <string>

#include "gtest/gtest.h"

namespace tessera::server {
namespace {

TEST(SyncGroups, RefusesAGroupNoJobRegisteredOrWithAnotherWorkerCount) {
  SyncGroups groups("shard 3");
  const absl::Status unknown = groups.Check("job#1", 2);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(unknown.message().find("job 'job#1' registered no sync group with shard 3"),
            std::string::npos)
      << unknown;
  ASSERT_TRUE(groups.Register("job#1", 2).ok());
  EXPECT_TRUE(groups.Check("job#1", 2).ok());
  const absl::Status other = groups.Check("job#1", 4);
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.message().find("of 2 workers with shard 3, not 4"), std::string::npos) << other;
  // Registered again with another count: that count is the group's.
  ASSERT_TRUE(groups.Register("job#1", 4).ok());
  EXPECT_TRUE(groups.Check("job#1", 4).ok());
  EXPECT_FALSE(groups.Check("job#1", 2).ok());
}

TEST(SyncGroups, RefusesBadGroupsAndKeepsTheGroupsUsedLast) {
  SyncGroups groups("shard 0", /*capacity=*/3);
  EXPECT_EQ(groups.Register("", 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(groups.Register(std::string(257, 'j'), 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(groups.Register("j", 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(groups.Register("j", SyncGroups::kMaxWorkers + 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(groups.size(), 0u);
  ASSERT_TRUE(groups.Register("a", 2).ok());
  ASSERT_TRUE(groups.Register("b", 2).ok());
  ASSERT_TRUE(groups.Register("c", 2).ok());
  ASSERT_TRUE(groups.Check("a", 2).ok());  // "b" is now the one used longest ago
  ASSERT_TRUE(groups.Register("d", 2).ok());
  EXPECT_EQ(groups.size(), 3u);
  EXPECT_TRUE(groups.Check("a", 2).ok());
  EXPECT_FALSE(groups.Check("b", 2).ok());
  EXPECT_TRUE(groups.Check("c", 2).ok());
  EXPECT_TRUE(groups.Check("d", 2).ok());
}

}  // namespace
}  // namespace tessera::server
