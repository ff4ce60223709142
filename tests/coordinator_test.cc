// The coordinator routing to real tessera-shard processes on 127.0.0.1.

#include <cmath>
#include <random>

#include "client/shard_router.h"
#include "embedding/collection.h"
#include "embedding/inprocess_collection.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/coordinator_service.h"
#include "tests/shard_process.h"
#include "tests/support/local_server.h"
#include "tests/support/stub_calls.h"
#include "tests/support/table_configs.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using testing::ShardProcess;

class CoordinatorTest : public ::testing::Test {
 protected:
  static constexpr int kShards = 3;

  void SetUp() override {
    std::vector<std::string> addresses;
    for (int k = 0; k < kShards; ++k) {
      shards_.push_back(std::make_unique<ShardProcess>(k, kShards));
      ASSERT_FALSE(shards_[k]->address().empty());
      ASSERT_TRUE(client::WaitHealthy(shards_[k]->address()));
      addresses.push_back(shards_[k]->address());
    }
    client::RouterOptions ro;
    ro.deadline = std::chrono::milliseconds(5000);
    router_ = std::make_unique<client::ShardRouter>(addresses, ro);
    server::CoordinatorOptions co;
    co.max_batch_ids = 5000;
    service_ = std::make_unique<server::CoordinatorService>(router_.get(), 1, co);
    int port = 0;
    server_ = testing::StartLocalServer(service_.get(), &port);
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Coordinator::NewStub(testing::LocalChannel(port));
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  static v1::TableConfig Config() { return testing::TestTable("item", 16, 77, v1::ADAM, 0.01f); }

  grpc::Status Create(const v1::TableConfig& c) { return testing::CreateTable(*stub_, c); }
  grpc::Status Lookup(const v1::LookupRequest& req, v1::LookupResponse* resp) {
    return testing::Lookup(*stub_, req, resp);
  }
  grpc::Status Push(const v1::PushGradientsRequest& req) {
    return testing::PushGradients(*stub_, req);
  }

  std::vector<std::unique_ptr<ShardProcess>> shards_;
  std::unique_ptr<client::ShardRouter> router_;
  std::unique_ptr<server::CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

// A request built on another shard map than the coordinator serves is refused as a shard
// refuses it, not routed on the coordinator's map.
TEST_F(CoordinatorTest, RefusesARequestBuiltOnAnotherShardMapVersion) {
  ASSERT_TRUE(Create(Config()).ok());
  v1::LookupRequest lookup;
  lookup.set_table("item");
  lookup.add_ids(3);
  lookup.set_shard_map_version(2);
  v1::LookupResponse got;
  const grpc::Status s = Lookup(lookup, &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("refresh the shard map"));
  v1::PushGradientsRequest push;
  push.set_table("item");
  push.add_ids(3);
  for (int i = 0; i < 16; ++i) push.add_gradients(1.0f);
  push.set_shard_map_version(7);
  EXPECT_EQ(Push(push).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  lookup.set_shard_map_version(1);  // the version served, or 0: not checked
  EXPECT_TRUE(Lookup(lookup, &got).ok());
  lookup.set_shard_map_version(0);
  EXPECT_TRUE(Lookup(lookup, &got).ok());
}

TEST_F(CoordinatorTest, AgreesWithTheInProcessCollectionOverSeveralSteps) {
  ASSERT_TRUE(Create(Config()).ok());
  auto reference = std::move(embedding::NewInProcessCollection(kShards)).value();
  ASSERT_TRUE(reference->CreateTable(Config()).ok());
  std::mt19937_64 rng(8);
  for (int step = 0; step < 5; ++step) {
    std::vector<int64_t> ids(400);
    for (auto& id : ids) id = static_cast<int64_t>(rng() % 300) * 7919 - 1000;
    v1::LookupRequest lookup;
    lookup.set_table("item");
    for (int64_t id : ids) lookup.add_ids(id);
    v1::LookupResponse got;
    ASSERT_TRUE(Lookup(lookup, &got).ok());
    std::vector<float> want(ids.size() * 16);
    ASSERT_TRUE(reference->Lookup("item", ids, absl::MakeSpan(want)).ok());
    ASSERT_EQ(std::vector<float>(got.values().begin(), got.values().end()), want)
        << "step " << step << ": row lookups are bit-identical";

    // Pooled bags of 4 with MEAN: shards pool their part, so sums may differ in the last bit.
    for (int b = 0; b <= 100; ++b) lookup.add_offsets(b * 4);
    lookup.set_pooling(v1::MEAN);
    ASSERT_TRUE(Lookup(lookup, &got).ok());
    std::vector<int32_t> offsets(lookup.offsets().begin(), lookup.offsets().end());
    std::vector<float> want_pooled(100 * 16);
    ASSERT_TRUE(
        reference->PooledLookup("item", ids, offsets, {}, v1::MEAN, absl::MakeSpan(want_pooled))
            .ok());
    ASSERT_EQ(got.values_size(), 1600);
    for (int i = 0; i < 1600; ++i) ASSERT_NEAR(got.values(i), want_pooled[i], 1e-6);

    v1::PushGradientsRequest push;
    push.set_table("item");
    push.set_step(step);
    std::vector<float> grads(ids.size() * 16);
    for (auto& g : grads) g = static_cast<float>(static_cast<int>(rng() % 200) - 100) / 1000;
    for (int64_t id : ids) push.add_ids(id);
    for (float g : grads) push.add_gradients(g);
    ASSERT_TRUE(Push(push).ok());
    ASSERT_TRUE(reference->PushGradients("item", ids, grads, step).ok());
  }
  grpc::ClientContext ctx;
  v1::StatsResponse stats;
  ASSERT_TRUE(stub_->Stats(&ctx, v1::StatsRequest(), &stats).ok());
  ASSERT_EQ(stats.tables_size(), kShards);
  int64_t rows = 0;
  for (const auto& t : stats.tables()) rows += t.rows();
  EXPECT_EQ(rows, reference->Usage("item")->rows);

  grpc::ClientContext mctx;
  v1::ShardMap map;
  ASSERT_TRUE(stub_->GetShardMap(&mctx, v1::GetShardMapRequest(), &map).ok());
  EXPECT_EQ(map.version(), 1u);
  ASSERT_EQ(map.shards_size(), kShards);
  EXPECT_EQ(map.shards(2).address(), shards_[2]->address());
}

TEST_F(CoordinatorTest, BadInputGetsItsCodeAndADeadShardIsUnavailable) {
  ASSERT_TRUE(Create(Config()).ok());
  EXPECT_TRUE(Create(Config()).ok());  // the same table again: idempotent
  v1::TableConfig other = Config();
  other.set_seed(other.seed() + 1);
  EXPECT_EQ(Create(other).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  v1::LookupRequest lookup;
  lookup.set_table("item");
  for (int64_t id = 0; id < 30; ++id) lookup.add_ids(id);
  v1::LookupResponse before, resp;
  ASSERT_TRUE(Lookup(lookup, &before).ok());

  v1::LookupRequest unknown = lookup;
  unknown.set_table("nope");
  EXPECT_EQ(Lookup(unknown, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  v1::LookupRequest bad_offsets = lookup;
  for (int o : {0, 20, 10, 30}) bad_offsets.add_offsets(o);
  EXPECT_EQ(Lookup(bad_offsets, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::LookupRequest big;
  big.set_table("item");
  for (int i = 0; i < 5001; ++i) big.add_ids(i);
  EXPECT_EQ(Lookup(big, &resp).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  v1::PushGradientsRequest push;
  push.set_table("item");
  for (int64_t id = 0; id < 30; ++id) push.add_ids(id);
  for (int i = 0; i < 30 * 15; ++i) push.add_gradients(0.1f);
  EXPECT_EQ(Push(push).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  for (int i = 0; i < 30; ++i) push.add_gradients(0.1f);
  push.set_gradients(77, NAN);
  grpc::Status s = Push(push);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("batch rejected"));

  ASSERT_TRUE(Lookup(lookup, &resp).ok());
  EXPECT_EQ(std::vector<float>(resp.values().begin(), resp.values().end()),
            std::vector<float>(before.values().begin(), before.values().end()));

  shards_[1]->Kill();
  s = Lookup(lookup, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr("shard 1 (" + shards_[1]->address()));
}

}  // namespace
}  // namespace tessera
