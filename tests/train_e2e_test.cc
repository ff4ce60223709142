// End-to-end runs of the tessera-train binary, as a user would start it.

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "embedding/device/device_table.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"
#include "tests/train_process.h"
#include "trainer/criteo_reader.h"
#include "trainer/dense_backend.h"

namespace {

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

Result RunBinary(const std::string& binary, const std::string& args) {
  const std::string cmd = absl::StrCat(binary, " ", args, " 2>&1");
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// tessera-train: the build's, or $TESSERA_TRAIN_BIN (a command prefix) where the binaries
// run from elsewhere (scripts/gpu_check.sh).
std::string TrainBin() {
  const char* env = std::getenv("TESSERA_TRAIN_BIN");
  return env != nullptr && *env != '\0' ? env : TESSERA_TRAIN_BIN;
}

Result RunTrain(const std::string& args) { return RunBinary(TrainBin(), args); }

// tessera-train with `args` stops at start-up (exit 1) saying `says`.
void ExpectRefused(const std::string& args, const std::string& says) {
  const Result r = RunTrain(args);
  EXPECT_EQ(r.exit_code, 1) << args;
  EXPECT_THAT(r.output, testing::HasSubstr(says)) << args;
}

// Where no GPU is usable (`usable` is why), `args` fail at start-up, before any data is
// read, naming `flag`, what is missing and `instead` (what runs without a GPU); skipped
// where a GPU is (TesseraTrainCuda, ctest label gpu, runs it there).
void ExpectRefusedWithoutAGpu(const std::string& args, const absl::Status& usable,
                              const std::string& flag, const std::string& instead) {
  if (usable.ok()) GTEST_SKIP() << "a GPU is here: TesseraTrainCuda (ctest label gpu) runs it";
  const Result r = RunTrain(args);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, testing::HasSubstr(flag));
  EXPECT_THAT(r.output, testing::HasSubstr(std::string(usable.message())));
  EXPECT_THAT(r.output, testing::HasSubstr(instead));
  EXPECT_THAT(r.output, testing::Not(testing::HasSubstr("step 1")));
}

// A path in a directory of this process's own: two suites running at once on one machine
// must not write each other's files.
std::string TempPath(const std::string& name) {
  return absl::StrCat(tessera::testing::ProcessScratchDir(), "/", name);
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

// The number after "key": in a flat JSON object line.
double JsonNumber(const std::string& line, const std::string& key) {
  const std::string tag = absl::StrCat("\"", key, "\":");
  const size_t at = line.find(tag);
  if (at == std::string::npos) return -1e300;
  const size_t end = line.find_first_of(",}", at);
  double v = 0;
  if (!absl::SimpleAtod(line.substr(at + tag.size(), end - at - tag.size()), &v)) return -1e300;
  return v;
}

std::vector<double> TrainLosses(const std::string& metrics) {
  std::vector<double> losses;
  for (const auto& l : ReadLines(metrics)) {
    if (l.find("\"event\":\"train\"") != std::string::npos) losses.push_back(JsonNumber(l, "loss"));
  }
  return losses;
}

TEST(TesseraTrain, DefaultRunReachesTheTeachersAucWithinTwoHundredths) {
  const std::string metrics = TempPath("default.jsonl");
  Result r = RunTrain(absl::StrCat("--metrics_out=", metrics));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, testing::HasSubstr("step 100/10000  samples/s"));
  EXPECT_THAT(r.output, testing::HasSubstr("held-out: 50000 samples"));
  const std::vector<std::string> lines = ReadLines(metrics);
  ASSERT_FALSE(lines.empty());
  const std::string& eval = lines.back();
  ASSERT_THAT(eval, testing::HasSubstr("\"event\":\"eval\""));
  const double auc = JsonNumber(eval, "auc");
  const double teacher = JsonNumber(eval, "teacher_auc");
  EXPECT_GT(teacher, 0.8);
  EXPECT_GE(auc, teacher - 0.02) << eval;
  EXPECT_EQ(TrainLosses(metrics).size(), 100u);
}

TEST(TesseraTrain, SameSeedSameLossesAcrossProcessesAndShardCounts) {
  const std::string a = TempPath("a.jsonl"), b = TempPath("b.jsonl"), c = TempPath("c.jsonl");
  const std::string common = "--steps=300 --log_every=10 --held_out=2000";
  ASSERT_EQ(RunTrain(absl::StrCat(common, " --shards=inproc:2 --metrics_out=", a)).exit_code, 0);
  ASSERT_EQ(RunTrain(absl::StrCat(common, " --shards=inproc:2 --metrics_out=", b)).exit_code, 0);
  ASSERT_EQ(
      RunTrain(absl::StrCat(common, " --shards=inproc:5 --reader_threads=2 --metrics_out=", c))
          .exit_code,
      0);
  const auto la = TrainLosses(a);
  ASSERT_EQ(la.size(), 30u);
  EXPECT_EQ(la, TrainLosses(b));
  EXPECT_EQ(la, TrainLosses(c));
  EXPECT_LT(la.back(), la.front());
}

std::string EvalLine(const std::string& metrics) {
  for (const auto& l : ReadLines(metrics)) {
    if (l.find("\"event\":\"eval\"") != std::string::npos) return l;
  }
  return "";
}

// A run checkpointed at step 200 and resumed (a new process, tables and dense state from
// disk) ends exactly where one that never stopped does: every later step's loss and the
// held-out metrics are identical as printed (6 decimals; trainer_test compares doubles).
TEST(TesseraTrain, ResumedRunEndsWithTheSameLossAsOneThatNeverStopped) {
  const std::string straight = TempPath("straight.jsonl"), first = TempPath("first.jsonl"),
                    resumed = TempPath("resumed.jsonl"), dir = TempPath("resume-data");
  std::filesystem::remove_all(dir);
  const std::string common = "--log_every=1 --held_out=3000 --shards=inproc:3";
  ASSERT_EQ(RunTrain(absl::StrCat(common, " --steps=400 --metrics_out=", straight)).exit_code, 0);
  Result a = RunTrain(absl::StrCat(common, " --steps=200 --checkpoint_every=100 --data_dir=", dir,
                                   " --metrics_out=", first));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_THAT(a.output, testing::HasSubstr("checkpoint 200:"));
  // Without --resume the tables on disk are not silently trained further.
  Result refused = RunTrain(absl::StrCat(common, " --steps=400 --data_dir=", dir));
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.output, testing::HasSubstr("pass --resume"));
  // Another run's checkpoint is not taken for this one.
  Result other =
      RunTrain(absl::StrCat(common, " --steps=400 --batch_size=128 --resume --data_dir=", dir));
  EXPECT_EQ(other.exit_code, 1);
  EXPECT_THAT(other.output,
              testing::HasSubstr("batch_size: the checkpoint's 256, this run's 128"));
  EXPECT_THAT(other.output, testing::HasSubstr("nothing was restored"));
  // Nor one of another dense network whose parameters happen to number the same (the
  // padded count collides for these bottom MLPs): the flag is named with both values.
  Result shaped = RunTrain(
      absl::StrCat(common, " --steps=400 --bottom_mlp=32,62 --resume=auto --data_dir=", dir));
  EXPECT_EQ(shaped.exit_code, 1) << shaped.output;
  EXPECT_THAT(shaped.output,
              testing::HasSubstr("bottom_mlp: the checkpoint's 64,32, this run's 32,62"));
  EXPECT_THAT(shaped.output, testing::HasSubstr("nothing was restored"));

  Result b =
      RunTrain(absl::StrCat(common, " --steps=400 --checkpoint_every=100 --resume --data_dir=", dir,
                            " --metrics_out=", resumed));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_THAT(b.output, testing::HasSubstr("resume: restored checkpoint 200"));
  const auto all = TrainLosses(straight);
  const auto tail = TrainLosses(resumed);
  ASSERT_EQ(all.size(), 400u);
  ASSERT_EQ(tail.size(), 200u);
  EXPECT_EQ(std::vector<double>(all.begin() + 200, all.end()), tail);
  EXPECT_EQ(std::vector<double>(all.begin(), all.begin() + 200), TrainLosses(first));
  const std::string e1 = EvalLine(straight), e2 = EvalLine(resumed);
  EXPECT_EQ(JsonNumber(e1, "logloss"), JsonNumber(e2, "logloss"));
  EXPECT_EQ(JsonNumber(e1, "auc"), JsonNumber(e2, "auc"));
  EXPECT_EQ(JsonNumber(e2, "step"), 400);
  std::filesystem::remove_all(dir);
}

std::string CriteoLine(std::mt19937& rng, bool positive) {
  std::string s = positive ? "1" : "0";
  for (int i = 0; i < 13; ++i) {
    s += "\t";
    if (rng() % 10) absl::StrAppend(&s, rng() % (positive ? 40 : 20));
  }
  for (int i = 0; i < 26; ++i) {
    s += "\t";
    if (rng() % 10) {
      const uint32_t v =
          positive && i < 4 ? 0xabc00000u + rng() % 4 : static_cast<uint32_t>(rng() % 64);
      absl::StrAppend(&s, absl::Hex(v, absl::kZeroPad8));
    }
  }
  return s;
}

TEST(TesseraTrain, TrainsOnCriteoTsvAndReportsMalformedLines) {
  const std::string path = TempPath("criteo.tsv");
  {
    std::ofstream out(path);
    std::mt19937 rng(4);
    for (int i = 0; i < 3000; ++i) {
      if (i == 41) {
        out << "1\tthis line is broken\n";
        continue;
      }
      out << CriteoLine(rng, rng() % 4 == 0) << "\n";
    }
  }
  Result skip = RunTrain(absl::StrCat("--data=", path, " --batch_size=64 --epochs=2"));
  ASSERT_EQ(skip.exit_code, 0) << skip.output;
  EXPECT_THAT(skip.output, testing::HasSubstr(absl::StrCat(path, ":42:")));
  EXPECT_THAT(skip.output, testing::HasSubstr("skipped 2 malformed line(s)"));  // once per epoch
  EXPECT_THAT(skip.output, testing::HasSubstr("held-out:"));
  // Positives carry planted ids and larger integers: the model must find them.
  const size_t at = skip.output.find("auc ");
  ASSERT_NE(at, std::string::npos);
  double auc = 0;
  ASSERT_TRUE(absl::SimpleAtod(skip.output.substr(at + 4, 7), &auc)) << skip.output;
  EXPECT_GT(auc, 0.8) << skip.output;

  Result stop = RunTrain(absl::StrCat("--data=", path, " --on_bad_line=stop"));
  EXPECT_EQ(stop.exit_code, 1);
  EXPECT_THAT(stop.output, testing::HasSubstr(absl::StrCat(path, ":42:")));
  EXPECT_THAT(stop.output, testing::HasSubstr("INVALID_ARGUMENT"));

  // More steps than the file holds: trained what there is, and said so.
  Result short_file = RunTrain(
      absl::StrCat("--data=", path, " --batch_size=64 --steps=100 --log_every=10 --model=tsv"));
  ASSERT_EQ(short_file.exit_code, 0) << short_file.output;
  EXPECT_THAT(short_file.output, testing::HasSubstr("data: the input ran out at step "));
  EXPECT_THAT(short_file.output, testing::HasSubstr("of --steps=100"));
  EXPECT_THAT(short_file.output, testing::HasSubstr("model: 'tsv' (DLRM) on cpu"));
}

// The number after `label` in tessera-train's output ("auc 0.9" -> 0.9), or -1.
double Figure(const std::string& output, const std::string& label) {
  const size_t at = output.find(label);
  double value = -1;
  if (at == std::string::npos) return value;
  const std::string rest = output.substr(at + label.size(), 20);
  if (!absl::SimpleAtod(rest.substr(0, rest.find_first_of(" \n,")), &value)) return -1;
  return value;
}

// Feature admission on ids with a long tail (200k per feature, most seen once): rows only
// for ids seen in 3 steps, a fraction of the rows, at the same held-out AUC.
TEST(TesseraTrain, AdmissionKeepsRareIdsOutAtTheSameAuc) {
  std::string cardinalities = "200000";
  for (int f = 1; f < 26; ++f) absl::StrAppend(&cardinalities, ",200000");
  const std::string common = absl::StrCat("--cardinalities=", cardinalities,
                                          " --steps=600 --held_out=10000 --log_every=0");
  const Result all = RunTrain(common);
  const Result admitted = RunTrain(absl::StrCat(common, " --admit_min_count=3"));
  ASSERT_EQ(all.exit_code, 0) << all.output;
  ASSERT_EQ(admitted.exit_code, 0) << admitted.output;
  const double rows_all = Figure(all.output, "tables: "),
               rows_admitted = Figure(admitted.output, "tables: ");
  ASSERT_GT(rows_all, 0) << all.output;
  EXPECT_LT(rows_admitted, 0.3 * rows_all) << admitted.output;
  EXPECT_GT(rows_admitted, 0.02 * rows_all) << admitted.output;
  EXPECT_NEAR(Figure(admitted.output, "auc "), Figure(all.output, "auc "), 0.01)
      << all.output << admitted.output;
}

TEST(TesseraTrain, BadFlagsGiveClearErrors) {
  ExpectRefused("--admit_min_count=300", "--admit_min_count must be <= 255");
  ExpectRefused("--admit_probability=1.5", "--admit_probability");
  ExpectRefused("--shards=remote", "--shards must be inproc:N");
  ExpectRefused("--optimizer=lamb --steps=1", "unknown optimizer 'lamb'");
  ExpectRefused("--checkpoint_every=10 --steps=20", "--data_dir");
  ExpectRefused("--data=/nonexistent.tsv", "cannot open");
  ExpectRefused("--sparse_threads=-1", "--sparse_threads");
}

TEST(TesseraTrain, DenseBackendFlagRefusesWhatCannotRunHere) {
  ExpectRefused("--dense_backend=tpu --steps=1", "dense backend must be cpu or cuda, got 'tpu'");
  ExpectRefused("--cuda_device=1 --steps=1", "--cuda_device=1 needs --dense_backend=cuda");
  // No GPU, no driver or no CUDA in the build.
  ExpectRefusedWithoutAGpu("--dense_backend=cuda --steps=5", tessera::trainer::CudaBackendUsable(),
                           "--dense_backend=cuda", "--dense_backend=cpu runs without a GPU");
}

TEST(TesseraTrain, DeviceTablesFlagRefusesWhatCannotRunHere) {
  ExpectRefused("--shards=cuda --steps=1", "--shards=cuda keeps the tables in the dense "
                                           "network's GPU: it needs --dense_backend=cuda");
  ExpectRefusedWithoutAGpu(
      "--shards=cuda --dense_backend=cuda --steps=5",
      tessera::embedding::device::DeviceTable::Usable(0),
      "FAILED_PRECONDITION: --shards=cuda: ", "--shards=inproc:N runs without");
}

// The default run on the CPU (metrics to `cpu`) and with `gpu_flags` (metrics to `gpu`, its
// output saying `gpu_says`) reach the same held-out AUC (within 0.002).
void ExpectTheCpuRunsAuc(const std::string& gpu_flags, const std::string& gpu_says,
                         const std::string& cpu, const std::string& gpu) {
  Result a = RunTrain(absl::StrCat("--dense_backend=cpu --metrics_out=", cpu));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  Result b = RunTrain(absl::StrCat(gpu_flags, " --metrics_out=", gpu));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_THAT(b.output, testing::HasSubstr(gpu_says));
  const double auc_cpu = JsonNumber(ReadLines(cpu).back(), "auc");
  const double auc_gpu = JsonNumber(ReadLines(gpu).back(), "auc");
  std::printf("held-out AUC: cpu %.5f, %s %.5f\n", auc_cpu, gpu_flags.c_str(), auc_gpu);
  EXPECT_NEAR(auc_gpu, auc_cpu, 0.002);
}

// Run by `train_e2e_test --gpu` (ctest: train_cuda_test, label gpu) where a GPU is.
// The default run with the dense network on the GPU reaches the CPU backend's AUC.
TEST(TesseraTrainCuda, DefaultRunReachesTheCpuBackendsAuc) {
  const std::string cpu = TempPath("cpu.jsonl"), gpu = TempPath("gpu.jsonl");
  ASSERT_NO_FATAL_FAILURE(
      ExpectTheCpuRunsAuc("--dense_backend=cuda", "model: 'dlrm' (DLRM) on cuda:0", cpu, gpu));
  const std::vector<double> lc = TrainLosses(cpu), lg = TrainLosses(gpu);
  ASSERT_EQ(lc.size(), lg.size());
  // The first logged loss (step 100) is before the two runs' small differences compound.
  EXPECT_NEAR(lg[0], lc[0], 1e-3 * lc[0]);
}

// Every table in the GPU's memory (--shards=cuda): the default run reaches the CPU run's
// AUC (issue 28's check).
TEST(TesseraTrainCuda, DeviceTablesReachTheCpuRunsAuc) {
  ExpectTheCpuRunsAuc("--dense_backend=cuda --shards=cuda", "device tables on GPU 0",
                      TempPath("cpu-host.jsonl"), TempPath("gpu-device.jsonl"));
}

// A run of 200 steps with `flags` and `first`, checkpointed into `dir`, resumes with
// `flags` and `second` from its checkpoint of step 200 and runs on to step 400.
void ExpectResumedWith(const std::string& flags, const std::string& first,
                       const std::string& second, const std::string& dir) {
  const std::string common = "--log_every=50 --held_out=5000 " + flags;
  Result a = RunTrain(
      absl::StrCat(common, " --steps=200 --checkpoint_every=100 --data_dir=", dir, " ", first));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  Result b = RunTrain(absl::StrCat(common, " --steps=400 --resume --data_dir=", dir, " ", second));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_THAT(b.output, testing::HasSubstr("resume: restored checkpoint 200"));
}

// A checkpoint written with device tables resumes on host tables and the other way round
// (both through the same files).
TEST(TesseraTrainCuda, DeviceTableCheckpointsResumeOnHostTables) {
  ExpectResumedWith("--dense_backend=cuda", "--shards=cuda", "--shards=inproc:4",
                    TempPath("tables-device"));
  ExpectResumedWith("--dense_backend=cuda", "--shards=inproc:4", "--shards=cuda",
                    TempPath("tables-host"));
}

// A checkpoint written with one backend resumes with the other.
TEST(TesseraTrainCuda, CheckpointsResumeOnTheOtherBackend) {
  ExpectResumedWith("", "--dense_backend=cuda", "--dense_backend=cpu", TempPath("resume-cuda"));
  ExpectResumedWith("", "--dense_backend=cpu", "--dense_backend=cuda", TempPath("resume-cpu"));
}

std::string WriteCriteo(const std::string& name, int lines, uint32_t seed) {
  const std::string path = TempPath(name);
  std::ofstream out(path);
  std::mt19937 rng(seed);
  for (int i = 0; i < lines; ++i) out << CriteoLine(rng, rng() % 4 == 0) << "\n";
  return path;
}

TEST(TesseraTrain, AFailingRunStopsItsInputPipelineAndSaysWhy) {
  // The tables fill up at once: the trainer fails while the readers still make batches.
  for (const char* threads : {"1", "3"}) {
    Result r = RunTrain(absl::StrCat("--max_rows=100 --steps=50 --reader_threads=", threads));
    EXPECT_EQ(r.exit_code, 1) << r.output;  // not a signal
    EXPECT_THAT(r.output, testing::HasSubstr("row budget of 25 rows is full (this shard's part "
                                             "of the table's max_rows); raise max_rows"));
  }
}

// What the budget error advises works: the same budget with --eviction trains on.
TEST(TesseraTrain, ARowBudgetWithEvictionTrainsOnAndEvictionNeedsABudget) {
  Result r = RunTrain("--max_rows=100 --eviction=lru --steps=50 --log_every=0");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  ExpectRefused("--eviction=lru --steps=5", "give one with --max_rows");
  ExpectRefused("--max_rows=100 --eviction=oldest --steps=5",
                "--eviction must be none, lru or lfu, got 'oldest'");
}

TEST(TesseraTrain, InputWithoutOneTrainableLineFailsAndGzipTrainsLikeThePlainFile) {
  const std::string empty = TempPath("empty.tsv");
  std::ofstream(empty).close();
  const std::string garbage = TempPath("garbage.tsv");
  {
    std::ofstream out(garbage, std::ios::binary);
    std::mt19937 rng(9);
    for (int i = 0; i < 200000; ++i) out.put(static_cast<char>(rng()));
  }
  const std::string bad = TempPath("bad-lines.tsv");
  {
    std::ofstream out(bad);
    for (int i = 0; i < 500; ++i) out << "1\t2\tthree\n";
  }
  for (const std::string& path : {empty, garbage, bad}) {
    Result r = RunTrain(absl::StrCat("--data=", path, " --log_every=0"));
    EXPECT_EQ(r.exit_code, 1) << path << "\n" << r.output;
    EXPECT_THAT(r.output, testing::HasSubstr("has no valid training line")) << path;
    EXPECT_THAT(r.output, testing::Not(testing::HasSubstr("auc 0.5")));
  }

  const std::string plain = WriteCriteo("plain.tsv", 2000, 7);
  ASSERT_EQ(std::system(absl::StrCat("gzip -c ", plain, " > ", plain, ".gz").c_str()), 0);
  const std::string m1 = TempPath("plain.jsonl"), m2 = TempPath("gz.jsonl");
  Result a =
      RunTrain(absl::StrCat("--data=", plain, " --batch_size=64 --log_every=1 --metrics_out=", m1));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  Result b = RunTrain(
      absl::StrCat("--data=", plain, ".gz --batch_size=64 --log_every=1 --metrics_out=", m2));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_FALSE(TrainLosses(m1).empty());
  EXPECT_EQ(TrainLosses(m1), TrainLosses(m2));
  EXPECT_EQ(JsonNumber(EvalLine(m1), "auc"), JsonNumber(EvalLine(m2), "auc"));

  // A truncated download is an error, not a shorter epoch.
  const std::string cut = TempPath("cut.tsv.gz");
  ASSERT_EQ(std::system(absl::StrCat("head -c 20000 ", plain, ".gz > ", cut).c_str()), 0);
  Result c = RunTrain(absl::StrCat("--data=", cut, " --batch_size=64"));
  EXPECT_EQ(c.exit_code, 1);
  EXPECT_THAT(c.output, testing::HasSubstr("corrupt or truncated"));
  EXPECT_THAT(c.output, testing::HasSubstr("copy or compress the input file named above again"));
  EXPECT_THAT(c.output, testing::Not(testing::HasSubstr("restore a checkpoint")));
}

TEST(TesseraTrain, FlagsOutsideTheirRangeAreRefusedNamingTheFlag) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--steps=-1", "--steps must be >= 0"},
      {"--epochs=0", "--epochs must be >= 1"},
      {"--held_out_fraction=1.5", "--held_out_fraction must be in [0, 1)"},
      {"--log_every=-5", "--log_every must be >= 0"},
      {"--reader_threads=0", "--reader_threads must be >= 1"},
      {"--keep_checkpoints=-1", "--keep_checkpoints must be >= 0"},
      {"--prefetch=0", "--prefetch must be >= 1"},
      {"--batch_size=0", "--batch_size must be >= 1"},
      {"--max_staleness=-2", "--max_staleness must be >= 0"},
      {"--lr=nan", "--lr must be a number in [0, 1e+06], got nan"},
      {"--dense_lr=nan", "--dense_lr must be a number"},
  };
  for (const auto& [flag, message] : cases) {
    Result r = RunTrain(flag);
    EXPECT_EQ(r.exit_code, 1) << flag;
    EXPECT_THAT(r.output, testing::HasSubstr(message)) << flag;
    EXPECT_THAT(r.output, testing::Not(testing::HasSubstr("step 100"))) << flag;
  }
}

TEST(TesseraTrain, BadLinesAreNamedFirstInFileOrderAndReportedOnceEach) {
  tessera::trainer::CriteoOptions split;  // the defaults tessera-train uses
  std::vector<int> train_lines, held_lines;
  for (int line = 1; line <= 400; ++line) {
    (tessera::trainer::IsHeldOutLine(line, split) ? held_lines : train_lines).push_back(line);
  }
  // Bad lines: an early training line, a later held-out one, two later training ones.
  const int first = train_lines[5],
            held = *std::upper_bound(held_lines.begin(), held_lines.end(), first);
  const int later1 = train_lines[200], later2 = train_lines[250];
  const std::string path = TempPath("order.tsv");
  {
    std::ofstream out(path);
    std::mt19937 rng(3);
    for (int line = 1; line <= 3000; ++line) {
      if (line == first || line == held || line == later1 || line == later2) {
        out << "x\tbroken\n";
      } else {
        out << CriteoLine(rng, rng() % 4 == 0) << "\n";
      }
    }
  }
  Result stop = RunTrain(absl::StrCat("--data=", path, " --on_bad_line=stop"));
  EXPECT_EQ(stop.exit_code, 1);
  EXPECT_THAT(stop.output, testing::HasSubstr(absl::StrCat(path, ":", first, ":")));
  EXPECT_THAT(stop.output, testing::Not(testing::HasSubstr(absl::StrCat(path, ":", held, ":"))));

  Result skip = RunTrain(absl::StrCat("--data=", path, " --epochs=3 --batch_size=64"));
  ASSERT_EQ(skip.exit_code, 0) << skip.output;
  std::vector<std::string> reported;
  for (absl::string_view l : absl::StrSplit(skip.output, '\n')) {
    if (absl::StartsWith(l, "criteo: skipping malformed line")) reported.emplace_back(l);
  }
  ASSERT_EQ(reported.size(), 3u) << skip.output;  // training lines, first epoch only
  EXPECT_THAT(reported[0], testing::HasSubstr(absl::StrCat(":", first, ":")));
  EXPECT_THAT(reported[1], testing::HasSubstr(absl::StrCat(":", later1, ":")));
  EXPECT_THAT(reported[2], testing::HasSubstr(absl::StrCat(":", later2, ":")));
  EXPECT_THAT(skip.output, testing::HasSubstr("skipped 1 malformed held-out line(s)"));
  EXPECT_THAT(skip.output, testing::HasSubstr(absl::StrCat(
                               "criteo: skipping malformed held-out line ", path, ":", held, ":")));
  EXPECT_THAT(skip.output, testing::HasSubstr("skipped 9 malformed line(s)"));  // 3 epochs
}

// Issue 25, item 8: Ctrl-C stops at the end of the step, checkpointed, and says how to go
// on; the command it prints resumes from that step.
TEST(TesseraTrain, ASignalStopsAtTheEndOfAStepWithACheckpointAndSaysHowToGoOn) {
  const std::string dir = TempPath("stop-data");
  std::filesystem::remove_all(dir);
  const std::string args = absl::StrCat("--data_dir=", dir, " --checkpoint_every=100000 ",
                                        "--steps=100000 --log_every=50 --held_out=500");
  tessera::testing::TrainProcess run(args, TempPath("stop.log"));
  for (int i = 0; i < 600 && run.Output().find("step 100/") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_THAT(run.Output(), testing::HasSubstr("step 100/")) << run.Output();
  run.Signal(SIGINT);
  EXPECT_EQ(run.WaitForExit(), 128 + SIGINT);
  const std::string out = run.Output();
  const size_t at = out.find("stopped by SIGINT at step ");
  ASSERT_NE(at, std::string::npos) << out;
  int64_t step = 0;
  ASSERT_TRUE(absl::SimpleAtoi(out.substr(at + 26, out.find(' ', at + 26) - at - 26), &step))
      << out;
  EXPECT_THAT(
      out, testing::HasSubstr(absl::StrCat("newest checkpoint: step ", step, " of model 'dlrm'")));
  EXPECT_THAT(out, testing::HasSubstr(absl::StrCat("to go on from it: ", TESSERA_TRAIN_BIN, " ",
                                                   args, " --resume=auto")));
  EXPECT_THAT(out, testing::Not(testing::HasSubstr("held-out:")));  // stopped, not finished
  Result resumed = RunTrain(absl::StrCat(args, " --resume=auto --steps=", step + 20));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_THAT(resumed.output,
              testing::HasSubstr(absl::StrCat("resume: restored checkpoint ", step)));
  std::filesystem::remove_all(dir);
}

TEST(TesseraBinaries, HelpListsEachBinarysOwnFlagsAndVersionPrintsIt) {
  const std::vector<std::pair<std::string, std::string>> binaries = {
      {TESSERA_TRAIN_BIN, "--max_staleness"},
      {TESSERA_SHARD_BIN, "--shard_index"},
      {TESSERA_COORDINATOR_BIN, "--shards"},
      {TESSERA_CLI_BIN, "--coordinator"},
  };
  for (const auto& [binary, own_flag] : binaries) {
    Result help = RunBinary(binary, "--help");
    EXPECT_THAT(help.output, testing::HasSubstr(own_flag)) << binary;
    // Flags are listed by their file as the repository names it, not the build machine's.
    EXPECT_THAT(help.output, testing::HasSubstr("Flags from wire/security_flags.cc:")) << binary;
    EXPECT_THAT(help.output, testing::Not(testing::HasSubstr(TESSERA_SOURCE_DIR))) << binary;
    EXPECT_THAT(help.output, testing::Not(testing::HasSubstr("No flags matched"))) << binary;
    Result version = RunBinary(binary, "--version");
    const std::string name = std::filesystem::path(binary).filename();
    EXPECT_THAT(version.output, testing::HasSubstr(absl::StrCat(name, " 0."))) << binary;
  }
}

}  // namespace

// `train_e2e_test` runs every suite but TesseraTrainCuda; `train_e2e_test --gpu` runs only
// that one, and exits 77 (CTest: skipped) where the CUDA backend cannot run.
int main(int argc, char** argv) {
  bool gpu = false;
  for (int i = 1; i < argc; ++i) gpu |= std::string(argv[i]) == "--gpu";
  testing::InitGoogleTest(&argc, argv);
  if (gpu) {
    if (absl::Status usable = tessera::trainer::CudaBackendUsable(); !usable.ok()) {
      std::printf("skipped: the CUDA dense backend cannot run here: %s\n",
                  std::string(usable.message()).c_str());
      return 77;
    }
    testing::GTEST_FLAG(filter) = "TesseraTrainCuda.*";
  } else if (testing::GTEST_FLAG(filter) == "*") {
    testing::GTEST_FLAG(filter) = "-TesseraTrainCuda.*";
  }
  return RUN_ALL_TESTS();
}
