// main() of the Google Benchmark binaries: benchmark's own, after what every Tessera
// binary does first (abseil's mutex deadlock detection off; see embedding_table.h).

#include "benchmark/benchmark.h"
#include "embedding/embedding_table.h"

int main(int argc, char** argv) {
  tessera::embedding::DisableMutexDeadlockDetection();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
