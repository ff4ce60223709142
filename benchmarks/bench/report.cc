#include "benchmarks/bench/report.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tessera::bench {
namespace {

std::string Tables(const Scenario& s) {
  std::vector<std::string> parts;
  for (const auto& t : s.tables()) {
    parts.push_back(absl::StrCat(t.count(), "x", t.rows(), "x", t.dim()));
  }
  return absl::StrJoin(parts, "+");
}

// The tables and how their rows (weights and optimizer state) compare with the last-level
// cache.
std::string TablesAndSize(const ScenarioResult& r) {
  std::string out = Tables(r.scenario);
  if (r.table_bytes > 0) absl::StrAppend(&out, absl::StrFormat(" (%.4g MB", r.table_bytes / 1e6));
  if (r.table_bytes > 0 && r.llc_bytes > 0) {
    absl::StrAppend(&out, absl::StrFormat(", %.2g× LLC", static_cast<double>(r.table_bytes) /
                                                             static_cast<double>(r.llc_bytes)));
  }
  if (r.table_bytes > 0) absl::StrAppend(&out, ")");
  return out;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::string ToJson(const ScenarioResult& r) {
  const Scenario& s = r.scenario;
  std::string procs;
  for (const auto& p : r.processes) {
    absl::StrAppend(&procs, procs.empty() ? "" : ",",
                    absl::StrFormat(R"({"name":%s,"peak_rss_bytes":%d,"cpu_seconds":%.3f})",
                                    JsonString(p.name), p.peak_rss_bytes, p.cpu_seconds));
  }
  return absl::StrFormat(
      R"({"scenario":%s,"mode":%s,"shards":%d,"batch_size":%d,"ids_per_sample":%d,"tables":%s,)"
      R"("distribution":%s,"zipf_s":%.3f,"optimizer":%s,"workload":%s,"max_staleness":%d,)"
      R"("steps":%d,"samples":%d,"seconds":%.3f,"samples_per_s":%.1f,"lookups_per_s":%.1f,)"
      R"("updates_per_s":%.1f,"payload_bytes_per_s":%.1f,"step_ms_p50":%.4f,"step_ms_p99":%.4f,)"
      R"("step_ms_p999":%.4f,"call_ms_p50":%.4f,"call_ms_p99":%.4f,"call_ms_p999":%.4f,)"
      R"("cpu_us_per_sample":%.3f,"memcpy_bytes_per_s":%.1f,"vs_memcpy":%.4f,)"
      R"("echo_bytes_per_s":%.1f,"echo_stream_bytes_per_s":%.1f,"vs_echo":%.4f,)"
      R"("gemm_gflops":%.3f,"step_gflops":%.3f,"vs_gemm":%.4f,"workers":%d,"lookup_ms":%.4f,)"
      R"("dense_ms":%.4f,"grads_ms":%.4f,"allreduce_ms":%.4f,"push_ms":%.4f,"dense_backend":%s,)"
      R"("dense_samples_per_s":%.1f,"dense_vs_gemm":%.4f,"sparse_work_ms":%.4f,)"
      R"("train_step_ms":%.4f,)"
      R"("usd_per_hour":%.4f,"usd_per_million_samples":%.6f,"table_bytes":%d,"llc_bytes":%d,)"
      R"("processes":[%s]})",
      JsonString(s.name()), JsonString(s.mode()), s.shards(), s.batch_size(), s.ids_per_sample(),
      JsonString(Tables(s)), JsonString(s.distribution()), s.zipf_s(), JsonString(s.optimizer()),
      JsonString(s.workload()), s.max_staleness(), r.steps, r.samples, r.seconds, r.samples_per_s,
      r.lookups_per_s, r.updates_per_s, r.payload_bytes_per_s, r.step_ms[0], r.step_ms[1],
      r.step_ms[2], r.call_ms[0], r.call_ms[1], r.call_ms[2], r.cpu_us_per_sample,
      r.memcpy_bytes_per_s, r.vs_memcpy, r.echo_bytes_per_s, r.echo_stream_bytes_per_s, r.vs_echo,
      r.gemm_gflops, r.step_gflops, r.vs_gemm, s.workers(), r.lookup_ms, r.dense_ms, r.grads_ms,
      r.allreduce_ms, r.push_ms, JsonString(s.dense_backend()), r.dense_samples_per_s,
      r.dense_vs_gemm, r.sparse_work_ms, r.train_step_ms, r.usd_per_hour,
      r.usd_per_million_samples, r.table_bytes, r.llc_bytes,
      procs);
}

std::string MachineDescription() {
  std::vector<std::string> parts;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (absl::StartsWith(line, "model name")) {
      parts.push_back(std::string(absl::StripAsciiWhitespace(line.substr(line.find(':') + 1))));
      break;
    }
  }
  cpu_set_t cpus;
  if (sched_getaffinity(0, sizeof(cpus), &cpus) == 0) {
    parts.push_back(absl::StrCat(CPU_COUNT(&cpus), " CPUs"));
  }
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    int64_t kb = 0;
    if (absl::StartsWith(line, "MemTotal:") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::StripSuffix(
                             absl::string_view(line).substr(9), "kB")),
                         &kb)) {
      parts.push_back(absl::StrFormat("%.1f GiB", kb / 1048576.0));
    }
  }
  if (const int64_t llc = sysconf(_SC_LEVEL3_CACHE_SIZE); llc > 0) {
    parts.push_back(absl::StrFormat("LLC %.0f MiB", llc / 1048576.0));
  }
  return absl::StrJoin(parts, ", ");
}

ReportContext NewReportContext(const std::string& title, const std::string& prices_path,
                               bool example_prices) {
  ReportContext c;
  c.title = title;
  c.machine = MachineDescription();
  c.date = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
  c.prices = prices_path;
  c.example_prices = example_prices;
  return c;
}

namespace {

// What the columns of the scenario table mean.
constexpr char kLegend[] =
    "Columns: **mode** inproc (tables in the process), coordinator or smart (a local cluster "
    "through the coordinator, or straight to the shards), redis (the baseline); **workload** "
    "lookup, lookup_update or train (DLRM steps); **batch** samples per step; **tables** "
    "count × rows × dim (their rows' bytes, and that against the last-level cache); "
    "**samples/s** and **vs first** (against the first scenario of the same workload); "
    "**MB/s payload** embedding bytes moved; **vs memcpy**, **vs echo**, **vs GEMM** the same "
    "run's ceilings (copying the bytes, a gRPC echo of them, the dense step's GEMMs alone); "
    "**step** and **call** latency percentiles; **CPU µs/sample** over every process; "
    "**peak RSS** of every process; **$/M samples** the node prices × time for a million "
    "samples, **cost vs first** against the first of the same workload.\n";

// The first scenario of each workload: what "vs first" compares with.
const ScenarioResult* FirstOfWorkload(const std::vector<ScenarioResult>& results,
                                      const std::string& workload) {
  for (const auto& r : results) {
    if (r.scenario.workload() == workload) return &r;
  }
  return nullptr;
}

std::string Header(const ReportContext& c) {
  std::string h = absl::StrCat("# ", c.title, "\n\n");
  if (!c.machine.empty()) absl::StrAppend(&h, "- machine: ", c.machine, "\n");
  if (!c.date.empty()) absl::StrAppend(&h, "- date: ", c.date, "\n");
  if (!c.prices.empty()) {
    absl::StrAppend(&h, "- prices: ", c.prices,
                    c.example_prices ? " (EXAMPLE figures, not quotes: costs are illustrations; "
                                       "give your own with --prices)"
                                     : "",
                    "\n");
  }
  return h + "\n";
}

}  // namespace

std::string ToMarkdown(const std::vector<ScenarioResult>& results, const ReportContext& context) {
  std::string md = Header(context);
  absl::StrAppend(
      &md,
      "| scenario | mode | shards | workload | batch | tables | samples/s | vs first | MB/s "
      "payload | vs memcpy | vs echo | vs GEMM | step p50 / p99 / p99.9 ms | call p99 ms | CPU "
      "µs/sample | peak RSS MB | $/M samples | cost vs first |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& r : results) {
    const Scenario& s = r.scenario;
    const ScenarioResult* first = FirstOfWorkload(results, s.workload());
    int64_t rss = 0;
    for (const auto& p : r.processes) rss += p.peak_rss_bytes;
    const std::string cost =
        r.usd_per_million_samples > 0 ? absl::StrFormat("%.3g", r.usd_per_million_samples) : "-";
    const std::string cost_ratio =
        r.usd_per_million_samples > 0 && first->usd_per_million_samples > 0
            ? absl::StrFormat("%.2f×", r.usd_per_million_samples / first->usd_per_million_samples)
            : "-";
    absl::StrAppend(
        &md,
        absl::StrFormat("| %s | %s | %d | %s | %d | %s | %.0f | %.2f× | %.1f | %.2f | %s | %s | "
                        "%.2f / %.2f / %.2f | %.2f | %.2f | %.0f | %s | %s |\n",
                        s.name(), s.mode(), s.shards(),
                        s.workers() > 1 ? absl::StrCat(s.workload(), " ×", s.workers(), " workers")
                                        : s.workload(),
                        s.batch_size(), TablesAndSize(r), r.samples_per_s,
                        first->samples_per_s > 0 ? r.samples_per_s / first->samples_per_s : 0,
                        r.payload_bytes_per_s / 1e6, r.vs_memcpy,
                        r.echo_bytes_per_s > 0 ? absl::StrFormat("%.2f", r.vs_echo) : "-",
                        r.gemm_gflops > 0 ? absl::StrFormat("%.2f", r.vs_gemm) : "-", r.step_ms[0],
                        r.step_ms[1], r.step_ms[2], r.call_ms[1], r.cpu_us_per_sample, rss / 1e6,
                        cost, cost_ratio));
  }
  absl::StrAppend(&md, "\n", kLegend);
  // Training scenarios: where a step's time goes, per worker.
  std::string steps;
  for (const auto& r : results) {
    const Scenario& s = r.scenario;
    if (s.workload() != "train") continue;
    const int n = std::max(1, s.workers());
    absl::StrAppend(
        &steps, absl::StrFormat("| %s | %s | %d | %d | %.0f | %.0f | %.2f | %.2f | "
                                "%.2f | %.2f | %.2f | %.0f | %.2f | %.2f | %.2f |\n",
                                s.name(), s.dense_backend(), n, s.batch_size(), r.samples_per_s,
                                r.samples_per_s / n, r.lookup_ms, r.dense_ms, r.grads_ms,
                                r.allreduce_ms, r.push_ms, r.dense_samples_per_s, r.dense_vs_gemm,
                                r.sparse_work_ms, r.train_step_ms));
  }
  if (!steps.empty()) {
    absl::StrAppend(&md,
                    "\nTraining steps, ms per step and worker (lookup and push: waiting for them "
                    "when pipelined; dense: the dense network's forward, backward and "
                    "optimizer; emb grads: the embedding gradients' deduplication for the push; "
                    "allreduce: the workers' mean of the dense gradients; sparse work: the "
                    "tables' lookups, gradients and pushes wherever they ran; step: the step's "
                    "own time, near the larger of sparse work and dense when they overlap):\n\n"
                    "| scenario | dense on | workers | batch per worker | samples/s | per worker | "
                    "lookup | dense | emb grads | allreduce | push | dense step samples/s | "
                    "dense vs GEMM | sparse work | step |\n"
                    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
                    steps);
  }
  return md;
}

absl::StatusOr<std::vector<std::string>> WriteReport(const std::vector<ScenarioResult>& results,
                                                     const std::string& dir,
                                                     const ReportContext& context) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::FailedPreconditionError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  {
    std::ofstream json(dir + "/results.jsonl");
    for (const auto& r : results) json << ToJson(r) << "\n";
    std::ofstream md(dir + "/report.md");
    md << ToMarkdown(results, context);
    if (!json || !md) return absl::InternalError(absl::StrCat("cannot write into ", dir));
  }
  // Plot data: one row per scenario, in file order.
  {
    std::ofstream data(dir + "/plot.dat");
    data << "# index name shards samples_per_s p50 p99 p999 usd_per_million\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      data << i << " \"" << r.scenario.name() << "\" " << r.scenario.shards() << " "
           << r.samples_per_s << " " << r.step_ms[0] << " " << r.step_ms[1] << " " << r.step_ms[2]
           << " " << r.usd_per_million_samples << "\n";
    }
  }
  const std::string script = dir + "/plots.gp";
  {
    std::ofstream gp(script);
    gp << "set terminal pngcairo size 900,500\n"
          "set datafile separator whitespace\n"
          "set key off\nset grid\nset style fill solid 0.6\nset boxwidth 0.6\n"
          "set xtics rotate by -30\n"
          // Bars start at zero (a bar's height is its value), and tick labels carry
          // enough digits to differ.
          "set yrange [0:*]\nset format y '%.3g'\n"
       << "set output '" << dir << "/throughput_vs_shards.png'\n"
       << "set title 'samples/s by scenario (label: shards)'\nset ylabel 'samples/s'\n"
       << "plot '" << dir
       << "/plot.dat' using 1:4:xtic(2) with boxes, '' using 1:4:3 with labels offset 0,1\n"
       << "set output '" << dir << "/latency_percentiles.png'\n"
       << "set title 'step latency (ms): p50, p99, p99.9 of each scenario'\nset ylabel 'ms'\n"
          "set yrange [*:*]\nset logscale y\nset key on\n"
       // Points, not lines: scenarios are separate setups, not a series.
       << "plot '" << dir << "/plot.dat' using 1:5:xtic(2) with points pt 7 title 'p50', "
       << "'' using 1:6 with points pt 5 title 'p99', '' using 1:7 with points pt 9 title 'p99.9'\n"
       << "unset logscale y\nset yrange [0:*]\nset key off\n"
       << "set output '" << dir << "/cost_per_million_samples.png'\n"
       << "set title 'USD per million training samples'\nset ylabel 'USD'\n"
       << "plot '" << dir << "/plot.dat' using 1:8:xtic(2) with boxes\n";
  }
  std::vector<std::string> pngs;
  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0) return pngs;
  if (std::system(absl::StrCat("gnuplot '", script, "' 2> '", dir, "/gnuplot.log'").c_str()) != 0) {
    return absl::InternalError(absl::StrCat("gnuplot failed; see ", dir, "/gnuplot.log"));
  }
  for (const char* name :
       {"throughput_vs_shards.png", "latency_percentiles.png", "cost_per_million_samples.png"}) {
    pngs.push_back(absl::StrCat(dir, "/", name));
  }
  return pngs;
}

}  // namespace tessera::bench
