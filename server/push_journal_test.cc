#include "server/push_journal.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "embedding/embedding_table.h"
#include "gtest/gtest.h"

namespace tessera::server {
namespace {

using embedding::RequestId;

TEST(PushJournal, AppliesARequestIdOnceAndAnswersRepeatsWithTheFirstAnswer) {
  PushJournal journal;
  int applied = 0;
  auto apply = [&](std::vector<int64_t>* done) {
    ++applied;
    done->push_back(7);
    return absl::OkStatus();
  };
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::vector<int64_t>> r = journal.Run({5, 1}, 1, apply);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(*r, std::vector<int64_t>{7});
  }
  EXPECT_EQ(applied, 1);
  ASSERT_TRUE(journal.Run({5, 2}, 1, apply).ok());  // another sequence
  ASSERT_TRUE(journal.Run({6, 1}, 1, apply).ok());  // another client
  EXPECT_EQ(applied, 3);
}

TEST(PushJournal, RequestsWithoutAnIdAreAppliedEveryTime) {
  PushJournal journal;
  int applied = 0;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(journal
                    .Run({0, 0}, 1,
                         [&](std::vector<int64_t>* done) {
                           ++applied;
                           done->push_back(1);
                           return absl::OkStatus();
                         })
                    .ok());
  }
  EXPECT_EQ(applied, 3);
  EXPECT_EQ(journal.size(), 0u);
}

TEST(PushJournal, ARetryAfterAPartialFailureAppliesOnlyTheRemainingParts) {
  PushJournal journal;
  std::vector<int> applied_parts;
  bool fail_part_1 = true;
  auto apply = [&](std::vector<int64_t>* done) -> absl::Status {
    for (size_t p = done->size(); p < 3; ++p) {
      if (p == 1 && fail_part_1) return absl::UnavailableError("disk away");
      applied_parts.push_back(static_cast<int>(p));
      done->push_back(static_cast<int64_t>(10 + p));
    }
    return absl::OkStatus();
  };
  EXPECT_EQ(journal.Run({1, 1}, 3, apply).status().code(), absl::StatusCode::kUnavailable);
  fail_part_1 = false;
  absl::StatusOr<std::vector<int64_t>> r = journal.Run({1, 1}, 3, apply);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (std::vector<int64_t>{10, 11, 12}));
  EXPECT_EQ(applied_parts, (std::vector<int>{0, 1, 2}));  // part 0 once
}

TEST(PushJournal, ARepeatArrivingWhileTheFirstAttemptRunsWaitsForItsAnswer) {
  PushJournal journal;
  std::atomic<int> applied{0};
  std::atomic<bool> release{false};
  std::atomic<bool> started{false};
  std::thread first([&] {
    (void)journal.Run({2, 9}, 1, [&](std::vector<int64_t>* done) {
      started = true;
      while (!release) std::this_thread::yield();
      ++applied;
      done->push_back(3);
      return absl::OkStatus();
    });
  });
  while (!started) std::this_thread::yield();
  absl::StatusOr<std::vector<int64_t>> second;
  std::thread repeat([&] {
    second = journal.Run({2, 9}, 1, [&](std::vector<int64_t>* done) {
      ++applied;
      done->push_back(4);
      return absl::OkStatus();
    });
  });
  release = true;
  first.join();
  repeat.join();
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*second, std::vector<int64_t>{3});
  EXPECT_EQ(applied.load(), 1);
}

// The two halves, for a push answered on another thread: a copy arriving meanwhile is told
// the first runs (not made to wait), a failed attempt may be tried again, and a complete
// one answers every later copy.
TEST(PushJournal, BeginAndEndClaimAnIdWithoutWaiting) {
  PushJournal journal;
  const RequestId id{4, 2};
  PushJournal::Claim first = journal.Begin(id);
  EXPECT_EQ(first.state, PushJournal::Began::kRun);
  EXPECT_EQ(journal.Begin(id).state, PushJournal::Began::kBusy);
  journal.End(id, absl::AbortedError("a worker did not come"), {});
  PushJournal::Claim second = journal.Begin(id);
  EXPECT_EQ(second.state, PushJournal::Began::kRun);
  journal.End(id, absl::OkStatus(), {3, 0});
  PushJournal::Claim third = journal.Begin(id);
  EXPECT_EQ(third.state, PushJournal::Began::kDone);
  EXPECT_EQ(third.done, (std::vector<int64_t>{3, 0}));
  // Run answers from it too, applying nothing.
  absl::StatusOr<std::vector<int64_t>> ran =
      journal.Run(id, 2, [](std::vector<int64_t>*) { return absl::InternalError("applied"); });
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_EQ(*ran, (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(journal.Begin(RequestId{}).state, PushJournal::Began::kRun);  // no id: every time
}

TEST(PushJournal, KeepsOnlyTheNewestIds) {
  PushJournal journal(/*capacity=*/4);
  int applied = 0;
  auto apply = [&](std::vector<int64_t>* done) {
    ++applied;
    done->push_back(1);
    return absl::OkStatus();
  };
  for (uint64_t seq = 1; seq <= 10; ++seq) ASSERT_TRUE(journal.Run({1, seq}, 1, apply).ok());
  EXPECT_EQ(journal.size(), 4u);
  ASSERT_TRUE(journal.Run({1, 10}, 1, apply).ok());  // still known
  EXPECT_EQ(applied, 10);
  ASSERT_TRUE(journal.Run({1, 1}, 1, apply).ok());  // forgotten: applied again
  EXPECT_EQ(applied, 11);
}

TEST(PushJournal, ClearForgetsAppliedIds) {
  PushJournal journal;
  int applied = 0;
  auto apply = [&](std::vector<int64_t>* done) {
    ++applied;
    done->push_back(1);
    return absl::OkStatus();
  };
  ASSERT_TRUE(journal.Run({1, 1}, 1, apply).ok());
  journal.Clear();
  ASSERT_TRUE(journal.Run({1, 1}, 1, apply).ok());
  EXPECT_EQ(applied, 2);
}

}  // namespace
}  // namespace tessera::server

namespace tessera::server {
namespace {

TEST(PushJournal, ListsTheAppliedPushesWithThePartsOfAnUnfinishedOne) {
  PushJournal journal;
  auto two = [](std::vector<int64_t>* done) {
    done->assign({1, 2});
    return absl::OkStatus();
  };
  ASSERT_TRUE(journal.Run({5, 1}, 2, two).ok());
  // The second part fails: the first stays applied, named.
  auto half = [](std::vector<int64_t>* done) {
    done->push_back(1);
    return absl::ResourceExhaustedError("full");
  };
  auto table_of = [](size_t i) { return std::string(i == 0 ? "a" : "b"); };
  EXPECT_FALSE(journal.Run({5, 2}, 2, half, table_of).ok());
  // Refused whole: nothing applied, not listed.
  EXPECT_FALSE(
      journal.Run({5, 3}, 1, [](std::vector<int64_t>*) { return absl::InternalError("no"); }).ok());
  std::vector<PushJournal::Applied> applied = journal.AppliedPushes();
  ASSERT_EQ(applied.size(), 2u);
  std::sort(applied.begin(), applied.end(),
            [](const auto& x, const auto& y) { return x.id.sequence < y.id.sequence; });
  EXPECT_TRUE(applied[0].complete);
  EXPECT_TRUE(applied[0].tables.empty());
  EXPECT_FALSE(applied[1].complete);
  EXPECT_EQ(applied[1].tables, std::vector<std::string>{"a"});
}

v1::AppliedPush Moved(uint64_t client, uint64_t sequence, int owner, int shards,
                      std::vector<std::string> tables = {}) {
  v1::AppliedPush p;
  p.mutable_request_id()->set_client_id(client);
  p.mutable_request_id()->set_sequence(sequence);
  p.set_owner(owner);
  p.set_num_shards(shards);
  for (const auto& t : tables) p.add_tables(t);
  return p;
}

TEST(MovedPushes, FindsAPushByIdAndItsRowsByTheOldOwner) {
  MovedPushes moved(/*capacity=*/2);
  google::protobuf::RepeatedPtrField<v1::AppliedPush> add;
  *add.Add() = Moved(1, 1, 0, 2);
  *add.Add() = Moved(1, 1, 0, 2);  // a repeated COMMIT adds nothing
  *add.Add() = Moved(1, 2, 1, 2, {"b"});
  moved.Add(add);
  EXPECT_EQ(moved.Of({1, 1}).size(), 1u);
  EXPECT_TRUE(moved.Of({1, 3}).empty());
  v1::TableConfig a;
  a.set_name("a");
  a.set_seed(9);
  v1::TableConfig b = a;
  b.set_name("b");
  for (int64_t id = 0; id < 200; ++id) {
    const bool old_owner_0 = embedding::ShardOfRow(a, id, 2) == 0;
    EXPECT_EQ(AppliedTo(moved.Of({1, 1})[0], a, id), old_owner_0);
    // Only its table b was applied.
    EXPECT_FALSE(AppliedTo(moved.Of({1, 2})[0], a, id));
    EXPECT_EQ(AppliedTo(moved.Of({1, 2})[0], b, id), !old_owner_0);
  }
  // Past its capacity the oldest goes.
  google::protobuf::RepeatedPtrField<v1::AppliedPush> more;
  *more.Add() = Moved(2, 1, 0, 3);
  moved.Add(more);
  EXPECT_TRUE(moved.Of({1, 1}).empty());
  EXPECT_EQ(moved.All().size(), 2u);
  moved.Clear();
  EXPECT_TRUE(moved.empty());
}

}  // namespace
}  // namespace tessera::server
