#ifndef TESSERA_TESTS_TRAIN_PROCESS_H_
#define TESSERA_TESTS_TRAIN_PROCESS_H_

// tessera-train runs for the tests that train through a real cluster: a cluster of shard
// processes and a coordinator on 127.0.0.1, tessera-train run to its end or in the
// background, and what its output says.

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/shard_process.h"
#include "tests/support/temp_dir.h"

namespace tessera::testing {

// A directory of this process's own: two suites running at once must not share files.
inline const std::string& ScratchDir() { return ProcessScratchDir(); }

// A cluster of `n` shards and a coordinator.
struct Cluster {
  // `n` shards, each started with `shard_flags`, and a coordinator.
  explicit Cluster(int n, const std::vector<std::string>& shard_flags = {}) {
    std::string list;
    for (int k = 0; k < n; ++k) {
      shards.push_back(std::make_unique<ShardProcess>(k, n, shard_flags));
      if (!shards[k]->address().empty() && client::WaitHealthy(shards[k]->address())) {
        absl::StrAppend(&list, k ? "," : "", shards[k]->address());
      }
    }
    coordinator = std::make_unique<base::ServerProcess>(
        TESSERA_COORDINATOR_BIN, std::vector<std::string>{absl::StrCat("--shards=", list)});
    ok = !coordinator->address().empty() && client::WaitHealthy(coordinator->address());
  }
  bool ok = false;
  std::vector<std::unique_ptr<ShardProcess>> shards;
  std::unique_ptr<base::ServerProcess> coordinator;
};

// Runs shell command `command` to its end; its exit code, with stdout and stderr in
// *output.
inline int RunCommand(const std::string& command, std::string* output) {
  FILE* p = popen(absl::StrCat(command, " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Runs tessera-train with `args` to its end, as RunCommand.
inline int RunTrain(const std::string& args, std::string* output) {
  return RunCommand(absl::StrCat(TESSERA_TRAIN_BIN, " ", args), output);
}

using base::LoggedProcess;

// tessera-train in the background with `args` (space-separated).
class TrainProcess : public LoggedProcess {
 public:
  TrainProcess(const std::string& args, const std::string& log)
      : LoggedProcess(Argv(args), log) {}

 private:
  static std::vector<std::string> Argv(const std::string& args) {
    std::vector<std::string> argv = {TESSERA_TRAIN_BIN};
    for (absl::string_view a : absl::StrSplit(args, ' ', absl::SkipEmpty())) argv.emplace_back(a);
    return argv;
  }
};

// The loss trajectory of a metrics file: its train records without their timing fields.
inline std::vector<std::string> TrainRecords(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);) {
    if (l.find("\"event\":\"train\"") == std::string::npos) continue;
    const size_t loss = l.find("\"loss\":");
    out.push_back(l.substr(loss, l.find(',', loss) - loss));
  }
  return out;
}

// The held-out AUC a run printed, or -1.
inline double HeldOutAuc(const std::string& out) {
  const size_t at = out.find("held-out:");
  const size_t auc = out.find("auc ", at);
  if (at == std::string::npos || auc == std::string::npos) return -1;
  return std::stod(out.substr(auc + 4));
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TRAIN_PROCESS_H_
