// Data-parallel tessera-train: N worker processes training one model against a cluster
// of shard and coordinator processes on 127.0.0.1.

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/train_process.h"

// In the test kit's namespace: its clusters, processes and records by their names.
namespace tessera::testing {
namespace {

using ::testing::HasSubstr;

// The "dense parameters XXXX" fingerprint a worker printed, or "".
std::string DenseFingerprint(const std::string& out) {
  const std::string key = "dense parameters ";
  const size_t at = out.find(key);
  return at == std::string::npos ? "" : out.substr(at + key.size(), 16);
}

// Runs `n` workers at once, worker w with args(w) and its index; their outputs, and
// whether all ended with 0.
bool RunWorkers(int n, const std::function<std::string(int)>& args,
                std::vector<std::string>* outs) {
  std::vector<int> codes(n);
  outs->assign(n, "");
  std::vector<std::thread> threads;
  for (int w = 0; w < n; ++w) {
    threads.emplace_back([&, w] {
      codes[w] =
          RunTrain(absl::StrCat(args(w), " --num_workers=", n, " --worker_index=", w), &(*outs)[w]);
    });
  }
  for (auto& t : threads) t.join();
  return std::all_of(codes.begin(), codes.end(), [](int c) { return c == 0; });
}

TEST(DataParallelTraining, TwoWorkersAtHalfTheBatchTrainTheModelOfOneWorker) {
  const std::string common = "--steps=400 --log_every=100 --held_out=5000";
  for (const std::string mode : {"smart", "coordinator"}) {
    Cluster cluster(2);
    ASSERT_TRUE(cluster.ok) << "cluster did not come up";
    const std::string at =
        absl::StrCat(" --coordinator=", cluster.coordinator->address(), " --client_mode=", mode);
    std::string one;
    ASSERT_EQ(RunTrain(absl::StrCat(common, at, " --model=one --batch_size=256"), &one), 0) << one;
    std::vector<std::string> two;
    ASSERT_TRUE(RunWorkers(
        2, [&](int) { return absl::StrCat(common, at, " --model=two --batch_size=128"); }, &two))
        << two[0] << "\n----\n"
        << two[1];
    for (const std::string& out : two) {
      EXPECT_THAT(out, HasSubstr("all 2 workers connected"));
    }
    // One model: the same dense parameters on both workers, and the same evaluation.
    ASSERT_EQ(DenseFingerprint(two[0]).size(), 16u) << two[0];
    EXPECT_EQ(DenseFingerprint(two[0]), DenseFingerprint(two[1]));
    EXPECT_EQ(HeldOutAuc(two[0]), HeldOutAuc(two[1]));
    // Trained as one worker at twice the batch trains it.
    const double auc_one = HeldOutAuc(one);
    ASSERT_GT(auc_one, 0.6) << one;
    EXPECT_NEAR(HeldOutAuc(two[0]), auc_one, 0.003) << mode << " client\n"
                                                    << one << "\n----\n"
                                                    << two[0];
  }
}

// Bounded staleness on top: lookups run a step ahead of the sync pushes on every worker;
// the workers still end with one dense model and train it.
TEST(DataParallelTraining, PipelinedWorkersKeepOneModel) {
  Cluster cluster(2);
  ASSERT_TRUE(cluster.ok) << "cluster did not come up";
  std::vector<std::string> out;
  ASSERT_TRUE(RunWorkers(
      2,
      [&](int) {
        return absl::StrCat("--coordinator=", cluster.coordinator->address(),
                            " --model=k1 --steps=300 --log_every=100 --held_out=2000 "
                            "--batch_size=128 --max_staleness=1");
      },
      &out))
      << out[0] << "\n----\n"
      << out[1];
  ASSERT_EQ(DenseFingerprint(out[0]).size(), 16u) << out[0];
  EXPECT_EQ(DenseFingerprint(out[0]), DenseFingerprint(out[1]));
  EXPECT_GT(HeldOutAuc(out[0]), 0.75) << out[0];
}

// scripts/train_workers.sh: N workers of one model, their lines marked; a failing worker
// fails the run.
TEST(DataParallelTraining, TheLocalLauncherRunsTheWorkersAndFailsWithThem) {
  Cluster cluster(2);
  ASSERT_TRUE(cluster.ok) << "cluster did not come up";
  const std::string script = absl::StrCat("TESSERA_BIN=", TESSERA_BIN_DIR, " bash ",
                                          TESSERA_SOURCE_DIR, "/scripts/train_workers.sh");
  auto run = [&](const std::string& args, std::string* out) {
    return RunCommand(absl::StrCat(script, " ", args), out);
  };
  const std::string at = absl::StrCat("--coordinator=", cluster.coordinator->address());
  std::string out;
  ASSERT_EQ(run(absl::StrCat("2 ", at, " --model=launched --steps=50 --log_every=0 --held_out=500"),
                &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("[worker 0] data-parallel: all 2 workers connected"));
  EXPECT_THAT(out, HasSubstr("[worker 1] held-out:"));
  // The model's tables exist now: worker 0 refuses to start over them, and the launcher
  // stops worker 1 and exits non-zero.
  out.clear();
  EXPECT_NE(run(absl::StrCat("2 ", at, " --model=launched --steps=50"), &out), 0);
  EXPECT_THAT(out, HasSubstr("[worker 0] tessera-train: FAILED_PRECONDITION"));
  out.clear();
  EXPECT_NE(run("2 --model=x", &out), 0);
  EXPECT_THAT(out, HasSubstr("the workers need --coordinator"));
}

// Issue 25, item 8: the launcher terminated stops its workers together at the end of a
// step, each checkpointed and saying how to go on; no worker is left running.
TEST(DataParallelTraining, ATerminatedLauncherStopsItsWorkersTogetherAtACheckpoint) {
  const std::string root = absl::StrCat(ScratchDir(), "/stop-cluster");
  DurableCluster cluster(2, root);
  ASSERT_TRUE(cluster.Start());
  setenv("TESSERA_BIN", TESSERA_BIN_DIR, 1);
  LoggedProcess launcher(
      {"/bin/bash", absl::StrCat(TESSERA_SOURCE_DIR, "/scripts/train_workers.sh"), "2",
       absl::StrCat("--coordinator=", cluster.coordinator->address()), "--model=stopped",
       "--steps=1000000", "--log_every=10", "--held_out=100", "--checkpoint_every=1000000"},
      ScratchDir() + "/stopped.log");
  for (int i = 0; i < 600 && launcher.Output().find("[worker 1] step 20/") == std::string::npos;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_THAT(launcher.Output(), HasSubstr("[worker 1] step 20/")) << launcher.Output();
  launcher.Signal(SIGTERM);
  EXPECT_EQ(launcher.WaitForExit(), 128 + SIGTERM);
  const std::string out = launcher.Output();
  // Both at the same step, which the checkpoint holds.
  const size_t at = out.find("[worker 0] stopped by SIGTERM at step ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string step = out.substr(at + 38, out.find(' ', at + 38) - at - 38);
  EXPECT_THAT(out, HasSubstr(absl::StrCat("[worker 1] stopped by SIGTERM at step ", step, " ")));
  EXPECT_THAT(out, HasSubstr(absl::StrCat("[worker 0] newest checkpoint: step ", step,
                                          " of model 'stopped'")));
  EXPECT_THAT(out, HasSubstr(absl::StrCat("[worker 1] newest checkpoint: step ", step, " ")));
  EXPECT_THAT(out, HasSubstr("--resume=auto"));
  std::string left;
  EXPECT_EQ(RunCommand("pgrep -f -- '--model=[s]topped '", &left), 1) << left;
}

TEST(DataParallelTraining, AKilledWorkerMakesTheOtherFailNamingIt) {
  Cluster cluster(2);
  ASSERT_TRUE(cluster.ok) << "cluster did not come up";
  const std::string args =
      absl::StrCat("--coordinator=", cluster.coordinator->address(),
                   " --model=killed --steps=1000000 --log_every=10 --held_out=100 "
                   "--num_workers=2 --worker_timeout_s=20");
  TrainProcess w0(absl::StrCat(args, " --worker_index=0"), ScratchDir() + "/killed-0.log");
  TrainProcess w1(absl::StrCat(args, " --worker_index=1"), ScratchDir() + "/killed-1.log");
  // Bounded: both train a few steps (or one fails first), then worker 1 is killed.
  for (int i = 0; i < 600 && w1.Output().find("step 20/") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_THAT(w1.Output(), HasSubstr("step 20/")) << w0.Output() << "\n----\n" << w1.Output();
  w1.Kill();
  EXPECT_NE(w0.WaitForExit(), 0);
  const std::string out = w0.Output();
  // Named whichever way worker 0 learns it: its allreduce, or a shard's wait for the push.
  EXPECT_THAT(out, ::testing::AnyOf(HasSubstr("worker 1 has stopped"),
                                    HasSubstr("worker(s) 1 of 2 did not push")))
      << out;
  // The hint points at the worker, not at a server.
  EXPECT_THAT(out, HasSubstr("next: start (or restart) the worker(s) named above")) << out;
  EXPECT_THAT(out, ::testing::Not(HasSubstr("bring back the server"))) << out;
}

// Two workers checkpoint at step 100, every server is killed and started again on its
// data directory, and the two workers resume: their losses from step 100 on are the
// uninterrupted two-worker run's, bit for bit.
TEST(DataParallelTraining, AResumedRunEqualsTheUninterruptedOne) {
  const std::string root = absl::StrCat(ScratchDir(), "/resume-cluster");
  DurableCluster cluster(2, root);
  ASSERT_TRUE(cluster.Start());
  const std::string common = "--log_every=10 --held_out=1000 --batch_size=64";
  auto at = [&] { return absl::StrCat(" --coordinator=", cluster.coordinator->address()); };
  auto metrics = [&](const std::string& name, int w) {
    return absl::StrCat(ScratchDir(), "/", name, "-", w, ".jsonl");
  };
  // Both workers, each with a metrics file of its own.
  auto run = [&](const std::string& name, const std::string& args, std::vector<std::string>* out) {
    return RunWorkers(
        2,
        [&](int w) {
          return absl::StrCat(common, at(), " ", args, " --metrics_out=", metrics(name, w));
        },
        out);
  };
  std::vector<std::string> out;
  ASSERT_TRUE(run("whole", "--model=whole --steps=200", &out)) << out[0] << "\n----\n" << out[1];
  ASSERT_TRUE(run("first", "--model=part --steps=100 --checkpoint_every=100", &out))
      << out[0] << "\n----\n"
      << out[1];
  EXPECT_THAT(out[0], HasSubstr("checkpoint 100:"));
  cluster.KillAll();
  ASSERT_TRUE(cluster.Start()) << "the cluster did not come back on its data directories";
  ASSERT_TRUE(run("resumed", "--model=part --steps=200 --resume", &out)) << out[0] << "\n----\n"
                                                                         << out[1];
  EXPECT_THAT(out[0], HasSubstr("resume: restored checkpoint 100"));
  EXPECT_THAT(out[1], HasSubstr("resume: took checkpoint 100 of model 'part' from worker 0"));
  for (int w = 0; w < 2; ++w) {
    const auto want = TrainRecords(metrics("whole", w));
    ASSERT_EQ(want.size(), 20u) << "worker " << w;
    EXPECT_EQ(TrainRecords(metrics("first", w)),
              std::vector<std::string>(want.begin(), want.begin() + 10))
        << "worker " << w;
    EXPECT_EQ(TrainRecords(metrics("resumed", w)),
              std::vector<std::string>(want.begin() + 10, want.end()))
        << "worker " << w;
  }
  EXPECT_EQ(DenseFingerprint(out[0]), DenseFingerprint(out[1]));
  cluster.KillAll();
  std::filesystem::remove_all(root);
}

TEST(DataParallelTraining, BadWorkerFlagsAreClearErrors) {
  std::string out;
  EXPECT_NE(RunTrain("--num_workers=2 --worker_index=0 --steps=1", &out), 0);
  EXPECT_THAT(out, HasSubstr("--num_workers > 1 needs --coordinator")) << out;
  out.clear();
  EXPECT_NE(RunTrain("--num_workers=2 --worker_index=2 --steps=1", &out), 0);
  EXPECT_THAT(out, HasSubstr("--worker_index must be <= 1")) << out;
}

}  // namespace
}  // namespace tessera::testing
