#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "benchmarks/bench/measures.h"
#include "benchmarks/bench/report.h"
#include "benchmarks/bench/runner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/dense_backend.h"

namespace tessera::bench {
namespace {

using ::testing::HasSubstr;

TEST(Percentile, NearestRank) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  EXPECT_EQ(Percentile(v, 50), 50);
  EXPECT_EQ(Percentile(v, 99), 99);
  EXPECT_EQ(Percentile(v, 99.9), 100);
  EXPECT_EQ(Percentile(v, 0), 1);
  std::vector<double> empty;
  EXPECT_EQ(Percentile(empty, 50), 0);
}

TEST(Normalize, FillsDefaultsAndNamesBadFields) {
  Scenario s;
  s.set_name("x");
  ASSERT_TRUE(Normalize(&s).ok());
  EXPECT_EQ(s.mode(), "inproc");
  EXPECT_EQ(s.batch_size(), 4096);
  EXPECT_EQ(s.tables_size(), 1);
  EXPECT_EQ(s.workload(), "lookup_update");
  Scenario bad = s;
  bad.set_mode("cloud");
  absl::Status st = Normalize(&bad);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("mode"));
  Scenario device = s;  // tables in the GPU's memory: one GPU
  device.set_mode("cuda");
  EXPECT_TRUE(Normalize(&device).ok());
  device.set_shards(2);
  EXPECT_THAT(Normalize(&device).message(), HasSubstr("cuda: one GPU (shards 1)"));
  bad = s;
  bad.set_workload("train");
  bad.set_max_staleness(-1);
  EXPECT_THAT(Normalize(&bad).message(), HasSubstr("max_staleness must be >= 0"));
  Scenario pipelined = s;
  pipelined.set_workload("train");
  pipelined.set_max_staleness(2);  // a pipelined trainer
  EXPECT_TRUE(Normalize(&pipelined).ok());
  bad = s;
  bad.set_optimizer("lamb");
  EXPECT_FALSE(Normalize(&bad).ok());
  EXPECT_EQ(s.workers(), 1);
  // Data-parallel workers train through a cluster.
  Scenario workers = s;
  workers.set_workload("train");
  workers.set_workers(2);
  EXPECT_THAT(Normalize(&workers).message(),
              HasSubstr("workers > 1 needs workload train through a cluster"));
  workers.set_mode("smart");
  EXPECT_TRUE(Normalize(&workers).ok());
  workers.set_workload("lookup");
  EXPECT_FALSE(Normalize(&workers).ok());
  // The dense network's backend: cpu by default, cuda only for training.
  EXPECT_EQ(s.dense_backend(), "cpu");
  Scenario gpu = s;
  gpu.set_dense_backend("cuda");
  EXPECT_THAT(Normalize(&gpu).message(), HasSubstr("dense_backend cuda needs workload train"));
  gpu.set_workload("train");
  EXPECT_TRUE(Normalize(&gpu).ok());
  gpu.set_dense_backend("tpu");
  EXPECT_THAT(Normalize(&gpu).message(), HasSubstr("dense_backend must be cpu or cuda"));
}

Scenario Quick(const std::string& name, const std::string& workload) {
  Scenario s;
  s.set_name(name);
  s.set_batch_size(256);
  s.set_workload(workload);
  s.set_warmup_seconds(0.05);
  s.set_seconds(0.3);
  TableSpec* t = s.add_tables();
  t->set_count(2);
  t->set_rows(5000);
  t->set_dim(16);
  NodeSpec* n = s.add_nodes();
  n->set_type("test-node");
  n->set_count(2);
  return s;
}

// Issue 25, item 16: a report says what, where and when; compares a scenario only with
// the first of its own workload; says its prices are examples; explains its columns.
TEST(ToMarkdown, HasATitleMachineDateLegendAndComparesWithinAWorkload) {
  auto result = [](const std::string& name, const std::string& workload, double rate) {
    ScenarioResult r;
    r.scenario.set_name(name);
    r.scenario.set_mode("inproc");
    r.scenario.set_workload(workload);
    r.samples_per_s = rate;
    r.usd_per_million_samples = 1.0 / rate;
    return r;
  };
  const std::vector<ScenarioResult> results = {result("look", "lookup_update", 1000),
                                               result("train", "train", 100),
                                               result("look2", "lookup_update", 2000),
                                               result("train2", "train", 50)};
  const ReportContext context = NewReportContext("tessera-bench: x.json", "prices.json", true);
  EXPECT_FALSE(context.machine.empty());
  const std::string md = ToMarkdown(results, context);
  EXPECT_THAT(md, HasSubstr("# tessera-bench: x.json\n"));
  EXPECT_THAT(md, HasSubstr(absl::StrCat("- machine: ", context.machine, "\n")));
  EXPECT_THAT(md, HasSubstr("- date: 20"));
  EXPECT_THAT(md, HasSubstr("EXAMPLE figures, not quotes"));
  EXPECT_THAT(md, HasSubstr("Columns: **mode**"));
  // Each against the first of its workload: train is 1.00×, not 0.10× of a lookup row.
  EXPECT_THAT(md, HasSubstr("| train | inproc | 0 | train | 0 |  | 100 | 1.00× |"));
  EXPECT_THAT(md, HasSubstr("| look2 | inproc | 0 | lookup_update | 0 |  | 2000 | 2.00× |"));
  EXPECT_THAT(md, HasSubstr("| train2 | inproc | 0 | train | 0 |  | 50 | 0.50× |"));
}

// The cost of one scenario, 0.00075 USD: its bar chart starts at zero and no two y tick
// labels are the same (drawn by gnuplot's text terminal from the report's own script).
TEST(WriteReport, BarChartsStartAtZeroWithDistinctTickLabels) {
  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0) GTEST_SKIP() << "no gnuplot";
  const std::string dir = absl::StrCat(::testing::TempDir(), "/report-", ::getpid());
  ScenarioResult r;
  r.scenario.set_name("one");
  r.scenario.set_mode("inproc");
  r.samples_per_s = 1000;
  r.usd_per_million_samples = 0.00075;
  r.step_ms[0] = 1.0;  // p50, p99, p99.9 (a log-scale plot)
  r.step_ms[1] = 2.0;
  r.step_ms[2] = 3.0;
  const auto written = WriteReport({r}, dir);
  ASSERT_TRUE(written.ok()) << written.status();
  // The same script, drawn as text: each plot into a file of its own.
  std::ifstream in(dir + "/plots.gp");
  std::string script((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  script.replace(script.find("set terminal pngcairo size 900,500"),
                 std::string("set terminal pngcairo size 900,500").size(),
                 "set terminal dumb 80,24");
  for (size_t at = 0; (at = script.find(".png'", at)) != std::string::npos;) {
    script.replace(at, 5, ".txt'");
  }
  std::ofstream(dir + "/text.gp") << script;
  ASSERT_EQ(std::system(absl::StrCat("gnuplot '", dir, "/text.gp' 2>/dev/null").c_str()), 0);
  std::ifstream plot(dir + "/cost_per_million_samples.txt");
  std::vector<std::string> ticks;
  for (std::string line; std::getline(plot, line);) {
    // "  0.0007 |-+ ...": a y tick label, then the axis.
    const size_t axis = line.find_first_of("|+");
    const std::string label(absl::StripAsciiWhitespace(line.substr(0, axis)));
    if (axis != std::string::npos && !label.empty()) ticks.push_back(label);
  }
  ASSERT_GE(ticks.size(), 3u);
  EXPECT_EQ(ticks.back(), "0") << "the bars' axis does not start at zero";
  EXPECT_EQ(std::set<std::string>(ticks.begin(), ticks.end()).size(), ticks.size())
      << "tick labels repeat: " << absl::StrJoin(ticks, " ");
  std::filesystem::remove_all(dir);
}

TEST(RunScenario, MeasuresAnInProcessScenarioAndItsCost) {
  Prices prices;
  (*prices.mutable_nodes())["test-node"].set_usd_per_hour(3.6);
  RunOptions o;
  o.prices = &prices;
  auto r = RunScenario(Quick("q", "lookup_update"), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->steps, 0);
  EXPECT_EQ(r->samples, r->steps * 256);
  EXPECT_NEAR(r->samples_per_s, r->samples / r->seconds, 1e-6 * r->samples_per_s);
  // Two tables, 256 ids each, looked up and pushed every step.
  EXPECT_NEAR(r->lookups_per_s, r->samples_per_s * 2, 1e-6 * r->lookups_per_s);
  EXPECT_NEAR(r->updates_per_s, r->samples_per_s * 2, 1e-6 * r->updates_per_s);
  EXPECT_LE(r->step_ms[0], r->step_ms[1]);
  EXPECT_LE(r->step_ms[1], r->step_ms[2]);
  EXPECT_GT(r->call_ms[0], 0);
  EXPECT_EQ(r->usd_per_hour, 7.2);
  EXPECT_NEAR(r->usd_per_million_samples, 7.2 / 3600 / r->samples_per_s * 1e6, 1e-9);
  ASSERT_EQ(r->processes.size(), 1u);
  EXPECT_GT(r->processes[0].peak_rss_bytes, 0);
  EXPECT_GT(r->cpu_us_per_sample, 0);
  EXPECT_GT(r->vs_memcpy, 0);

  const std::string json = ToJson(*r);
  EXPECT_THAT(json, HasSubstr("\"scenario\":\"q\""));
  EXPECT_THAT(json, HasSubstr("\"usd_per_million_samples\":"));
  const std::string md = ToMarkdown({*r, *r});
  // The tables' rows: 2 x 5000 rows of 16 weights and 16 Adagrad accumulators (the default
  // optimizer), next to the machine's LLC.
  EXPECT_EQ(r->table_bytes, 2 * 5000 * (16 + 16) * 4);
  EXPECT_THAT(json, HasSubstr("\"table_bytes\":1280000,"));
  EXPECT_THAT(md, HasSubstr("| q | inproc | 1 | lookup_update | 256 | 2x5000x16 (1.28 MB"));
  if (r->llc_bytes > 0) {
    EXPECT_THAT(md, HasSubstr("× LLC) |"));
  }
  EXPECT_THAT(md, HasSubstr("1.00×"));
}

TEST(RunScenario, TrainsDlrmStepsAndRefusesUnknownNodeTypes) {
  Prices prices;
  (*prices.mutable_nodes())["test-node"].set_usd_per_hour(1);
  RunOptions o;
  o.prices = &prices;
  auto r = RunScenario(Quick("t", "train"), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->steps, 0);
  EXPECT_GT(r->dense_ms, 0);
  EXPECT_GT(r->dense_samples_per_s, 0);
  EXPECT_GT(r->dense_vs_gemm, 0);
  // On the GPU where there is one; else the scenario fails saying why.
  Scenario gpu = Quick("g", "train");
  gpu.set_dense_backend("cuda");
  auto on_gpu = RunScenario(gpu, o);
  if (trainer::CudaBackendUsable().ok()) {
    ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
    EXPECT_GT(on_gpu->dense_vs_gemm, 0);
  } else {
    EXPECT_EQ(on_gpu.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(on_gpu.status().message(),
                HasSubstr(std::string(trainer::CudaBackendUsable().message())));
    EXPECT_THAT(on_gpu.status().message(), HasSubstr("scenario 'g': dense_backend cuda"));
  }
  Scenario unknown = Quick("u", "lookup");
  unknown.mutable_nodes(0)->set_type("no-such-node");
  auto bad = RunScenario(unknown, o);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("no-such-node"));
}

TEST(RunScenario, ClusterModeWithoutTheServerBinariesSaysWhatIsMissing) {
  Prices prices;
  (*prices.mutable_nodes())["test-node"].set_usd_per_hour(1);
  RunOptions o;
  o.prices = &prices;
  o.bin_dir = "/nonexistent";
  Scenario s = Quick("c", "lookup");
  s.set_mode("smart");
  auto r = RunScenario(s, o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("/nonexistent/tessera-shard not found"));
}

}  // namespace
}  // namespace tessera::bench
