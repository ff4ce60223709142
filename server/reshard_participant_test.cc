// The shard's side of a live reshard, without a server: the gate's waits, the commit's
// checks and switch of place, copy rounds, and the pushes a freeze hands over.
#include "server/reshard_participant.h"

#include <algorithm>
#include <optional>
#include <thread>

#include "absl/synchronization/notification.h"
#include "embedding/embedding_table.h"
#include "embedding/inprocess_collection.h"
#include "embedding/sharding.h"
#include "gtest/gtest.h"
#include "server/push_applier.h"
#include "tests/support/table_configs.h"

namespace tessera::server {
namespace {

using Traffic = ReshardParticipant::Traffic;

v1::TableConfig Sgd(const std::string& name) {
  return testing::TestTable(name, 2, 0, v1::SGD, 0.5f);
}

v1::ReshardRequest Phase(v1::ReshardRequest::Phase phase, uint64_t version, int32_t index,
                         int32_t num_shards) {
  v1::ReshardRequest r;
  r.set_phase(phase);
  r.set_version(version);
  r.set_shard_index(index);
  r.set_num_shards(num_shards);
  return r;
}

absl::Time Soon() { return absl::Now() + absl::Milliseconds(400); }

// A shard's tables (table "user"), its participant and its pushes.
class Shard {
 public:
  explicit Shard(int32_t index = 0, int32_t num_shards = 1)
      : tables_(std::move(embedding::NewInProcessCollection(1)).value()),
        reshard_(tables_.get(), &pushes_,
                 {index, num_shards, 1,
                  [this](int i, int n, uint64_t v) {
                    placements_.push_back({i, n, static_cast<int>(v)});
                    return placement_result_;
                  }}),
        pushes_(tables_.get(), &reshard_,
                [this](const std::string& t,
                       std::shared_ptr<TableCounters>*) -> absl::StatusOr<ConfigRef> {
                  if (t != "user") return absl::NotFoundError(t);
                  return std::make_shared<const v1::TableConfig>(Sgd(t));
                },
                {}) {
    EXPECT_TRUE(tables_->CreateTable(Sgd("user")).ok());
  }

  absl::Status Handle(v1::ReshardRequest::Phase phase, uint64_t version, int32_t index,
                      int32_t num_shards, v1::ReshardResponse* response = nullptr) {
    v1::ReshardResponse ignored;
    return reshard_.Handle(Phase(phase, version, index, num_shards),
                           response != nullptr ? response : &ignored);
  }
  // A push of rows `ids` of "user" under request id client:1.
  absl::Status Push(std::vector<int64_t> ids, uint64_t client) {
    std::vector<float> gradients(ids.size() * 2, 1.0f);
    DecodedBatch batch;
    batch.configs = {Sgd("user")};
    batch.pushes = {{"user", ids, gradients}};
    return pushes_.Apply(batch, 1, {client, 1}).status();
  }
  // Enter and Leave at once: the status Enter gave.
  absl::Status Pass(Traffic traffic, uint64_t version) {
    absl::Status s = reshard_.Enter(traffic, version, Soon());
    if (s.ok()) reshard_.Leave(traffic);
    return s;
  }

  std::unique_ptr<embedding::InProcessCollection> tables_;
  std::vector<std::vector<int>> placements_;
  absl::Status placement_result_;
  ReshardParticipant reshard_;
  PushApplier pushes_;
};

TEST(ReshardParticipant, WhileFrozenPushesAndTheNewMapsReadsWaitAndTheOldMapsReadsPass) {
  Shard shard;
  ASSERT_TRUE(shard.Handle(v1::ReshardRequest::FREEZE, 2, 0, 2).ok());
  absl::Status push = shard.Pass(Traffic::kPush, 1);
  EXPECT_TRUE(absl::IsUnavailable(push)) << push;
  EXPECT_NE(push.message().find("moving rows to shard map version 2"), std::string::npos) << push;
  EXPECT_TRUE(absl::IsUnavailable(shard.Pass(Traffic::kRead, 2)));
  EXPECT_TRUE(shard.Pass(Traffic::kRead, 1).ok());
  EXPECT_TRUE(shard.Pass(Traffic::kRead, 0).ok());
  EXPECT_TRUE(shard.Pass(Traffic::kImport, 2).ok());  // the reshard's own rows
  EXPECT_TRUE(shard.reshard_.MovingRowsOf(2));
  EXPECT_FALSE(shard.reshard_.MovingRowsOf(1));

  ASSERT_TRUE(shard.Handle(v1::ReshardRequest::ABORT, 2, 0, 2).ok());
  EXPECT_TRUE(shard.Pass(Traffic::kPush, 1).ok());
  EXPECT_FALSE(shard.reshard_.MovingRowsOf(2));
  EXPECT_EQ(shard.reshard_.version(), 1u);
}

TEST(ReshardParticipant, AWaitingPushGoesOnOnceTheReshardIsAborted) {
  Shard shard;
  ASSERT_TRUE(shard.Handle(v1::ReshardRequest::FREEZE, 2, 0, 2).ok());
  absl::Status entered = absl::UnknownError("not yet");
  absl::Notification done;
  std::thread pusher([&] {
    entered = shard.reshard_.Enter(Traffic::kPush, 1, absl::Now() + absl::Seconds(60));
    done.Notify();
  });
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  ASSERT_TRUE(shard.Handle(v1::ReshardRequest::ABORT, 2, 0, 2).ok());
  pusher.join();
  EXPECT_TRUE(entered.ok()) << entered;
  shard.reshard_.Leave(Traffic::kPush);
}

TEST(ReshardParticipant, FreezeWaitsForThePushesInFlight) {
  Shard shard;
  std::optional<ReshardParticipant::Admitted> push;
  ASSERT_TRUE(shard.reshard_.Enter(Traffic::kPush, 1, Soon()).ok());
  push.emplace(&shard.reshard_, Traffic::kPush);
  absl::Notification frozen;
  std::thread freezer([&] {
    EXPECT_TRUE(shard.Handle(v1::ReshardRequest::FREEZE, 2, 0, 2).ok());
    frozen.Notify();
  });
  EXPECT_FALSE(frozen.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  push.reset();  // the push answered: the freeze goes on
  freezer.join();
  EXPECT_TRUE(frozen.HasBeenNotified());
}

TEST(ReshardParticipant, CommitWaitsForReadsInFlightThenServesTheNewPlace) {
  Shard shard(0, 1);
  ASSERT_TRUE(shard.Handle(v1::ReshardRequest::COPY, 2, 1, 3).ok());
  shard.reshard_.NoteCopied("user");
  ASSERT_TRUE(shard.Handle(v1::ReshardRequest::FREEZE, 2, 1, 3).ok());
  std::optional<ReshardParticipant::Admitted> read;
  ASSERT_TRUE(shard.reshard_.Enter(Traffic::kRead, 1, Soon()).ok());
  read.emplace(&shard.reshard_, Traffic::kRead);
  absl::Notification committed;
  std::thread committer([&] {
    v1::ReshardResponse response;
    EXPECT_TRUE(shard.Handle(v1::ReshardRequest::COMMIT, 2, 1, 3, &response).ok());
    EXPECT_EQ(response.version(), 2u);
    EXPECT_EQ(response.shard_index(), 1);
    EXPECT_EQ(response.num_shards(), 3);
    committed.Notify();
  });
  EXPECT_FALSE(committed.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  EXPECT_EQ(shard.reshard_.version(), 1u);
  read.reset();
  committer.join();
  EXPECT_EQ(shard.reshard_.index(), 1);
  EXPECT_EQ(shard.reshard_.num_shards(), 3);
  EXPECT_EQ(shard.reshard_.version(), 2u);
  EXPECT_EQ(shard.placements_, (std::vector<std::vector<int>>{{1, 3, 2}}));
  EXPECT_TRUE(shard.Pass(Traffic::kPush, 2).ok());  // no longer frozen
  // A repeated commit is done already.
  EXPECT_TRUE(shard.Handle(v1::ReshardRequest::COMMIT, 2, 1, 3).ok());
}

TEST(ReshardParticipant, AShardThatLeftTheMapRefusesEveryRequest) {
  Shard shard(1, 2);
  ASSERT_TRUE(shard.Handle(v1::ReshardRequest::FREEZE, 2, -1, 1).ok());
  shard.reshard_.NoteCopied("user");
  ASSERT_TRUE(shard.Handle(v1::ReshardRequest::COMMIT, 2, -1, 1).ok());
  for (Traffic t : {Traffic::kRead, Traffic::kPush, Traffic::kImport}) {
    absl::Status s = shard.Pass(t, 0);
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
    EXPECT_NE(s.message().find("no longer in the shard map"), std::string::npos) << s;
  }
}

TEST(ReshardParticipant, CommitRefusesAShardNotFrozenForThatPlace) {
  Shard shard;
  absl::Status s = shard.Handle(v1::ReshardRequest::COMMIT, 2, 0, 2);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("freeze it first"), std::string::npos) << s;
  ASSERT_TRUE(shard.Handle(v1::ReshardRequest::FREEZE, 2, 0, 2).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(shard.Handle(v1::ReshardRequest::COMMIT, 2, 1, 2)));
  EXPECT_EQ(shard.reshard_.version(), 1u);
  EXPECT_TRUE(shard.placements_.empty());
}

TEST(ReshardParticipant, ATableWhoseRowsNoRoundCopiedStopsTheCommitUntilCopied) {
  Shard shard;
  ASSERT_TRUE(shard.Push({1, 2, 3}, 0).ok());  // rows, created by the push
  ASSERT_TRUE(shard.Handle(v1::ReshardRequest::COPY, 2, 0, 2).ok());
  ASSERT_TRUE(shard.Handle(v1::ReshardRequest::FREEZE, 2, 0, 2).ok());
  absl::Status s = shard.Handle(v1::ReshardRequest::COMMIT, 2, 0, 2);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("'user' holds 3 rows"), std::string::npos) << s;
  // Still frozen, not committed: the coordinator repeats it once the table is copied.
  EXPECT_TRUE(absl::IsUnavailable(shard.Pass(Traffic::kPush, 1)));
  EXPECT_EQ(shard.reshard_.version(), 1u);
  shard.reshard_.NoteCopied("user");
  EXPECT_TRUE(shard.Handle(v1::ReshardRequest::COMMIT, 2, 0, 2).ok());
  EXPECT_EQ(shard.reshard_.version(), 2u);
}

TEST(ReshardParticipant, APlacementThatFailsLeavesTheShardFrozenOnTheOldMap) {
  Shard shard;
  shard.placement_result_ = absl::InternalError("disk full");
  ASSERT_TRUE(shard.Handle(v1::ReshardRequest::FREEZE, 2, 0, 2).ok());
  shard.reshard_.NoteCopied("user");
  absl::Status s = shard.Handle(v1::ReshardRequest::COMMIT, 2, 0, 2);
  EXPECT_TRUE(absl::IsInternal(s)) << s;
  EXPECT_NE(s.message().find("reshard not committed"), std::string::npos) << s;
  EXPECT_EQ(shard.reshard_.version(), 1u);
  EXPECT_EQ(shard.reshard_.num_shards(), 1);
  shard.placement_result_ = absl::OkStatus();
  EXPECT_TRUE(shard.Handle(v1::ReshardRequest::COMMIT, 2, 0, 2).ok());
  EXPECT_EQ(shard.reshard_.num_shards(), 2);
}

TEST(ReshardParticipant, EachCopyRoundReportsTheLeavingRowsChangedInTheLastOne) {
  Shard shard;
  v1::ReshardResponse response;
  ASSERT_TRUE(shard.Handle(v1::ReshardRequest::COPY, 2, 0, 2, &response).ok());
  EXPECT_EQ(response.changed_rows(), -1);  // the first round copies every row
  std::vector<int64_t> ids;
  std::vector<int64_t> leaving;
  for (int64_t id = 0; id < 40; ++id) {
    ids.push_back(id);
    if (embedding::ShardOfRow(Sgd("user"), id, 2) != 0) leaving.push_back(id);
  }
  ASSERT_FALSE(leaving.empty());
  ASSERT_LT(leaving.size(), ids.size());
  ASSERT_TRUE(shard.Push(ids, 7).ok());  // the push notes what it changed
  ASSERT_TRUE(shard.Handle(v1::ReshardRequest::COPY, 2, 0, 2, &response).ok());
  EXPECT_EQ(response.changed_rows(), static_cast<int64_t>(leaving.size()));
  std::vector<int64_t> again = shard.reshard_.ChangedInLastRound("user");
  std::sort(again.begin(), again.end());
  EXPECT_EQ(again, leaving);
  // Nothing changed since: the next round sends nothing.
  ASSERT_TRUE(shard.Handle(v1::ReshardRequest::COPY, 2, 0, 2, &response).ok());
  EXPECT_EQ(response.changed_rows(), 0);
  EXPECT_TRUE(shard.reshard_.ChangedInLastRound("user").empty());
}

TEST(ReshardParticipant, FreezeHandsOverThePushesAppliedUnderTheOldMap) {
  Shard shard;
  ASSERT_TRUE(shard.Push({4, 5}, 42).ok());
  v1::ReshardResponse response;
  ASSERT_TRUE(shard.Handle(v1::ReshardRequest::FREEZE, 2, 0, 2, &response).ok());
  ASSERT_EQ(response.applied_size(), 1);
  EXPECT_EQ(response.applied(0).request_id().client_id(), 42u);
  EXPECT_EQ(response.applied(0).request_id().sequence(), 1u);
  EXPECT_EQ(response.applied(0).owner(), 0);
  EXPECT_EQ(response.applied(0).num_shards(), 1);
  EXPECT_EQ(response.applied(0).tables_size(), 0);  // applied whole: no table left out
}

TEST(ReshardParticipant, AnotherReshardWhileOneIsPendingAndBadPlacesAreRefused) {
  Shard shard;
  ASSERT_TRUE(shard.Handle(v1::ReshardRequest::COPY, 2, 0, 2).ok());
  absl::Status s = shard.Handle(v1::ReshardRequest::COPY, 3, 0, 3);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("finish or abort that reshard first"), std::string::npos) << s;
  EXPECT_TRUE(absl::IsFailedPrecondition(shard.Handle(v1::ReshardRequest::FREEZE, 3, 0, 3)));
  EXPECT_TRUE(absl::IsInvalidArgument(shard.Handle(v1::ReshardRequest::COPY, 0, 0, 2)));
  EXPECT_TRUE(absl::IsInvalidArgument(shard.Handle(v1::ReshardRequest::COPY, 3, 2, 2)));
  EXPECT_TRUE(absl::IsInvalidArgument(shard.Handle(v1::ReshardRequest::COPY, 3, 0, 0)));
}

TEST(ReshardParticipant, AnImportOfTheNewMapIsCheckedAgainstThisShardsPlaceInIt) {
  Shard shard;
  uint64_t version = 2;
  int32_t index = -1;
  int32_t shards = -1;
  ASSERT_TRUE(shard.reshard_.PlaceOfImport(&version, &index, &shards).ok());
  EXPECT_EQ(version, 2u);  // no reshard pending: as the caller sent it
  EXPECT_EQ(index, -1);
  ASSERT_TRUE(shard.Handle(v1::ReshardRequest::COPY, 2, 1, 3).ok());
  ASSERT_TRUE(shard.reshard_.PlaceOfImport(&version, &index, &shards).ok());
  EXPECT_EQ(version, 0u);
  EXPECT_EQ(index, 1);
  EXPECT_EQ(shards, 3);
}

}  // namespace
}  // namespace tessera::server
