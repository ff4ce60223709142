// End-to-end runs of the tessera-train binary, as a user would start it.

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

Result RunTrain(const std::string& args) {
  const std::string cmd = absl::StrCat(TESSERA_TRAIN_BIN, " ", args, " 2>&1");
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

// A path in a directory of this process's own: two suites running at once on one machine
// must not write each other's files.
std::string TempPath(const std::string& name) {
  static const std::string dir = [] {
    std::string tmpl = absl::StrCat(testing::TempDir(), "/tessera-e2e-XXXXXX");
    return std::string(::mkdtemp(tmpl.data()));
  }();
  return absl::StrCat(dir, "/", name);
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
  EXPECT_THAT(other.output, testing::HasSubstr("of another run"));

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
}

TEST(TesseraTrain, BadFlagsGiveClearErrors) {
  Result r = RunTrain("--shards=remote");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, testing::HasSubstr("--shards must be inproc:N"));
  r = RunTrain("--optimizer=lamb --steps=1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, testing::HasSubstr("unknown optimizer 'lamb'"));
  r = RunTrain("--checkpoint_every=10 --steps=20");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, testing::HasSubstr("--data_dir"));
  r = RunTrain("--data=/nonexistent.tsv");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, testing::HasSubstr("cannot open"));
}

}  // namespace
