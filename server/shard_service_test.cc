// The shard service over a real gRPC channel on 127.0.0.1 (in this process).

#include "server/shard_service.h"

#include <atomic>
#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "embedding/collection.h"
#include "embedding/inprocess_collection.h"
#include "embedding/sharding.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"
#include "tests/support/local_server.h"
#include "tests/support/stub_calls.h"
#include "tests/support/table_configs.h"

namespace tessera::server {
namespace {

class ShardServiceTest : public ::testing::Test {
 protected:
  void Start(int index, int shards, int64_t max_batch = 1000) {
    tables_ = std::move(embedding::NewInProcessCollection(1)).value();
    ShardOptions o;
    o.shard_index = index;
    o.num_shards = shards;
    o.shard_map_version = 7;
    o.max_batch_ids = max_batch;
    o.max_sync_wait = max_sync_wait_;
    service_ = std::make_unique<ShardService>(tables_.get(), o);
    int port = 0;
    server_ = testing::StartLocalServer(service_.get(), &port);
    ASSERT_NE(server_, nullptr);
    channel_ = testing::LocalChannel(port);
    stub_ = v1::EmbeddingShard::NewStub(channel_);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  v1::TableConfig Config(const std::string& name = "user", int dim = 4) {
    return testing::TestTable(name, dim, 99, v1::SGD, 0.5f);
  }

  grpc::Status Create(const v1::TableConfig& c) { return testing::CreateTable(*stub_, c); }

  grpc::Status Lookup(const v1::LookupRequest& req, v1::LookupResponse* resp) {
    return testing::Lookup(*stub_, req, resp);
  }

  // Registers sync group `job` of `workers` workers, as a data-parallel job does first.
  void RegisterGroup(const std::string& job = "job#0", int workers = 2) {
    v1::RegisterSyncGroupRequest req;
    req.mutable_group()->set_job(job);
    req.mutable_group()->set_workers(workers);
    grpc::ClientContext ctx;
    v1::RegisterSyncGroupResponse resp;
    const grpc::Status s = stub_->RegisterSyncGroup(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  grpc::Status Push(const v1::PushGradientsRequest& req) {
    return testing::PushGradients(*stub_, req);
  }

  std::chrono::milliseconds max_sync_wait_{60000};  // ShardOptions::max_sync_wait
  std::unique_ptr<embedding::ShardTables> tables_;
  std::unique_ptr<ShardService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::EmbeddingShard::Stub> stub_;
};

v1::LookupRequest LookupOf(std::vector<int64_t> ids, const std::string& table = "user") {
  v1::LookupRequest r;
  r.set_table(table);
  for (int64_t id : ids) r.add_ids(id);
  return r;
}

TEST_F(ShardServiceTest, LookupsAndPushesOverTheWireMatchTheInProcessCollection) {
  Start(0, 1);
  ASSERT_TRUE(Create(Config()).ok());
  auto reference = std::move(embedding::NewInProcessCollection(3)).value();
  ASSERT_TRUE(reference->CreateTable(Config()).ok());

  const std::vector<int64_t> ids = {5, 17, 5, -3};
  v1::PushGradientsRequest push;
  push.set_table("user");
  std::vector<float> grads;
  for (int64_t id : ids) {
    push.add_ids(id);
    for (int j = 0; j < 4; ++j) {
      grads.push_back(0.1f * (j + 1) * static_cast<float>(id % 7));
      push.add_gradients(grads.back());
    }
  }
  push.set_step(3);
  ASSERT_TRUE(Push(push).ok());
  ASSERT_TRUE(reference->PushGradients("user", ids, grads, 3).ok());

  v1::LookupResponse resp;
  ASSERT_TRUE(Lookup(LookupOf(ids), &resp).ok());
  EXPECT_EQ(resp.dim(), 4);
  std::vector<float> want(ids.size() * 4);
  ASSERT_TRUE(reference->Lookup("user", ids, absl::MakeSpan(want)).ok());
  EXPECT_EQ(std::vector<float>(resp.values().begin(), resp.values().end()), want);

  // Pooled: the shard pools its part of each bag.
  v1::LookupRequest pooled = LookupOf(ids);
  for (int o : {0, 3, 4}) pooled.add_offsets(o);
  pooled.set_pooling(v1::MEAN);
  ASSERT_TRUE(Lookup(pooled, &resp).ok());
  std::vector<int32_t> offsets = {0, 3, 4};
  std::vector<float> want_pooled(8);
  ASSERT_TRUE(
      reference->PooledLookup("user", ids, offsets, {}, v1::MEAN, absl::MakeSpan(want_pooled))
          .ok());
  EXPECT_EQ(std::vector<float>(resp.values().begin(), resp.values().end()), want_pooled);

  grpc::ClientContext ctx;
  v1::StatsRequest sreq;
  v1::StatsResponse stats;
  ASSERT_TRUE(stub_->Stats(&ctx, sreq, &stats).ok());
  ASSERT_EQ(stats.tables_size(), 1);
  EXPECT_EQ(stats.tables(0).rows(), 3);
  EXPECT_EQ(stats.tables(0).updates(), 3);
  EXPECT_EQ(stats.tables(0).lookups(), 8);
}

TEST_F(ShardServiceTest, BadRequestsGetTheirCodesAndLeaveRowsBitIdentical) {
  Start(0, 1, /*max_batch=*/100);
  ASSERT_TRUE(Create(Config()).ok());
  EXPECT_TRUE(Create(Config()).ok());  // the same table again: idempotent
  v1::TableConfig other = Config();
  other.set_seed(other.seed() + 1);
  EXPECT_EQ(Create(other).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  v1::TableConfig bad = Config("bad", 0);
  EXPECT_EQ(Create(bad).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  v1::LookupResponse before;
  ASSERT_TRUE(Lookup(LookupOf({1, 2}), &before).ok());

  v1::LookupResponse resp;
  EXPECT_EQ(Lookup(LookupOf({1}, "item"), &resp).error_code(), grpc::StatusCode::NOT_FOUND);

  auto push_of = [](std::vector<float> g) {
    v1::PushGradientsRequest p;
    p.set_table("user");
    p.add_ids(1);
    p.add_ids(2);
    for (float v : g) p.add_gradients(v);
    return p;
  };
  grpc::Status s = Push(push_of({1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("dimension mismatch"));
  s = Push(push_of({1, 1, 1, 1, 1, 1, NAN, 1}));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Push(push_of({1, 1, 1, 1, 1, 1, INFINITY, 1})).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  v1::LookupRequest offsets = LookupOf({1, 2});
  for (int o : {0, 2, 1}) offsets.add_offsets(o);
  EXPECT_EQ(Lookup(offsets, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::LookupRequest weights = LookupOf({1, 2});
  for (int o : {0, 2}) weights.add_offsets(o);
  weights.add_weights(1.0f);
  EXPECT_EQ(Lookup(weights, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  std::vector<int64_t> many(101, 1);
  EXPECT_EQ(Lookup(LookupOf(many), &resp).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  v1::LookupRequest stale = LookupOf({1});
  stale.set_shard_map_version(6);
  s = Lookup(stale, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("version 6"));

  grpc::ClientContext late;
  late.set_deadline(std::chrono::system_clock::now() - std::chrono::seconds(1));
  EXPECT_EQ(stub_->Lookup(&late, LookupOf({1}), &resp).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);

  v1::LookupResponse after;
  ASSERT_TRUE(Lookup(LookupOf({1, 2}), &after).ok());
  EXPECT_EQ(std::vector<float>(after.values().begin(), after.values().end()),
            std::vector<float>(before.values().begin(), before.values().end()));
}

// A finite gradient whose update overflows is INVALID_ARGUMENT on the wire; the overflowing
// row keeps its value (never -inf served), and a repeat of the request id applies nothing.
TEST_F(ShardServiceTest, AnOverflowingUpdateIsRefusedForItsRowAndARepeatAppliesNothing) {
  Start(0, 1);
  v1::TableConfig c = Config();
  c.mutable_optimizer()->set_learning_rate(10.0f);
  ASSERT_TRUE(Create(c).ok());
  v1::LookupResponse before, after, again;
  ASSERT_TRUE(Lookup(LookupOf({1, 2}), &before).ok());
  v1::PushGradientsRequest push;
  push.set_table("user");
  push.add_ids(1);
  push.add_ids(2);
  for (float g : {0.1f, 0.1f, 0.1f, 0.1f, 1e38f, 1e38f, 1e38f, 1e38f}) push.add_gradients(g);
  push.mutable_request_id()->set_client_id(5);
  push.mutable_request_id()->set_sequence(1);
  grpc::Status s = Push(push);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("non-finite"));
  ASSERT_TRUE(Lookup(LookupOf({1, 2}), &after).ok());
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(after.values(i), before.values(i) - 1.0f, 1e-5f);  // id 1 moved
    EXPECT_EQ(after.values(4 + i), before.values(4 + i));          // id 2 kept its value
  }
  EXPECT_TRUE(Push(push).ok());  // the repeat: answered, not applied again
  ASSERT_TRUE(Lookup(LookupOf({1, 2}), &again).ok());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(again.values(i), after.values(i));
}

// An answer is sized by its bags, not its ids: many empty bags are bounded as ids are,
// before the answer is allocated (a few such requests used to take gigabytes).
TEST_F(ShardServiceTest, ALookupOfManyEmptyBagsIsRefusedBeforeItsAnswerIsMade) {
  Start(0, 1, /*max_batch=*/1000);
  ASSERT_TRUE(Create(Config("wide", 64)).ok());
  v1::LookupRequest req = LookupOf({}, "wide");
  req.set_shard_map_version(7);
  for (int b = 0; b <= 5000; ++b) req.add_offsets(0);
  v1::LookupResponse resp;
  grpc::Status s = Lookup(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("5000 rows"));

  v1::BatchLookupRequest batch;
  batch.set_shard_map_version(7);
  for (int t = 0; t < 2; ++t) {
    v1::TableLookup* part = batch.add_tables();
    part->set_table("wide");
    std::vector<int32_t> offsets(601, 0);
    part->set_offsets(std::string(reinterpret_cast<const char*>(offsets.data()),
                                  offsets.size() * sizeof(int32_t)));
  }
  grpc::ClientContext ctx;
  v1::BatchLookupResponse batch_resp;
  s = stub_->BatchLookup(&ctx, batch, &batch_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("1200 rows"));
  // Within the limit, empty bags answer zero rows.
  req.clear_offsets();
  for (int b = 0; b <= 10; ++b) req.add_offsets(0);
  ASSERT_TRUE(Lookup(req, &resp).ok());
  EXPECT_EQ(resp.values_size(), 10 * 64);
  for (float v : resp.values()) EXPECT_EQ(v, 0.0f);
}

TEST_F(ShardServiceTest, RefusesIdsOwnedByAnotherShard) {
  Start(1, 3);
  ASSERT_TRUE(Create(Config()).ok());
  int64_t mine = 0, other = 0;
  while (embedding::ShardOf(mine, 99, 3) != 1) ++mine;
  while (embedding::ShardOf(other, 99, 3) == 1) ++other;
  v1::LookupResponse resp;
  EXPECT_TRUE(Lookup(LookupOf({mine}), &resp).ok());
  grpc::Status s = Lookup(LookupOf({mine, other}), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("refresh the shard map"));
}

TEST_F(ShardServiceTest, ServesGrpcHealth) {
  Start(0, 1);
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(health->Check(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

}  // namespace
}  // namespace tessera::server

namespace tessera::server {
namespace {

// A worker's part of a synchronous step: `ids` of table "user" (dim 4), every gradient
// `g`, under request id (client, 1).
v1::BatchPushRequest SyncPart(int worker, std::vector<int64_t> ids, float g, uint64_t client) {
  v1::BatchPushRequest r;
  r.set_step(3);
  r.mutable_request_id()->set_client_id(client);
  r.mutable_request_id()->set_sequence(1);
  r.mutable_sync()->set_job("job#0");
  r.mutable_sync()->set_worker(worker);
  r.mutable_sync()->set_workers(2);
  r.mutable_sync()->set_timeout_ms(20000);
  if (!ids.empty()) {
    v1::TableGradients* t = r.add_tables();
    t->set_table("user");
    std::vector<float> grads(ids.size() * 4, g);
    t->set_ids(std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 8));
    t->set_gradients(std::string(reinterpret_cast<const char*>(grads.data()), grads.size() * 4));
  }
  return r;
}

// A batched push of several tables: `grads[t]` for table t ("t0".., dim 4), ids `ids`.
v1::BatchPushRequest BatchOf(const std::vector<int64_t>& ids,
                             const std::vector<std::vector<float>>& grads, uint64_t client) {
  v1::BatchPushRequest r;
  r.set_step(4);
  r.mutable_request_id()->set_client_id(client);
  r.mutable_request_id()->set_sequence(1);
  for (size_t t = 0; t < grads.size(); ++t) {
    v1::TableGradients* part = r.add_tables();
    part->set_table(absl::StrCat("t", t));
    part->set_ids(std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 8));
    part->set_gradients(
        std::string(reinterpret_cast<const char*>(grads[t].data()), grads[t].size() * 4));
  }
  return r;
}

TEST_F(ShardServiceTest, ABatchedPushIsRefusedWholeOrAppliedWholeAndOnce) {
  Start(0, 1);
  for (int t = 0; t < 5; ++t) ASSERT_TRUE(Create(Config(absl::StrCat("t", t))).ok());
  auto rows = [&](int t) {
    v1::LookupResponse r;
    EXPECT_TRUE(Lookup(LookupOf({1, 2, 3}, absl::StrCat("t", t)), &r).ok());
    return std::vector<float>(r.values().begin(), r.values().end());
  };
  std::vector<std::vector<float>> before;
  for (int t = 0; t < 5; ++t) before.push_back(rows(t));
  const std::vector<int64_t> ids = {1, 2, 1, 3};  // 3 distinct
  std::vector<std::vector<float>> grads(5, std::vector<float>(ids.size() * 4, 1.0f));
  auto push = [&](const v1::BatchPushRequest& r, v1::BatchPushResponse* resp) {
    grpc::ClientContext ctx;
    return stub_->BatchPush(&ctx, r, resp);
  };
  // A NaN in the last table refuses the batch: no table moves, not even the first four.
  grads[4][5] = NAN;
  v1::BatchPushResponse resp;
  EXPECT_EQ(push(BatchOf(ids, grads, 31), &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  for (int t = 0; t < 5; ++t) EXPECT_EQ(rows(t), before[t]) << "table t" << t;
  // A good batch moves every table, counts its distinct rows, and a repeat moves nothing.
  grads[4][5] = 1.0f;
  ASSERT_TRUE(push(BatchOf(ids, grads, 32), &resp).ok());
  ASSERT_EQ(resp.rows_updated_size(), 5);
  for (int t = 0; t < 5; ++t) EXPECT_EQ(resp.rows_updated(t), 3);
  std::vector<std::vector<float>> after;
  for (int t = 0; t < 5; ++t) {
    after.push_back(rows(t));
    // SGD at 0.5: id 1 got two gradients of 1, ids 2 and 3 one.
    for (int j = 0; j < 4; ++j) {
      EXPECT_FLOAT_EQ(after[t][j], before[t][j] - 1.0f);
      EXPECT_FLOAT_EQ(after[t][4 + j], before[t][4 + j] - 0.5f);
    }
  }
  v1::BatchPushResponse again;
  ASSERT_TRUE(push(BatchOf(ids, grads, 32), &again).ok());
  EXPECT_EQ(again.rows_updated_size(), 5);
  for (int t = 0; t < 5; ++t) EXPECT_EQ(rows(t), after[t]);
}

// A request id names one push: one reused for a push of another shape is refused, instead
// of being answered with the first push's answer (which does not fit it).
TEST_F(ShardServiceTest, ARequestIdReusedForAnotherPushIsRefused) {
  Start(0, 1);
  for (int t = 0; t < 2; ++t) ASSERT_TRUE(Create(Config(absl::StrCat("t", t))).ok());
  const std::vector<int64_t> ids = {1, 2};
  const std::vector<float> grads(ids.size() * 4, 1.0f);
  v1::BatchPushResponse resp;
  grpc::ClientContext first;
  ASSERT_TRUE(stub_->BatchPush(&first, BatchOf(ids, {grads, grads}, 77), &resp).ok());
  grpc::ClientContext second;
  const grpc::Status reused = stub_->BatchPush(&second, BatchOf(ids, {grads}, 77), &resp);
  EXPECT_EQ(reused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(reused.error_message(), ::testing::HasSubstr("was used by an earlier push"));
}

TEST_F(ShardServiceTest, ASyncStepIsAppliedOnceWhenEveryWorkerHasPushedAndRepeatsChangeNothing) {
  Start(0, 1);
  ASSERT_TRUE(Create(Config()).ok());
  RegisterGroup();
  v1::LookupResponse before;
  ASSERT_TRUE(Lookup(LookupOf({1, 2}), &before).ok());
  auto push = [&](const v1::BatchPushRequest& r, v1::BatchPushResponse* resp) {
    grpc::ClientContext ctx;
    return stub_->BatchPush(&ctx, r, resp);
  };
  // Worker 1 pushes id 1 and waits; worker 0 pushes ids 1 and 2 and completes the step.
  v1::BatchPushResponse r1;
  grpc::Status s1;
  std::thread w1([&] { s1 = push(SyncPart(1, {1}, 1.0f, 22), &r1); });
  v1::BatchPushResponse r0;
  grpc::Status s0 = push(SyncPart(0, {1, 2}, 3.0f, 11), &r0);
  w1.join();
  ASSERT_TRUE(s0.ok()) << s0.error_message();
  ASSERT_TRUE(s1.ok()) << s1.error_message();
  v1::LookupResponse after;
  ASSERT_TRUE(Lookup(LookupOf({1, 2}), &after).ok());
  // SGD at 0.5: id 1 moved by 0.5 * (3 + 1), id 2 by 0.5 * 3, in every column.
  for (int j = 0; j < 4; ++j) {
    EXPECT_FLOAT_EQ(after.values(j), before.values(j) - 2.0f);
    EXPECT_FLOAT_EQ(after.values(4 + j), before.values(4 + j) - 1.5f);
  }
  // Each worker's retry (the answer lost) is answered from its request id: nothing moves,
  // and it does not wait for the other worker again.
  v1::BatchPushResponse again;
  ASSERT_TRUE(push(SyncPart(0, {1, 2}, 3.0f, 11), &again).ok());
  ASSERT_TRUE(push(SyncPart(1, {1}, 1.0f, 22), &again).ok());
  v1::LookupResponse repeated;
  ASSERT_TRUE(Lookup(LookupOf({1, 2}), &repeated).ok());
  for (int j = 0; j < 8; ++j) EXPECT_EQ(repeated.values(j), after.values(j));
}

TEST_F(ShardServiceTest, AWorkerWithNoRowsOnAShardStillCompletesTheStepThere) {
  Start(0, 1);
  ASSERT_TRUE(Create(Config()).ok());
  RegisterGroup();
  v1::LookupResponse before;
  ASSERT_TRUE(Lookup(LookupOf({5}), &before).ok());
  grpc::Status s1;
  std::thread w1([&] {
    grpc::ClientContext ctx;
    v1::BatchPushResponse resp;
    s1 = stub_->BatchPush(&ctx, SyncPart(1, {}, 0.0f, 22), &resp);  // no tables at all
  });
  grpc::ClientContext ctx;
  v1::BatchPushResponse resp;
  ASSERT_TRUE(stub_->BatchPush(&ctx, SyncPart(0, {5}, 2.0f, 11), &resp).ok());
  w1.join();
  ASSERT_TRUE(s1.ok()) << s1.error_message();
  v1::LookupResponse after;
  ASSERT_TRUE(Lookup(LookupOf({5}), &after).ok());
  EXPECT_FLOAT_EQ(after.values(0), before.values(0) - 1.0f);
}

TEST_F(ShardServiceTest, ASyncStepMissingAWorkerIsAbortedNamingItAndChangesNothing) {
  Start(0, 1);
  ASSERT_TRUE(Create(Config()).ok());
  RegisterGroup();
  v1::LookupResponse before;
  ASSERT_TRUE(Lookup(LookupOf({1}), &before).ok());
  v1::BatchPushRequest alone = SyncPart(0, {1}, 1.0f, 11);
  alone.mutable_sync()->set_timeout_ms(50);
  grpc::ClientContext ctx;
  v1::BatchPushResponse resp;
  grpc::Status s = stub_->BatchPush(&ctx, alone, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("worker(s) 1 of 2 did not push to shard 0"));
  v1::LookupResponse after;
  ASSERT_TRUE(Lookup(LookupOf({1}), &after).ok());
  EXPECT_EQ(after.values(0), before.values(0));
}

// An import sent straight to a shard frozen for a reshard waits with the pushes until the
// reshard ends (here: aborted), instead of writing rows the commit would drop after an OK.
TEST_F(ShardServiceTest, ACallersImportWaitsWhileTheShardIsFrozen) {
  Start(0, 1);
  ASSERT_TRUE(Create(Config()).ok());
  auto phase = [&](v1::ReshardRequest::Phase p) {
    v1::ReshardRequest req;
    req.set_phase(p);
    req.set_version(8);
    req.set_shard_index(0);
    req.set_num_shards(1);
    grpc::ClientContext ctx;
    v1::ReshardResponse resp;
    return stub_->Reshard(&ctx, req, &resp);
  };
  ASSERT_TRUE(phase(v1::ReshardRequest::COPY).ok());
  ASSERT_TRUE(phase(v1::ReshardRequest::FREEZE).ok());
  std::atomic<bool> aborted{false};
  std::atomic<bool> imported_before_abort{false};
  grpc::Status imported;
  std::thread import([&] {
    v1::ImportRowsRequest req;
    req.set_table("user");
    v1::RowChunk* rows = req.mutable_rows();
    rows->set_dim(4);
    const int64_t id = 5;
    const std::vector<float> w = {1, 2, 3, 4};
    rows->set_ids(std::string(reinterpret_cast<const char*>(&id), 8));
    rows->set_weights(std::string(reinterpret_cast<const char*>(w.data()), 16));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::ImportRowsResponse resp;
    imported = stub_->ImportRows(&ctx, req, &resp);
    imported_before_abort = !aborted.load();
  });
  // Time for the import to reach the gate (were it not held, it would be done by now).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  aborted = true;
  ASSERT_TRUE(phase(v1::ReshardRequest::ABORT).ok());
  import.join();
  EXPECT_FALSE(imported_before_abort) << "the import went through the frozen shard";
  ASSERT_TRUE(imported.ok()) << imported.error_message();
  v1::LookupResponse got;
  ASSERT_TRUE(Lookup(LookupOf({5}), &got).ok());
  EXPECT_EQ(std::vector<float>(got.values().begin(), got.values().end()),
            (std::vector<float>{1, 2, 3, 4}));
}

// Issue 41, item 13: a sync push of a group that no job registered, or with another worker
// count, is refused at once (it would wait for workers that never come) and changes nothing.
TEST_F(ShardServiceTest, ASyncPushOfAGroupNoJobRegisteredIsRefusedAtOnce) {
  Start(0, 1);
  ASSERT_TRUE(Create(Config()).ok());
  v1::LookupResponse before;
  ASSERT_TRUE(Lookup(LookupOf({1}), &before).ok());
  v1::BatchPushRequest stray = SyncPart(0, {1}, 1.0f, 11);
  stray.mutable_sync()->set_workers(5);
  stray.mutable_sync()->set_timeout_ms(3600 * 1000);
  grpc::ClientContext ctx;
  v1::BatchPushResponse resp;
  grpc::Status s = stub_->BatchPush(&ctx, stray, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("registered no sync group"));
  EXPECT_EQ(service_->sync_pushes_waiting(), 0);
  RegisterGroup("job#0", 2);
  grpc::ClientContext again;
  s = stub_->BatchPush(&again, stray, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("of 2 workers with shard 0, not 5"));
  v1::LookupResponse after;
  ASSERT_TRUE(Lookup(LookupOf({1}), &after).ok());
  EXPECT_EQ(after.values(0), before.values(0));
  // A registration is checked as a push would be.
  v1::RegisterSyncGroupRequest bad;
  bad.mutable_group()->set_job("job#0");
  bad.mutable_group()->set_workers(1);
  grpc::ClientContext registering;
  v1::RegisterSyncGroupResponse registered;
  EXPECT_EQ(stub_->RegisterSyncGroup(&registering, bad, &registered).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// Waits, up to `seconds`, until `done` holds; its last value.
template <typename Done>
bool Eventually(const Done& done, int seconds = 30) {
  for (int i = 0; i < seconds * 100 && !done(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

// One push sent with the callback client: it may wait while the test goes on.
struct PendingPush {
  v1::BatchPushRequest request;
  grpc::ClientContext context;
  v1::BatchPushResponse response;
  grpc::Status status;
  absl::Notification done;
  void Send(v1::EmbeddingShard::Stub* stub) {
    stub->async()->BatchPush(&context, &request, &response, [this](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
  }
};

// Issue 41, item 13: a push that waits for its step's other workers holds no thread.
// 64 jobs each have one worker waiting: no push thread is busy, and other calls are
// served meanwhile; then each job's other worker completes its step.
TEST_F(ShardServiceTest, SyncPushesWaitWithoutHoldingAThread) {
  Start(0, 1);
  ASSERT_TRUE(Create(Config()).ok());
  constexpr int kJobs = 64;
  std::vector<std::unique_ptr<PendingPush>> first;
  for (int j = 0; j < kJobs; ++j) {
    first.push_back(std::make_unique<PendingPush>());
    first.back()->request = SyncPart(0, {j}, 1.0f, 1000 + j);
    first.back()->request.mutable_sync()->set_job("job#" + std::to_string(j));
    RegisterGroup("job#" + std::to_string(j));
    first.back()->Send(stub_.get());
  }
  ASSERT_TRUE(Eventually([&] { return service_->sync_pushes_waiting() == kJobs; }))
      << service_->sync_pushes_waiting();
  EXPECT_TRUE(Eventually([&] { return service_->push_threads_busy() == 0; }))
      << service_->push_threads_busy() << " threads still held by waiting pushes";
  EXPECT_EQ(service_->sync_pushes_waiting(), kJobs);
  v1::LookupResponse looked;
  ASSERT_TRUE(Lookup(LookupOf({1, 2}), &looked).ok());
  for (int j = 0; j < kJobs; ++j) {
    v1::BatchPushRequest second = SyncPart(1, {j}, 1.0f, 2000 + j);
    second.mutable_sync()->set_job("job#" + std::to_string(j));
    grpc::ClientContext ctx;
    v1::BatchPushResponse resp;
    ASSERT_TRUE(stub_->BatchPush(&ctx, second, &resp).ok()) << j;
    first[j]->done.WaitForNotification();
    ASSERT_TRUE(first[j]->status.ok()) << first[j]->status.error_message();
    ASSERT_EQ(first[j]->response.rows_updated_size(), 1);
    EXPECT_EQ(first[j]->response.rows_updated(0), 1);
  }
  EXPECT_EQ(service_->sync_pushes_waiting(), 0);
}

// A waiting push whose caller gives up (its deadline) leaves its step at once, instead of
// waiting out its timeout; a retry of it (the same request id) takes its place anew.
TEST_F(ShardServiceTest, AWaitingSyncPushWhoseCallerGivesUpLeavesItsStep) {
  Start(0, 1);
  ASSERT_TRUE(Create(Config()).ok());
  RegisterGroup();
  v1::LookupResponse before;
  ASSERT_TRUE(Lookup(LookupOf({1}), &before).ok());
  const v1::BatchPushRequest mine = SyncPart(0, {1}, 1.0f, 11);  // waits up to 20 s
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    v1::BatchPushResponse resp;
    EXPECT_EQ(stub_->BatchPush(&ctx, mine, &resp).error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  // (Well before its 20 s timeout would end the wait.)
  ASSERT_TRUE(Eventually([&] { return service_->sync_pushes_waiting() == 0; }, 10))
      << "the abandoned push still waits in its step";
  PendingPush retry;
  retry.request = mine;
  retry.Send(stub_.get());
  ASSERT_TRUE(Eventually([&] { return service_->sync_pushes_waiting() == 1; }));
  // While it waits, one more copy of it is refused (not queued behind it on a thread).
  {
    grpc::ClientContext ctx;
    v1::BatchPushResponse resp;
    const grpc::Status again = stub_->BatchPush(&ctx, mine, &resp);
    EXPECT_EQ(again.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(again.error_message(), ::testing::HasSubstr("waiting for the step's other"));
  }
  grpc::ClientContext ctx;
  v1::BatchPushResponse resp;
  ASSERT_TRUE(stub_->BatchPush(&ctx, SyncPart(1, {}, 0.0f, 22), &resp).ok());
  retry.done.WaitForNotification();
  ASSERT_TRUE(retry.status.ok()) << retry.status.error_message();
  v1::LookupResponse after;
  ASSERT_TRUE(Lookup(LookupOf({1}), &after).ok());
  EXPECT_FLOAT_EQ(after.values(0), before.values(0) - 0.5f);  // applied once, at SGD 0.5
}

// A sync push asking to wait an hour for workers that never come holds the handler for the
// shard's cap (ShardOptions::max_sync_wait), not for what it asked.
TEST_F(ShardServiceTest, ASyncPushWaitsNoLongerThanTheShardsCap) {
  max_sync_wait_ = std::chrono::milliseconds(40);
  Start(0, 1);
  ASSERT_TRUE(Create(Config()).ok());
  RegisterGroup();
  v1::BatchPushRequest alone = SyncPart(0, {1}, 1.0f, 12);
  alone.mutable_sync()->set_timeout_ms(3600 * 1000);
  grpc::ClientContext ctx;
  v1::BatchPushResponse resp;
  const grpc::Status s = stub_->BatchPush(&ctx, alone, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("within 40 ms"));
}

}  // namespace
}  // namespace tessera::server
