#ifndef TESSERA_BENCHMARKS_BENCH_RUNNER_H_
#define TESSERA_BENCHMARKS_BENCH_RUNNER_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "benchmarks/bench/scenario.pb.h"

namespace tessera::bench {

struct ProcessFigures {
  std::string name;
  int64_t peak_rss_bytes = 0;
  double cpu_seconds = 0;  // during the measured phase
};

// What one scenario measured.
struct ScenarioResult {
  Scenario scenario;  // with defaults filled in
  int64_t steps = 0;
  int64_t samples = 0;
  double seconds = 0;
  double samples_per_s = 0;
  double lookups_per_s = 0;        // ids looked up
  double updates_per_s = 0;        // ids pushed
  double payload_bytes_per_s = 0;  // 8 per id sent, 4 x dim per row received or pushed
  double step_ms[3] = {0, 0, 0};   // p50, p99, p99.9 of a step
  double call_ms[3] = {0, 0, 0};   // p50, p99, p99.9 of one collection call (an RPC remotely)
  // The tables' rows in bytes (weights in their dtype and the optimizer's state, every
  // table), and the last-level cache this machine reports, so a reader can tell whether
  // the working set fits in it.
  int64_t table_bytes = 0;
  int64_t llc_bytes = 0;
  std::vector<ProcessFigures> processes;
  double cpu_us_per_sample = 0;  // all processes
  // Memory ceiling, same run: memcpy bytes/s moving the step's payload bytes out of a
  // buffer the size of the tables (capped at 1 GiB); vs_memcpy = payload over that.
  double memcpy_bytes_per_s = 0;
  double vs_memcpy = 0;
  // Transport ceiling, same run (cluster modes): a raw gRPC echo carrying one call's
  // payload (a lookup's ids and rows), unary and on one stream; vs_echo = payload bytes/s
  // over the unary echo's.
  double echo_bytes_per_s = 0;
  double echo_stream_bytes_per_s = 0;
  double vs_echo = 0;
  // Dense compute ceiling, same run (train workload): Eigen GEMM GFLOP/s at the model's
  // layer shapes and batch, one thread as the CPU backend (cuBLAS over all the step's GEMMs
  // with dense_backend cuda); step_gflops counts the step's
  // matrix FLOPs (forward and backward) over its time; vs_gemm = step over ceiling.
  double gemm_gflops = 0;
  double step_gflops = 0;
  double vs_gemm = 0;
  // Train workload: where a step's time goes (ms per step, mean over the workers and the
  // measured steps; trainer::StepTimes), and with workers > 1 the dense gradients'
  // allreduce among them (waiting for the slowest included). dense_ms is the dense
  // network's forward, backward and optimizer; grads_ms the embedding gradients'
  // preparation for the push (deduplication and pooling's backward, on the CPU).
  double lookup_ms = 0, dense_ms = 0, grads_ms = 0, allreduce_ms = 0, push_ms = 0;
  // The tables' work wherever it ran (trainer::StepTimes::sparse_work) and the step's own
  // time: pipelined, a step nears the larger of sparse work and dense.
  double sparse_work_ms = 0, train_step_ms = 0;
  // Train workload: the dense step alone (dense_ms: forward, backward and optimizer, with
  // the CUDA backend's copies), samples/s at the batch per worker, and its matrix GFLOP/s over
  // the GEMM ceiling of its backend at the same shapes (gemm_gflops: Eigen for cpu, cuBLAS
  // for cuda, where every GEMM of the step is timed).
  double dense_samples_per_s = 0;
  double dense_vs_gemm = 0;
  double usd_per_hour = 0;  // of the scenario's nodes
  double usd_per_million_samples = 0;
};

struct RunOptions {
  std::string bin_dir;  // where tessera-shard and tessera-coordinator are
  const Prices* prices = nullptr;
  std::function<void(const std::string&)> progress;  // progress lines
};

// Fills unset fields with their defaults and checks the rest: InvalidArgument naming the
// field.
absl::Status Normalize(Scenario* s);

// Starts what `scenario` needs (in-process tables, or a local cluster), warms up, runs
// for its time or step budget, measures, and stops everything.
absl::StatusOr<ScenarioResult> RunScenario(const Scenario& scenario, const RunOptions& options);

}  // namespace tessera::bench

#endif  // TESSERA_BENCHMARKS_BENCH_RUNNER_H_
