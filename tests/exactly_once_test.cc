// Exactly-once pushes: shards and a coordinator that apply a push and then lose its answer,
// and a shard that goes away in the middle of a fan-out. Every row must equal a replay of
// the acknowledged pushes, each applied once, in both client modes.

#include <atomic>
#include <thread>

#include "client/embedding_client.h"
#include "embedding/collection.h"
#include "embedding/inprocess_collection.h"
#include "embedding/sharding.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/coordinator_service.h"
#include "server/shard_service.h"
#include "tests/support/answer_loser.h"
#include "tests/support/local_server.h"
#include "tests/support/memory_shards.h"
#include "tests/support/push_requests.h"
#include "tests/support/reference_cluster.h"
#include "tests/support/table_configs.h"
#include "tests/support/test_client.h"

namespace tessera {
namespace {

using testing::StartLocalServer;

// What a shard and the coordinator carry out and can lose the answer of.
const std::vector<std::string> kShardLosable = {"/PushGradients", "/BatchPush", "/DropTable",
                                                "/ImportRows", "/AlterTable"};
const std::vector<std::string> kCoordinatorLosable = {"/BatchPush", "/DropTable", "/AlterTable",
                                                      "/ImportRows"};

v1::TableConfig Sgd(const std::string& name, uint64_t seed) {
  return testing::TestTable(name, 4, seed, v1::SGD, 1.0f);
}

class ExactlyOnceTest : public testing::ReferenceClusterTest {
 protected:
  static constexpr int kShards = 2;

  void SetUp() override {
    const std::vector<std::string> addresses = shards_.Start(kShards, kShardLosable);
    client::RouterOptions ro;
    ro.deadline = std::chrono::milliseconds(2000);
    ro.retry.max_retries = 4;
    ro.retry.initial_backoff = std::chrono::milliseconds(20);
    ro.health_check_interval = std::chrono::milliseconds(100);
    losing_coordinator_ = std::make_unique<testing::AnswerLoser>(kCoordinatorLosable);
    ASSERT_NO_FATAL_FAILURE(StartCoordinator(addresses, ro, losing_coordinator_.get()));
    reference_ = std::move(embedding::NewInProcessCollection(kShards)).value();
  }
  void TearDown() override {
    ReferenceClusterTest::TearDown();
    shards_.Shutdown();
  }

  // Every row of `ids` in `table` as the cluster and as the reference see it.
  void ExpectRowsEqualReference(client::EmbeddingClient& c, const std::string& table,
                                const std::vector<int64_t>& ids) {
    std::vector<float> got(ids.size() * 4), want(ids.size() * 4);
    ASSERT_TRUE(c.Lookup(table, ids, absl::MakeSpan(got), {}).ok());
    ASSERT_TRUE(reference_->Lookup(table, ids, absl::MakeSpan(want), {}).ok());
    EXPECT_EQ(got, want) << "table " << table;
  }

  // Shard k restarts on its port, empty (memory-only), without a health check failing.
  void RestartShard(int k) { shards_.Restart(k); }

  testing::MemoryShards shards_;
  std::unique_ptr<testing::AnswerLoser> losing_coordinator_;
};

std::vector<int64_t> Ids(int n, int64_t base) {
  std::vector<int64_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(base + 7919 * i);
  return ids;
}

// Pushes g = 1 (and 2 for the second table) to every id, as one batched push.
absl::Status PushOnes(embedding::EmbeddingCollection& c, const std::vector<int64_t>& a,
                      const std::vector<int64_t>& b, int64_t step) {
  std::vector<float> ga(a.size() * 4, 1.0f), gb(b.size() * 4, 2.0f);
  const std::vector<embedding::TableGradients> parts = {{"a", a, ga}, {"b", b, gb}};
  return c.PushBatch(parts, step);
}

// The same case through the smart client and through the coordinator, each on a fresh
// cluster.
TESSERA_IN_EACH_CLIENT_MODE(ExactlyOnceInEachMode, ExactlyOnceTest);

TEST_P(ExactlyOnceInEachMode, ShardsThatApplyAndLoseTheirAnswerApplyEachPushOnce) {
  const client::ClientOptions::Mode mode = GetParam();
  auto c = Connect(mode);
  CreateBoth(*c, Sgd("a", 11));
  CreateBoth(*c, Sgd("b", 12));
  const std::vector<int64_t> a = Ids(400, 1), b = Ids(300, 5);
  for (int step = 0; step < 3; ++step) {
    // After the check round (each shard checks its part first: one call), shard 1
    // applies the push, and twice in a row its answer is lost.
    shards_.losing[1]->LoseAnswers(2, /*after=*/1);
    const int seen0 = shards_.losing[0]->calls(), seen1 = shards_.losing[1]->calls();
    ASSERT_TRUE(PushOnes(*c, a, b, step).ok());
    ASSERT_TRUE(PushOnes(*reference_, a, b, step).ok());
    EXPECT_EQ(shards_.losing[0]->calls() - seen0, 2) << "the healthy shard was sent it again";
    EXPECT_EQ(shards_.losing[1]->calls() - seen1, 4);  // the check, the push and two retries
  }
  ExpectRowsEqualReference(*c, "a", a);
  ExpectRowsEqualReference(*c, "b", b);
}

TEST_F(ExactlyOnceTest, ACoordinatorThatAppliesAndLosesItsAnswerAppliesThePushOnce) {
  auto c = Connect(client::ClientOptions::Mode::kCoordinator);
  CreateBoth(*c, Sgd("a", 11));
  CreateBoth(*c, Sgd("b", 12));
  const std::vector<int64_t> a = Ids(400, 1), b = Ids(300, 5);
  losing_coordinator_->LoseAnswers(2);
  shards_.losing[0]->LoseAnswers(1);  // and one shard behind it loses one too
  ASSERT_TRUE(PushOnes(*c, a, b, 1).ok());
  ASSERT_TRUE(PushOnes(*reference_, a, b, 1).ok());
  ExpectRowsEqualReference(*c, "a", a);
  ExpectRowsEqualReference(*c, "b", b);
}

// A server shutting down (SIGTERM) answers CANCELLED to the calls it had received and not
// begun, and to those its grace period cut short: the callers retry them as they retry
// UNAVAILABLE, and each push is still applied once. (A training run used to end with
// "CANCELLED" when its coordinator was restarted.)
TEST_P(ExactlyOnceInEachMode, CallsCancelledByAServerShuttingDownAreRetriedAndAppliedOnce) {
  const client::ClientOptions::Mode mode = GetParam();
  auto c = Connect(mode);
  CreateBoth(*c, Sgd("a", 11));
  CreateBoth(*c, Sgd("b", 12));
  for (auto& loser : shards_.losing) loser->set_code(grpc::StatusCode::CANCELLED);
  losing_coordinator_->set_code(grpc::StatusCode::CANCELLED);
  const std::vector<int64_t> a = Ids(400, 1), b = Ids(300, 5);
  for (int step = 0; step < 2; ++step) {
    shards_.losing[1]->LoseAnswers(1, /*after=*/1);  // applied, then cut short
    losing_coordinator_->LoseAnswers(1);             // through it: applied, then cut short
    losing_coordinator_->RefuseNext("/ListTables", 1);
    shards_.losing[0]->RefuseNext("/Lookup", 1);  // not begun
    ASSERT_TRUE(PushOnes(*c, a, b, step).ok());
    ASSERT_TRUE(PushOnes(*reference_, a, b, step).ok());
    auto tables = c->ListTables();
    ASSERT_TRUE(tables.ok()) << tables.status();
    EXPECT_EQ(tables->size(), 2u);
    ExpectRowsEqualReference(*c, "a", a);
    ExpectRowsEqualReference(*c, "b", b);
  }
}

TEST_F(ExactlyOnceTest, AFailedPushRepeatedWithItsRequestIdCompletesWithoutApplyingTwice) {
  auto c = Connect(client::ClientOptions::Mode::kSmart, /*max_retries=*/0);
  CreateBoth(*c, Sgd("a", 11));
  CreateBoth(*c, Sgd("b", 12));
  const std::vector<int64_t> a = Ids(400, 1), b = Ids(300, 5);
  const embedding::RequestId id = c->NextRequestId();
  std::vector<float> ga(a.size() * 4, 1.0f), gb(b.size() * 4, 2.0f);
  const std::vector<embedding::TableGradients> parts = {{"a", a, ga}, {"b", b, gb}};
  shards_.losing[1]->LoseAnswers(1);
  embedding::PushOptions options;
  options.request_id = id;
  const absl::Status failed = c->PushBatch(parts, 1, options);
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_NE(failed.message().find("shard 1"), std::string::npos) << failed;
  // The caller repeats it, with the same id: done, and nothing applied twice.
  ASSERT_TRUE(c->PushBatch(parts, 1, options).ok());
  ASSERT_TRUE(reference_->PushBatch(parts, 1).ok());
  ExpectRowsEqualReference(*c, "a", a);
  ExpectRowsEqualReference(*c, "b", b);
  // A new id is a new push.
  ASSERT_TRUE(c->PushBatch(parts, 2).ok());
  ASSERT_TRUE(reference_->PushBatch(parts, 2).ok());
  ExpectRowsEqualReference(*c, "a", a);
}

TEST_F(ExactlyOnceTest, AShardGoneInTheMiddleOfAFanOutIsRetriedAloneOnceItIsBack) {
  for (auto mode :
       {client::ClientOptions::Mode::kSmart, client::ClientOptions::Mode::kCoordinator}) {
    SCOPED_TRACE(mode == client::ClientOptions::Mode::kSmart ? "smart" : "coordinator");
    auto c = Connect(mode);
    const std::string ta = mode == client::ClientOptions::Mode::kSmart ? "a" : "c";
    const std::string tb = mode == client::ClientOptions::Mode::kSmart ? "b" : "d";
    CreateBoth(*c, Sgd(ta, 11));
    CreateBoth(*c, Sgd(tb, 12));
    const std::vector<int64_t> a = Ids(400, 1), b = Ids(300, 5);
    shards_.servers[1]->Shutdown();
    shards_.servers[1].reset();
    const int seen0 = shards_.losing[0]->calls();
    std::vector<float> ga(a.size() * 4, 1.0f), gb(b.size() * 4, 2.0f);
    const std::vector<embedding::TableGradients> parts = {{ta, a, ga}, {tb, b, gb}};
    absl::Status pushed;
    // As a trainer pushes after its lookup: no check round, so the fan-out itself meets
    // the shard that is gone.
    embedding::PushOptions after_lookup;
    after_lookup.after_lookup = true;
    std::thread push([&] { pushed = c->PushBatch(parts, 1, after_lookup); });
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    // Back on its port, rows kept.
    shards_.servers[1] =
        StartLocalServer(shards_.services[1].get(), &shards_.ports[1], shards_.losing[1].get());
    ASSERT_NE(shards_.servers[1], nullptr);
    push.join();
    ASSERT_TRUE(pushed.ok()) << pushed;
    ASSERT_TRUE(reference_->PushBatch(parts, 1).ok());
    ExpectRowsEqualReference(*c, ta, a);
    ExpectRowsEqualReference(*c, tb, b);
    if (mode == client::ClientOptions::Mode::kSmart) {
      EXPECT_EQ(shards_.losing[0]->calls() - seen0, 1) << "the healthy shard was sent it again";
    }
  }
}

// Drops and imports whose answer is lost after they were carried out, by a shard and by
// the coordinator: the retries end as one call (a drop found done is done; an import sets
// the same rows again).
TEST_F(ExactlyOnceTest, DropsAndImportsThatApplyAndLoseTheirAnswerEndAsOneCall) {
  auto c = Connect(client::ClientOptions::Mode::kCoordinator);
  CreateBoth(*c, Sgd("gone", 7));
  losing_coordinator_->LoseAnswers(1);
  shards_.losing[0]->LoseAnswers(1);
  ASSERT_TRUE(c->DropTable("gone").ok());
  auto tables = c->ListTables();
  ASSERT_TRUE(tables.ok());
  EXPECT_TRUE(tables->empty());
  for (auto& t : shards_.tables) EXPECT_TRUE(t->ListTables()->empty());

  CreateBoth(*c, Sgd("rows", 8));
  embedding::RowBlock rows;
  rows.dim = 4;
  rows.ids = Ids(300, 2);
  for (size_t i = 0; i < rows.ids.size() * 4; ++i) rows.weights.push_back(0.001f * i);
  losing_coordinator_->LoseAnswers(1);
  shards_.losing[1]->LoseAnswers(1);
  ASSERT_TRUE(c->ImportRows("rows", rows).ok());
  ASSERT_TRUE(reference_->ImportRows("rows", rows).ok());
  ExpectRowsEqualReference(*c, "rows", rows.ids);
  // Trained on from there, the rows stay the reference's (state and counts as imported).
  const std::vector<float> g(rows.ids.size() * 4, 0.5f);
  ASSERT_TRUE(c->PushGradients("rows", rows.ids, g, 2).ok());
  ASSERT_TRUE(reference_->PushGradients("rows", rows.ids, g, 2).ok());
  ExpectRowsEqualReference(*c, "rows", rows.ids);
}

// AlterTable applied and its answer lost, on a shard and at the coordinator: the retries
// end as one call, and the next push uses the new learning rate exactly once.
TEST_F(ExactlyOnceTest, AnAlterThatAppliesAndLosesItsAnswerEndsAsOneCall) {
  auto c = Connect(client::ClientOptions::Mode::kCoordinator);
  CreateBoth(*c, Sgd("alt", 9));
  losing_coordinator_->LoseAnswers(1);
  shards_.losing[1]->LoseAnswers(1);
  v1::OptimizerConfig slower;
  slower.set_learning_rate(0.125f);
  auto altered = c->AlterTable("alt", slower);
  ASSERT_TRUE(altered.ok()) << altered.status();
  EXPECT_EQ(altered->optimizer().learning_rate(), 0.125f);
  ASSERT_TRUE(reference_->AlterTable("alt", slower).ok());
  for (auto& t : shards_.tables) {
    auto held = t->ListTables();
    ASSERT_TRUE(held.ok());
    for (const auto& config : *held) {
      if (config.name() == "alt") {
        EXPECT_EQ(config.optimizer().learning_rate(), 0.125f);
      }
    }
  }
  const std::vector<int64_t> ids = Ids(200, 4);
  const std::vector<float> g(ids.size() * 4, 1.0f);
  ASSERT_TRUE(c->PushGradients("alt", ids, g, 1).ok());
  ASSERT_TRUE(reference_->PushGradients("alt", ids, g, 1).ok());
  ExpectRowsEqualReference(*c, "alt", ids);
}

TEST_F(ExactlyOnceTest, AHalfFailedCreateTableRetriedSucceeds) {
  auto c = Connect(client::ClientOptions::Mode::kCoordinator, /*max_retries=*/0);
  shards_.losing[1]->RefuseNext("/CreateTable", 10);  // more than the coordinator's own retries
  const absl::Status failed = c->CreateTable(Sgd("half", 3));
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  shards_.losing[1]->RefuseNext("/CreateTable", 0);
  ASSERT_TRUE(c->CreateTable(Sgd("half", 3)).ok());  // shard 0 has it already: still OK
  ASSERT_TRUE(reference_->CreateTable(Sgd("half", 3)).ok());
  const std::vector<int64_t> ids = Ids(100, 3);
  std::vector<float> g(ids.size() * 4, 0.5f);
  ASSERT_TRUE(c->PushGradients("half", ids, g, 1).ok());
  ASSERT_TRUE(reference_->PushGradients("half", ids, g, 1).ok());
  ExpectRowsEqualReference(*c, "half", ids);
  v1::TableConfig other = Sgd("half", 4);
  EXPECT_EQ(c->CreateTable(other).code(), absl::StatusCode::kAlreadyExists);
}

// Polls `done` every 20 ms for up to 10 s.
bool Eventually(const std::function<bool()>& done) {
  for (int i = 0; i < 500; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Issue 41, item 12: a shard the health checks have marked down fails a call through the
// coordinator at once, not after the retries that a shard restarting is given.
TEST_F(ExactlyOnceTest, AShardMarkedDownFailsThroughTheCoordinatorWithoutRetries) {
  auto c = Connect(client::ClientOptions::Mode::kCoordinator);
  CreateBoth(*c, Sgd("a", 11));
  const std::vector<int64_t> ids = Ids(200, 1);
  std::vector<float> g(ids.size() * 4, 1.0f);
  shards_.servers[1]->Shutdown();
  shards_.servers[1].reset();
  ASSERT_TRUE(Eventually([&] { return !router_->serving(1); }));
  const int64_t retries = router_->retries();
  const absl::Status s = c->PushGradients("a", ids, g, 1);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("failing its health checks"));
  EXPECT_EQ(router_->retries(), retries) << "the shard marked down was retried";
  // Shard 0 took nothing: the push is refused whole before any part applies.
  std::vector<int64_t> mine;
  for (int64_t id : ids) {
    if (embedding::ShardOf(id, 11, kShards) == 0) mine.push_back(id);
  }
  ASSERT_FALSE(mine.empty());
  std::vector<float> got(mine.size() * 4), want(mine.size() * 4);
  ASSERT_TRUE(shards_.tables[0]->Lookup("a", mine, absl::MakeSpan(got), {}).ok());
  ASSERT_TRUE(reference_->Lookup("a", mine, absl::MakeSpan(want), {}).ok());
  EXPECT_EQ(got, want);
}

TEST_F(ExactlyOnceTest, AMemoryOnlyShardThatRestartsServesItsTablesAgain) {
  auto c = Connect(client::ClientOptions::Mode::kCoordinator);
  CreateBoth(*c, Sgd("a", 11));
  const std::vector<int64_t> ids = Ids(200, 1);
  std::vector<float> g(ids.size() * 4, 1.0f);
  ASSERT_TRUE(c->PushGradients("a", ids, g, 1).ok());
  ASSERT_TRUE(reference_->PushGradients("a", ids, g, 1).ok());

  // Shard 1 goes away and comes back empty (no data directory).
  shards_.servers[1]->Shutdown();
  shards_.servers[1].reset();
  ASSERT_TRUE(Eventually([&] { return !router_->serving(1); }));
  shards_.tables[1] = std::move(embedding::NewInProcessCollection(1)).value();
  server::ShardOptions o;
  o.shard_index = 1;
  o.num_shards = kShards;
  auto fresh = std::make_unique<server::ShardService>(shards_.tables[1].get(), o);
  shards_.servers[1] = StartLocalServer(fresh.get(), &shards_.ports[1], shards_.losing[1].get());
  ASSERT_NE(shards_.servers[1], nullptr);

  // Re-admitted, it is given the table again: lookups find it; its rows start over from
  // their initial weights, the other shard's keep their update.
  // The restart notice says the shard came back empty.
  std::vector<float> got(ids.size() * 4);
  ::testing::internal::CaptureStderr();
  const bool served = Eventually([&] { return c->Lookup("a", ids, absl::MakeSpan(got), {}).ok(); });
  const std::string notice = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(served) << "the restarted shard never served table 'a' again";
  EXPECT_THAT(notice, ::testing::HasSubstr("it has no data directory, so its tables came back "
                                           "empty"));
  auto initial = std::move(embedding::NewInProcessCollection(kShards)).value();
  ASSERT_TRUE(initial->CreateTable(Sgd("a", 11)).ok());
  std::vector<float> start(ids.size() * 4), updated(ids.size() * 4);
  ASSERT_TRUE(initial->Lookup("a", ids, absl::MakeSpan(start), {}).ok());
  ASSERT_TRUE(reference_->Lookup("a", ids, absl::MakeSpan(updated), {}).ok());
  int on_shard_1 = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const bool restarted = embedding::ShardOf(ids[i], 11, kShards) == 1;
    on_shard_1 += restarted;
    for (int j = 0; j < 4; ++j) {
      EXPECT_EQ(got[i * 4 + j], restarted ? start[i * 4 + j] : updated[i * 4 + j])
          << "id " << ids[i];
    }
  }
  EXPECT_GT(on_shard_1, 50);
  // And it trains again.
  ASSERT_TRUE(c->PushGradients("a", ids, g, 2).ok());
  shards_.servers[1]->Shutdown();
  shards_.servers[1].reset();
  shards_.services[1] = std::move(fresh);
}

// Issue 25, item 5: a memory-only shard that restarts faster than the health checks can
// see (no failed check) answers with a new incarnation: the caller's router has its tables
// made again and sends the refused part once more, in both client modes.
TEST_F(ExactlyOnceTest, AShardBackBeforeTheHealthChecksNoticedIsGivenItsTablesAgain) {
  auto smart = Connect(client::ClientOptions::Mode::kSmart);
  auto routed = Connect(client::ClientOptions::Mode::kCoordinator);
  CreateBoth(*routed, Sgd("q", 13));
  const std::vector<int64_t> ids = Ids(200, 3);
  std::vector<float> got(ids.size() * 4);
  for (auto* c : {smart.get(), routed.get()}) {
    ASSERT_TRUE(c->Lookup("q", ids, absl::MakeSpan(got), {}).ok());  // incarnations heard
  }
  for (auto* first : {smart.get(), routed.get()}) {
    // Shard 1 restarts on its port, empty, without a health check failing twice.
    RestartShard(1);
    ASSERT_TRUE(router_->serving(1));
    // The first call after the restart succeeds: no NOT_FOUND reaches the caller.
    absl::Status s = first->Lookup("q", ids, absl::MakeSpan(got), {});
    ASSERT_TRUE(s.ok()) << s;
    std::vector<float> g(ids.size() * 4, 0.5f);
    for (auto* c : {smart.get(), routed.get()}) {
      EXPECT_TRUE(c->Lookup("q", ids, absl::MakeSpan(got), {}).ok());
      EXPECT_TRUE(c->PushGradients("q", ids, g, 1).ok());
    }
  }
  shards_.servers[1]->Shutdown();
  shards_.servers[1].reset();
}

// Two calls meet a shard that came back empty: the second hears of the restart after the
// first did and before the first has the tables made again. It does not take the shard's
// NOT_FOUND for an answer either: it has the tables made, and its call goes through.
TEST_F(ExactlyOnceTest, ACallThatHearsOfARestartSecondStillHasTheTablesMadeAgain) {
  const v1::TableConfig config = Sgd("late", 17);
  ASSERT_TRUE(router_->CreateTable(config).ok());
  const std::vector<int64_t> ids = Ids(60, 4);
  std::vector<float> first(ids.size() * 4), second(ids.size() * 4);
  auto lookup = [&](std::vector<float>& out) {
    const embedding::TableBags bags{"late", ids, {}, {}, v1::SUM, absl::MakeSpan(out)};
    return router_->LookupBatch({&config, 1}, {&bags, 1}, /*read_only=*/false);
  };
  ASSERT_TRUE(lookup(first).ok());  // incarnations heard
  RestartShard(1);
  int callbacks = 0;
  absl::Status inner = absl::UnknownError("the second call never ran");
  router_->SetRestartCallback([&](int) {
    // The first call heard of the restart; before it makes the table, a second call.
    if (callbacks++ == 0) inner = lookup(second);
    EXPECT_TRUE(router_->CreateTable(config).ok());
  });
  const absl::Status outer = lookup(first);
  router_->SetRestartCallback(nullptr);
  EXPECT_TRUE(outer.ok()) << outer;
  EXPECT_TRUE(inner.ok()) << inner;
  EXPECT_EQ(callbacks, 2);  // the second call had the table made too
  EXPECT_EQ(first, second);
}

// Issue 41, item 13: a data-parallel job's group is registered by the client before its
// first push. A shard that restarts forgets it (and, memory-only, its tables): the next sync
// push there is refused, the client (or the coordinator) makes the table and registers the
// group again, and the push goes through; each step is applied once, in both client modes.
// A raw push of a group that no job registered is refused by the coordinator at once.
TEST_F(ExactlyOnceTest, ASyncGroupForgottenByARestartedShardIsRegisteredAgain) {
  const std::vector<int64_t> ids = Ids(100, 5);
  for (const auto mode :
       {client::ClientOptions::Mode::kSmart, client::ClientOptions::Mode::kCoordinator}) {
    const bool smart = mode == client::ClientOptions::Mode::kSmart;
    SCOPED_TRACE(smart ? "smart" : "coordinator");
    const std::string table = smart ? "dp_smart" : "dp_routed";
    auto w0 = Connect(mode);
    auto w1 = Connect(mode);
    ASSERT_TRUE(w0->CreateTable(Sgd(table, 17)).ok());
    auto initial = std::move(embedding::NewInProcessCollection(kShards)).value();
    ASSERT_TRUE(initial->CreateTable(Sgd(table, 17)).ok());
    std::vector<float> expected(ids.size() * 4);
    ASSERT_TRUE(initial->Lookup(table, ids, absl::MakeSpan(expected), {}).ok());
    // One step of both workers: gradients 1 and 2 on every id, so each row moves by 3.
    auto step = [&](int64_t at) {
      const std::vector<float> g0(ids.size() * 4, 1.0f), g1(ids.size() * 4, 2.0f);
      auto sync = [&](int worker) {
        embedding::PushOptions o;
        o.sync.job = table + "#0";
        o.sync.worker = worker;
        o.sync.workers = 2;
        o.sync.timeout = std::chrono::seconds(20);
        return o;
      };
      absl::Status s1;
      std::thread second([&] {
        const std::vector<embedding::TableGradients> p1 = {{table, ids, g1}};
        s1 = w1->PushBatch(p1, at, sync(1));
      });
      const std::vector<embedding::TableGradients> p0 = {{table, ids, g0}};
      const absl::Status s0 = w0->PushBatch(p0, at, sync(0));
      second.join();
      EXPECT_TRUE(s0.ok()) << s0;
      EXPECT_TRUE(s1.ok()) << s1;
    };
    step(1);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (embedding::ShardOf(ids[i], 17, kShards) == 1) continue;  // restarted below
      for (int j = 0; j < 4; ++j) expected[i * 4 + j] -= 3.0f;
    }
    RestartShard(1);
    step(2);
    step(3);
    for (float& e : expected) e -= 3.0f;
    for (float& e : expected) e -= 3.0f;
    std::vector<float> got(ids.size() * 4);
    ASSERT_TRUE(w0->Lookup(table, ids, absl::MakeSpan(got), {}).ok());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_FLOAT_EQ(got[i], expected[i]) << "at " << i;
  }
  auto stub = v1::Coordinator::NewStub(
      grpc::CreateChannel(coordinator_address_, grpc::InsecureChannelCredentials()));
  v1::BatchPushRequest stray;
  stray.set_step(1);
  stray.mutable_sync()->set_job("stray");
  stray.mutable_sync()->set_workers(3);
  stray.mutable_sync()->set_timeout_ms(3600 * 1000);
  grpc::ClientContext ctx;
  v1::BatchPushResponse resp;
  const grpc::Status refused = stub->BatchPush(&ctx, stray, &resp);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(refused.error_message(),
              ::testing::HasSubstr("registered no sync group with the coordinator"));
}

// A caller of the coordinator that registered its group once: after a shard restarts, the
// coordinator registers the group with it again by itself (and makes its table again), so
// the caller's next step goes through.
TEST_F(ExactlyOnceTest, TheCoordinatorRegistersAGroupAgainWithAShardThatLostIt) {
  auto c = Connect(client::ClientOptions::Mode::kCoordinator);
  ASSERT_TRUE(c->CreateTable(Sgd("raw", 19)).ok());
  auto stub = v1::Coordinator::NewStub(
      grpc::CreateChannel(coordinator_address_, grpc::InsecureChannelCredentials()));
  v1::RegisterSyncGroupRequest group;
  group.mutable_group()->set_job("raw#0");
  group.mutable_group()->set_workers(2);
  grpc::ClientContext registering;
  v1::RegisterSyncGroupResponse registered;
  ASSERT_TRUE(stub->RegisterSyncGroup(&registering, group, &registered).ok());
  const std::vector<int64_t> ids = Ids(50, 9);
  auto part = [&](int worker, int64_t step) {
    const testing::SyncPart p{.job = "raw#0",
                              .worker = worker,
                              .client = 100 + static_cast<uint64_t>(worker),
                              .sequence = static_cast<uint64_t>(step),
                              .step = step};
    return testing::SyncPushRequest(p, "raw", ids, 4);
  };
  auto step = [&](int64_t at) {
    grpc::Status s1;
    std::thread second([&] {
      grpc::ClientContext ctx;
      v1::BatchPushResponse resp;
      s1 = stub->BatchPush(&ctx, part(1, at), &resp);
    });
    grpc::ClientContext ctx;
    v1::BatchPushResponse resp;
    const grpc::Status s0 = stub->BatchPush(&ctx, part(0, at), &resp);
    second.join();
    EXPECT_TRUE(s0.ok()) << s0.error_message();
    EXPECT_TRUE(s1.ok()) << s1.error_message();
  };
  step(1);
  RestartShard(1);
  step(2);
}

}  // namespace
}  // namespace tessera
