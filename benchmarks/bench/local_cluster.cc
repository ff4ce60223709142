#include "benchmarks/bench/local_cluster.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "client/health_check.h"

namespace tessera::bench {

absl::StatusOr<LocalCluster::Process> LocalCluster::Spawn(const std::string& binary,
                                                          const std::string& name,
                                                          std::vector<std::string> args) {
  if (access(binary.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(binary, " not found; build it first"));
  }
  // Stopped by the destructor whatever happens next.
  servers_.push_back(std::make_unique<base::ServerProcess>(binary, args, /*quiet=*/true));
  const base::ServerProcess& server = *servers_.back();
  processes_.push_back(Process{name, server.pid(), server.address()});
  if (server.address().empty() || !client::WaitHealthy(server.address(), 20)) {
    return absl::UnavailableError(absl::StrCat(name, " (", binary, ") did not start"));
  }
  return processes_.back();
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(const std::string& bin_dir,
                                                                  int shards) {
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  std::string list;
  for (int k = 0; k < shards; ++k) {
    absl::StatusOr<Process> p =
        c->Spawn(bin_dir + "/tessera-shard", absl::StrCat("shard-", k),
                 {absl::StrCat("--shard_index=", k), absl::StrCat("--num_shards=", shards),
                  "--max_batch_ids=16777216"});
    if (!p.ok()) return p.status();
    absl::StrAppend(&list, k ? "," : "", p->address);
  }
  absl::StatusOr<Process> coordinator =
      c->Spawn(bin_dir + "/tessera-coordinator", "coordinator",
               {absl::StrCat("--shards=", list), "--max_batch_ids=16777216"});
  if (!coordinator.ok()) return coordinator.status();
  return c;
}

LocalCluster::~LocalCluster() {
  // Every server is asked to stop first, so that they stop together; each then gets 5 s.
  for (const auto& s : servers_) {
    if (s->pid() > 0) kill(s->pid(), SIGTERM);
  }
  for (const auto& s : servers_) s->Terminate(std::chrono::seconds(5));
}

}  // namespace tessera::bench
