#include "server/change_log.h"

#include <numeric>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

ChangeLog::Changes ReadAll(const ChangeLog& log, ChangeLog::Cursor after, size_t max_ids = 1000) {
  absl::StatusOr<ChangeLog::Changes> read = log.Read(after, max_ids, nullptr);
  EXPECT_TRUE(read.ok()) << read.status();
  return read.ok() ? *read : ChangeLog::Changes{};
}

TEST(ChangeLog, ReadsEachTablesDistinctIdsAfterACursorWithTheNewestStep) {
  ChangeLog log(1 << 20);
  const ChangeLog::Cursor start = log.Head();
  EXPECT_EQ(start.sequence, 0u);
  log.Append("m.a", 1, std::vector<int64_t>{5, 7, 5});
  log.Append("m.b", 1, std::vector<int64_t>{9});
  log.Append("m.a", 2, std::vector<int64_t>{7, 11});
  ChangeLog::Changes all = ReadAll(log, start);
  EXPECT_THAT(all.ids["m.a"], ElementsAre(5, 7, 11));
  EXPECT_THAT(all.ids["m.b"], ElementsAre(9));
  EXPECT_EQ(all.steps["m.a"], 2);
  EXPECT_EQ(all.steps["m.b"], 1);
  EXPECT_EQ(all.reached.sequence, 3u);
  EXPECT_EQ(all.head.sequence, 3u);
  EXPECT_EQ(all.entries, 3);
  EXPECT_EQ(all.head_step, 2);
  // From the middle: only what came after.
  ChangeLog::Changes later = ReadAll(log, {start.log, 2});
  EXPECT_THAT(later.ids["m.a"], ElementsAre(7, 11));
  EXPECT_EQ(later.ids.count("m.b"), 0u);
  // At the head: nothing, and the cursor stays.
  ChangeLog::Changes none = ReadAll(log, all.reached);
  EXPECT_TRUE(none.ids.empty());
  EXPECT_EQ(none.reached.sequence, 3u);
}

TEST(ChangeLog, AReadStopsAtWholeEntriesNearItsLimitAndGoesOnFromThere) {
  ChangeLog log(1 << 20);
  const ChangeLog::Cursor start = log.Head();
  for (int64_t step = 0; step < 10; ++step) {
    log.Append("t", step, std::vector<int64_t>{step * 3, step * 3 + 1, step * 3 + 2});
  }
  std::vector<int64_t> got;
  ChangeLog::Cursor at = start;
  int reads = 0;
  while (at.sequence < log.Head().sequence && reads < 100) {
    ChangeLog::Changes c = ReadAll(log, at, /*max_ids=*/4);
    EXPECT_LE(c.ids["t"].size(), 6u);  // whole entries: 3, then 3 more reach 6 >= 4
    got.insert(got.end(), c.ids["t"].begin(), c.ids["t"].end());
    at = c.reached;
    ++reads;
  }
  std::vector<int64_t> want(30);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(got, want);
  EXPECT_EQ(reads, 5);
}

TEST(ChangeLog, ALargeChangeIsSplitAndAnEntryLargerThanTheLimitIsStillRead) {
  ChangeLog log(64 << 20);
  std::vector<int64_t> ids(ChangeLog::kMaxEntryIds * 2 + 5);
  std::iota(ids.begin(), ids.end(), 0);
  log.Append("t", 4, ids);
  EXPECT_EQ(log.entries(), 3u);
  ChangeLog::Changes first = ReadAll(log, {log.Head().log, 0}, /*max_ids=*/1);
  EXPECT_EQ(first.ids["t"].size(), ChangeLog::kMaxEntryIds);
  EXPECT_EQ(first.reached.sequence, 1u);
}

TEST(ChangeLog, OldEntriesGoPastTheBoundAndACursorBehindThemIsToldToStartAgain) {
  ChangeLog log(4096);
  const ChangeLog::Cursor start = log.Head();
  for (int64_t step = 0; step < 100; ++step) log.Append("t", step, std::vector<int64_t>{step});
  EXPECT_LE(log.bytes(), 4096u);
  EXPECT_GT(log.dropped(), 0);
  EXPECT_EQ(static_cast<int64_t>(log.entries()) + log.dropped(), 100);
  absl::StatusOr<ChangeLog::Changes> old = log.Read(start, 100, nullptr);
  EXPECT_EQ(old.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(old.status().message()), HasSubstr("--change_log_bytes"));
  EXPECT_THAT(std::string(old.status().message()), HasSubstr("snapshot"));
  // The oldest kept is still readable from just before it.
  const uint64_t oldest = static_cast<uint64_t>(log.dropped()) + 1;
  ChangeLog::Changes kept = ReadAll(log, {start.log, oldest - 1}, 1000);
  EXPECT_EQ(kept.ids["t"].front(), log.dropped());
  EXPECT_EQ(kept.reached.sequence, 100u);
  // A cursor past the head is a caller's mistake.
  EXPECT_EQ(log.Read({start.log, 101}, 1, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChangeLog, AResetStartsAnotherLogThatOldCursorsDoNotRead) {
  ChangeLog log(1 << 20);
  log.Append("t", 1, std::vector<int64_t>{1});
  const ChangeLog::Cursor before = log.Head();
  log.Reset();
  const ChangeLog::Cursor after = log.Head();
  EXPECT_NE(after.log, before.log);
  EXPECT_EQ(after.sequence, 0u);
  absl::StatusOr<ChangeLog::Changes> old = log.Read(before, 10, nullptr);
  EXPECT_EQ(old.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(old.status().message()), HasSubstr("is gone"));
  log.Append("t", 2, std::vector<int64_t>{2});
  EXPECT_THAT(ReadAll(log, after).ids["t"], ElementsAre(2));
}

TEST(ChangeLog, HeldRowsAppearOnlyWhenPublished) {
  ChangeLog log(1 << 20);
  const ChangeLog::Cursor start = log.Head();
  log.Hold("t", std::vector<int64_t>{1, 2});
  log.Hold("t", std::vector<int64_t>{3});
  EXPECT_EQ(log.Head().sequence, 0u);
  log.Publish();
  ChangeLog::Changes c = ReadAll(log, start);
  EXPECT_THAT(c.ids["t"], UnorderedElementsAre(1, 2, 3));
  EXPECT_EQ(c.steps["t"], -1);
  // Dropped: a reshard given up publishes nothing.
  log.Hold("t", std::vector<int64_t>{4});
  log.DropHeld();
  log.Publish();
  EXPECT_TRUE(ReadAll(log, c.reached).ids.empty());
}

TEST(ChangeLog, AReadsBudgetCountsEachIdAtItsTablesCost) {
  ChangeLog log(1 << 20);
  const ChangeLog::Cursor start = log.Head();
  log.Append("wide", 1, std::vector<int64_t>{1, 2});
  log.Append("narrow", 1, std::vector<int64_t>{1, 2});
  log.Append("narrow", 2, std::vector<int64_t>{3});
  auto cost = [](const std::string& t) { return t == "wide" ? size_t{100} : size_t{1}; };
  absl::StatusOr<ChangeLog::Changes> c = log.Read(start, 150, cost);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->reached.sequence, 1u);  // the wide entry spent the budget
  c = log.Read(c->reached, 150, cost);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->reached.sequence, 3u);
  EXPECT_THAT(c->ids["narrow"], ElementsAre(1, 2, 3));
}

TEST(ChangeLog, UnwantedTablesAreReadPastWithoutCountingTowardTheLimit) {
  ChangeLog log(1 << 20);
  const ChangeLog::Cursor start = log.Head();
  log.Append("other.t", 1, std::vector<int64_t>{1, 2, 3, 4});
  log.Append("m.t", 1, std::vector<int64_t>{5});
  log.Append("other.t", 2, std::vector<int64_t>{6});
  absl::StatusOr<ChangeLog::Changes> c = log.Read(
      start, 1, [](const std::string& t) { return t.rfind("m.", 0) == 0 ? size_t{1} : 0; });
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->ids.size(), 1u);
  EXPECT_THAT(c->ids["m.t"], ElementsAre(5));
  EXPECT_EQ(c->reached.sequence, 3u);
}

TEST(ChangeLog, ConcurrentAppendsAreEachReadOnce) {
  ChangeLog log(64 << 20);
  const ChangeLog::Cursor start = log.Head();
  std::vector<std::thread> writers;
  for (int w = 0; w < 4; ++w) {
    writers.emplace_back([&log, w] {
      for (int64_t i = 0; i < 500; ++i) log.Append("t", i, std::vector<int64_t>{w * 1000 + i});
    });
  }
  std::vector<int64_t> got;
  ChangeLog::Cursor at = start;
  for (int reads = 0; reads < 100000 && got.size() < 2000; ++reads) {
    ChangeLog::Changes c = ReadAll(log, at, 7);
    got.insert(got.end(), c.ids["t"].begin(), c.ids["t"].end());
    at = c.reached;
  }
  for (std::thread& t : writers) t.join();
  ChangeLog::Changes rest = ReadAll(log, at, 1 << 20);
  got.insert(got.end(), rest.ids["t"].begin(), rest.ids["t"].end());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got.size(), 2000u);
  EXPECT_EQ(std::adjacent_find(got.begin(), got.end()), got.end());
}

}  // namespace
}  // namespace tessera::server
