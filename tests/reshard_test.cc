// Live resharding through a coordinator (in this process, over gRPC on 127.0.0.1) with
// durable write-through shards: pushes go on while the cluster moves from 2 shards to 3
// and back, shards lose answers meanwhile, and every row must equal a replay of the
// acknowledged pushes, each applied once, held by its owner alone, and still there when
// its shard opens its data directory again.

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/embedding_client.h"
#include "embedding/batch_ops.h"
#include "embedding/embedding_table.h"
#include "embedding/inprocess_collection.h"
#include "embedding/storage/coordinator_store.h"
#include "embedding/storage/durable_collection.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/cluster.h"
#include "server/coordinator_service.h"
#include "server/shard_service.h"
#include "tests/support/answer_loser.h"
#include "tests/support/local_server.h"
#include "tests/support/reference_cluster.h"
#include "tests/support/served_shard.h"
#include "tests/support/stored_rows.h"
#include "tests/support/table_configs.h"
#include "tests/support/test_client.h"

namespace tessera {
namespace {

constexpr int kDim = 4;

v1::TableConfig Table(const std::string& name, v1::OptimizerType type, uint64_t seed) {
  return testing::TestTable(name, kDim, seed, type, 0.5f, v1::WRITE_THROUGH);
}

using Shard = testing::ServedShard;

// One push of the pusher: ids drawn from a pool (rows updated many times) and new ones.
struct Push {
  std::vector<int64_t> a, b, c;  // c: ids of a fixed vocabulary
  std::vector<float> ga, gb, gc;
};

constexpr int64_t kVocabulary = 20000;

Push MakePush(std::mt19937_64& rng, int i) {
  Push p;
  std::uniform_int_distribution<int64_t> pool(0, 3000);
  for (int j = 0; j < 64; ++j) {
    p.a.push_back(j % 4 == 0 ? static_cast<int64_t>(rng()) : pool(rng) * 7919);
    p.b.push_back(pool(rng) * 104729 + (i % 3));
  }
  for (int j = 0; j < 32; ++j) p.c.push_back(static_cast<int64_t>(rng() % kVocabulary));
  std::uniform_real_distribution<float> g(-1.0f, 1.0f);
  for (size_t j = 0; j < p.a.size() * kDim; ++j) p.ga.push_back(g(rng));
  for (size_t j = 0; j < p.b.size() * kDim; ++j) p.gb.push_back(g(rng));
  for (size_t j = 0; j < p.c.size() * kDim; ++j) p.gc.push_back(g(rng));
  return p;
}

// MakePush's first push from a generator seeded with `seed`.
Push FirstPush(uint64_t seed) {
  std::mt19937_64 rng(seed);
  return MakePush(rng, 0);
}

// Push `p`'s parts of tables a and b.
std::vector<embedding::TableGradients> PartsOf(const Push& p) {
  return {{"a", p.a, p.ga}, {"b", p.b, p.gb}};
}

// Shard 0's part of push `p` alone, straight to shard 0 under map version 1, as if the
// other shard had not received its part (a client gone before it sent it).
void PushShardZerosPart(int port, const Push& p, const embedding::RequestId& id) {
  v1::BatchPushRequest request;
  request.set_step(1);
  request.set_shard_map_version(1);
  request.mutable_request_id()->set_client_id(id.client_id);
  request.mutable_request_id()->set_sequence(id.sequence);
  for (const auto& [name, ids, grads, seed] :
       {std::tuple{"a", &p.a, &p.ga, 11}, std::tuple{"b", &p.b, &p.gb, 12}}) {
    std::vector<int64_t> mine;
    std::vector<float> g;
    v1::TableConfig config = Table(name, v1::SGD, seed);
    for (size_t j = 0; j < ids->size(); ++j) {
      if (embedding::ShardOfRow(config, (*ids)[j], 2) != 0) continue;
      mine.push_back((*ids)[j]);
      g.insert(g.end(), grads->begin() + j * kDim, grads->begin() + (j + 1) * kDim);
    }
    v1::TableGradients* t = request.add_tables();
    t->set_table(name);
    t->set_ids(mine.data(), mine.size() * sizeof(int64_t));
    t->set_gradients(g.data(), g.size() * sizeof(float));
  }
  auto stub = v1::EmbeddingShard::NewStub(testing::LocalChannel(port));
  grpc::ClientContext ctx;
  v1::BatchPushResponse response;
  ASSERT_TRUE(stub->BatchPush(&ctx, request, &response).ok());
}

using testing::StoredRows;

class ReshardTest : public testing::ReferenceClusterTest {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(::testing::TempDir(), "/reshard-", ::getpid());
    std::filesystem::remove_all(root_);
    shards_.resize(3);
    for (int k = 0; k < 3; ++k) {
      shards_[k].dir = absl::StrCat(root_, "/shard-", k);
      shards_[k].index = k;
      // Shards 0 and 1 serve map version 1; shard 2 starts empty with its place in 2.
      shards_[k].num_shards = k < 2 ? 2 : 3;
      shards_[k].version = k < 2 ? 1 : 2;
      // What the tests make each shard lose: shard 0 its reshard answers, shard 1 its
      // pushes', shard 2 (the new one) its imports'.
      const char* losable[] = {"/Reshard", "/BatchPush", "/ImportRows"};
      shards_[k].losable = {losable[k]};
      ASSERT_NO_FATAL_FAILURE(shards_[k].Start());
    }
    ASSERT_NO_FATAL_FAILURE(StartCoordinator({shards_[0].address(), shards_[1].address()},
                                             RetryingRouter(std::chrono::milliseconds(5000))));
    coordinator_stub_ = v1::Coordinator::NewStub(testing::LocalChannel(coordinator_port_));
    client_deadline_ = std::chrono::milliseconds(5000);
    reference_ = std::move(embedding::NewInProcessCollection(1)).value();
  }
  void TearDown() override {
    ReferenceClusterTest::TearDown();
    for (Shard& s : shards_) s.Stop();
    std::filesystem::remove_all(root_);
  }

  // A smart client, with table "a" (SGD) made on the cluster and in the reference, and
  // MakePush's first push from `seed` (its ids `a`) applied to both at step 1.
  std::unique_ptr<client::EmbeddingClient> ConnectWithTableA(uint64_t seed, Push* p) {
    auto c = Connect(client::ClientOptions::Mode::kSmart);
    CreateBoth(*c, Table("a", v1::SGD, 11));
    *p = FirstPush(seed);
    PushBoth(*c, "a", p->a, p->ga, 1);
    return c;
  }

  // The coordinator's Reshard to `shards` (indices into shards_).
  grpc::Status Reshard(const std::vector<int>& shards, v1::ReshardClusterResponse* out) {
    v1::ReshardClusterRequest request;
    for (int k : shards) request.add_shards(shards_[k].address());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return coordinator_stub_->Reshard(&ctx, request, out);
  }

  // Every row of `tables` lives on the shard that owns it in the map of `serving` (indices
  // into shards_, in shard order), and the rows together equal the reference's.
  void ExpectRowsPlacedAndEqualTheReference(const std::vector<std::string>& tables,
                                            const std::vector<int>& serving) {
    for (const std::string& table : tables) {
      SCOPED_TRACE(table);
      v1::TableConfig config;
      const std::vector<v1::TableConfig> configs = reference_->ListTables().value();
      for (const v1::TableConfig& c : configs) {
        if (c.name() == table) config = c;
      }
      testing::RowMap all;
      for (size_t k = 0; k < serving.size(); ++k) {
        for (auto& [id, row] : StoredRows(*shards_[serving[k]].tables, table)) {
          EXPECT_EQ(embedding::ShardOfRow(config, id, static_cast<int>(serving.size())),
                    static_cast<int>(k))
              << "row " << id << " on shard " << k;
          EXPECT_TRUE(all.emplace(id, row).second) << "row " << id << " on two shards";
        }
      }
      const auto want = StoredRows(*reference_, table);
      EXPECT_EQ(all.size(), want.size());
      EXPECT_TRUE(all == want) << "rows differ from a replay of the acknowledged pushes";
    }
  }

  // Tables a and b, and push `p` of them applied by shard 0 alone under *id (its answer
  // lost, the other shard's part never sent); the reference takes it once, as every row
  // must in the end.
  void HalfApply(client::EmbeddingClient& c, const Push& p, embedding::RequestId* id) {
    CreateBoth(c, Table("a", v1::SGD, 11));
    CreateBoth(c, Table("b", v1::ADAGRAD, 12));
    *id = c.NextRequestId();
    ASSERT_NO_FATAL_FAILURE(PushShardZerosPart(shards_[0].port, p, *id));
    ASSERT_TRUE(reference_->PushBatch(PartsOf(p), 1).ok());
  }
  // `p` sent again under `id` through `c` (3 shards): each row has taken it once.
  void RepeatAndExpectAppliedOnce(client::EmbeddingClient& c, const Push& p,
                                  const embedding::RequestId& id) {
    embedding::PushOptions options;
    options.request_id = id;
    ASSERT_TRUE(c.PushBatch(PartsOf(p), 1, options).ok());
    ExpectRowsPlacedAndEqualTheReference({"a", "b"}, {0, 1, 2});
  }

  std::string root_;
  std::vector<Shard> shards_;
  std::unique_ptr<v1::Coordinator::Stub> coordinator_stub_;
};

// The same case through the smart client and through the coordinator, each on a fresh
// cluster.
TESSERA_IN_EACH_CLIENT_MODE(ReshardInEachMode, ReshardTest);

TEST_P(ReshardInEachMode, PushesDuringTwoToThreeToTwoWithLostAnswersEqualAReplay) {
  const client::ClientOptions::Mode mode = GetParam();
  auto c = Connect(mode);
  CreateBoth(*c, Table("a", v1::SGD, 11));
  CreateBoth(*c, Table("b", v1::ADAGRAD, 12));
  // A fixed vocabulary: its rows are laid out by place, and every row moves.
  v1::TableConfig fixed = Table("c", v1::ADAGRAD, 13);
  fixed.set_vocabulary_size(kVocabulary);
  CreateBoth(*c, fixed);
  constexpr int kPushes = 240;
  std::atomic<int> acknowledged{0};
  std::thread pusher([&] {
    std::mt19937_64 rng(7);
    for (int i = 0; i < kPushes; ++i) {
      const Push p = MakePush(rng, i);
      const std::vector<embedding::TableGradients> parts = {
          {"a", p.a, p.ga}, {"b", p.b, p.gb}, {"c", p.c, p.gc}};
      // Shard 1 applies a push and loses its answer now and then (retried with its id).
      if (i % 7 == 3) shards_[1].loser->LoseAnswers(1);
      embedding::PushOptions options;
      options.request_id = c->NextRequestId();
      absl::Status s = c->PushBatch(parts, i, options);
      for (int retry = 0; !s.ok() && retry < 20; ++retry) s = c->PushBatch(parts, i, options);
      ASSERT_TRUE(s.ok()) << "push " << i << ": " << s;
      ASSERT_TRUE(reference_->PushBatch(parts, i).ok());
      acknowledged.store(i + 1);
    }
  });
  auto wait_for = [&](int n) {
    for (int i = 0; i < 6000 && acknowledged.load() < n; ++i) usleep(10000);
  };
  // The reshards, while the pusher pushes (joined whatever they assert).
  [&] {
    wait_for(60);
    // The new shard loses the answers of two imports (the coordinator repeats them).
    shards_[2].loser->LoseAnswers(2);
    v1::ReshardClusterResponse r;
    grpc::Status s = Reshard({0, 1, 2}, &r);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(r.version(), 2u);
    EXPECT_GT(r.rows_moved(), 0);
    EXPECT_LE(shards_[2].loser->answers_left_to_lose(), 0) << "no import answer was lost";
    EXPECT_LT(acknowledged.load(), kPushes) << "the pushes ended before the reshard";
    wait_for(acknowledged.load() + 40);
    s = Reshard({0, 1}, &r);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(r.version(), 3u);
    EXPECT_LT(acknowledged.load(), kPushes) << "the pushes ended before the reshard";
  }();
  pusher.join();
  ExpectRowsPlacedAndEqualTheReference({"a", "b", "c"}, {0, 1});
  // The shards' disks hold what they serve: open them again.
  for (int k = 0; k < 2; ++k) {
    testing::RowMap b = StoredRows(*shards_[k].tables, "b");
    testing::RowMap fixed_rows = StoredRows(*shards_[k].tables, "c");
    shards_[k].Stop();
    shards_[k].num_shards = 2;
    shards_[k].version = 3;
    ASSERT_NO_FATAL_FAILURE(shards_[k].Start());
    EXPECT_TRUE(StoredRows(*shards_[k].tables, "b") == b)
        << "shard " << k << "'s rows after a restart";
    EXPECT_TRUE(StoredRows(*shards_[k].tables, "c") == fixed_rows)
        << "shard " << k << "'s fixed-vocabulary rows after a restart";
  }
}

// A push that one shard applied before the reshard and the other never saw, repeated
// with its request id once the cluster is on 3 shards: the rows that took it (some now on
// the new shard) do not take it again, the others do.
TEST_F(ReshardTest, APushHalfAppliedBeforeAReshardIsCompletedOnceAfterIt) {
  auto c = Connect(client::ClientOptions::Mode::kSmart);
  const Push p = FirstPush(3);
  embedding::RequestId id;
  ASSERT_NO_FATAL_FAILURE(HalfApply(*c, p, &id));
  v1::ReshardClusterResponse r;
  ASSERT_TRUE(Reshard({0, 1, 2}, &r).ok());
  EXPECT_GT(r.pushes_kept(), 0);
  ASSERT_NO_FATAL_FAILURE(RepeatAndExpectAppliedOnce(*c, p, id));
  // Once more with the same id: nothing changes.
  ASSERT_NO_FATAL_FAILURE(RepeatAndExpectAppliedOnce(*c, p, id));
}

// The same across restarts, as operators run them: shard 0 restarts before the reshard
// (what it applied is in its durable records, no longer in its journal), and every shard
// restarts after the commit (the pushes handed over are on their disks). Repeated with
// its request id, the push still reaches each row once.
TEST_F(ReshardTest, APushHalfAppliedBeforeAReshardIsCompletedOnceAcrossRestarts) {
  auto c = Connect(client::ClientOptions::Mode::kSmart);
  const Push p = FirstPush(5);
  embedding::RequestId id;
  ASSERT_NO_FATAL_FAILURE(HalfApply(*c, p, &id));
  shards_[0].Stop();
  ASSERT_NO_FATAL_FAILURE(shards_[0].Start());
  v1::ReshardClusterResponse r;
  grpc::Status s = Reshard({0, 1, 2}, &r);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_GT(r.pushes_kept(), 0) << "shard 0's recorded push was not handed over";
  for (int k = 0; k < 3; ++k) {
    shards_[k].Stop();
    shards_[k].num_shards = 3;
    shards_[k].version = 2;
    ASSERT_NO_FATAL_FAILURE(shards_[k].Start());
  }
  ASSERT_NO_FATAL_FAILURE(RepeatAndExpectAppliedOnce(*c, p, id));
  // Once more with the same id after another restart: nothing changes. The client's
  // notice of the restart says what a shard with a data directory keeps.
  shards_[2].Stop();
  ASSERT_NO_FATAL_FAILURE(shards_[2].Start());
  ::testing::internal::CaptureStderr();
  RepeatAndExpectAppliedOnce(*c, p, id);
  const std::string notice = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(notice, ::testing::HasSubstr("restarted"));
  EXPECT_THAT(notice, ::testing::HasSubstr("its WRITE_THROUGH tables as last written"));
  EXPECT_THAT(notice, ::testing::Not(::testing::HasSubstr("empty")));
}

// Issue 41, item 14: a restore (a trainer resuming) that arrives while a reshard holds the
// registry's lock waits for the reshard. Were it to take the checkpoint barrier first, as
// it once did, the reshard would wait for the barrier and the restore for the registry,
// both for good, and every checkpoint and routed push after them too. The reshard pauses
// with the registry held and the barrier not yet taken, and lets the restore go as far as
// the lock order allows; then both must end.
TEST_F(ReshardTest, ARestoreArrivingDuringAReshardWaitsForItAndBothEnd) {
  auto store = storage::CoordinatorStore::Open(root_ + "/coordinator", 3);
  ASSERT_TRUE(store.ok()) << store.status();
  std::unique_ptr<server::Cluster> cluster;
  std::atomic<bool> restore_locked{false};
  absl::Status restored = absl::UnknownError("not run");
  std::thread restore;
  embedding::RestoreOptions of_m;
  of_m.model = "m";
  server::ClusterOptions options;
  options.pause = [&](absl::string_view point) {
    if (point == "restore: locked") restore_locked = true;
    if (point != "reshard: copied") return;
    restore = std::thread([&] { restored = cluster->Restore(-1, nullptr, of_m).status(); });
    // As far as the restore gets while the reshard holds the registry (bounded: in the
    // right lock order it gets nowhere).
    for (int i = 0; i < 200 && !restore_locked.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
  cluster = std::make_unique<server::Cluster>(router_.get(), 1, options, store->get());
  const v1::TableConfig table = Table("m.a", v1::SGD, 11);
  ASSERT_TRUE(cluster->CreateTable(table).ok());
  std::mt19937_64 rng(8);
  const Push p = MakePush(rng, 0);
  const embedding::TableGradients part{"m.a", p.a, p.ga};
  const absl::StatusOr<embedding::CheckedPush> push = embedding::CheckPush({&table, 1}, {&part, 1});
  ASSERT_TRUE(push.ok()) << push.status();
  ASSERT_TRUE(cluster->PushBatch(*push, 1, {}).ok());
  ASSERT_TRUE(cluster->Checkpoint(1, {}, "m").ok());
  auto reshard = std::async(std::launch::async, [&] {
    return cluster->Reshard({shards_[0].address(), shards_[1].address(), shards_[2].address()})
        .status();
  });
  if (reshard.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
    ADD_FAILURE() << "the reshard and the restore wait for each other";
    std::_Exit(1);  // their threads hold the locks: nothing can be torn down
  }
  const absl::Status resharded = reshard.get();
  restore.join();
  EXPECT_TRUE(resharded.ok()) << resharded;
  EXPECT_TRUE(restored.ok()) << restored;
}

// A new shard started for another map version (a script's or operator's slip) is refused
// before anything is published, naming the flag; the old map serves on, and the same
// reshard works once the shard runs with the version it names.
TEST_F(ReshardTest, ANewShardOfAnotherMapVersionIsRefusedBeforeAnythingIsPublished) {
  Push p;
  std::unique_ptr<client::EmbeddingClient> c;
  ASSERT_NO_FATAL_FAILURE(c = ConnectWithTableA(6, &p));
  // Shard 2 started anew, empty, serving `version`.
  auto restart_new_shard = [&](uint64_t version) {
    shards_[2].Stop();
    std::filesystem::remove_all(shards_[2].dir);
    shards_[2].version = version;
    shards_[2].Start();
  };
  for (const uint64_t wrong : {3, 1}) {
    ASSERT_NO_FATAL_FAILURE(restart_new_shard(wrong));
    v1::ReshardClusterResponse r;
    const grpc::Status s = Reshard({0, 1, 2}, &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
    EXPECT_THAT(s.error_message(), ::testing::HasSubstr(absl::StrCat(
                                       "serves shard map version ", wrong, ", not 2")));
    EXPECT_THAT(s.error_message(), ::testing::HasSubstr("--shard_map_version=2"));
    ASSERT_TRUE(c->PushGradients("a", p.a, p.ga, 2).ok()) << "the old map serves on";
    ASSERT_TRUE(reference_->PushGradients("a", p.a, p.ga, 2).ok());
    ExpectRowsPlacedAndEqualTheReference({"a"}, {0, 1});
  }
  ASSERT_NO_FATAL_FAILURE(restart_new_shard(2));
  v1::ReshardClusterResponse r;
  const grpc::Status s = Reshard({0, 1, 2}, &r);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(r.version(), 2u);
  ExpectRowsPlacedAndEqualTheReference({"a"}, {0, 1, 2});
}

// Rows an aborted reshard copied to a new shard do not come back: a table dropped (and made
// again) meanwhile holds only its new rows once the next reshard commits.
TEST_F(ReshardTest, ADroppedTablesRowsDoNotComeBackFromAnAbortedReshardsCopies) {
  Push p;
  std::unique_ptr<client::EmbeddingClient> c;
  ASSERT_NO_FATAL_FAILURE(c = ConnectWithTableA(7, &p));
  // Shard 0 loses its answer to the catch-up round, after the rows came to shard 2.
  shards_[0].loser->LoseAnswers(1, /*after=*/1);
  v1::ReshardClusterResponse r;
  grpc::Status s = Reshard({0, 1, 2}, &r);
  EXPECT_NE(s.error_message().find("aborted"), std::string::npos) << s.error_message();
  shards_[0].loser->LoseAnswers(0);
  ASSERT_FALSE(StoredRows(*shards_[2].tables, "a").empty()) << "the copy reached shard 2";
  // Dropped (on the map served: shards 0 and 1) and made again with the same config.
  ASSERT_TRUE(c->DropTable("a").ok());
  ASSERT_TRUE(reference_->DropTable("a").ok());
  CreateBoth(*c, Table("a", v1::SGD, 11));
  ASSERT_NO_FATAL_FAILURE(PushBoth(*c, "a", p.b, p.gb, 2));
  s = Reshard({0, 1, 2}, &r);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ExpectRowsPlacedAndEqualTheReference({"a"}, {0, 1, 2});
}

// A reshard that fails before it publishes changes nothing (the frozen shards go on);
// one that fails after it publishes is finished by repeating it.
TEST_F(ReshardTest, AFailedReshardIsAbortedOrFinishedByRepeatingIt) {
  Push p;
  std::unique_ptr<client::EmbeddingClient> c;
  ASSERT_NO_FATAL_FAILURE(c = ConnectWithTableA(5, &p));
  // Shard 0 freezes and loses its answer: the reshard is aborted, shard 0 included.
  shards_[0].loser->LoseAnswers(1);
  v1::ReshardClusterResponse r;
  grpc::Status s = Reshard({0, 1, 2}, &r);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.error_message().find("aborted"), std::string::npos) << s.error_message();
  ASSERT_TRUE(c->PushGradients("a", p.a, p.ga, 2).ok()) << "the old map serves on";
  ASSERT_TRUE(reference_->PushGradients("a", p.a, p.ga, 2).ok());

  // Shard 1 holds rows of a table the coordinator does not know (no round copies them): it
  // cannot commit, after the new map is published.
  v1::TableConfig fixed = Table("local", v1::SGD, 3);
  fixed.set_vocabulary_size(100);
  fixed.set_durability(v1::CHECKPOINT);
  ASSERT_TRUE(shards_[1].tables->CreateTable(fixed).ok());
  ASSERT_TRUE(
      shards_[1].tables->PushGradients("local", {1, 3}, std::vector<float>(8, 1.0f), 1).ok());
  s = Reshard({0, 1, 2}, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("repeat the same reshard"), std::string::npos)
      << s.error_message();
  EXPECT_NE(s.error_message().find("'local' holds 2 rows"), std::string::npos) << s.error_message();
  ASSERT_TRUE(shards_[1].tables->DropTable("local").ok());
  s = Reshard({0, 1, 2}, &r);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(r.version(), 2u);
  ASSERT_NO_FATAL_FAILURE(PushBoth(*c, "a", p.a, p.ga, 3));
  ExpectRowsPlacedAndEqualTheReference({"a"}, {0, 1, 2});

  // A fixed vocabulary known to the coordinator moves (3 shards to 2).
  v1::TableConfig fixed_everywhere = Table("dense", v1::SGD, 4);
  fixed_everywhere.set_vocabulary_size(1000);
  CreateBoth(*c, fixed_everywhere);
  std::vector<int64_t> ids(300);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 3 + 1);
  const std::vector<float> g(ids.size() * kDim, 0.5f);
  ASSERT_NO_FATAL_FAILURE(PushBoth(*c, "dense", ids, g, 4));
  // Shard 0 loses its answer to the catch-up round's start, after shard 2's rows came to
  // it and to shard 1: the reshard is aborted, and no shard keeps a row it does not own.
  shards_[0].loser->LoseAnswers(1, /*after=*/1);
  s = Reshard({0, 1}, &r);
  EXPECT_NE(s.error_message().find("reshard aborted"), std::string::npos) << s.error_message();
  shards_[0].loser->LoseAnswers(0);
  ExpectRowsPlacedAndEqualTheReference({"a", "dense"}, {0, 1, 2});
  s = Reshard({0, 1}, &r);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ExpectRowsPlacedAndEqualTheReference({"a", "dense"}, {0, 1});
  s = Reshard({0, 0}, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// A table with a row budget and eviction (rows evicted to disk) moves with its budget
// split anew: while rows move no shard evicts, after the commit each holds at most its
// part in memory, and every row, in memory or on disk, reads as a replay says.
TEST_F(ReshardTest, ABudgetedTableMovesWithItsBudgetSplitAnew) {
  auto c = Connect(client::ClientOptions::Mode::kSmart);
  v1::TableConfig lru = Table("lru", v1::ADAGRAD, 13);
  lru.set_max_rows(600);
  lru.mutable_eviction()->set_policy(v1::EVICTION_LRU);
  ASSERT_TRUE(c->CreateTable(lru).ok());
  v1::TableConfig unbounded = lru;
  unbounded.clear_max_rows();
  unbounded.clear_eviction();
  ASSERT_TRUE(reference_->CreateTable(unbounded).ok());
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 1000; ++i) ids.push_back(i * 7919 + 5);
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<float> g(-1.0f, 1.0f);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> grads(ids.size() * kDim);
    for (float& x : grads) x = g(rng);
    ASSERT_NO_FATAL_FAILURE(PushBoth(*c, "lru", ids, grads, step));
  }
  auto expect_parts = [&](const std::vector<int>& serving, int64_t part) {
    for (int k : serving) {
      const std::vector<v1::TableConfig> held = shards_[k].tables->ListTables().value();
      ASSERT_EQ(held.size(), 1u);
      EXPECT_EQ(held[0].max_rows(), part) << "shard " << k;
      EXPECT_LE(shards_[k].tables->Usage("lru").value().rows, part) << "shard " << k;
    }
  };
  expect_parts({0, 1}, 300);
  auto expect_rows = [&] {
    std::vector<float> got(ids.size() * kDim), want(ids.size() * kDim);
    embedding::LookupOptions read_only;
    read_only.insert_missing = false;
    ASSERT_TRUE(c->Lookup("lru", ids, absl::MakeSpan(got), read_only).ok());
    ASSERT_TRUE(reference_->Lookup("lru", ids, absl::MakeSpan(want), read_only).ok());
    EXPECT_EQ(got, want);
  };
  expect_rows();
  v1::ReshardClusterResponse r;
  grpc::Status s = Reshard({0, 1, 2}, &r);
  ASSERT_TRUE(s.ok()) << s.error_message();
  expect_parts({0, 1, 2}, 200);
  expect_rows();
  s = Reshard({0, 1}, &r);
  ASSERT_TRUE(s.ok()) << s.error_message();
  expect_parts({0, 1}, 300);
  expect_rows();
}

}  // namespace
}  // namespace tessera
