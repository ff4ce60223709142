#include "serving/replica.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "embedding/inprocess_collection.h"
#include "embedding/storage/coordinator_store.h"
#include "embedding/storage/durable_collection.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shard_service.h"
#include "serving/serving_service.h"
#include "tests/support/local_server.h"
#include "tests/support/reference_cluster.h"
#include "tests/support/served_shard.h"
#include "tests/support/table_configs.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_client.h"
#include "trainer/coordinator_rendezvous.h"
#include "trainer/input_pipeline.h"
#include "trainer/metrics.h"
#include "trainer/sparse_step.h"
#include "trainer/synthetic.h"
#include "trainer/trainer.h"
#include "wire/packed_bytes.h"

namespace tessera::serving {
namespace {

using ::testing::HasSubstr;

constexpr int kDim = 4;
constexpr int64_t kVocabulary = 5000;

using Shard = testing::ServedShard;

class ReplicaTest : public testing::ReferenceClusterTest {
 protected:
  // `durable`: shards and coordinator keep their data (and checkpoints) in directories.
  void StartCluster(size_t change_log_bytes = size_t{64} << 20, bool durable = false) {
    shards_.resize(3);
    for (int k = 0; k < 3; ++k) {
      shards_[k].index = k;
      // Shards 0 and 1 serve map version 1; shard 2 waits with its place in version 2.
      shards_[k].num_shards = k < 2 ? 2 : 3;
      shards_[k].version = k < 2 ? 1 : 2;
      shards_[k].change_log_bytes = change_log_bytes;
      if (durable) shards_[k].dir = absl::StrCat(data_.path, "/shard-", k);
      ASSERT_NO_FATAL_FAILURE(shards_[k].Start());
    }
    if (durable) {
      auto store = storage::CoordinatorStore::Open(data_.path + "/coordinator", 3);
      ASSERT_TRUE(store.ok()) << store.status();
      store_ = *std::move(store);
    }
    ASSERT_NO_FATAL_FAILURE(StartCoordinator({shards_[0].address(), shards_[1].address()},
                                             RetryingRouter(std::chrono::milliseconds(5000)),
                                             nullptr, store_.get()));
    client_deadline_ = std::chrono::milliseconds(5000);
    trainer_ = Connect(client::ClientOptions::Mode::kSmart);
    ASSERT_NE(trainer_, nullptr);
    ASSERT_TRUE(trainer_->CreateTable(testing::TestTable("m.a", kDim, 11, v1::SGD, 0.5f)).ok());
    ASSERT_TRUE(trainer_->CreateTable(testing::TestTable("m.b", kDim, 12, v1::ADAGRAD, 0.5f)).ok());
    v1::TableConfig fixed = testing::TestTable("m.c", kDim, 13, v1::ADAGRAD, 0.5f);
    fixed.set_vocabulary_size(kVocabulary);
    ASSERT_TRUE(trainer_->CreateTable(fixed).ok());
    // Another model's table: the replica does not follow it.
    ASSERT_TRUE(trainer_->CreateTable(testing::TestTable("other.x", kDim, 14, v1::SGD, 0.5f)).ok());
  }
  void TearDown() override {
    ReferenceClusterTest::TearDown();
    coordinator_.reset();  // before the store it keeps its checkpoints in
    for (Shard& s : shards_) s.Stop();
  }

  std::unique_ptr<Replica> StartReplica(ReplicaOptions options = {}) {
    options.model = "m";
    options.client.deadline = std::chrono::milliseconds(5000);
    options.client.retry.max_retries = 2;
    options.client.retry.initial_backoff = std::chrono::milliseconds(20);
    absl::StatusOr<std::unique_ptr<Replica>> r = Replica::Start(coordinator_address_, options);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? std::move(r).value() : nullptr;
  }

  // Push `i` of a stream: ids drawn from a pool (rows updated many times) and new ones.
  void Push(int i) {
    std::mt19937_64 rng(1000 + i);
    std::uniform_int_distribution<int64_t> pool(0, 400);
    std::uniform_real_distribution<float> g(-1.0f, 1.0f);
    std::vector<embedding::TableGradients> parts(4);
    const char* names[] = {"m.a", "m.b", "m.c", "other.x"};
    std::vector<std::vector<int64_t>> ids(4);
    std::vector<std::vector<float>> grads(4);
    for (int t = 0; t < 4; ++t) {
      for (int j = 0; j < 24; ++j) {
        ids[t].push_back(t == 2  ? static_cast<int64_t>(rng() % kVocabulary)
                         : j % 6 ? pool(rng) * 7919
                                 : static_cast<int64_t>(rng()));
        for (int d = 0; d < kDim; ++d) grads[t].push_back(g(rng));
      }
      parts[t] = {names[t], ids[t], grads[t]};
    }
    embedding::PushOptions options;
    options.request_id = trainer_->NextRequestId();
    absl::Status s = trainer_->PushBatch(parts, i, options);
    for (int retry = 0; !s.ok() && retry < 20; ++retry) s = trainer_->PushBatch(parts, i, options);
    ASSERT_TRUE(s.ok()) << "push " << i << ": " << s;
  }

  // Polls until every shard is caught up (bounded).
  void CatchUp(Replica& replica) {
    for (int i = 0; i < 200; ++i) {
      const absl::Status s = replica.Poll();
      if (s.ok() && replica.shards_caught_up() == replica.shards()) return;
      usleep(20000);
    }
    FAIL() << "the replica did not catch up";
  }

  // Every row the cluster stores of the model's tables reads the same on the replica, bit
  // for bit, and so do ids never pushed (their initial weights).
  void ExpectReplicaEqualsTheCluster(const Replica& replica) {
    for (const std::string table : {"m.a", "m.b", "m.c"}) {
      SCOPED_TRACE(table);
      std::vector<int64_t> ids;
      std::vector<float> want;
      embedding::ExportOptions options;
      ASSERT_TRUE(trainer_
                      ->ExportRows(table, options,
                                   [&](const embedding::RowBlock& b) {
                                     ids.insert(ids.end(), b.ids.begin(), b.ids.end());
                                     want.insert(want.end(), b.weights.begin(), b.weights.end());
                                     return absl::OkStatus();
                                   })
                      .ok());
      ASSERT_GT(ids.size(), 0u);
      for (int64_t never : {int64_t{3}, int64_t{4999}, int64_t{77}}) {
        ids.push_back(never);
        std::vector<float> row(kDim);
        const int64_t one[] = {never};
        ASSERT_TRUE(trainer_->Lookup(table, one, absl::MakeSpan(row), {}).ok());
        want.insert(want.end(), row.begin(), row.end());
      }
      std::shared_ptr<const embedding::ServingTable> served = replica.table(table);
      ASSERT_NE(served, nullptr);
      std::vector<float> got(want.size());
      ASSERT_TRUE(served->Lookup(ids, absl::MakeSpan(got)).ok());
      int differ = 0;
      for (size_t i = 0; i < want.size(); ++i) differ += want[i] != got[i] ? 1 : 0;
      EXPECT_EQ(differ, 0) << "of " << want.size() << " values";
    }
    EXPECT_EQ(replica.table("other.x"), nullptr);
  }

  grpc::Status Reshard(const std::vector<int>& shards) {
    v1::ReshardClusterRequest request;
    for (int k : shards) request.add_shards(shards_[k].address());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::ReshardClusterResponse out;
    return v1::Coordinator::NewStub(testing::LocalChannel(coordinator_port_))
        ->Reshard(&ctx, request, &out);
  }

  testing::ScopedTempDir data_{"tessera-replica"};  // of a durable cluster
  std::unique_ptr<storage::CoordinatorStore> store_;
  std::vector<Shard> shards_;
  std::unique_ptr<client::EmbeddingClient> trainer_;
};

TEST_F(ReplicaTest, FollowsPushesFromASnapshotAndEqualsTheTrainingRowsBitForBit) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  for (int i = 0; i < 20; ++i) ASSERT_NO_FATAL_FAILURE(Push(i));
  std::unique_ptr<Replica> replica = StartReplica();
  ASSERT_NE(replica, nullptr);
  EXPECT_EQ(replica->counters().snapshots, 2);
  EXPECT_EQ(replica->serving_step(), 20);
  // Pushes while the replica follows.
  std::atomic<bool> done{false};
  std::thread follower([&] {
    for (int i = 0; i < 2000 && !done.load(); ++i) {
      (void)replica->Poll();
      usleep(2000);
    }
  });
  for (int i = 20; i < 120; ++i) ASSERT_NO_FATAL_FAILURE(Push(i));
  done = true;
  follower.join();
  ASSERT_NO_FATAL_FAILURE(CatchUp(*replica));
  ExpectReplicaEqualsTheCluster(*replica);
  EXPECT_EQ(replica->serving_step(), 120);
  EXPECT_EQ(replica->counters().snapshots, 2) << "no shard was read whole again";
  EXPECT_GT(replica->counters().reads, 2);
  EXPECT_THAT(replica->tables(), ::testing::ElementsAre("m.a", "m.b", "m.c"));
}

TEST_F(ReplicaTest, AReplicaBehindTheLogsBoundReadsTheShardWholeAndSaysSo) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(/*change_log_bytes=*/4096));
  std::unique_ptr<Replica> replica = StartReplica();
  ASSERT_NE(replica, nullptr);
  for (int i = 0; i < 40; ++i) ASSERT_NO_FATAL_FAILURE(Push(i));
  ASSERT_NO_FATAL_FAILURE(CatchUp(*replica));
  ExpectReplicaEqualsTheCluster(*replica);
  EXPECT_GT(replica->counters().snapshots, 2);
  const std::vector<std::string> events = replica->events();
  ASSERT_FALSE(events.empty());
  EXPECT_THAT(events.back(), HasSubstr("--change_log_bytes"));
}

TEST_F(ReplicaTest, AShardThatCameBackEmptyIsReadWholeAndItsOldRowsGoBackToInitial) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  for (int i = 0; i < 10; ++i) ASSERT_NO_FATAL_FAILURE(Push(i));
  std::unique_ptr<Replica> replica = StartReplica();
  ASSERT_NE(replica, nullptr);
  // Shard 1 restarts with no rows (memory only); its tables made again, as the
  // coordinator re-provisions a shard that came back empty.
  shards_[1].Stop();
  ASSERT_NO_FATAL_FAILURE(shards_[1].Start());
  auto stub = v1::EmbeddingShard::NewStub(testing::LocalChannel(shards_[1].port));
  const std::vector<v1::TableConfig> configs = trainer_->ListTables().value();
  for (const v1::TableConfig& c : configs) {
    grpc::ClientContext ctx;
    v1::CreateTableRequest request;
    *request.mutable_config() = c;
    v1::CreateTableResponse response;
    ASSERT_TRUE(stub->CreateTable(&ctx, request, &response).ok());
  }
  for (int i = 10; i < 15; ++i) ASSERT_NO_FATAL_FAILURE(Push(i));
  ASSERT_NO_FATAL_FAILURE(CatchUp(*replica));
  ExpectReplicaEqualsTheCluster(*replica);
  EXPECT_EQ(replica->counters().snapshots, 3);
  EXPECT_THAT(replica->events().back(), HasSubstr("is gone"));
}

TEST_F(ReplicaTest, FollowsALiveReshardTwoToThreeToTwo) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  for (int i = 0; i < 10; ++i) ASSERT_NO_FATAL_FAILURE(Push(i));
  std::unique_ptr<Replica> replica = StartReplica();
  ASSERT_NE(replica, nullptr);
  std::atomic<bool> done{false};
  std::atomic<int> pushed{10};
  std::thread pusher([&] {
    for (int i = 10; i < 2000 && !done.load(); ++i) {
      Push(i);
      pushed = i + 1;
    }
  });
  std::thread follower([&] {
    for (int i = 0; i < 20000 && !done.load(); ++i) {
      (void)replica->Poll();
      usleep(1000);
    }
  });
  auto push_more = [&](int n) {
    const int until = pushed.load() + n;
    for (int i = 0; i < 5000 && pushed.load() < until; ++i) usleep(1000);
  };
  push_more(30);
  grpc::Status s = Reshard({0, 1, 2});
  EXPECT_TRUE(s.ok()) << s.error_message();
  // The replica takes the new map (it reads it once a second) and follows three shards.
  for (int i = 0; i < 5000 && replica->shards() != 3; ++i) usleep(1000);
  EXPECT_EQ(replica->shards(), 3);
  push_more(30);
  s = Reshard({0, 1});
  EXPECT_TRUE(s.ok()) << s.error_message();
  push_more(10);
  done = true;
  pusher.join();
  follower.join();
  ASSERT_NO_FATAL_FAILURE(CatchUp(*replica));
  ExpectReplicaEqualsTheCluster(*replica);
  EXPECT_EQ(replica->serving_step(), pushed.load());
  EXPECT_EQ(replica->counters().snapshots, 3) << "only the new shard was read whole";
}

// A replica with a state_dir, stopped and started again, reads on from its saved cursors:
// no shard read whole, rows equal; one whose shards' logs no longer hold what it missed
// reads them whole and says so.
TEST_F(ReplicaTest, ARestartedReplicaReadsOnFromItsSavedStateOrSaysWhyNot) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(/*change_log_bytes=*/size_t{16} << 10));
  const std::string dir = ::testing::TempDir() + "/replica-state-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  ReplicaOptions options;
  options.state_dir = dir;
  for (int i = 0; i < 10; ++i) ASSERT_NO_FATAL_FAILURE(Push(i));
  std::unique_ptr<Replica> replica = StartReplica(options);
  ASSERT_NE(replica, nullptr);
  EXPECT_EQ(replica->counters().snapshots, 2);
  ASSERT_NO_FATAL_FAILURE(CatchUp(*replica));
  ASSERT_TRUE(replica->Save().ok());
  replica.reset();
  for (int i = 10; i < 20; ++i) ASSERT_NO_FATAL_FAILURE(Push(i));
  replica = StartReplica(options);
  ASSERT_NE(replica, nullptr);
  EXPECT_THAT(replica->events().front(), HasSubstr("resumed from the state saved"));
  ASSERT_NO_FATAL_FAILURE(CatchUp(*replica));
  EXPECT_EQ(replica->counters().snapshots, 0) << "every shard read on from its cursor";
  ExpectReplicaEqualsTheCluster(*replica);
  EXPECT_EQ(replica->serving_step(), 20);
  // Down while the logs' bound (16 KiB) moved past its cursors: read whole, and said.
  ASSERT_TRUE(replica->Save().ok());
  replica.reset();
  for (int i = 20; i < 400; ++i) ASSERT_NO_FATAL_FAILURE(Push(i));
  replica = StartReplica(options);
  ASSERT_NE(replica, nullptr);
  ASSERT_NO_FATAL_FAILURE(CatchUp(*replica));
  EXPECT_EQ(replica->counters().snapshots, 2);
  EXPECT_THAT(replica->events().back(), HasSubstr("fell out of the shard's change log"));
  ExpectReplicaEqualsTheCluster(*replica);
  // A damaged state is not taken: a fresh start, which says so.
  ASSERT_TRUE(replica->Save().ok());
  replica.reset();
  {
    std::fstream f(dir + "/replica.state", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x5a');
  }
  replica = StartReplica(options);
  ASSERT_NE(replica, nullptr);
  EXPECT_THAT(replica->events().front(), HasSubstr("not taken"));
  ASSERT_NO_FATAL_FAILURE(CatchUp(*replica));
  ExpectReplicaEqualsTheCluster(*replica);
  std::filesystem::remove_all(dir);
}

// A small DLRM trained through the cluster on the model's tables "m.C1".."m.C4", its dense
// network published every 10 steps.
struct TrainedModel {
  std::unique_ptr<trainer::DenseBackend> dense;
  std::unique_ptr<trainer::CoordinatorRendezvous> store;
  std::unique_ptr<trainer::DensePublisher> publisher;
  std::unique_ptr<trainer::Trainer> trainer;
  std::unique_ptr<trainer::SyntheticGenerator> data;
};

TrainedModel MakeModel(client::EmbeddingClient* tables, int64_t checkpoint_every = 0) {
  TrainedModel m;
  trainer::DlrmConfig config;
  config.num_sparse = 4;
  config.emb_dim = 8;
  config.bottom_mlp = {16};
  config.top_mlp = {16};
  config.learning_rate = 3e-3f;
  m.dense = std::move(trainer::NewCpuDenseBackend(config)).value();
  m.store = std::make_unique<trainer::CoordinatorRendezvous>(tables);
  m.publisher = std::make_unique<trainer::DensePublisher>(
      m.store.get(), "m", trainer::Trainer::TableNames(config.num_sparse, "m"));
  trainer::TrainerOptions options;
  options.model = "m";
  options.print_progress = false;
  options.publish_dense_every = 10;
  options.dense_publisher = m.publisher.get();
  options.checkpoint_every = checkpoint_every;
  m.trainer = std::make_unique<trainer::Trainer>(tables, m.dense.get(), options);
  v1::TableConfig proto;
  proto.set_dim(8);
  proto.set_seed(5);
  proto.mutable_optimizer()->set_type(v1::ADAGRAD);
  proto.mutable_optimizer()->set_learning_rate(0.05f);
  proto.mutable_initializer()->set_scale(0.05f);
  EXPECT_TRUE(m.trainer->CreateTables(proto).ok());
  trainer::SyntheticConfig sc;
  sc.cardinalities = {20, 200, 50, 1000};
  sc.seed = 5;
  m.data = std::move(trainer::SyntheticGenerator::Create(sc)).value();
  return m;
}

void Train(TrainedModel& m, int64_t from, int64_t to) {
  const trainer::SyntheticGenerator* g = m.data.get();
  trainer::ParallelBatchPipeline source(
      [g](int64_t i, trainer::Batch* b) {
        g->MakeBatch(i, 64, b);
        return absl::OkStatus();
      },
      to - from, 1, 4);
  absl::StatusOr<trainer::TrainResult> r = m.trainer->Train(&source, to, from);
  ASSERT_TRUE(r.ok()) << r.status();
}

std::vector<FeatureBags> BagsOf(const trainer::Batch& batch) {
  std::vector<FeatureBags> bags;
  for (size_t f = 0; f < batch.ids.size(); ++f) bags.push_back({batch.ids[f], batch.offsets[f]});
  return bags;
}

TEST_F(ReplicaTest, PredictEqualsTheTrainersEvaluationBitForBitAtThePublishedStep) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  TrainedModel m = MakeModel(trainer_.get());
  std::unique_ptr<Replica> replica = StartReplica();
  ASSERT_NE(replica, nullptr);
  const trainer::Batch held_out = m.data->MakeHeldOut(700);
  EXPECT_EQ(replica->Predict(held_out.size, held_out.dense, BagsOf(held_out)).status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "no dense network published yet";
  ASSERT_NO_FATAL_FAILURE(Train(m, 0, 25));
  ASSERT_NO_FATAL_FAILURE(CatchUp(*replica));
  EXPECT_EQ(replica->dense_step(), 25) << "published every 10 steps and after the last";
  EXPECT_EQ(replica->serving_step(), 25);
  absl::StatusOr<Replica::Prediction> p =
      replica->Predict(held_out.size, held_out.dense, BagsOf(held_out));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->dense_step, 25);
  // The trainer's evaluation path: its pooled lookup through the cluster, its network.
  trainer::SparseStep lookup;
  const std::vector<std::string> names = trainer::Trainer::TableNames(4, "m");
  std::vector<float> emb(4 * held_out.size * 8);
  ASSERT_TRUE(
      lookup.Lookup(*trainer_, names, held_out, 8, /*insert_missing=*/false, absl::MakeSpan(emb))
          .ok());
  std::vector<float> logits(held_out.size);
  ASSERT_TRUE(
      m.dense->Forward(held_out.size, held_out.dense.data(), emb.data(), logits.data()).ok());
  EXPECT_EQ(p->logits, logits);
  absl::StatusOr<trainer::EvalResult> eval = m.trainer->Evaluate(held_out);
  ASSERT_TRUE(eval.ok());
  EXPECT_EQ(trainer::ExactAuc(p->scores, held_out.labels), eval->auc);
  // Training on: the replica follows, rows and weights.
  ASSERT_NO_FATAL_FAILURE(Train(m, 25, 40));
  ASSERT_NO_FATAL_FAILURE(CatchUp(*replica));
  EXPECT_EQ(replica->dense_step(), 40);
  p = replica->Predict(held_out.size, held_out.dense, BagsOf(held_out));
  ASSERT_TRUE(p.ok());
  eval = m.trainer->Evaluate(held_out);
  EXPECT_EQ(trainer::ExactAuc(p->scores, held_out.labels), eval->auc);
}

// The trainer's logits for `batch` now: its pooled lookup through the cluster, its network.
std::vector<float> TrainerLogits(TrainedModel& m, client::EmbeddingClient& tables,
                                 const trainer::Batch& batch) {
  trainer::SparseStep lookup;
  const std::vector<std::string> names = trainer::Trainer::TableNames(4, "m");
  std::vector<float> emb(4 * batch.size * 8);
  EXPECT_TRUE(
      lookup.Lookup(tables, names, batch, 8, /*insert_missing=*/false, absl::MakeSpan(emb)).ok());
  std::vector<float> logits(batch.size);
  EXPECT_TRUE(m.dense->Forward(batch.size, batch.dense.data(), emb.data(), logits.data()).ok());
  return logits;
}

// Every stored row of the model's tables "m.C1".."m.C4", by table and id.
using ModelRows = std::map<std::string, std::map<int64_t, std::vector<float>>>;
ModelRows RowsOf(client::EmbeddingClient& tables) {
  ModelRows out;
  for (const std::string& name : trainer::Trainer::TableNames(4, "m")) {
    std::map<int64_t, std::vector<float>>& rows = out[name];
    EXPECT_TRUE(tables
                    .ExportRows(name, {},
                                [&](const embedding::RowBlock& b) {
                                  for (size_t i = 0; i < b.size(); ++i) {
                                    rows[b.ids[i]].assign(b.weights.begin() + i * b.dim,
                                                          b.weights.begin() + (i + 1) * b.dim);
                                  }
                                  return absl::OkStatus();
                                })
                    .ok());
  }
  return out;
}

// The replica's rows of every id in `want` equal want's, bit for bit; so do ids never
// trained (their initial weights, as `tables` reads them).
void ExpectServes(const Replica& replica, const ModelRows& want, client::EmbeddingClient& tables) {
  for (const auto& [name, rows] : want) {
    SCOPED_TRACE(name);
    std::shared_ptr<const embedding::ServingTable> served = replica.table(name);
    ASSERT_NE(served, nullptr);
    ASSERT_GT(rows.size(), 0u);
    std::vector<int64_t> ids;
    std::vector<float> expected;
    for (const auto& [id, row] : rows) {
      ids.push_back(id);
      expected.insert(expected.end(), row.begin(), row.end());
    }
    const std::vector<int64_t> never = {int64_t{1} << 50, (int64_t{1} << 50) + 7};
    std::vector<float> initial(never.size() * 8);
    embedding::LookupOptions read_only;
    read_only.insert_missing = false;
    ASSERT_TRUE(tables.Lookup(name, never, absl::MakeSpan(initial), read_only).ok());
    ids.insert(ids.end(), never.begin(), never.end());
    expected.insert(expected.end(), initial.begin(), initial.end());
    std::vector<float> got(expected.size());
    ASSERT_TRUE(served->Lookup(ids, absl::MakeSpan(got)).ok());
    int differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != expected[i] ? 1 : 0;
    EXPECT_EQ(differ, 0) << "of " << got.size() << " values";
  }
}

// A replica of a named checkpoint serves its rows and its dense network as they were when
// it was taken, bit for bit, frozen while training goes on, and after a reshard since
// (the checkpoint's 2 shards' files read by 3); reading it changes no training table.
TEST_F(ReplicaTest, ServesANamedCheckpointFrozenAsItWasTaken) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(size_t{64} << 20, /*durable=*/true));
  TrainedModel m = MakeModel(trainer_.get(), /*checkpoint_every=*/10);
  const trainer::Batch held_out = m.data->MakeHeldOut(500);
  ASSERT_NO_FATAL_FAILURE(Train(m, 0, 20));  // checkpoints 10 and 20
  const ModelRows at_20 = RowsOf(*trainer_);
  const std::vector<float> logits_20 = TrainerLogits(m, *trainer_, held_out);
  ASSERT_NO_FATAL_FAILURE(Train(m, 20, 35));  // checkpoints 30 and 35 (a run's last step)
  ASSERT_TRUE(Reshard({0, 1, 2}).ok());
  const ModelRows at_35 = RowsOf(*trainer_);
  ASSERT_NE(at_35, at_20);

  ReplicaOptions options;
  options.checkpoint = 20;
  std::unique_ptr<Replica> replica = StartReplica(options);
  ASSERT_NE(replica, nullptr);
  EXPECT_EQ(replica->frozen_step(), 20);
  EXPECT_EQ(replica->serving_step(), 20);
  EXPECT_EQ(replica->dense_step(), 20);
  EXPECT_THAT(replica->events().back(), HasSubstr("serving checkpoint 20 of model 'm' frozen"));
  ExpectServes(*replica, at_20, *trainer_);
  absl::StatusOr<Replica::Prediction> p =
      replica->Predict(held_out.size, held_out.dense, BagsOf(held_out));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->logits, logits_20);
  EXPECT_EQ(RowsOf(*trainer_), at_35) << "reading the checkpoint changed the training tables";
  // Training on: the replica stays at its checkpoint.
  ASSERT_NO_FATAL_FAILURE(Train(m, 35, 45));  // checkpoints 40 and 45
  ASSERT_TRUE(replica->Poll().ok());
  EXPECT_EQ(replica->serving_step(), 20);
  ExpectServes(*replica, at_20, *trainer_);

  options.checkpoint = -1;  // the newest
  replica = StartReplica(options);
  ASSERT_NE(replica, nullptr);
  EXPECT_EQ(replica->frozen_step(), 45);
  ExpectServes(*replica, RowsOf(*trainer_), *trainer_);

  // An operator's checkpoint of the model holds no dense network: lookups only.
  embedding::CheckpointOptions of_m;
  of_m.model = "m";
  ASSERT_TRUE(trainer_->Checkpoint(100, {}, of_m).ok());
  options.checkpoint = 100;
  replica = StartReplica(options);
  ASSERT_NE(replica, nullptr);
  EXPECT_EQ(replica->dense(), nullptr);
  EXPECT_THAT(replica->events().front(), HasSubstr("holds no dense network"));
  ExpectServes(*replica, RowsOf(*trainer_), *trainer_);

  // Refused, with reasons.
  options.model = "m";
  options.checkpoint = 25;
  absl::StatusOr<std::unique_ptr<Replica>> none = Replica::Start(coordinator_address_, options);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound) << none.status();
  options.checkpoint = 20;
  options.state_dir = data_.path + "/state";
  none = Replica::Start(coordinator_address_, options);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument) << none.status();
}

// Bad requests get clear errors, and the replica serves on.
TEST_F(ReplicaTest, TheServiceRefusesBadRequestsAndServesOn) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  TrainedModel m = MakeModel(trainer_.get());
  ASSERT_NO_FATAL_FAILURE(Train(m, 0, 10));
  std::unique_ptr<Replica> replica = StartReplica();
  ASSERT_NE(replica, nullptr);
  ASSERT_NO_FATAL_FAILURE(CatchUp(*replica));
  ServingServiceOptions so;
  so.max_batch_ids = 1000;
  ServingService service(replica.get(), so);
  const trainer::Batch batch = m.data->MakeHeldOut(16);
  auto predict = [&](const v1::PredictRequest& request, v1::PredictResponse* response) {
    grpc::ServerContext ctx;
    return service.Predict(&ctx, &request, response);
  };
  v1::PredictRequest good;
  good.set_samples(batch.size);
  wire::SetPacked<float>(batch.dense, good.mutable_dense());
  for (size_t f = 0; f < batch.ids.size(); ++f) {
    v1::TableLookup* feature = good.add_features();
    wire::SetPacked<int64_t>(batch.ids[f], feature->mutable_ids());
    wire::SetPacked<int32_t>(batch.offsets[f], feature->mutable_offsets());
  }
  v1::PredictResponse r;
  ASSERT_TRUE(predict(good, &r).ok());
  EXPECT_EQ(r.scores().size(), batch.size * sizeof(float));
  auto expect_refused = [&](const v1::PredictRequest& bad, grpc::StatusCode code,
                            const std::string& says) {
    v1::PredictResponse out;
    const grpc::Status s = predict(bad, &out);
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(says));
  };
  v1::PredictRequest bad = good;
  std::vector<float> nan_dense = batch.dense;
  nan_dense[3] = std::nanf("");
  wire::SetPacked<float>(nan_dense, bad.mutable_dense());
  expect_refused(bad, grpc::StatusCode::INVALID_ARGUMENT, "dense features");
  bad = good;
  bad.set_samples(batch.size + 1);
  expect_refused(bad, grpc::StatusCode::INVALID_ARGUMENT, "dense features");
  bad = good;
  bad.mutable_features()->RemoveLast();
  expect_refused(bad, grpc::StatusCode::INVALID_ARGUMENT, "3 sparse features");
  bad = good;
  bad.mutable_features(1)->set_offsets("abc");
  expect_refused(bad, grpc::StatusCode::INVALID_ARGUMENT, "feature 1");
  bad = good;
  bad.set_samples(5000);
  expect_refused(bad, grpc::StatusCode::RESOURCE_EXHAUSTED, "--max_batch_ids");
  // Lookups: an unknown table, an id outside a fixed vocabulary.
  auto lookup = [&](const v1::LookupRequest& request, v1::LookupResponse* response) {
    grpc::ServerContext ctx;
    return service.Lookup(&ctx, &request, response);
  };
  v1::LookupRequest unknown;
  unknown.set_table("m.nope");
  unknown.add_ids(1);
  v1::LookupResponse lr;
  grpc::Status s = lookup(unknown, &lr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("m.nope"));
  v1::LookupRequest outside;
  outside.set_table("m.c");
  outside.add_ids(kVocabulary);
  s = lookup(outside, &lr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  // And it serves on: a pooled lookup equal to the training tables' answer.
  v1::LookupRequest pooled;
  pooled.set_table("m.C2");
  for (int64_t id : {3, 7, 3, 11}) pooled.add_ids(id);
  for (int32_t o : {0, 2, 4}) pooled.add_offsets(o);
  pooled.set_pooling(v1::MEAN);
  ASSERT_TRUE(lookup(pooled, &lr).ok());
  std::vector<float> want(2 * 8);
  embedding::LookupOptions read_only;
  read_only.insert_missing = false;
  const int64_t ids[] = {3, 7, 3, 11};
  const int32_t offsets[] = {0, 2, 4};
  ASSERT_TRUE(
      trainer_->PooledLookup("m.C2", ids, offsets, {}, v1::MEAN, absl::MakeSpan(want), read_only)
          .ok());
  EXPECT_EQ(std::vector<float>(lr.values().begin(), lr.values().end()), want);
  grpc::ServerContext ctx;
  v1::ServingStatusRequest status_request;
  v1::ServingStatusResponse status;
  ASSERT_TRUE(service.Status(&ctx, &status_request, &status).ok());
  EXPECT_EQ(status.model(), "m");
  EXPECT_EQ(status.dense_step(), 10);
  EXPECT_EQ(status.serving_step(), 10);
  EXPECT_EQ(status.shards_caught_up(), 2);
  EXPECT_EQ(status.tables_size(), 7);  // a, b, c and C1..C4
}

// The shard's side of the stream, on the wire.
TEST_F(ReplicaTest, ReadChangesRefusesBadRequestsWithClearErrors) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(/*change_log_bytes=*/4096));
  auto stub = v1::EmbeddingShard::NewStub(testing::LocalChannel(shards_[0].port));
  auto read = [&](const v1::ReadChangesRequest& request, v1::ReadChangesResponse* response) {
    grpc::ClientContext ctx;
    return stub->ReadChanges(&ctx, request, response);
  };
  v1::ReadChangesRequest head;
  head.set_model("m");
  v1::ReadChangesResponse at;
  ASSERT_TRUE(read(head, &at).ok());
  EXPECT_NE(at.head().log(), 0u);
  EXPECT_EQ(at.num_shards(), 2);
  v1::ReadChangesRequest bad = head;
  bad.set_model("no spaces");
  v1::ReadChangesResponse r;
  EXPECT_EQ(read(bad, &r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  bad = head;
  *bad.mutable_after() = at.head();
  bad.set_max_bytes(-1);
  EXPECT_EQ(read(bad, &r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  bad.set_max_bytes(0);
  bad.mutable_after()->set_sequence(at.head().sequence() + 5);
  EXPECT_EQ(read(bad, &r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  bad.mutable_after()->set_log(at.head().log() + 1);
  grpc::Status other = read(bad, &r);
  EXPECT_EQ(other.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_THAT(other.error_message(), HasSubstr("snapshot"));
  // Pushes past the bound: the first cursor fell out.
  for (int i = 0; i < 30; ++i) ASSERT_NO_FATAL_FAILURE(Push(i));
  v1::ReadChangesRequest behind = head;
  *behind.mutable_after() = at.head();
  grpc::Status old = read(behind, &r);
  EXPECT_EQ(old.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_THAT(old.error_message(), HasSubstr("--change_log_bytes"));
  // A shard that keeps no log says so (a replica cannot follow it).
  Shard bare;
  bare.index = 0;
  bare.num_shards = 1;
  bare.change_log_bytes = 0;
  ASSERT_NO_FATAL_FAILURE(bare.Start());
  grpc::ClientContext bare_ctx;
  const grpc::Status none = v1::EmbeddingShard::NewStub(testing::LocalChannel(bare.port))
                                ->ReadChanges(&bare_ctx, head, &r);
  EXPECT_EQ(none.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(none.error_message(), HasSubstr("--change_log_bytes=0"));
  bare.Stop();
  // Another model's changes are read past: none of its rows come.
  v1::ReadChangesRequest other_model;
  other_model.set_model("other");
  ASSERT_TRUE(read(other_model, &at).ok());
  Push(30);
  *other_model.mutable_after() = at.head();
  ASSERT_TRUE(read(other_model, &r).ok());
  ASSERT_EQ(r.tables_size(), 1);
  EXPECT_EQ(r.tables(0).table(), "other.x");
  EXPECT_EQ(r.tables(0).step(), 30);
  EXPECT_EQ(r.reached().sequence(), r.head().sequence());
}

}  // namespace
}  // namespace tessera::serving
