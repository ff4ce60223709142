// tessera-bench: runs benchmark scenarios (in-process tables or a local cluster of shard
// processes on loopback) and reports throughput, latency, memory, CPU and cost.
//
//   tessera-bench --scenarios=benchmarks/scenarios/shards.json --out=bench-out
//   tessera-bench --mode=smart --shards=2 --workload=lookup_update --seconds=5

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "base/command_line.h"
#include "benchmarks/bench/report.h"
#include "benchmarks/bench/runner.h"
#include "embedding/storage/files.h"
#include "google/protobuf/util/json_util.h"

ABSL_FLAG(std::string, scenarios, "",
          "JSON file of scenarios (benchmarks/scenarios/*.json); "
          "empty = one scenario from the flags below");
ABSL_FLAG(std::string, prices, "",
          "price table (default: benchmarks/prices.json beside the "
          "scenarios, or in the source tree)");
ABSL_FLAG(std::string, out, "bench-out", "directory for results.jsonl, report.md and plots");
ABSL_FLAG(std::string, only, "", "run only the scenario of this name");
ABSL_FLAG(std::string, name, "flags", "scenario from flags: its name");
ABSL_FLAG(std::string, mode, "inproc", "scenario from flags: inproc, coordinator or smart");
ABSL_FLAG(int, shards, 1, "scenario from flags: shards");
ABSL_FLAG(int, batch_size, 4096, "scenario from flags: samples per step");
ABSL_FLAG(int64_t, rows, 1000000, "scenario from flags: rows per table");
ABSL_FLAG(int, dim, 64, "scenario from flags: embedding dimension");
ABSL_FLAG(std::string, dtype, "fp32", "scenario from flags: stored weights, fp32, fp16 or bf16");
ABSL_FLAG(int, num_tables, 1, "scenario from flags: tables");
ABSL_FLAG(std::string, distribution, "uniform", "scenario from flags: uniform or zipf");
ABSL_FLAG(double, zipf_s, 1.05, "scenario from flags: Zipf exponent");
ABSL_FLAG(std::string, workload, "lookup_update",
          "scenario from flags: lookup, update, lookup_update or train");
ABSL_FLAG(int, max_staleness, 0, "scenario from flags: steps in flight (0 = sync)");
ABSL_FLAG(double, seconds, 5, "scenario from flags: measured seconds");
ABSL_FLAG(double, warmup_seconds, 1, "scenario from flags: warm-up seconds");

namespace tessera::bench {
namespace {

absl::StatusOr<std::string> Read(const std::string& path, const char* what) {
  absl::StatusOr<std::string> text = storage::ReadFile(path);
  if (!text.ok()) {
    return absl::NotFoundError(
        absl::StrCat("cannot read the ", what, " ", path, ": ", text.status().message()));
  }
  return text;
}

template <typename Message>
absl::StatusOr<Message> ParseJson(const std::string& path, const char* what) {
  absl::StatusOr<std::string> text = Read(path, what);
  if (!text.ok()) return text.status();
  Message m;
  const auto s = google::protobuf::util::JsonStringToMessage(*text, &m);
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a valid ", what, ": ", std::string(s.message())));
  }
  return m;
}

// The directory of this binary (tessera-shard and tessera-coordinator sit beside it).
std::string BinDir() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "." : self.parent_path().string();
}

// The one scenario the flags describe (without --scenarios).
Scenario ScenarioFromFlags() {
  Scenario s;
  s.set_name(absl::GetFlag(FLAGS_name));
  s.set_mode(absl::GetFlag(FLAGS_mode));
  s.set_shards(absl::GetFlag(FLAGS_shards));
  s.set_batch_size(absl::GetFlag(FLAGS_batch_size));
  TableSpec* t = s.add_tables();
  t->set_count(absl::GetFlag(FLAGS_num_tables));
  t->set_rows(absl::GetFlag(FLAGS_rows));
  t->set_dim(absl::GetFlag(FLAGS_dim));
  t->set_dtype(absl::GetFlag(FLAGS_dtype));
  s.set_distribution(absl::GetFlag(FLAGS_distribution));
  s.set_zipf_s(absl::GetFlag(FLAGS_zipf_s));
  s.set_workload(absl::GetFlag(FLAGS_workload));
  s.set_max_staleness(absl::GetFlag(FLAGS_max_staleness));
  s.set_seconds(absl::GetFlag(FLAGS_seconds));
  s.set_warmup_seconds(absl::GetFlag(FLAGS_warmup_seconds));
  return s;
}

absl::Status Run() {
  std::vector<Scenario> scenarios;
  const std::string file = absl::GetFlag(FLAGS_scenarios);
  std::string prices_path = absl::GetFlag(FLAGS_prices);
  if (!file.empty()) {
    absl::StatusOr<ScenarioFile> f = ParseJson<ScenarioFile>(file, "scenario file");
    if (!f.ok()) return f.status();
    for (const auto& s : f->scenarios()) {
      if (absl::GetFlag(FLAGS_only).empty() || s.name() == absl::GetFlag(FLAGS_only)) {
        scenarios.push_back(s);
      }
    }
    if (scenarios.empty()) return absl::NotFoundError(absl::StrCat("no scenario to run in ", file));
    if (prices_path.empty()) {
      prices_path =
          (std::filesystem::path(file).parent_path().parent_path() / "prices.json").string();
    }
  } else {
    scenarios.push_back(ScenarioFromFlags());
  }
  Prices prices;
  bool example_prices = false;
  if (!prices_path.empty() && std::filesystem::exists(prices_path)) {
    absl::StatusOr<Prices> p = ParseJson<Prices>(prices_path, "price table");
    if (!p.ok()) return p.status();
    prices = *p;
    for (const auto& [name, node] : prices.nodes()) example_prices |= node.example();
  } else {
    prices_path.clear();
  }
  const ReportContext context = NewReportContext(
      absl::StrCat("tessera-bench: ", file.empty() ? absl::GetFlag(FLAGS_name) : file),
      prices_path, example_prices);
  // Check every scenario before running any.
  for (auto& s : scenarios) {
    absl::Status ok = Normalize(&s);
    if (!ok.ok()) return ok;
  }
  RunOptions options;
  options.bin_dir = BinDir();
  options.prices = &prices;
  options.progress = [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  std::vector<ScenarioResult> results;
  for (size_t i = 0; i < scenarios.size(); ++i) {
    std::printf("[%zu/%zu] %s\n", i + 1, scenarios.size(), scenarios[i].name().c_str());
    absl::StatusOr<ScenarioResult> r = RunScenario(scenarios[i], options);
    if (!r.ok()) return r.status();
    results.push_back(*std::move(r));
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  absl::StatusOr<std::vector<std::string>> pngs = WriteReport(results, out, context);
  if (!pngs.ok()) return pngs.status();
  std::printf("\n%s\nresults: %s/results.jsonl, %s/report.md\n",
              ToMarkdown(results, context).c_str(), out.c_str(), out.c_str());
  if (pngs->empty()) {
    std::printf(
        "plots: gnuplot is not installed (apt-get install gnuplot-nox); the script is "
        "%s/plots.gp\n",
        out.c_str());
  }
  for (const auto& p : *pngs) std::printf("plot: %s\n", p.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace tessera::bench

int main(int argc, char** argv) {
  tessera::base::ParseCommandLine(
      argc, argv, "tessera-bench",
      "Benchmarks Tessera setups side by side: tessera-bench --scenarios=FILE --out=DIR");
  absl::Status s = tessera::bench::Run();
  if (!s.ok()) {
    std::cerr << "tessera-bench: " << s << "\n";
    return 1;
  }
  return 0;
}
