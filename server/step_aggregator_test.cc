#include "server/step_aggregator.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace tessera::server {
namespace {

using embedding::RequestId;
using embedding::TableGradients;

embedding::PushSync Member(int worker, int workers, int timeout_ms = 10000) {
  embedding::PushSync m;
  m.job = "job#0";
  m.worker = worker;
  m.workers = workers;
  m.timeout = std::chrono::milliseconds(timeout_ms);
  return m;
}

// What a step's apply saw.
struct Applied {
  std::atomic<int> calls{0};
  std::vector<std::string> tables;
  std::vector<std::vector<int64_t>> ids;
  std::vector<std::vector<float>> grads;
  RequestId id;
};

StepAggregator::ApplyFn Recorder(Applied* a) {
  return [a](absl::Span<const TableGradients> merged,
             const RequestId& id) -> absl::StatusOr<std::vector<int64_t>> {
    ++a->calls;
    a->id = id;
    std::vector<int64_t> rows;
    for (const auto& t : merged) {
      a->tables.push_back(t.table);
      a->ids.emplace_back(t.ids.begin(), t.ids.end());
      a->grads.emplace_back(t.gradients.begin(), t.gradients.end());
      rows.push_back(static_cast<int64_t>(t.ids.size()));
    }
    return rows;
  };
}

TEST(StepAggregator, AppliesAStepOnceWithTheWorkersGradientsInWorkerOrder) {
  StepAggregator agg("shard 0");
  Applied applied;
  // Worker 1 arrives first; the merged push still lists worker 0's rows first.
  const std::vector<int64_t> ids0 = {5, 6}, ids1 = {6};
  const std::vector<float> g0 = {1, 2}, g1 = {3};
  const std::vector<TableGradients> t0 = {{"a", ids0, g0}};
  const std::vector<TableGradients> t1 = {{"b", ids1, g1}, {"a", ids1, g1}};
  const Contribution c0{t0, RequestId{11, 1}}, c1{t1, RequestId{22, 1}};
  absl::StatusOr<std::vector<int64_t>> r1;
  std::thread second([&] { r1 = agg.Contribute(Member(1, 2), 7, c1, Recorder(&applied)); });
  while (agg.pending() == 0) std::this_thread::yield();
  EXPECT_EQ(applied.calls.load(), 0);  // nothing applied before every worker is in
  absl::StatusOr<std::vector<int64_t>> r0 = agg.Contribute(Member(0, 2), 7, c0, Recorder(&applied));
  second.join();
  ASSERT_TRUE(r0.ok()) << r0.status();
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(applied.calls.load(), 1);
  // Tables in order of first appearance in worker order: worker 0's "a", then "b".
  ASSERT_EQ(applied.tables, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(applied.ids[0], (std::vector<int64_t>{5, 6, 6}));
  EXPECT_EQ(applied.grads[0], (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(applied.ids[1], (std::vector<int64_t>{6}));
  EXPECT_EQ(applied.id.client_id, 11u);  // worker 0's request id
  // Each worker hears the rows of its own tables, in its order.
  EXPECT_EQ(*r0, (std::vector<int64_t>{3}));
  EXPECT_EQ(*r1, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(agg.pending(), 0u);
}

TEST(StepAggregator, AWorkerThatDoesNotComeFailsTheOthersNamingIt) {
  StepAggregator agg("shard 0");
  Applied applied;
  const std::vector<TableGradients> none;
  const Contribution c{none, RequestId{1, 1}};
  absl::StatusOr<std::vector<int64_t>> r =
      agg.Contribute(Member(0, 3, 30), 4, c, Recorder(&applied));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(r.status().message().find("worker(s) 1, 2 of 3 did not push to shard 0"),
            std::string::npos)
      << r.status();
  EXPECT_EQ(applied.calls.load(), 0);
  EXPECT_EQ(agg.pending(), 0u);  // the abandoned step is gone
}

TEST(StepAggregator, ARetriedPushAfterATimeoutJoinsTheStepAsNew) {
  StepAggregator agg("shard 0");
  Applied applied;
  const std::vector<int64_t> ids = {1};
  const std::vector<float> g = {1};
  const std::vector<TableGradients> t = {{"a", ids, g}};
  const Contribution c0{t, RequestId{1, 1}}, c1{t, RequestId{2, 1}};
  ASSERT_EQ(agg.Contribute(Member(0, 2, 10), 1, c0, Recorder(&applied)).status().code(),
            absl::StatusCode::kAborted);
  absl::StatusOr<std::vector<int64_t>> r0;
  std::thread retry([&] { r0 = agg.Contribute(Member(0, 2), 1, c0, Recorder(&applied)); });
  while (agg.pending() == 0) std::this_thread::yield();
  ASSERT_TRUE(agg.Contribute(Member(1, 2), 1, c1, Recorder(&applied)).ok());
  retry.join();
  ASSERT_TRUE(r0.ok()) << r0.status();
  EXPECT_EQ(applied.calls.load(), 1);
  EXPECT_EQ(applied.ids[0], (std::vector<int64_t>{1, 1}));  // worker 0's rows counted once
}

// Issue 41, item 13: pushes that would wait are bounded (each holds a server thread):
// past the bound a lone push of another job is refused at once, the push that completes
// a waiting step is still taken, and once the step is applied there is room again.
TEST(StepAggregator, BoundsThePushesWaitingAndStillTakesOneThatCompletesAStep) {
  StepAggregator agg("shard 0", /*max_waiting=*/2);
  Applied applied;
  const std::vector<TableGradients> none;
  const Contribution c0{none, RequestId{1, 1}}, c1{none, RequestId{2, 1}},
      c2{none, RequestId{3, 1}}, stranger{none, RequestId{4, 1}};
  std::vector<absl::StatusOr<std::vector<int64_t>>> r(2);
  std::thread w0([&] { r[0] = agg.Contribute(Member(0, 3), 1, c0, Recorder(&applied)); });
  std::thread w1([&] { r[1] = agg.Contribute(Member(1, 3), 1, c1, Recorder(&applied)); });
  embedding::PushSync other = Member(0, 2);
  other.job = "other";
  // Both workers of job#0 wait: the stranger's push, which would wait too, is refused.
  while (agg.waiting() < 2) std::this_thread::yield();
  const absl::StatusOr<std::vector<int64_t>> refused =
      agg.Contribute(other, 1, stranger, Recorder(&applied));
  ASSERT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("--max_sync_waiting"), std::string::npos);
  EXPECT_EQ(agg.pending(), 1u);  // the refused push left no step behind
  // The last worker of job#0 completes its step.
  ASSERT_TRUE(agg.Contribute(Member(2, 3), 1, c2, Recorder(&applied)).ok());
  w0.join();
  w1.join();
  EXPECT_TRUE(r[0].ok() && r[1].ok());
  EXPECT_EQ(applied.calls.load(), 1);
  // Room again: the stranger's push now waits (and, alone, times out).
  other.timeout = std::chrono::milliseconds(10);
  EXPECT_EQ(agg.Contribute(other, 1, stranger, Recorder(&applied)).status().code(),
            absl::StatusCode::kAborted);
}

TEST(StepAggregator, RefusesAWorkerOutOfRangeOrAGroupSizeThatDiffers) {
  StepAggregator agg("shard 0");
  Applied applied;
  const std::vector<TableGradients> none;
  const Contribution c{none, RequestId{}};
  EXPECT_EQ(agg.Contribute(Member(2, 2), 0, c, Recorder(&applied)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(agg.Contribute(Member(0, 1), 0, c, Recorder(&applied)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A group size from the wire is bounded (one of 2^31 took the fuzzer out of memory).
  EXPECT_EQ(agg.Contribute(Member(0, StepAggregator::kMaxWorkers + 1), 0, c, Recorder(&applied))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(agg.pending(), 0u);
  absl::StatusOr<std::vector<int64_t>> first;
  std::thread t([&] { first = agg.Contribute(Member(0, 2, 200), 3, c, Recorder(&applied)); });
  while (agg.pending() == 0) std::this_thread::yield();
  absl::StatusOr<std::vector<int64_t>> other =
      agg.Contribute(Member(1, 3), 3, c, Recorder(&applied));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(other.status().message().find("says 3 workers, others said 2"), std::string::npos)
      << other.status();
  t.join();
  EXPECT_EQ(applied.calls.load(), 0);
}

TEST(StepAggregator, AFailedApplyFailsEveryWorkerOfTheStep) {
  StepAggregator agg("shard 0");
  const std::vector<TableGradients> none;
  const Contribution c0{none, RequestId{1, 1}}, c1{none, RequestId{2, 1}};
  auto failing = [](absl::Span<const TableGradients>,
                    const RequestId&) -> absl::StatusOr<std::vector<int64_t>> {
    return absl::InvalidArgumentError("summed gradient is not finite");
  };
  absl::StatusOr<std::vector<int64_t>> r0;
  std::thread t([&] { r0 = agg.Contribute(Member(0, 2), 9, c0, failing); });
  while (agg.pending() == 0) std::this_thread::yield();
  absl::StatusOr<std::vector<int64_t>> r1 = agg.Contribute(Member(1, 2), 9, c1, failing);
  t.join();
  EXPECT_EQ(r0.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r1.status().code(), absl::StatusCode::kInvalidArgument);
}

// Issue 41, item 13: Start answers through `done` and never waits: a push that waits for
// other workers returns at once, and is answered on the thread of the push that completes
// the step, or on the timer's when it times out.
TEST(StepAggregator, StartReturnsAtOnceAndTheStepsLastPushAnswersTheOthers) {
  StepAggregator agg("shard 0");
  Applied applied;
  const std::vector<TableGradients> none;
  const Contribution c0{none, RequestId{1, 1}}, c1{none, RequestId{2, 1}};
  std::vector<absl::StatusOr<std::vector<int64_t>>> got;
  std::vector<std::thread::id> on;
  auto record = [&](absl::StatusOr<std::vector<int64_t>> r) {
    got.push_back(std::move(r));
    on.push_back(std::this_thread::get_id());
  };
  agg.Start(Member(0, 2), 5, &c0, Recorder(&applied), record);
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(agg.waiting(), 1);
  agg.Start(Member(1, 2), 5, &c1, Recorder(&applied), record);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(got[0].ok() && got[1].ok());
  EXPECT_EQ(on[0], std::this_thread::get_id());
  EXPECT_EQ(applied.calls.load(), 1);
  EXPECT_EQ(agg.waiting(), 0);
}

TEST(StepAggregator, ATimeoutACancelAndALaterPushOfTheSameWorkerEachEndAWait) {
  StepAggregator agg("shard 0");
  Applied applied;
  const std::vector<TableGradients> none;
  const Contribution a{none, RequestId{1, 1}}, b{none, RequestId{2, 1}}, c{none, RequestId{3, 1}};
  absl::Notification timed_out;
  absl::Status why;
  agg.Start(Member(0, 2, 20), 1, &a, Recorder(&applied),
            [&](absl::StatusOr<std::vector<int64_t>> r) {
              why = r.status();
              timed_out.Notify();
            });
  timed_out.WaitForNotification();  // on the timer's thread, 20 ms on
  EXPECT_EQ(why.code(), absl::StatusCode::kAborted) << why;
  EXPECT_NE(why.message().find("within 20 ms"), std::string::npos) << why;
  EXPECT_EQ(agg.pending(), 0u);

  absl::Status cancelled;
  agg.Start(Member(0, 2), 2, &b, Recorder(&applied),
            [&](absl::StatusOr<std::vector<int64_t>> r) { cancelled = r.status(); });
  EXPECT_FALSE(agg.Cancel(&c));  // not waiting
  EXPECT_TRUE(agg.Cancel(&b));
  EXPECT_EQ(cancelled.code(), absl::StatusCode::kCancelled) << cancelled;
  EXPECT_FALSE(agg.Cancel(&b));  // answered once
  EXPECT_EQ(agg.waiting(), 0);

  // A restarted worker's push of the same step takes the waiting one's place.
  absl::Status replaced;
  absl::StatusOr<std::vector<int64_t>> later = absl::UnknownError("not answered");
  agg.Start(Member(0, 2), 3, &b, Recorder(&applied),
            [&](absl::StatusOr<std::vector<int64_t>> r) { replaced = r.status(); });
  agg.Start(Member(0, 2), 3, &c, Recorder(&applied),
            [&](absl::StatusOr<std::vector<int64_t>> r) { later = std::move(r); });
  EXPECT_EQ(replaced.code(), absl::StatusCode::kAborted) << replaced;
  EXPECT_NE(replaced.message().find("took this one's place"), std::string::npos) << replaced;
  EXPECT_EQ(agg.waiting(), 1);
  ASSERT_TRUE(agg.Contribute(Member(1, 2), 3, a, Recorder(&applied)).ok());
  EXPECT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(applied.calls.load(), 1);
}

}  // namespace
}  // namespace tessera::server
