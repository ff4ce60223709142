#ifndef TESSERA_BENCHMARKS_BENCH_LOCAL_CLUSTER_H_
#define TESSERA_BENCHMARKS_BENCH_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/child_process.h"

namespace tessera::bench {

// Shard processes and a coordinator on 127.0.0.1, each on a free port, started from the
// binaries in `bin_dir` and stopped (SIGTERM, then SIGKILL) on destruction.
class LocalCluster {
 public:
  struct Process {
    std::string name;  // "shard-0", ..., "coordinator"
    pid_t pid = -1;
    std::string address;  // 127.0.0.1:PORT
  };

  // Starts `shards` shards and a coordinator and waits (bounded) until all are healthy.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const std::string& bin_dir,
                                                             int shards);
  ~LocalCluster();

  const std::string& coordinator() const { return processes_.back().address; }
  const std::vector<Process>& processes() const { return processes_; }

 private:
  LocalCluster() = default;
  absl::StatusOr<Process> Spawn(const std::string& binary, const std::string& name,
                                std::vector<std::string> args);

  std::vector<Process> processes_;
  std::vector<std::unique_ptr<base::ServerProcess>> servers_;  // as processes_
};

}  // namespace tessera::bench

#endif  // TESSERA_BENCHMARKS_BENCH_LOCAL_CLUSTER_H_
