// main() of the Google Benchmark binaries: benchmark's own, after what every Tessera
// binary does first (abseil's mutex deadlock detection off; see base/process_settings.h).

#include "base/process_settings.h"
#include "benchmark/benchmark.h"

int main(int argc, char** argv) {
  tessera::base::DisableMutexDeadlockDetection();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
