#ifndef TESSERA_BENCHMARKS_BENCH_REPORT_H_
#define TESSERA_BENCHMARKS_BENCH_REPORT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "benchmarks/bench/runner.h"

namespace tessera::bench {

// What a report says about the run it comes from.
struct ReportContext {
  std::string title = "tessera-bench";  // what was run (the scenario file)
  std::string machine;                  // MachineDescription()
  std::string date;                     // when, UTC ISO-8601
  std::string prices;                   // the price table's path ("" = none)
  bool example_prices = false;          // it holds example figures, not quotes
};

// This machine in one line: CPU model, CPUs this process may use, memory, last-level
// cache ("" for what cannot be read).
std::string MachineDescription();

// A context with this machine and the time now.
ReportContext NewReportContext(const std::string& title, const std::string& prices_path,
                               bool example_prices);

// One JSON object (one line) per scenario: its settings and every figure.
std::string ToJson(const ScenarioResult& r);

// A Markdown report: a title, the machine and date, a table of all scenarios with a legend
// of its columns; throughput and cost are also given as ratios to the first scenario of
// the same workload (training is not compared with lookups).
std::string ToMarkdown(const std::vector<ScenarioResult>& results,
                       const ReportContext& context = {});

// Writes results.jsonl and report.md into `dir`, and, when gnuplot is installed, the
// data and script for three plots and the PNGs themselves: throughput vs shards, step
// latency percentiles, cost per million samples. Returns the PNGs written.
absl::StatusOr<std::vector<std::string>> WriteReport(const std::vector<ScenarioResult>& results,
                                                     const std::string& dir,
                                                     const ReportContext& context = {});

}  // namespace tessera::bench

#endif  // TESSERA_BENCHMARKS_BENCH_REPORT_H_
