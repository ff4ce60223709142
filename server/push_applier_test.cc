// The exactly-once push path below the wire: a data-parallel step's pushes merged, and
// their retries answered from the journal.
#include "server/push_applier.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "embedding/inprocess_collection.h"
#include "gtest/gtest.h"
#include "server/reshard_participant.h"
#include "tests/support/table_configs.h"

namespace tessera::server {
namespace {

// A shard's tables (t1 and t2, dim 2, SGD), its place and its pushes.
class Shard {
 public:
  Shard()
      : tables_(std::move(embedding::NewInProcessCollection(1)).value()),
        reshard_(tables_.get(), &pushes_, {}),
        pushes_(
            tables_.get(), &reshard_,
            [](const std::string& t, std::shared_ptr<TableCounters>*) -> absl::StatusOr<ConfigRef> {
              return std::make_shared<const v1::TableConfig>(
                  testing::TestTable(t, 2, 7, v1::SGD, 1.0f));
            },
            {}) {
    for (const char* t : {"t1", "t2"}) {
      EXPECT_TRUE(tables_->CreateTable(testing::TestTable(t, 2, 7, v1::SGD, 1.0f)).ok());
    }
  }

  // Worker `worker`'s push of `tables` (each row of id 1, gradient 1) in step 3 of job
  // "j" of 2 workers, under request id worker+1:1; its answer once it has one (a push
  // that waits for the other worker has none yet).
  struct Push {
    std::vector<embedding::TableGradients> parts;
    Contribution part;
    absl::Notification answered;
    absl::StatusOr<std::vector<int64_t>> rows;
  };
  void Start(int worker, const std::vector<std::string>& tables, Push* push) {
    for (const std::string& t : tables) push->parts.push_back({t, ids_, gradients_});
    embedding::PushSync member{"j", worker, 2, std::chrono::milliseconds(60000)};
    const embedding::RequestId id{static_cast<uint64_t>(worker + 1), 1};
    push->part = Contribution{push->parts, id};
    pushes_.StartSync(member, 3, id, &push->part,
                      [push](absl::StatusOr<std::vector<int64_t>> rows) {
                        push->rows = std::move(rows);
                        push->answered.Notify();
                      });
  }
  std::vector<float> Row(const std::string& table) {
    std::vector<float> out(2);
    EXPECT_TRUE(tables_->Lookup(table, ids_, absl::MakeSpan(out)).ok());
    return out;
  }

  std::unique_ptr<embedding::InProcessCollection> tables_;
  ReshardParticipant reshard_;
  PushApplier pushes_;

 private:
  const std::vector<int64_t> ids_ = {1};
  const std::vector<float> gradients_ = {1.0f, 1.0f};
};

TEST(PushApplier, AStepIsAppliedOnceAndEachWorkersRetryGetsItsOwnAnswer) {
  Shard shard;
  ASSERT_TRUE(shard.pushes_.RegisterGroup("j", 2).ok());
  const std::vector<float> t1 = shard.Row("t1"), t2 = shard.Row("t2");
  // Worker 0 pushes one table, worker 1 two: the step merges two.
  Shard::Push w0, w1;
  shard.Start(0, {"t1"}, &w0);
  EXPECT_FALSE(w0.answered.HasBeenNotified());  // it waits for worker 1
  shard.Start(1, {"t1", "t2"}, &w1);
  ASSERT_TRUE(w0.answered.WaitForNotificationWithTimeout(absl::Seconds(60)));
  ASSERT_TRUE(w1.answered.WaitForNotificationWithTimeout(absl::Seconds(60)));
  // Each worker is answered the rows of its own tables; both gradients are summed on t1 (lr
  // 1: each weight down by 2), one on t2.
  auto expect_step_applied = [&](const Shard::Push& worker0, const Shard::Push& worker1) {
    ASSERT_TRUE(worker0.rows.ok()) << worker0.rows.status();
    ASSERT_TRUE(worker1.rows.ok()) << worker1.rows.status();
    EXPECT_EQ(*worker0.rows, std::vector<int64_t>{1});
    EXPECT_EQ(*worker1.rows, (std::vector<int64_t>{1, 1}));
    EXPECT_FLOAT_EQ(shard.Row("t1")[0], t1[0] - 2.0f);
    EXPECT_FLOAT_EQ(shard.Row("t2")[0], t2[0] - 1.0f);
  };
  expect_step_applied(w0, w1);
  // Each worker's retry (its answer was lost) is answered as before and applies nothing,
  // whatever number of tables the step merged.
  Shard::Push again0, again1;
  shard.Start(0, {"t1"}, &again0);
  shard.Start(1, {"t1", "t2"}, &again1);
  ASSERT_TRUE(again0.answered.HasBeenNotified());
  ASSERT_TRUE(again1.answered.HasBeenNotified());
  expect_step_applied(again0, again1);
}

TEST(PushApplier, ASyncPushOfAGroupNoJobRegisteredIsRefused) {
  Shard shard;
  Shard::Push w0;
  shard.Start(0, {"t1"}, &w0);
  ASSERT_TRUE(w0.answered.HasBeenNotified());
  EXPECT_TRUE(absl::IsFailedPrecondition(w0.rows.status())) << w0.rows.status();
}

}  // namespace
}  // namespace tessera::server
