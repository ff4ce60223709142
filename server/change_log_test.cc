#include "server/change_log.h"

#include <algorithm>
#include <numeric>
#include <random>
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
  // Every push a row of its own, 8,000 bytes of ids: merged, they still do not fit.
  for (int64_t step = 0; step < 1000; ++step) log.Append("t", step, std::vector<int64_t>{step});
  EXPECT_LE(log.bytes(), 4096u);
  EXPECT_GT(log.dropped(), 0);
  absl::StatusOr<ChangeLog::Changes> old = log.Read(start, 1000, nullptr);
  EXPECT_EQ(old.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(old.status().message()), HasSubstr("--change_log_bytes"));
  EXPECT_THAT(std::string(old.status().message()), HasSubstr("snapshot"));
  // From the oldest cursor kept: every row changed after it (push k changed row k - 1).
  const uint64_t oldest = static_cast<uint64_t>(log.dropped());
  ChangeLog::Changes kept = ReadAll(log, {start.log, oldest}, 10000);
  std::vector<int64_t> ids = kept.ids["t"];
  std::sort(ids.begin(), ids.end());
  std::vector<int64_t> want(1000 - oldest);
  std::iota(want.begin(), want.end(), static_cast<int64_t>(oldest));
  EXPECT_EQ(ids, want);
  EXPECT_EQ(kept.reached.sequence, 1000u);
  // A cursor past the head is a caller's mistake.
  EXPECT_EQ(log.Read({start.log, 1001}, 1, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChangeLog, PushesOfAWorkingSetAreMergedAndKeptFarPastTheBound) {
  ChangeLog log(4096);
  const ChangeLog::Cursor start = log.Head();
  for (int64_t step = 0; step < 5000; ++step) {
    log.Append(step % 2 ? "a" : "b", step, std::vector<int64_t>{step % 7, 100 + step % 3});
  }
  EXPECT_LE(log.bytes(), 4096u);
  EXPECT_EQ(log.dropped(), 0) << "the union of a small working set fits";
  ChangeLog::Changes all = ReadAll(log, start, 1 << 20);
  std::vector<int64_t> a = all.ids["a"], b = all.ids["b"];
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  EXPECT_EQ(a, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 100, 101, 102}));
  EXPECT_EQ(b, a);
  EXPECT_EQ(all.steps["a"], 4999);
  EXPECT_EQ(all.reached.sequence, 5000u);
}

// Whatever merges and drops did: from any cursor still valid, a read takes every id
// appended after it (and perhaps some before), and a cursor behind is told so.
TEST(ChangeLog, EveryCursorKeptReadsEveryIdAppendedAfterIt) {
  ChangeLog log(8192);
  const ChangeLog::Cursor start = log.Head();
  std::mt19937_64 rng(3);
  std::vector<std::pair<std::string, std::vector<int64_t>>> appended;  // by sequence - 1
  for (int i = 0; i < 3000; ++i) {
    std::vector<int64_t> ids(1 + rng() % 4);
    for (int64_t& id : ids) id = static_cast<int64_t>(rng() % (i < 1500 ? 40 : 4000));
    const std::string table = rng() % 3 == 0 ? "x" : "y";
    log.Append(table, i, ids);
    appended.emplace_back(table, ids);
  }
  const uint64_t oldest = static_cast<uint64_t>(log.dropped());
  for (uint64_t c = 0; c <= 3000; c += 97) {
    absl::StatusOr<ChangeLog::Changes> read = log.Read({start.log, c}, 1 << 20, nullptr);
    if (c < oldest) {
      EXPECT_EQ(read.status().code(), absl::StatusCode::kOutOfRange) << c;
      continue;
    }
    ASSERT_TRUE(read.ok()) << c << ": " << read.status();
    for (uint64_t seq = c + 1; seq <= 3000; ++seq) {
      const auto& [table, ids] = appended[seq - 1];
      for (int64_t id : ids) {
        const std::vector<int64_t>& got = read->ids[table];
        ASSERT_NE(std::find(got.begin(), got.end(), id), got.end())
            << "cursor " << c << " misses id " << id << " of change " << seq;
      }
    }
  }
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
