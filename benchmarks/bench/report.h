#ifndef TESSERA_BENCHMARKS_BENCH_REPORT_H_
#define TESSERA_BENCHMARKS_BENCH_REPORT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "benchmarks/bench/runner.h"

namespace tessera::bench {

// One JSON object (one line) per scenario: its settings and every figure.
std::string ToJson(const ScenarioResult& r);

// A Markdown table of all scenarios; throughput and cost are also given as ratios to the
// first scenario (the comparison a user makes between setups).
std::string ToMarkdown(const std::vector<ScenarioResult>& results);

// Writes results.jsonl and report.md into `dir`, and, when gnuplot is installed, the
// data and script for three plots and the PNGs themselves: throughput vs shards, step
// latency percentiles, cost per million samples. Returns the PNGs written.
absl::StatusOr<std::vector<std::string>> WriteReport(const std::vector<ScenarioResult>& results,
                                                     const std::string& dir);

}  // namespace tessera::bench

#endif  // TESSERA_BENCHMARKS_BENCH_REPORT_H_
