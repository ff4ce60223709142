// A shard on a data directory over a real gRPC channel: a disk that refuses writes gives
// the RPC its error and changes nothing stored; checkpoint RPCs need a data directory.

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "embedding/storage/durable_collection.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/shard_service.h"
#include "tests/support/faulty_store.h"
#include "tests/support/local_server.h"
#include "tests/support/push_requests.h"
#include "tests/support/temp_dir.h"

namespace tessera::server {
namespace {

namespace fs = std::filesystem;

class DurableShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("tessera-shard");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override {
    Stop();
    fs::remove_all(dir_);
  }

  void Start(bool durable, int64_t memory_limit = 0) {
    if (durable) {
      storage::DurableOptions o;
      o.data_dir = dir_;
      o.memory_limit = memory_limit;
      o.log = [](const std::string&) {};
      // Every write fails while faults_.writes is set, as on a full disk.
      o.open_store = testing::FaultyRocksDbStores(&faults_);
      tables_ = std::move(storage::DurableCollection::Open(o)).value();
    } else {
      tables_ = std::move(embedding::NewInProcessCollection(1)).value();
    }
    service_ = std::make_unique<ShardService>(tables_.get(), ShardOptions());
    int port = 0;
    server_ = testing::StartLocalServer(service_.get(), &port);
    ASSERT_NE(server_, nullptr);
    stub_ = v1::EmbeddingShard::NewStub(testing::LocalChannel(port));
  }
  void Stop() {
    if (server_) server_->Shutdown();
    server_.reset();
    service_.reset();
    tables_.reset();
  }

  // Creates SGD table `name` (dim 4, lr 0.5) through the RPC.
  void CreateSgd(const std::string& name, v1::Durability durability) {
    v1::TableConfig c;
    c.set_name(name);
    c.set_dim(4);
    c.set_durability(durability);
    c.mutable_optimizer()->set_type(v1::SGD);
    c.mutable_optimizer()->set_learning_rate(0.5f);
    grpc::ClientContext ctx;
    v1::CreateTableRequest req;
    *req.mutable_config() = c;
    v1::CreateTableResponse resp;
    ASSERT_TRUE(stub_->CreateTable(&ctx, req, &resp).ok());
  }

  grpc::Status Push(const std::vector<int64_t>& ids, float g) {
    grpc::ClientContext ctx;
    v1::PushGradientsRequest req;
    req.set_table("wt");
    req.mutable_ids()->Add(ids.begin(), ids.end());
    for (size_t i = 0; i < ids.size() * 4; ++i) req.add_gradients(g);
    v1::PushGradientsResponse resp;
    return stub_->PushGradients(&ctx, req, &resp);
  }
  // One BatchPush of gradient `g` for each (table, ids) part.
  grpc::Status BatchPush(const std::vector<std::pair<std::string, std::vector<int64_t>>>& parts,
                         float g) {
    v1::BatchPushRequest req;
    for (const auto& [table, ids] : parts) {
      v1::TableGradients* t = req.add_tables();
      t->set_table(table);
      const std::vector<float> grads(ids.size() * 4, g);
      t->set_ids(std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 8));
      t->set_gradients(std::string(reinterpret_cast<const char*>(grads.data()), grads.size() * 4));
    }
    req.set_step(1);
    grpc::ClientContext ctx;
    v1::BatchPushResponse resp;
    return stub_->BatchPush(&ctx, req, &resp);
  }
  std::vector<float> Rows(const std::vector<int64_t>& ids, const std::string& table = "wt") {
    grpc::ClientContext ctx;
    v1::LookupRequest req;
    req.set_table(table);
    req.set_read_only(true);
    req.mutable_ids()->Add(ids.begin(), ids.end());
    v1::LookupResponse resp;
    EXPECT_TRUE(stub_->Lookup(&ctx, req, &resp).ok());
    return std::vector<float>(resp.values().begin(), resp.values().end());
  }

  std::string dir_;
  testing::StoreFaults faults_;
  std::unique_ptr<embedding::ShardTables> tables_;
  std::unique_ptr<ShardService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::EmbeddingShard::Stub> stub_;
};

TEST_F(DurableShardTest, FullDiskFailsThePushOverTheWireAndChangesNothing) {
  Start(/*durable=*/true);
  CreateSgd("wt", v1::WRITE_THROUGH);
  const std::vector<int64_t> ids = {1, 2, 3};
  ASSERT_TRUE(Push(ids, 1.0f).ok());
  const auto before = Rows(ids);
  faults_.writes = true;
  grpc::Status s = Push({1, 2, 3, 4}, 2.0f);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("No space left on device"));
  EXPECT_EQ(Rows(ids), before);
  {
    grpc::ClientContext ctx;
    v1::CheckpointRequest req;
    req.set_step(1);
    v1::CheckpointResponse resp;
    EXPECT_EQ(stub_->Checkpoint(&ctx, req, &resp).error_code(),
              grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  faults_.writes = false;
  Stop();
  Start(/*durable=*/true);  // what the disk holds: the first push, not the refused one
  EXPECT_EQ(Rows(ids), before);
  grpc::ClientContext ctx;
  v1::ListCheckpointsResponse list;
  ASSERT_TRUE(stub_->ListCheckpoints(&ctx, {}, &list).ok());
  EXPECT_EQ(list.checkpoints_size(), 0);
}

// A push of several tables on a durable shard is applied table by table, but checked whole
// first: a memory budget that cannot take a later table's new rows refuses the push with
// the earlier tables unchanged, in memory and on disk.
TEST_F(DurableShardTest, ABatchedPushALaterTableHasNoRoomForChangesNoTable) {
  Start(/*durable=*/true, /*memory_limit=*/40000);
  CreateSgd("wt", v1::WRITE_THROUGH);
  CreateSgd("big", v1::CHECKPOINT);
  const std::vector<int64_t> ids = {1, 2, 3};
  ASSERT_TRUE(Push(ids, 1.0f).ok());
  const auto before = Rows(ids);
  v1::BatchPushRequest req;
  auto add = [&](const std::string& table, const std::vector<int64_t>& part) {
    v1::TableGradients* t = req.add_tables();
    t->set_table(table);
    const std::vector<float> g(part.size() * 4, 1.0f);
    t->set_ids(std::string(reinterpret_cast<const char*>(part.data()), part.size() * 8));
    t->set_gradients(std::string(reinterpret_cast<const char*>(g.data()), g.size() * 4));
  };
  add("wt", ids);
  std::vector<int64_t> many(5000);
  for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<int64_t>(i) + 100;
  add("big", many);
  grpc::ClientContext ctx;
  v1::BatchPushResponse resp;
  const grpc::Status s = stub_->BatchPush(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_EQ(Rows(ids), before);
  Stop();
  Start(/*durable=*/true, /*memory_limit=*/40000);
  EXPECT_EQ(Rows(ids), before) << "the refused push reached the disk";
}

// Issue 41, item 16: a push of two write-through tables is written in one synced write,
// so a disk that fills after one more write leaves it applied whole; a full disk refuses it
// with neither table changed, in memory or on disk.
TEST_F(DurableShardTest, APushOfTwoWriteThroughTablesIsWrittenWholeOrNotAtAll) {
  Start(/*durable=*/true);
  CreateSgd("wt", v1::WRITE_THROUGH);
  CreateSgd("wt2", v1::WRITE_THROUGH);
  const std::vector<int64_t> ids = {1, 2, 3};
  const auto a0 = Rows(ids, "wt"), b0 = Rows(ids, "wt2");
  faults_.writes_left = 1;
  grpc::Status s = BatchPush({{"wt", ids}, {"wt2", ids}}, 1.0f);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const auto a1 = Rows(ids, "wt"), b1 = Rows(ids, "wt2");
  EXPECT_NE(a1, a0);
  EXPECT_NE(b1, b0);
  s = BatchPush({{"wt", ids}, {"wt2", ids}}, 1.0f);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("no row of it changed"));
  EXPECT_EQ(Rows(ids, "wt"), a1);
  EXPECT_EQ(Rows(ids, "wt2"), b1);
  faults_.writes_left = -1;
  Stop();
  Start(/*durable=*/true);
  EXPECT_EQ(Rows(ids, "wt"), a1);
  EXPECT_EQ(Rows(ids, "wt2"), b1);
}

TEST_F(DurableShardTest, APushAppliedBeforeARestartIsAnsweredNotAppliedWhenRepeated) {
  Start(/*durable=*/true);
  CreateSgd("wt", v1::WRITE_THROUGH);
  CreateSgd("ck", v1::CHECKPOINT);
  const std::vector<int64_t> ids = {1, 2, 3, 2};
  const std::vector<float> grads(ids.size() * 4, 1.0f);
  auto push = [&](uint64_t sequence) {
    v1::BatchPushRequest req;
    req.set_step(1);
    req.mutable_request_id()->set_client_id(77);
    req.mutable_request_id()->set_sequence(sequence);
    for (const char* name : {"wt", "ck"}) {
      v1::TableGradients* t = req.add_tables();
      t->set_table(name);
      t->set_ids(std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 8));
      t->set_gradients(std::string(reinterpret_cast<const char*>(grads.data()), grads.size() * 4));
    }
    grpc::ClientContext ctx;
    v1::BatchPushResponse resp;
    grpc::Status s = stub_->BatchPush(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  };
  auto rows = [&](const char* table) { return Rows(ids, table); };
  const auto wt_before = rows("wt");
  const auto ck_before = rows("ck");
  const v1::BatchPushResponse first = push(1);
  ASSERT_EQ(first.rows_updated_size(), 2);
  EXPECT_EQ(first.rows_updated(0), 3);
  const auto wt_after = rows("wt");
  const auto ck_after = rows("ck");
  ASSERT_NE(wt_after, wt_before);
  // The shard goes down having applied (and, for "wt", persisted) the push, say before its
  // answer left; the client repeats it to the restarted shard with the same id.
  Stop();
  Start(/*durable=*/true);
  EXPECT_EQ(rows("ck"), ck_before) << "a CHECKPOINT table comes back as of its checkpoint";
  const v1::BatchPushResponse repeat = push(1);
  EXPECT_EQ(repeat.rows_updated(0), first.rows_updated(0));
  EXPECT_EQ(rows("wt"), wt_after) << "the write-through part was applied twice";
  EXPECT_EQ(rows("ck"), ck_after) << "the checkpoint part, lost in the restart, applies again";
  // Known to the shard once more: a third send changes nothing; a new id does.
  push(1);
  EXPECT_EQ(rows("wt"), wt_after);
  push(2);
  EXPECT_NE(rows("wt"), wt_after);
}

// Data-parallel workers' step: applied and persisted once both workers pushed it; the
// shard goes down before its answers leave; both workers repeat their pushes to the
// restarted shard, which finds the merged step on record and applies nothing again.
TEST_F(DurableShardTest, ASyncStepAppliedBeforeARestartIsNotAppliedAgainWhenRepeated) {
  Start(/*durable=*/true);
  CreateSgd("wt", v1::WRITE_THROUGH);
  auto part = [](int worker, std::vector<int64_t> ids, uint64_t client) {
    const testing::SyncPart p{
        .job = "job#0", .worker = worker, .client = client, .sequence = 9, .step = 5};
    return testing::SyncPushRequest(p, "wt", ids, 4);
  };
  auto step = [&] {
    // (Registered again each time: a restarted shard has lost the job's group, and a
    // client registers it again when told so.)
    v1::RegisterSyncGroupRequest group;
    group.mutable_group()->set_job("job#0");
    group.mutable_group()->set_workers(2);
    grpc::ClientContext registering;
    v1::RegisterSyncGroupResponse registered;
    ASSERT_TRUE(stub_->RegisterSyncGroup(&registering, group, &registered).ok());
    grpc::Status s1;
    std::thread w1([&] {
      grpc::ClientContext ctx;
      v1::BatchPushResponse resp;
      s1 = stub_->BatchPush(&ctx, part(1, {2, 3}, 22), &resp);
    });
    grpc::ClientContext ctx;
    v1::BatchPushResponse resp;
    grpc::Status s0 = stub_->BatchPush(&ctx, part(0, {1, 2}, 11), &resp);
    w1.join();
    EXPECT_TRUE(s0.ok()) << s0.error_message();
    EXPECT_TRUE(s1.ok()) << s1.error_message();
  };
  const std::vector<int64_t> ids = {1, 2, 3};
  const auto before = Rows(ids);
  step();
  const auto after = Rows(ids);
  // SGD at 0.5 with gradients of 1: ids 1 and 3 once, id 2 from both workers.
  for (int j = 0; j < 4; ++j) {
    EXPECT_FLOAT_EQ(after[j], before[j] - 0.5f);
    EXPECT_FLOAT_EQ(after[4 + j], before[4 + j] - 1.0f);
    EXPECT_FLOAT_EQ(after[8 + j], before[8 + j] - 0.5f);
  }
  Stop();
  Start(/*durable=*/true);
  EXPECT_EQ(Rows(ids), after);
  step();  // both workers' repeats, under their first request ids
  EXPECT_EQ(Rows(ids), after) << "the step was applied twice";
}

TEST_F(DurableShardTest, APushTheDiskRefusedLeavesNoRecordAndAppliesWhenRepeated) {
  Start(/*durable=*/true);
  CreateSgd("wt", v1::WRITE_THROUGH);
  const std::vector<int64_t> ids = {1, 2};
  auto push = [&] {
    grpc::ClientContext ctx;
    v1::PushGradientsRequest req;
    req.set_table("wt");
    req.mutable_ids()->Add(ids.begin(), ids.end());
    for (size_t i = 0; i < ids.size() * 4; ++i) req.add_gradients(1.0f);
    req.mutable_request_id()->set_client_id(5);
    req.mutable_request_id()->set_sequence(9);
    v1::PushGradientsResponse resp;
    return stub_->PushGradients(&ctx, req, &resp);
  };
  const auto before = Rows(ids);
  faults_.writes = true;
  EXPECT_EQ(push().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  faults_.writes = false;
  Stop();
  Start(/*durable=*/true);
  ASSERT_TRUE(push().ok());
  const auto after = Rows(ids);
  for (size_t i = 0; i < after.size(); ++i) EXPECT_FLOAT_EQ(after[i], before[i] - 0.5f);
}

TEST_F(DurableShardTest, CheckpointsNeedADataDirectory) {
  Start(/*durable=*/false);
  grpc::ClientContext ctx;
  v1::CheckpointRequest req;
  req.set_step(1);
  v1::CheckpointResponse resp;
  grpc::Status s = stub_->Checkpoint(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("--data_dir"));
}

}  // namespace
}  // namespace tessera::server
