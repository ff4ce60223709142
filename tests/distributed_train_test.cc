// tessera-train through a real cluster (shard and coordinator processes on 127.0.0.1)
// against the same run in process.

#include <cstdio>
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

using tessera::testing::ServerProcess;
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
  const std::string local = absl::StrCat(testing::TempDir(), "/local.jsonl");
  std::string out;
  ASSERT_EQ(RunTrain(absl::StrCat(common, " --metrics_out=", local), &out), 0) << out;
  const auto want = TrainRecords(local);
  ASSERT_EQ(want.size(), 20u);

  for (const std::string mode : {"smart", "coordinator"}) {
    Cluster cluster(2);
    ASSERT_TRUE(cluster.ok) << "cluster did not come up";
    const std::string remote = absl::StrCat(testing::TempDir(), "/", mode, ".jsonl");
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
