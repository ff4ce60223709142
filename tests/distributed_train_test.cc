// tessera-train through a real cluster (shard and coordinator processes on 127.0.0.1)
// against the same run in process.

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/train_process.h"

namespace {

using tessera::base::ServerProcess;
using tessera::client::WaitHealthy;
using tessera::testing::Cluster;
using tessera::testing::DurableCluster;
using tessera::testing::HeldOutAuc;
using tessera::testing::RunCommand;
using tessera::testing::RunTrain;
using tessera::testing::ScratchDir;
using tessera::testing::ShardProcess;
using tessera::testing::TrainRecords;

// The flags of the runs that the in-process run of 200 steps is the reference of.
constexpr char kCommon[] = "--log_every=10 --held_out=2000 --batch_size=128";

// Runs tessera-train with `args` to its end, which must be exit 0; its output in *out.
void Train(const std::string& args, std::string* out) {
  out->clear();
  ASSERT_EQ(RunTrain(args, out), 0) << "tessera-train " << args << "\n" << *out;
}

// The train records of the in-process run of kCommon for 200 steps: what every cluster run
// of those flags must write, bit for bit. Run once, for every test that compares with it.
const std::vector<std::string>& InProcessRun() {
  static const std::vector<std::string> records = [] {
    const std::string local = absl::StrCat(ScratchDir(), "/local-200.jsonl");
    std::string out;
    if (RunTrain(absl::StrCat(kCommon, " --steps=200 --metrics_out=", local), &out) != 0) {
      ADD_FAILURE() << out;
    }
    return TrainRecords(local);
  }();
  return records;
}

TEST(DistributedTraining, LossTrajectoryEqualsTheInProcessRunBitForBit) {
  const std::vector<std::string>& want = InProcessRun();
  ASSERT_EQ(want.size(), 20u);
  for (const std::string mode : {"smart", "coordinator"}) {
    Cluster cluster(2);
    ASSERT_TRUE(cluster.ok) << "cluster did not come up";
    const std::string remote = absl::StrCat(ScratchDir(), "/", mode, ".jsonl");
    std::string out;
    // One data-parallel worker is the run without any.
    ASSERT_NO_FATAL_FAILURE(
        Train(absl::StrCat(kCommon, " --steps=200 --coordinator=", cluster.coordinator->address(),
                           " --client_mode=", mode, " --num_workers=1", " --metrics_out=", remote),
              &out));
    EXPECT_THAT(out, testing::HasSubstr("2 shards via"));
    EXPECT_EQ(TrainRecords(remote), want) << mode << " client";
  }
}

// --vocabulary=hashed: fixed-vocabulary tables, shard k of 3 holding the ids k mod 3, train
// the same losses as one in-process shard, bit for bit.
TEST(DistributedTraining, FixedVocabularyTablesTrainTheSameThroughACluster) {
  const std::string common =
      "--steps=150 --log_every=10 --held_out=2000 --batch_size=128 --vocabulary=hashed";
  const std::string local = absl::StrCat(ScratchDir(), "/hashed_local.jsonl");
  std::string out;
  ASSERT_NO_FATAL_FAILURE(
      Train(absl::StrCat(common, " --shards=inproc:1 --metrics_out=", local), &out));
  EXPECT_THAT(out, testing::HasSubstr("vocabulary: hashed"));
  const auto want = TrainRecords(local);
  ASSERT_EQ(want.size(), 15u);
  Cluster cluster(3);
  ASSERT_TRUE(cluster.ok) << "cluster did not come up";
  const std::string remote = absl::StrCat(ScratchDir(), "/hashed_remote.jsonl");
  ASSERT_NO_FATAL_FAILURE(
      Train(absl::StrCat(common, " --coordinator=", cluster.coordinator->address(),
                         " --metrics_out=", remote),
            &out));
  EXPECT_EQ(TrainRecords(remote), want);
}

// A batch's tables run on --sparse_threads threads in the trainer and on each shard, a
// table to a thread: the run is the same whatever the counts, in process and through a
// cluster.
TEST(DistributedTraining, ResultsDoNotDependOnSparseThreads) {
  // Batches of 26 x 256 ids: each of 2 shards gets enough to run its tables on its pool.
  const std::string common = "--steps=100 --log_every=10 --held_out=2000 --batch_size=256";
  const std::string local = absl::StrCat(ScratchDir(), "/threads-local.jsonl");
  std::string out;
  ASSERT_NO_FATAL_FAILURE(
      Train(absl::StrCat(common, " --sparse_threads=1 --metrics_out=", local), &out));
  const auto want = TrainRecords(local);
  ASSERT_EQ(want.size(), 10u);
  for (const int threads : {2, 7}) {
    const std::string in_process = absl::StrCat(ScratchDir(), "/threads-", threads, ".jsonl");
    ASSERT_NO_FATAL_FAILURE(Train(
        absl::StrCat(common, " --sparse_threads=", threads, " --metrics_out=", in_process), &out));
    EXPECT_EQ(TrainRecords(in_process), want) << threads << " threads in process";
  }
  for (const int threads : {1, 2, 7}) {
    Cluster cluster(2, {absl::StrCat("--sparse_threads=", threads)});
    ASSERT_TRUE(cluster.ok) << "cluster did not come up";
    const std::string remote = absl::StrCat(ScratchDir(), "/threads-cluster-", threads, ".jsonl");
    ASSERT_NO_FATAL_FAILURE(Train(
        absl::StrCat(common, " --sparse_threads=", threads,
                     " --coordinator=", cluster.coordinator->address(), " --metrics_out=", remote),
        &out));
    EXPECT_EQ(TrainRecords(remote), want) << threads << " threads through a cluster";
  }
}

TEST(DistributedTraining, PipelinedTrainingReplaysExactlyAndReachesTheSynchronousAuc) {
  const std::string common = "--steps=800 --log_every=100 --held_out=5000";
  const std::string local = absl::StrCat(ScratchDir(), "/k1-local.jsonl");
  std::string in_process;
  ASSERT_NO_FATAL_FAILURE(
      Train(absl::StrCat(common, " --max_staleness=1 --metrics_out=", local), &in_process));
  Cluster cluster(2);
  ASSERT_TRUE(cluster.ok) << "cluster did not come up";
  const std::string remote = absl::StrCat(ScratchDir(), "/k1-smart.jsonl");
  std::string pipelined;
  ASSERT_NO_FATAL_FAILURE(Train(
      absl::StrCat(common, " --max_staleness=1 --coordinator=", cluster.coordinator->address(),
                   " --metrics_out=", remote),
      &pipelined));
  // One sparse thread sends lookups and pushes in a fixed order: the same run either way.
  EXPECT_EQ(TrainRecords(remote), TrainRecords(local));
  Cluster fresh(2);
  ASSERT_TRUE(fresh.ok) << "cluster did not come up";
  std::string sync;
  ASSERT_NO_FATAL_FAILURE(
      Train(absl::StrCat(common, " --coordinator=", fresh.coordinator->address()), &sync));
  const double auc_sync = HeldOutAuc(sync), auc_k1 = HeldOutAuc(pipelined);
  ASSERT_GT(auc_sync, 0.5) << sync;
  EXPECT_NEAR(auc_k1, auc_sync, 0.005) << pipelined;
}

// A run of 200 steps through `coordinator` with --resume: it restores the checkpoint of
// step 100 and writes the in-process run's records from there, bit for bit.
void ExpectResumedAsTheInProcessRun(const ServerProcess& coordinator) {
  const std::vector<std::string>& want = InProcessRun();
  ASSERT_EQ(want.size(), 20u);
  const std::string resumed = absl::StrCat(ScratchDir(), "/resumed-", coordinator.pid(), ".jsonl");
  std::string out;
  ASSERT_NO_FATAL_FAILURE(Train(absl::StrCat(kCommon, " --steps=200 --resume --coordinator=",
                                             coordinator.address(), " --metrics_out=", resumed),
                                &out));
  EXPECT_THAT(out, testing::HasSubstr("resume: restored checkpoint 100"));
  EXPECT_EQ(TrainRecords(resumed), std::vector<std::string>(want.begin() + 10, want.end()));
}

// A distributed run checkpointed at step 100; every server is then killed and started
// again on its data directory; the resumed run (dense state from the coordinator's
// checkpoint, rows from the shards') ends exactly as the uninterrupted in-process run.
TEST(DistributedTraining, ResumesAfterTheWholeClusterRestarts) {
  const std::vector<std::string>& want = InProcessRun();
  ASSERT_EQ(want.size(), 20u);
  const std::string root = absl::StrCat(ScratchDir(), "/durable-cluster");
  std::filesystem::remove_all(root);
  DurableCluster cluster(2, root);
  ASSERT_TRUE(cluster.Start());
  const std::string first = absl::StrCat(ScratchDir(), "/first-100.jsonl");
  std::string out;
  ASSERT_NO_FATAL_FAILURE(Train(
      absl::StrCat(kCommon, " --steps=100 --checkpoint_every=100",
                   " --coordinator=", cluster.coordinator->address(), " --metrics_out=", first),
      &out));
  EXPECT_THAT(out, testing::HasSubstr("checkpoint 100:"));
  cluster.KillAll();
  ASSERT_TRUE(cluster.Start()) << "the cluster did not come back on its data directories";
  ASSERT_NO_FATAL_FAILURE(ExpectResumedAsTheInProcessRun(*cluster.coordinator));
  EXPECT_EQ(TrainRecords(first), std::vector<std::string>(want.begin(), want.begin() + 10));
  cluster.KillAll();
  std::filesystem::remove_all(root);
}

// A checkpoint taken on 3 shards (new processes, data directories of their own) resumes on
// 2: each new shard reads the 3 old shards' checkpoint directories and keeps the rows it
// owns; the run goes on exactly as one that never stopped.
TEST(DistributedTraining, ResumesOnTwoShardsFromACheckpointOfThree) {
  const std::string root = absl::StrCat(ScratchDir(), "/three-shards");
  const std::string root2 = absl::StrCat(ScratchDir(), "/two-shards");
  std::filesystem::remove_all(root);
  std::filesystem::remove_all(root2);
  {
    DurableCluster three(3, root);
    ASSERT_TRUE(three.Start());
    std::string out;
    ASSERT_NO_FATAL_FAILURE(Train(absl::StrCat(kCommon, " --steps=100 --checkpoint_every=100",
                                               " --coordinator=", three.coordinator->address()),
                                  &out));
    three.KillAll();
  }
  DurableCluster two(2, root2);
  two.coordinator_dir = root + "/coordinator";  // its checkpoints, and the old shards'
  ASSERT_TRUE(two.Start());
  ASSERT_NO_FATAL_FAILURE(ExpectResumedAsTheInProcessRun(*two.coordinator));
  two.KillAll();
  std::filesystem::remove_all(root);
  std::filesystem::remove_all(root2);
}

// The train records `path` holds now (a run in progress writes them as it goes).
size_t RecordsSoFar(const std::string& path) { return TrainRecords(path).size(); }

// Waits (at most 120 s) until the run writing `path` has written `n` train records.
bool WaitForRecords(const std::string& path, size_t n) {
  for (int i = 0; i < 12000 && RecordsSoFar(path) < n; ++i) usleep(10000);
  return RecordsSoFar(path) >= n;
}

// A running cluster moves from 2 shards to 3 and back to 2 while tessera-train trains
// through it (each client mode, and fixed-vocabulary tables, whose rows all move): rows
// move with their optimizer state, pushes in flight wait and are re-split, and the run's
// losses equal an un-resharded run's bit for bit.
TEST(DistributedTraining, ReshardsFromTwoToThreeAndBackWhileTrainingWithTheSameLosses) {
  const std::string common = "--steps=2500 --log_every=10 --held_out=2000 --batch_size=128";
  std::map<std::string, std::vector<std::string>> want;  // by vocabulary
  for (const std::string vocabulary : {"dynamic", "hashed"}) {
    const std::string local = absl::StrCat(ScratchDir(), "/local-reshard-", vocabulary, ".jsonl");
    std::string out;
    ASSERT_NO_FATAL_FAILURE(
        Train(absl::StrCat(common, " --vocabulary=", vocabulary, " --metrics_out=", local), &out));
    want[vocabulary] = TrainRecords(local);
    ASSERT_EQ(want[vocabulary].size(), 250u);
  }
  const std::pair<std::string, std::string> runs[] = {
      {"smart", "dynamic"}, {"coordinator", "dynamic"}, {"smart", "hashed"}};
  for (const auto& [mode, vocabulary] : runs) {
    SCOPED_TRACE(mode + " " + vocabulary);
    Cluster cluster(2);
    ASSERT_TRUE(cluster.ok) << "cluster did not come up";
    // The third shard starts empty, with its place in map version 2.
    ShardProcess third(2, 3, {"--shard_map_version=2"});
    ASSERT_TRUE(!third.address().empty() && WaitHealthy(third.address()));
    const std::string two =
        absl::StrCat(cluster.shards[0]->address(), ",", cluster.shards[1]->address());
    const std::string three = absl::StrCat(two, ",", third.address());
    const std::string name = absl::StrCat("/reshard-", mode, "-", vocabulary);
    const std::string metrics = absl::StrCat(ScratchDir(), name, ".jsonl");
    tessera::testing::TrainProcess run(
        absl::StrCat(common, " --coordinator=", cluster.coordinator->address(), " --client_mode=",
                     mode, " --vocabulary=", vocabulary, " --metrics_out=", metrics),
        absl::StrCat(ScratchDir(), name, ".log"));
    const std::string cli =
        absl::StrCat(TESSERA_CLI_BIN, " --coordinator=", cluster.coordinator->address(), " ");
    ASSERT_TRUE(WaitForRecords(metrics, 3));
    std::string out;
    ASSERT_EQ(RunCommand(cli + "reshard --shards=" + three, &out), 0) << out;
    EXPECT_THAT(out, testing::HasSubstr("resharded: 3 shards, shard map version 2"));
    EXPECT_THAT(out, testing::Not(testing::HasSubstr("; 0 rows moved")));
    EXPECT_LT(RecordsSoFar(metrics), want[vocabulary].size())
        << "the run ended before the reshard did";
    ASSERT_TRUE(WaitForRecords(metrics, RecordsSoFar(metrics) + 3));
    out.clear();
    ASSERT_EQ(RunCommand(cli + "reshard --shards=" + two, &out), 0) << out;
    EXPECT_THAT(out, testing::HasSubstr("resharded: 2 shards, shard map version 3"));
    EXPECT_LT(RecordsSoFar(metrics), want[vocabulary].size())
        << "the run ended before the reshard did";
    // Some steps on the map it came back to, then the run stops (SIGTERM: at the end of a
    // step): every step it trained, before, during and after both moves, is the in-process
    // run's step.
    ASSERT_TRUE(WaitForRecords(metrics, RecordsSoFar(metrics) + 3));
    run.Signal(SIGTERM);
    EXPECT_EQ(run.WaitForExit(), 128 + SIGTERM) << run.Output();
    const std::vector<std::string> got = TrainRecords(metrics);
    ASSERT_LE(got.size(), want[vocabulary].size());
    EXPECT_EQ(got, std::vector<std::string>(want[vocabulary].begin(),
                                            want[vocabulary].begin() + got.size()));
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
