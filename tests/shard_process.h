#ifndef TESSERA_TESTS_SHARD_PROCESS_H_
#define TESSERA_TESTS_SHARD_PROCESS_H_

// Tessera's servers as child processes of a test: a shard, and a cluster on data
// directories. (The binaries' paths come from the test's TESSERA_*_BIN definitions.)

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/child_process.h"
#include "client/health_check.h"

namespace tessera::testing {

#ifdef TESSERA_SHARD_BIN
// Shard `index` of `shards`, with `extra` flags.
class ShardProcess : public base::ServerProcess {
 public:
  ShardProcess(int index, int shards, const std::vector<std::string>& extra = {})
      : base::ServerProcess(TESSERA_SHARD_BIN, Args(index, shards, extra)) {}

 private:
  static std::vector<std::string> Args(int index, int shards,
                                       const std::vector<std::string>& extra) {
    std::vector<std::string> args = {absl::StrCat("--shard_index=", index),
                                     absl::StrCat("--num_shards=", shards)};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
};
#endif

#if defined(TESSERA_SHARD_BIN) && defined(TESSERA_COORDINATOR_BIN)
// Servers on data directories that can all be stopped and started again on their ports.
struct DurableCluster {
  DurableCluster(int n, std::string root) : n(n), root(std::move(root)) {}

  bool Start() {
    shards.clear();
    std::string list;
    for (int k = 0; k < n; ++k) {
      shards.emplace_back();
      if (!StartShard(k)) return false;
      absl::StrAppend(&list, k ? "," : "", shards[k]->address());
    }
    std::vector<std::string> args = {
        "--shards=" + list,
        "--data_dir=" + (coordinator_dir.empty() ? root + "/coordinator" : coordinator_dir)};
    if (!coordinator_port.empty()) args.push_back("--port=" + coordinator_port);
    coordinator = std::make_unique<base::ServerProcess>(TESSERA_COORDINATOR_BIN, args);
    const std::string& a = coordinator->address();
    if (a.empty() || !client::WaitHealthy(a)) return false;
    coordinator_port = a.substr(a.rfind(':') + 1);
    return true;
  }
  // Kills shard k (SIGKILL) and starts it again on its port and data directory.
  bool RestartShard(int k) {
    shards[k].reset();
    return StartShard(k);
  }
  bool StartShard(int k) {
    std::vector<std::string> args = {absl::StrCat("--shard_index=", k),
                                     absl::StrCat("--num_shards=", n),
                                     absl::StrCat("--data_dir=", root, "/shard-", k)};
    if (ports.size() > static_cast<size_t>(k)) args.push_back("--port=" + ports[k]);
    shards[k] = std::make_unique<base::ServerProcess>(TESSERA_SHARD_BIN, args);
    const std::string& a = shards[k]->address();
    if (a.empty() || !client::WaitHealthy(a)) return false;
    if (ports.size() <= static_cast<size_t>(k)) ports.push_back(a.substr(a.rfind(':') + 1));
    return true;
  }
  void KillAll() {
    coordinator.reset();
    shards.clear();
  }

  const int n;
  const std::string root;
  std::string coordinator_dir;  // empty: root/coordinator
  std::vector<std::string> ports;
  std::string coordinator_port;
  std::vector<std::unique_ptr<base::ServerProcess>> shards;
  std::unique_ptr<base::ServerProcess> coordinator;
};
#endif

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_SHARD_PROCESS_H_
