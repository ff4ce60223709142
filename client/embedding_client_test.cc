// EmbeddingClient against in-process gRPC servers on 127.0.0.1.

#include "client/embedding_client.h"

#include "client/health_check.h"
#include "embedding/collection.h"
#include "embedding/inprocess_collection.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/coordinator_service.h"
#include "server/shard_service.h"
#include "tests/support/local_server.h"

namespace tessera::client {
namespace {

std::unique_ptr<grpc::Server> Serve(grpc::Service* service, std::string* address) {
  int port = 0;
  auto server = tessera::testing::StartLocalServer(service, &port);
  *address = tessera::testing::LocalAddress(port);
  return server;
}

class EmbeddingClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<std::string> addresses;
    for (int k = 0; k < 2; ++k) {
      tables_.push_back(std::move(embedding::NewInProcessCollection(1)).value());
      server::ShardOptions o;
      o.shard_index = k;
      o.num_shards = 2;
      shards_.push_back(std::make_unique<server::ShardService>(tables_[k].get(), o));
      std::string a;
      servers_.push_back(Serve(shards_[k].get(), &a));
      addresses.push_back(a);
    }
    router_ = std::make_unique<ShardRouter>(addresses, RouterOptions());
    coordinator_ = std::make_unique<server::CoordinatorService>(router_.get(), 1,
                                                                server::CoordinatorOptions());
    servers_.push_back(Serve(coordinator_.get(), &coordinator_address_));
    shard_addresses_ = addresses;
  }
  void TearDown() override {
    for (auto& s : servers_) s->Shutdown();
  }

  std::unique_ptr<EmbeddingClient> Connect(ClientOptions::Mode mode) {
    ClientOptions o;
    o.mode = mode;
    o.deadline = std::chrono::milliseconds(3000);
    auto c = EmbeddingClient::Connect(coordinator_address_, o);
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(c).value();
  }

  static v1::TableConfig Config() {
    v1::TableConfig c;
    c.set_name("user");
    c.set_dim(8);
    c.set_seed(3);
    return c;
  }

  std::vector<std::unique_ptr<embedding::ShardTables>> tables_;
  std::vector<std::unique_ptr<server::ShardService>> shards_;
  std::unique_ptr<ShardRouter> router_;
  std::unique_ptr<server::CoordinatorService> coordinator_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
  std::string coordinator_address_;
  std::vector<std::string> shard_addresses_;
};

TEST_F(EmbeddingClientTest, SmartAndCoordinatorModesAgreeWithTheInProcessCollection) {
  auto smart = Connect(ClientOptions::Mode::kSmart);
  auto via = Connect(ClientOptions::Mode::kCoordinator);
  ASSERT_TRUE(smart->CreateTable(Config()).ok());
  EXPECT_TRUE(via->CreateTable(Config()).ok());  // the same table again: idempotent
  v1::TableConfig other = Config();
  other.set_dim(other.dim() * 2);
  EXPECT_EQ(via->CreateTable(other).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(smart->num_shards(), 2);
  auto reference = std::move(embedding::NewInProcessCollection(2)).value();
  ASSERT_TRUE(reference->CreateTable(Config()).ok());

  std::vector<int64_t> ids;
  std::vector<float> grads;
  for (int i = 0; i < 50; ++i) {
    ids.push_back(i % 37);
    for (int j = 0; j < 8; ++j) grads.push_back(0.01f * (i - j));
  }
  ASSERT_TRUE(smart->PushGradients("user", ids, grads, 1).ok());
  ASSERT_TRUE(via->PushGradients("user", ids, grads, 2).ok());
  ASSERT_TRUE(reference->PushGradients("user", ids, grads, 1).ok());
  ASSERT_TRUE(reference->PushGradients("user", ids, grads, 2).ok());
  std::vector<float> a(ids.size() * 8), b(ids.size() * 8), want(ids.size() * 8);
  ASSERT_TRUE(smart->Lookup("user", ids, absl::MakeSpan(a), {}).ok());
  ASSERT_TRUE(via->Lookup("user", ids, absl::MakeSpan(b), {}).ok());
  ASSERT_TRUE(reference->Lookup("user", ids, absl::MakeSpan(want), {}).ok());
  EXPECT_EQ(a, want);
  EXPECT_EQ(b, want);
  EXPECT_EQ(smart->Usage("user")->rows, 37);

  std::vector<float> small(3);
  EXPECT_EQ(smart->Lookup("user", ids, absl::MakeSpan(small), {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(via->Lookup("nope", ids, absl::MakeSpan(a), {}).code(), absl::StatusCode::kNotFound);
}

TEST_F(EmbeddingClientTest, ASmartLookupsPlanCarriesItsDistinctIdsToThePush) {
  auto smart = Connect(ClientOptions::Mode::kSmart);
  ASSERT_TRUE(smart->CreateTable(Config()).ok());
  auto reference = std::move(embedding::NewInProcessCollection(2)).value();
  ASSERT_TRUE(reference->CreateTable(Config()).ok());
  const std::vector<int64_t> ids = {5, 9, 5, 14, 9, 5, 77};
  const std::vector<int32_t> offsets = {0, 3, 7};
  std::vector<float> pooled(2 * 8);
  embedding::IdPlan plan;
  const embedding::TableBags bags{"user", ids, offsets, {}, v1::SUM, absl::MakeSpan(pooled), &plan};
  ASSERT_TRUE(smart->LookupBatch({&bags, 1}).ok());
  ASSERT_TRUE(plan.valid);
  EXPECT_THAT(plan.unique_ids, ::testing::ElementsAre(5, 9, 14, 77));
  EXPECT_THAT(plan.inverse, ::testing::ElementsAre(0, 1, 0, 2, 1, 0, 3));

  // Pushed with its plan, the distinct ids go out as they are: one row each.
  std::vector<float> grads(plan.unique_ids.size() * 8);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.01f * static_cast<float>(i % 11) - 0.03f;
  std::vector<int64_t> updated;
  embedding::PushOptions options;
  options.rows_updated = &updated;
  const embedding::TableGradients push{"user", plan.unique_ids, grads, &plan};
  ASSERT_TRUE(smart->PushBatch({&push, 1}, 1, options).ok());
  ASSERT_TRUE(reference->PushGradients("user", plan.unique_ids, grads, 1).ok());
  EXPECT_THAT(updated, ::testing::ElementsAre(4));

  // A plan whose ids were changed since (now repeating one) is not trusted blindly: the
  // repeated id's rows are still summed, as for any push.
  plan.unique_ids[3] = 5;
  auto via = Connect(ClientOptions::Mode::kCoordinator);
  ASSERT_TRUE(smart->PushBatch({&push, 1}, 2, options).ok());
  EXPECT_THAT(updated, ::testing::ElementsAre(3));
  ASSERT_TRUE(via->PushBatch({&push, 1}, 3, options).ok());  // the coordinator counts too
  EXPECT_THAT(updated, ::testing::ElementsAre(3));
  ASSERT_TRUE(reference->PushGradients("user", plan.unique_ids, grads, 2).ok());
  ASSERT_TRUE(reference->PushGradients("user", plan.unique_ids, grads, 3).ok());
  const std::vector<int64_t> all = {5, 9, 14, 77};
  std::vector<float> got(all.size() * 8), want(all.size() * 8);
  ASSERT_TRUE(smart->Lookup("user", all, absl::MakeSpan(got), {}).ok());
  ASSERT_TRUE(reference->Lookup("user", all, absl::MakeSpan(want), {}).ok());
  EXPECT_EQ(got, want);
}

// Every hop keeps a thread's last configs and copies a table's again only when the table
// changed: a table dropped and made again under its name with another dim is looked up
// and pushed at its new dim by the same client, in the same thread, in both modes.
TEST_F(EmbeddingClientTest, ATableMadeAgainWithAnotherDimIsServedAtItsNewDim) {
  for (const auto mode : {ClientOptions::Mode::kSmart, ClientOptions::Mode::kCoordinator}) {
    SCOPED_TRACE(mode == ClientOptions::Mode::kSmart ? "smart" : "coordinator");
    auto client = Connect(mode);
    auto reference = std::move(embedding::NewInProcessCollection(2)).value();
    const std::vector<int64_t> ids = {5, 9, 14, 77};
    for (const int dim : {8, 4}) {
      v1::TableConfig config = Config();
      config.set_name(mode == ClientOptions::Mode::kSmart ? "remade_smart" : "remade_via");
      config.set_dim(dim);
      if (dim == 4) {
        ASSERT_TRUE(client->DropTable(config.name()).ok());
        ASSERT_TRUE(reference->DropTable(config.name()).ok());
      }
      ASSERT_TRUE(client->CreateTable(config).ok());
      ASSERT_TRUE(reference->CreateTable(config).ok());
      std::vector<float> got(ids.size() * dim), want(ids.size() * dim);
      const embedding::TableBags bags{config.name(), ids, {}, {}, v1::SUM, absl::MakeSpan(got)};
      const embedding::TableBags expected{config.name(),       ids, {}, {}, v1::SUM,
                                          absl::MakeSpan(want)};
      for (int64_t step = 1; step <= 3; ++step) {
        std::vector<float> grads(ids.size() * dim);
        for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.01f * static_cast<float>(i + step);
        const embedding::TableGradients push{config.name(), ids, grads};
        ASSERT_TRUE(client->PushThenLookup({&push, 1}, step, {}, {&bags, 1}).ok()) << dim;
        ASSERT_TRUE(reference->PushThenLookup({&push, 1}, step, {}, {&expected, 1}).ok());
        EXPECT_EQ(got, want) << "dim " << dim << ", step " << step;
      }
      ASSERT_TRUE(client->LookupBatch({&bags, 1}).ok()) << dim;
      ASSERT_TRUE(reference->LookupBatch({&expected, 1}).ok());
      EXPECT_EQ(got, want) << "dim " << dim;
    }
  }
}

TEST_F(EmbeddingClientTest, PoolingsAgreeWithTheInProcessCollectionInBothModes) {
  auto smart = Connect(ClientOptions::Mode::kSmart);
  auto via = Connect(ClientOptions::Mode::kCoordinator);
  ASSERT_TRUE(smart->CreateTable(Config()).ok());
  auto reference = std::move(embedding::NewInProcessCollection(2)).value();
  ASSERT_TRUE(reference->CreateTable(Config()).ok());
  // Bags of many ids (the shards pool their shares) and bags of one id each (the router
  // pools the rows it gathered).
  const std::vector<int64_t> ids = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 4, 5};
  const std::vector<int32_t> many = {0, 4, 4, 13};
  const embedding::LookupOptions create;
  std::vector<int32_t> single;
  for (int32_t i = 0; i <= 13; ++i) single.push_back(i);
  for (const v1::Pooling pooling : {v1::SUM, v1::MEAN, v1::SQRTN}) {
    for (const std::vector<int32_t>* offsets :
         {&many, static_cast<const std::vector<int32_t>*>(&single)}) {
      const size_t bags = offsets->size() - 1;
      std::vector<float> want(bags * 8), a(bags * 8), b(bags * 8);
      ASSERT_TRUE(
          reference->PooledLookup("user", ids, *offsets, {}, pooling, absl::MakeSpan(want), create)
              .ok());
      ASSERT_TRUE(
          smart->PooledLookup("user", ids, *offsets, {}, pooling, absl::MakeSpan(a), create).ok());
      ASSERT_TRUE(
          via->PooledLookup("user", ids, *offsets, {}, pooling, absl::MakeSpan(b), create).ok());
      EXPECT_THAT(a, ::testing::Pointwise(::testing::FloatNear(1e-6f), want)) << pooling;
      EXPECT_THAT(b, ::testing::Pointwise(::testing::FloatNear(1e-6f), want)) << pooling;
    }
  }
  // Bag 2 of `many` (9 ids) under SQRTN is its sum over 3.
  std::vector<float> sum(2 * 8 + 8), scaled(3 * 8);
  ASSERT_TRUE(
      reference->PooledLookup("user", ids, many, {}, v1::SUM, absl::MakeSpan(sum), create).ok());
  ASSERT_TRUE(
      smart->PooledLookup("user", ids, many, {}, v1::SQRTN, absl::MakeSpan(scaled), create).ok());
  for (int j = 0; j < 8; ++j) EXPECT_NEAR(scaled[16 + j], sum[16 + j] / 3.0f, 1e-6f);
}

TEST_F(EmbeddingClientTest, SmartClientRefreshesAStaleShardMap) {
  auto smart = Connect(ClientOptions::Mode::kSmart);
  ASSERT_TRUE(smart->CreateTable(Config()).ok());
  std::vector<int64_t> ids = {1, 2, 3, 4, 5, 6};
  std::vector<float> out(ids.size() * 8);
  ASSERT_TRUE(smart->Lookup("user", ids, absl::MakeSpan(out), {}).ok());

  // The map moves to version 2: shards refuse version-1 requests from now on.
  for (auto& s : shards_) s->SetShardMapVersion(2);
  coordinator_->SetShardMapVersion(2);
  RouterOptions stale;
  stale.shard_map_version = 1;
  ShardRouter old(shard_addresses_, stale);
  const v1::TableConfig config = Config();
  const embedding::TableBags part{"user", ids, {}, {}, v1::SUM, absl::MakeSpan(out)};
  EXPECT_EQ(old.LookupBatch({&config, 1}, {&part, 1}, false).code(),
            absl::StatusCode::kFailedPrecondition);

  // The client's map is stale too; it refreshes and the call succeeds.
  std::vector<float> again(ids.size() * 8);
  ASSERT_TRUE(smart->Lookup("user", ids, absl::MakeSpan(again), {}).ok());
  EXPECT_EQ(again, out);
  std::vector<float> g(ids.size() * 8, 0.1f);
  EXPECT_TRUE(smart->PushGradients("user", ids, g, 1).ok());
}

TEST_F(EmbeddingClientTest, RetriesUnavailableThenReportsTheDeadShard) {
  auto smart = Connect(ClientOptions::Mode::kSmart);
  ASSERT_TRUE(smart->CreateTable(Config()).ok());
  servers_[1]->Shutdown();
  std::vector<int64_t> ids;
  for (int i = 0; i < 20; ++i) ids.push_back(i);
  std::vector<float> out(ids.size() * 8);
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = smart->Lookup("user", ids, absl::MakeSpan(out), {});
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("shard 1"));
  // Four retries with 50, 100, 200 and 400 ms of backoff happened before giving up.
  EXPECT_GE(waited, std::chrono::milliseconds(750));
}

// The operator's calls answer what the coordinator knows: the shard map (in shard order,
// each serving), per-shard statistics of the rows a push stored, whether a server is
// serving; and they refuse what it would.
TEST_F(EmbeddingClientTest, AnswersAnOperatorsCalls) {
  auto client = Connect(ClientOptions::Mode::kCoordinator);
  absl::StatusOr<v1::ShardMap> map = client->ShardMap();
  ASSERT_TRUE(map.ok()) << map.status();
  ASSERT_EQ(map->shards_size(), 2);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(map->shards(k).index(), k);
    EXPECT_EQ(map->shards(k).address(), shard_addresses_[k]);
  }
  ASSERT_TRUE(client->CreateTable(Config()).ok());
  const std::vector<int64_t> ids = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const std::vector<float> grads(ids.size() * Config().dim(), 0.5f);
  ASSERT_TRUE(client->PushGradients("user", ids, grads, 1).ok());
  absl::StatusOr<v1::StatsResponse> stats = client->Stats("user");
  ASSERT_TRUE(stats.ok()) << stats.status();
  int64_t rows = 0;
  for (const auto& t : stats->tables()) {
    EXPECT_EQ(t.table(), "user");
    rows += t.rows();
  }
  EXPECT_EQ(rows, static_cast<int64_t>(ids.size()));
  EXPECT_EQ(client->Stats("nope").status().code(), absl::StatusCode::kNotFound);
  // No checkpoints without a data directory: the restore is refused, saying why.
  embedding::RestoreOptions restore;
  restore.all_models = true;
  EXPECT_EQ(client->RestoreTables(-1, restore).status().code(),
            absl::StatusCode::kFailedPrecondition);

  absl::StatusOr<bool> serving =
      IsServing(shard_addresses_[0], wire::ClientSecurity(), std::chrono::seconds(3));
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_TRUE(*serving);
  std::string nobody = tessera::testing::LocalAddress(1);
  EXPECT_EQ(IsServing(nobody, wire::ClientSecurity(), std::chrono::seconds(3)).status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tessera::client
