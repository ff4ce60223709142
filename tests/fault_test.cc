// Fault tolerance over real processes on 127.0.0.1: shards killed with SIGKILL under load
// and restarted on their data directories, cluster checkpoints and restores, a
// coordinator restart, and servers refusing data directories they cannot use.

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/embedding_client.h"
#include "embedding/embedding_table.h"
#include "embedding/sharding.h"
#include "gtest/gtest.h"
#include "tessera/v1/embedding_service.grpc.pb.h"
#include "tests/shard_process.h"
#include "tests/support/random_pushes.h"
#include "tests/support/table_configs.h"
#include "tests/support/temp_dir.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using base::ServerProcess;
using client::WaitHealthy;

std::string TempDir() {
  std::string dir = testing::MakeTempDir("tessera-fault");
  EXPECT_FALSE(dir.empty());
  return dir;
}

// A shard server on a data directory that can be killed and restarted on the same port.
class DurableShard {
 public:
  DurableShard(int index, int shards, std::string data_dir, uint64_t map_version = 1)
      : index_(index), shards_(shards), data_dir_(std::move(data_dir)), version_(map_version) {}

  bool Start() {
    std::vector<std::string> args = {absl::StrCat("--shard_index=", index_),
                                     absl::StrCat("--num_shards=", shards_),
                                     absl::StrCat("--data_dir=", data_dir_),
                                     absl::StrCat("--shard_map_version=", version_)};
    if (!address_.empty()) args.push_back("--port=" + address_.substr(address_.rfind(':') + 1));
    process_ = std::make_unique<base::ServerProcess>(TESSERA_SHARD_BIN, args);
    if (process_->address().empty()) return false;
    address_ = process_->address();
    return client::WaitHealthy(address_);
  }
  void Kill() { process_->Kill(); }
  const std::string& address() const { return address_; }

 private:
  const int index_, shards_;
  const std::string data_dir_;
  const uint64_t version_;
  std::string address_;
  std::unique_ptr<base::ServerProcess> process_;
};

std::unique_ptr<v1::EmbeddingShard::Stub> ShardStub(const std::string& address) {
  return v1::EmbeddingShard::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

std::unique_ptr<grpc::ClientContext> Context(int ms = 3000) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
  return ctx;
}

v1::TableConfig Table(const std::string& name, v1::Durability durability) {
  return testing::TestTable(name, 8, 3, v1::ADAGRAD, 0.1f, durability);
}

// The weights the shard at `address` serves for `ids` (read-only: nothing is created).
std::vector<float> ShardRows(const std::string& address, const std::string& table,
                             const std::vector<int64_t>& ids) {
  auto stub = ShardStub(address);
  v1::LookupRequest req;
  req.set_table(table);
  req.set_read_only(true);
  for (int64_t id : ids) req.add_ids(id);
  v1::LookupResponse resp;
  auto ctx = Context();
  grpc::Status s = stub->Lookup(ctx.get(), req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return std::vector<float>(resp.values().begin(), resp.values().end());
}

std::vector<float> ReferenceRows(embedding::EmbeddingTable& t, const std::vector<int64_t>& ids) {
  std::vector<float> out(ids.size() * t.dim());
  EXPECT_TRUE(t.Lookup(ids, out.data(), /*insert_missing=*/false).ok());
  return out;
}

struct Push {
  std::vector<int64_t> ids;
  std::vector<float> grads;
  int64_t step = 0;
};

// What `reference` would hold after `p`, for p's ids, without changing `reference`.
std::vector<float> RowsAfter(const embedding::EmbeddingTable& reference, const Push& p) {
  auto scratch = embedding::EmbeddingTable::Create(reference.config()).value();
  for (int64_t id : p.ids) {
    auto row = reference.ReadRow(id);
    if (row.ok()) (void)scratch->PutRow(id, row->weights, row->state, row->meta);
  }
  EXPECT_TRUE(scratch->PushGradients(p.ids, p.grads.data(), p.step).ok());
  return ReferenceRows(*scratch, p.ids);
}

int KillCycles() {
  const char* env = std::getenv("TESSERA_KILL_CYCLES");
  return env != nullptr ? std::max(1, std::atoi(env)) : 20;
}

// A random shard is SIGKILLed while a pusher streams write-through pushes at it, then
// restarted on its data directory. Every acknowledged push must be there, row by row,
// bit for bit, against a replay of the acknowledged pushes in this process. The one push
// in flight at the kill is either wholly applied or not at all.
TEST(FaultTest, KilledShardsLoseNoAcknowledgedWriteThroughUpdate) {
  constexpr int kShards = 2;
  const std::string root = TempDir();
  const v1::TableConfig config = Table("wt", v1::WRITE_THROUGH);
  std::vector<std::unique_ptr<DurableShard>> shards;
  std::vector<std::unique_ptr<embedding::EmbeddingTable>> reference;
  std::vector<std::vector<int64_t>> owned(kShards);
  for (int64_t id = 0; id < 600; ++id) {
    owned[embedding::ShardOf(id, config.seed(), kShards)].push_back(id);
  }
  for (int k = 0; k < kShards; ++k) {
    shards.push_back(std::make_unique<DurableShard>(k, kShards, absl::StrCat(root, "/shard-", k)));
    ASSERT_TRUE(shards[k]->Start());
    v1::CreateTableRequest req;
    *req.mutable_config() = config;
    v1::CreateTableResponse resp;
    auto ctx = Context();
    ASSERT_TRUE(ShardStub(shards[k]->address())->CreateTable(ctx.get(), req, &resp).ok());
    reference.push_back(embedding::EmbeddingTable::Create(config).value());
  }

  std::mt19937_64 rng(2024);
  int64_t step = 0, acknowledged = 0, in_flight_applied = 0, in_flight_dropped = 0;
  const int cycles = KillCycles();
  for (int cycle = 0; cycle < cycles; ++cycle) {
    const int k = static_cast<int>(rng() % kShards);
    std::atomic<bool> stop{false};
    std::optional<Push> unacknowledged;
    const uint64_t push_seed = rng();
    std::thread pusher([&] {
      std::mt19937_64 prng(push_seed);
      std::normal_distribution<float> g(0.0f, 1.0f);
      auto stub = ShardStub(shards[k]->address());
      for (int i = 0; i < 500 && !stop.load(); ++i) {
        Push p;
        p.step = step++;
        for (int j = 0; j < 32; ++j) p.ids.push_back(owned[k][prng() % owned[k].size()]);
        for (size_t j = 0; j < p.ids.size() * 8; ++j) p.grads.push_back(g(prng));
        v1::PushGradientsRequest req;
        req.set_table("wt");
        req.set_step(p.step);
        req.mutable_ids()->Add(p.ids.begin(), p.ids.end());
        req.mutable_gradients()->Add(p.grads.begin(), p.grads.end());
        v1::PushGradientsResponse resp;
        auto ctx = Context();
        if (stub->PushGradients(ctx.get(), req, &resp).ok()) {
          ASSERT_TRUE(reference[k]->PushGradients(p.ids, p.grads.data(), p.step).ok());
          ++acknowledged;
        } else {
          unacknowledged = std::move(p);
          return;
        }
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(5 + rng() % 40));
    shards[k]->Kill();
    stop = true;
    pusher.join();
    ASSERT_TRUE(shards[k]->Start()) << "cycle " << cycle << ": shard " << k << " did not restart";
    if (unacknowledged.has_value()) {
      // Applied and synced just before the kill, or not at all; nothing in between.
      const auto rows = ShardRows(shards[k]->address(), "wt", unacknowledged->ids);
      if (rows == RowsAfter(*reference[k], *unacknowledged)) {
        ASSERT_TRUE(reference[k]
                        ->PushGradients(unacknowledged->ids, unacknowledged->grads.data(),
                                        unacknowledged->step)
                        .ok());
        ++in_flight_applied;
      } else {
        ASSERT_EQ(rows, ReferenceRows(*reference[k], unacknowledged->ids))
            << "cycle " << cycle << ": the push in flight at the kill was half applied";
        ++in_flight_dropped;
      }
    }
    for (int s = 0; s < kShards; ++s) {
      const auto served = ShardRows(shards[s]->address(), "wt", owned[s]);
      const auto expected = ReferenceRows(*reference[s], owned[s]);
      ASSERT_EQ(served.size(), expected.size());
      int64_t differing = 0;
      for (size_t i = 0; i < served.size(); ++i) differing += served[i] != expected[i];
      ASSERT_EQ(differing, 0) << "cycle " << cycle << ": shard " << s << " lost or corrupted "
                              << differing << " values";
    }
  }
  std::printf(
      "kill cycles: %d, acknowledged pushes: %lld, lost: 0, in flight at a kill: %lld "
      "applied, %lld not\n",
      cycles, static_cast<long long>(acknowledged), static_cast<long long>(in_flight_applied),
      static_cast<long long>(in_flight_dropped));
  EXPECT_GT(acknowledged, cycles);  // the kills really landed under load
  shards.clear();
  fs::remove_all(root);
}

std::vector<float> ClientRows(client::EmbeddingClient& c, const std::string& table,
                              const std::vector<int64_t>& ids) {
  std::vector<float> out(ids.size() * 8);
  embedding::LookupOptions o;
  o.insert_missing = false;
  absl::Status s = c.Lookup(table, ids, absl::MakeSpan(out), o);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// Polls (bounded: 10 s) the coordinator's shard map until shard `k`'s serving flag is `want`.
bool ShardServing(const std::string& coordinator, int k, bool want) {
  auto stub = v1::Coordinator::NewStub(
      grpc::CreateChannel(coordinator, grpc::InsecureChannelCredentials()));
  for (int i = 0; i < 100; ++i) {
    v1::ShardMap map;
    auto ctx = Context();
    if (stub->GetShardMap(ctx.get(), {}, &map).ok() && map.shards_size() > k &&
        map.shards(k).serving() == want) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

void PushSteps(client::EmbeddingClient& c, const std::string& table, int from, int to) {
  testing::RandomPushes pushes(from, 64, 300, 8);
  std::vector<int64_t> ids;
  std::vector<float> grads;
  for (int step = from; step < to; ++step) {
    pushes.Next(&ids, &grads);
    ASSERT_TRUE(c.PushGradients(table, ids, grads, step).ok());
  }
}

// Checkpoint through the coordinator, a shard killed and restarted (it comes back as of
// the checkpoint), a cluster restore, and a coordinator restart that a running client
// rides out.
TEST(FaultTest, ClusterCheckpointRestoreAndRestarts) {
  const std::string root = TempDir();
  std::vector<std::unique_ptr<DurableShard>> shards;
  std::string addresses;
  for (int k = 0; k < 2; ++k) {
    shards.push_back(std::make_unique<DurableShard>(k, 2, absl::StrCat(root, "/shard-", k)));
    ASSERT_TRUE(shards[k]->Start());
    addresses += (k ? "," : "") + shards[k]->address();
  }
  const std::vector<std::string> coordinator_args = {"--shards=" + addresses,
                                                     "--data_dir=" + root + "/coordinator"};
  auto coordinator =
      std::make_unique<base::ServerProcess>(TESSERA_COORDINATOR_BIN, coordinator_args);
  const std::string coordinator_address = coordinator->address();
  ASSERT_TRUE(client::WaitHealthy(coordinator_address));

  client::ClientOptions smart;
  smart.mode = client::ClientOptions::Mode::kSmart;
  auto c = client::EmbeddingClient::Connect(coordinator_address, smart).value();
  ASSERT_TRUE(c->CreateTable(Table("ck", v1::CHECKPOINT)).ok());
  std::vector<int64_t> ids(300);
  for (int i = 0; i < 300; ++i) ids[i] = i;
  PushSteps(*c, "ck", 0, 5);
  auto taken = c->Checkpoint(5, {{"dense", "dense-state-at-5"}});
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->step, 5);
  EXPECT_GT(taken->bytes, 0);
  const auto at5 = ClientRows(*c, "ck", ids);
  PushSteps(*c, "ck", 5, 10);
  const auto at10 = ClientRows(*c, "ck", ids);
  ASSERT_NE(at5, at10);

  // Shard 0 dies: the coordinator's health checks notice, calls that need it fail with
  // UNAVAILABLE naming it, shard 1 serves on.
  shards[0]->Kill();
  EXPECT_TRUE(ShardServing(coordinator_address, 0, false)) << "shard 0 never reported down";
  client::ClientOptions no_retries = smart;
  no_retries.retry.max_retries = 0;
  auto impatient = client::EmbeddingClient::Connect(coordinator_address, no_retries).value();
  std::vector<float> out(ids.size() * 8);
  absl::Status down = impatient->Lookup("ck", ids, absl::MakeSpan(out), {});
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable) << down;
  EXPECT_NE(down.message().find("shard 0"), std::string::npos) << down;
  client::ClientOptions routed;
  routed.retry.max_retries = 0;
  auto via = client::EmbeddingClient::Connect(coordinator_address, routed).value();
  down = via->Lookup("ck", ids, absl::MakeSpan(out), {});
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable) << down;
  EXPECT_NE(down.message().find("shard 0"), std::string::npos) << down;
  EXPECT_NE(down.message().find("health checks"), std::string::npos) << down;
  // A patient client's call made while shard 0 is down succeeds once it is back: its
  // retries ride out the restart.
  bool restarted = false;
  std::thread bring_back([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    restarted = shards[0]->Start();
  });
  client::ClientOptions patient;  // coordinator mode, default retries
  auto waiting = client::EmbeddingClient::Connect(coordinator_address, patient).value();
  absl::Status rode_out = waiting->Lookup("ck", ids, absl::MakeSpan(out), {});
  bring_back.join();
  ASSERT_TRUE(restarted);
  EXPECT_TRUE(rode_out.ok()) << rode_out;
  EXPECT_TRUE(ShardServing(coordinator_address, 0, true)) << "shard 0 never re-admitted";
  // Checkpoint tables come back as of the newest checkpoint on the restarted shard only.
  const auto mixed = ClientRows(*c, "ck", ids);
  for (size_t i = 0; i < ids.size(); ++i) {
    const bool on_zero = embedding::ShardOf(ids[i], 3, 2) == 0;
    for (int j = 0; j < 8; ++j) {
      ASSERT_EQ(mixed[i * 8 + j], (on_zero ? at5 : at10)[i * 8 + j]) << "id " << ids[i];
    }
  }

  embedding::Attachments attachments;
  embedding::RestoreOptions whole_cluster;
  whole_cluster.all_models = true;
  auto restored = c->Restore(-1, &attachments, whole_cluster);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->step, 5);
  EXPECT_EQ(attachments["dense"], "dense-state-at-5");
  EXPECT_EQ(ClientRows(*c, "ck", ids), at5);

  // The coordinator restarts on its port and data directory; the running client retries
  // through the gap and finds its tables and checkpoints again.
  coordinator->Kill();
  std::thread restart([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::vector<std::string> args = coordinator_args;
    args.push_back("--port=" + coordinator_address.substr(coordinator_address.rfind(':') + 1));
    coordinator = std::make_unique<base::ServerProcess>(TESSERA_COORDINATOR_BIN, args);
  });
  auto tables = c->ListTables();
  restart.join();
  ASSERT_EQ(coordinator->address(), coordinator_address) << "the coordinator did not restart";
  ASSERT_TRUE(tables.ok()) << tables.status();
  ASSERT_EQ(tables->size(), 1u);
  EXPECT_EQ((*tables)[0].name(), "ck");
  auto list = c->ListCheckpoints();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].step, 5);
  PushSteps(*c, "ck", 10, 12);  // and training goes on
  EXPECT_TRUE(c->CreateTable(Table("ck", v1::CHECKPOINT)).ok());  // the same: idempotent
  EXPECT_EQ(c->CreateTable(Table("ck", v1::WRITE_THROUGH)).code(),
            absl::StatusCode::kAlreadyExists);

  coordinator.reset();
  shards.clear();
  fs::remove_all(root);
}

TEST(FaultTest, ServersRefuseDataDirectoriesTheyCannotUse) {
  const std::string root = TempDir();
  const std::string file = root + "/a-file";
  { std::ofstream(file) << "not a directory"; }
  base::ServerProcess on_file(TESSERA_SHARD_BIN,
                              {"--shard_index=0", "--num_shards=1", "--data_dir=" + file});
  EXPECT_TRUE(on_file.address().empty());  // exited before listening
  base::ServerProcess coordinator_on_file(TESSERA_COORDINATOR_BIN,
                                          {"--shards=127.0.0.1:1", "--data_dir=" + file});
  EXPECT_TRUE(coordinator_on_file.address().empty());

  // Shard 0's directory given to shard 1: its rows would be the wrong ones.
  {
    DurableShard zero(0, 2, root + "/shard");
    ASSERT_TRUE(zero.Start());
  }
  base::ServerProcess misplaced(
      TESSERA_SHARD_BIN, {"--shard_index=1", "--num_shards=2", "--data_dir=" + root + "/shard"});
  EXPECT_TRUE(misplaced.address().empty());
  // The directory records the map version it serves: a shard started on it with an older
  // one is refused, a newer one is recorded.
  {
    base::ServerProcess newer(TESSERA_SHARD_BIN,
                              {"--shard_index=0", "--num_shards=2", "--shard_map_version=3",
                               "--data_dir=" + root + "/shard"});
    EXPECT_FALSE(newer.address().empty());
  }
  std::ifstream shard_file(root + "/shard/SHARD");
  std::string recorded((std::istreambuf_iterator<char>(shard_file)),
                       std::istreambuf_iterator<char>());
  EXPECT_EQ(recorded, "shard 0 of 2\nmap version 3\n");
  base::ServerProcess stale(TESSERA_SHARD_BIN,
                            {"--shard_index=0", "--num_shards=2", "--shard_map_version=2",
                             "--data_dir=" + root + "/shard"});
  EXPECT_TRUE(stale.address().empty());
  fs::remove_all(root);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A cluster resharded from 2 to 3 durable shards: each data directory records its new
// place, shards and coordinator restarted on the old map are refused (naming the new one),
// restarted on the new map they serve the same rows; back to 2, the shard that left says so.
TEST(FaultTest, AReshardedClusterRestartsOnItsNewMap) {
  const std::string root = TempDir();
  std::vector<std::unique_ptr<DurableShard>> shards;
  for (int k = 0; k < 2; ++k) {
    shards.push_back(std::make_unique<DurableShard>(k, 2, absl::StrCat(root, "/s", k)));
    ASSERT_TRUE(shards[k]->Start());
  }
  auto third = std::make_unique<DurableShard>(2, 3, root + "/s2", 2);
  ASSERT_TRUE(third->Start());
  const std::string two = shards[0]->address() + "," + shards[1]->address();
  const std::string three = two + "," + third->address();
  auto coordinator = std::make_unique<base::ServerProcess>(
      TESSERA_COORDINATOR_BIN,
      std::vector<std::string>{"--shards=" + two, "--data_dir=" + root + "/coordinator"});
  ASSERT_TRUE(client::WaitHealthy(coordinator->address()));
  const std::string port = coordinator->address().substr(coordinator->address().rfind(':') + 1);
  client::ClientOptions o;
  o.mode = client::ClientOptions::Mode::kSmart;
  auto c = client::EmbeddingClient::Connect(coordinator->address(), o).value();
  ASSERT_TRUE(c->CreateTable(Table("w", v1::WRITE_THROUGH)).ok());
  ASSERT_TRUE(c->CreateTable(Table("k", v1::CHECKPOINT)).ok());
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 3000; ++i) ids.push_back(i * 7919 + 1);
  const std::vector<float> g(ids.size() * 8, 0.25f);
  for (const char* t : {"w", "k"}) ASSERT_TRUE(c->PushGradients(t, ids, g, 1).ok());
  std::map<std::string, std::vector<float>> before;
  for (const char* t : {"w", "k"}) {
    before[t].resize(ids.size() * 8);
    ASSERT_TRUE(c->Lookup(t, ids, absl::MakeSpan(before[t]), {}).ok());
  }
  // A whole-cluster checkpoint of the 2-shard map, restored at the end on 3 shards.
  ASSERT_TRUE(c->Checkpoint(1, {}).ok());

  auto reshard = [&](const std::string& list) {
    auto stub = v1::Coordinator::NewStub(
        grpc::CreateChannel(coordinator->address(), grpc::InsecureChannelCredentials()));
    v1::ReshardClusterRequest request;
    for (absl::string_view a : absl::StrSplit(list, ',')) request.add_shards(std::string(a));
    v1::ReshardClusterResponse response;
    return stub->Reshard(Context(60000).get(), request, &response);
  };
  grpc::Status s = reshard(three);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(ReadAll(root + "/s0/SHARD"), "shard 0 of 3\nmap version 2\n");
  EXPECT_EQ(ReadAll(root + "/s1/SHARD"), "shard 1 of 3\nmap version 2\n");

  // Every server killed; started on the old map, each is refused.
  coordinator.reset();
  for (auto& shard : shards) shard->Kill();
  third->Kill();
  base::ServerProcess old_shard(
      TESSERA_SHARD_BIN, {"--shard_index=0", "--num_shards=2", "--data_dir=" + root + "/s0"});
  EXPECT_TRUE(old_shard.address().empty());
  base::ServerProcess old_coordinator(TESSERA_COORDINATOR_BIN,
                                      {"--shards=" + two, "--data_dir=" + root + "/coordinator"});
  EXPECT_TRUE(old_coordinator.address().empty());
  // On the new map they serve the rows as they were (both durabilities: the reshard
  // wrote every row a shard holds).
  // On the ports the map names.
  std::vector<std::unique_ptr<base::ServerProcess>> restarted;
  const std::vector<std::string> addresses = absl::StrSplit(three, ',');
  for (int k = 0; k < 3; ++k) {
    restarted.push_back(std::make_unique<base::ServerProcess>(
        TESSERA_SHARD_BIN, std::vector<std::string>{
                               absl::StrCat("--shard_index=", k), "--num_shards=3",
                               "--shard_map_version=2", absl::StrCat("--data_dir=", root, "/s", k),
                               "--port=" + addresses[k].substr(addresses[k].rfind(':') + 1)}));
    ASSERT_TRUE(client::WaitHealthy(restarted[k]->address()));
  }
  coordinator = std::make_unique<base::ServerProcess>(
      TESSERA_COORDINATOR_BIN,
      std::vector<std::string>{"--shards=" + three, "--shard_map_version=2",
                               "--data_dir=" + root + "/coordinator", "--port=" + port});
  ASSERT_TRUE(client::WaitHealthy(coordinator->address()));
  c = client::EmbeddingClient::Connect(coordinator->address(), o).value();
  for (const char* t : {"w", "k"}) {
    std::vector<float> after(ids.size() * 8);
    ASSERT_TRUE(c->Lookup(t, ids, absl::MakeSpan(after), {}).ok());
    EXPECT_EQ(after, before[t]) << "table " << t;
  }
  // Trained on, then back to the checkpoint taken before the reshard.
  for (const char* t : {"w", "k"}) ASSERT_TRUE(c->PushGradients(t, ids, g, 2).ok());
  embedding::RestoreOptions all;
  all.all_models = true;
  const absl::StatusOr<embedding::CheckpointInfo> restored = c->Restore(1, nullptr, all);
  ASSERT_TRUE(restored.ok()) << restored.status();
  for (const char* t : {"w", "k"}) {
    std::vector<float> after(ids.size() * 8);
    ASSERT_TRUE(c->Lookup(t, ids, absl::MakeSpan(after), {}).ok());
    EXPECT_EQ(after, before[t]) << "table " << t << " after the restore";
  }
  s = reshard(two);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(ReadAll(root + "/s2/SHARD"), "shard -1 of 2\nmap version 3\n");
  coordinator.reset();
  restarted.clear();
  fs::remove_all(root);
}

}  // namespace
}  // namespace tessera
