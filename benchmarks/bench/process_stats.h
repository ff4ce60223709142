#ifndef TESSERA_BENCHMARKS_BENCH_PROCESS_STATS_H_
#define TESSERA_BENCHMARKS_BENCH_PROCESS_STATS_H_

#include <sys/types.h>

#include <cstdint>
#include <vector>

namespace tessera::bench {

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

// The p-th percentile (0..100) of `values` by nearest rank; 0 when empty. Reorders them.
double Percentile(std::vector<double>& values, double p);

}  // namespace tessera::bench

#endif  // TESSERA_BENCHMARKS_BENCH_PROCESS_STATS_H_
