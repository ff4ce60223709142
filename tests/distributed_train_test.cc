// tessera-train through a real cluster (shard and coordinator processes on 127.0.0.1)
// against the same run in process.

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/shard_process.h"

namespace {

// A directory of this process's own: two suites running at once must not share files.
const std::string& ScratchDir() {
  static const std::string dir = [] {
    std::string tmpl = absl::StrCat(testing::TempDir(), "/tessera-dist-XXXXXX");
    return std::string(::mkdtemp(tmpl.data()));
  }();
  return dir;
}

using tessera::testing::ServerProcess;
using tessera::testing::DurableCluster;
using tessera::testing::ShardProcess;

// A cluster of `n` shards and a coordinator.
struct Cluster {
  explicit Cluster(int n) {
    std::string list;
    for (int k = 0; k < n; ++k) {
      shards.push_back(std::make_unique<ShardProcess>(k, n));
      if (!shards[k]->address().empty() && tessera::testing::WaitHealthy(shards[k]->address())) {
        absl::StrAppend(&list, k ? "," : "", shards[k]->address());
      }
    }
    coordinator = std::make_unique<ServerProcess>(
        TESSERA_COORDINATOR_BIN, std::vector<std::string>{absl::StrCat("--shards=", list)});
    ok = !coordinator->address().empty() && tessera::testing::WaitHealthy(coordinator->address());
  }
  bool ok = false;
  std::vector<std::unique_ptr<ShardProcess>> shards;
  std::unique_ptr<ServerProcess> coordinator;
};

int RunTrain(const std::string& args, std::string* output) {
  FILE* p = popen(absl::StrCat(TESSERA_TRAIN_BIN, " ", args, " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::vector<std::string> TrainRecords(const std::string& path) {
  // The loss trajectory: train records without their timing fields.
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);) {
    if (l.find("\"event\":\"train\"") == std::string::npos) continue;
    const size_t loss = l.find("\"loss\":");
    out.push_back(l.substr(loss, l.find(',', loss) - loss));
  }
  return out;
}

TEST(DistributedTraining, LossTrajectoryEqualsTheInProcessRunBitForBit) {
  const std::string common = "--steps=200 --log_every=10 --held_out=2000 --batch_size=128";
  const std::string local = absl::StrCat(ScratchDir(), "/local.jsonl");
  std::string out;
  ASSERT_EQ(RunTrain(absl::StrCat(common, " --metrics_out=", local), &out), 0) << out;
  const auto want = TrainRecords(local);
  ASSERT_EQ(want.size(), 20u);

  for (const std::string mode : {"smart", "coordinator"}) {
    Cluster cluster(2);
    ASSERT_TRUE(cluster.ok) << "cluster did not come up";
    const std::string remote = absl::StrCat(ScratchDir(), "/", mode, ".jsonl");
    out.clear();
    ASSERT_EQ(RunTrain(absl::StrCat(common, " --coordinator=", cluster.coordinator->address(),
                                    " --client_mode=", mode, " --metrics_out=", remote),
                       &out),
              0)
        << out;
    EXPECT_THAT(out, testing::HasSubstr("2 shards via"));
    EXPECT_EQ(TrainRecords(remote), want) << mode << " client";
  }
}

double HeldOutAuc(const std::string& out) {
  const size_t at = out.find("held-out:");
  const size_t auc = out.find("auc ", at);
  if (at == std::string::npos || auc == std::string::npos) return -1;
  return std::stod(out.substr(auc + 4));
}

TEST(DistributedTraining, PipelinedTrainingReplaysExactlyAndReachesTheSynchronousAuc) {
  const std::string common = "--steps=800 --log_every=100 --held_out=5000";
  const std::string local = absl::StrCat(ScratchDir(), "/k1-local.jsonl");
  std::string in_process;
  ASSERT_EQ(RunTrain(absl::StrCat(common, " --max_staleness=1 --metrics_out=", local), &in_process),
            0)
      << in_process;
  Cluster cluster(2);
  ASSERT_TRUE(cluster.ok) << "cluster did not come up";
  const std::string remote = absl::StrCat(ScratchDir(), "/k1-smart.jsonl");
  std::string pipelined;
  ASSERT_EQ(RunTrain(absl::StrCat(common, " --max_staleness=1 --coordinator=",
                                  cluster.coordinator->address(), " --metrics_out=", remote),
                     &pipelined),
            0)
      << pipelined;
  // One sparse thread sends lookups and pushes in a fixed order: the same run either way.
  EXPECT_EQ(TrainRecords(remote), TrainRecords(local));
  Cluster fresh(2);
  ASSERT_TRUE(fresh.ok) << "cluster did not come up";
  std::string sync;
  ASSERT_EQ(RunTrain(absl::StrCat(common, " --coordinator=", fresh.coordinator->address()), &sync),
            0)
      << sync;
  const double auc_sync = HeldOutAuc(sync), auc_k1 = HeldOutAuc(pipelined);
  ASSERT_GT(auc_sync, 0.5) << sync;
  EXPECT_NEAR(auc_k1, auc_sync, 0.005) << pipelined;
}

// A distributed run checkpointed at step 100; every server is then killed and started
// again on its data directory; the resumed run (dense state from the coordinator's
// checkpoint, rows from the shards') ends exactly as the uninterrupted in-process run.
TEST(DistributedTraining, ResumesAfterTheWholeClusterRestarts) {
  const std::string common = "--log_every=10 --held_out=2000 --batch_size=128";
  const std::string local = absl::StrCat(ScratchDir(), "/local-200.jsonl");
  std::string out;
  ASSERT_EQ(RunTrain(absl::StrCat(common, " --steps=200 --metrics_out=", local), &out), 0) << out;
  const auto want = TrainRecords(local);
  ASSERT_EQ(want.size(), 20u);

  const std::string root = absl::StrCat(ScratchDir(), "/durable-cluster");
  std::filesystem::remove_all(root);
  DurableCluster cluster(2, root);
  ASSERT_TRUE(cluster.Start());
  const std::string first = absl::StrCat(ScratchDir(), "/first-100.jsonl");
  out.clear();
  ASSERT_EQ(RunTrain(absl::StrCat(common, " --steps=100 --checkpoint_every=100 --coordinator=",
                                  cluster.coordinator->address(), " --metrics_out=", first),
                     &out),
            0)
      << out;
  EXPECT_THAT(out, testing::HasSubstr("checkpoint 100:"));
  cluster.KillAll();
  ASSERT_TRUE(cluster.Start()) << "the cluster did not come back on its data directories";

  const std::string resumed = absl::StrCat(ScratchDir(), "/resumed-200.jsonl");
  out.clear();
  ASSERT_EQ(RunTrain(absl::StrCat(common, " --steps=200 --resume --coordinator=",
                                  cluster.coordinator->address(), " --metrics_out=", resumed),
                     &out),
            0)
      << out;
  EXPECT_THAT(out, testing::HasSubstr("resume: restored checkpoint 100"));
  EXPECT_EQ(TrainRecords(first), std::vector<std::string>(want.begin(), want.begin() + 10));
  EXPECT_EQ(TrainRecords(resumed), std::vector<std::string>(want.begin() + 10, want.end()));
  cluster.KillAll();
  std::filesystem::remove_all(root);
}

TEST(DistributedTraining, ADeadClusterIsAClearError) {
  Cluster cluster(1);
  ASSERT_TRUE(cluster.ok);
  cluster.shards[0]->Kill();
  std::string out;
  EXPECT_EQ(
      RunTrain(absl::StrCat("--steps=5 --coordinator=", cluster.coordinator->address()), &out), 1);
  EXPECT_THAT(out, testing::HasSubstr("UNAVAILABLE"));
  EXPECT_THAT(out, testing::HasSubstr("shard 0"));
}

}  // namespace
