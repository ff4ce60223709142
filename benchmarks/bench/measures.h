#ifndef TESSERA_BENCHMARKS_BENCH_MEASURES_H_
#define TESSERA_BENCHMARKS_BENCH_MEASURES_H_

// What tessera-bench measures beside a run's own figures: its processes' memory and CPU
// time (process_stats.cc), and the transport's ceiling on this machine (echo_ceiling.cc).

#include <sys/types.h>

#include <cstdint>
#include <vector>

namespace tessera::bench {

// The p-th percentile (0..100) of `values` by nearest rank; 0 when empty. Reorders them.
double Percentile(std::vector<double>& values, double p);

// What /proc says of one process: peak resident memory and CPU time so far (all threads).
struct ProcessUsage {
  int64_t peak_rss_bytes = 0;
  double cpu_seconds = 0;
};

// Zeros when the process is gone or /proc cannot be read.
ProcessUsage ReadProcessUsage(pid_t pid);

// Starts the process's peak resident memory again from its current size (Linux
// clear_refs); silently nothing where that is not allowed.
void ResetPeakRss(pid_t pid);

// The transport ceiling, measured on 127.0.0.1 with a gRPC echo server in this process:
// bytes/s of calls sending `sent` and receiving `received` bytes, as unary calls and as
// request/response pairs on one bidirectional stream (about `seconds` each).
struct EchoCeiling {
  double unary_bytes_per_s = 0;
  double stream_bytes_per_s = 0;
};
EchoCeiling MeasureEcho(int64_t sent, int64_t received, double seconds = 0.5);

}  // namespace tessera::bench

#endif  // TESSERA_BENCHMARKS_BENCH_MEASURES_H_
