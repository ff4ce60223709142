#ifndef TESSERA_TESTS_SHARD_PROCESS_H_
#define TESSERA_TESTS_SHARD_PROCESS_H_

#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace tessera::testing {

// A child process of the test: killed (SIGKILL) and reaped on destruction.
class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() { Kill(); }

  // The parent's side of DieWithParent, before fork: its pid, or 0 when the caller is not
  // the main thread. The kernel sends the death signal when the thread that forked exits,
  // so a child forked by a short-lived thread (a restart from a helper thread) must not
  // ask for it.
  static pid_t ParentToDieWith() {
    return static_cast<pid_t>(syscall(SYS_gettid)) == getpid() ? getpid() : 0;
  }
  // In a forked child, before exec: the kernel kills it (SIGKILL) when the test process
  // dies, however it dies (an abort, a sanitizer report, ctest's timeout), so no server
  // outlives its test and holds ctest's pipe open. `parent`: ParentToDieWith().
  static void DieWithParent(pid_t parent) {
    if (parent == 0) return;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(125);  // the parent died before prctl took effect
  }

  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  // Waits for the process to end; its exit code (-1 when a signal ended it).
  int WaitForExit() {
    int status = 0;
    if (pid_ <= 0 || waitpid(pid_, &status, 0) != pid_) return -1;
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 protected:
  pid_t pid_ = -1;
};

// A child server process (tessera-shard, tessera-coordinator) started with --port=0
// unless `args` names a port; its first stdout line ends in the port it listens on.
class ServerProcess : public ChildProcess {
 public:
  ServerProcess(const std::string& binary, std::vector<std::string> args) {
    // Everything is built before fork: the child of a threaded process may only exec.
    bool has_port = false;
    for (const auto& a : args) has_port |= a.rfind("--port=", 0) == 0;
    if (!has_port) args.insert(args.begin(), "--port=0");
    args.insert(args.begin(), binary);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int fds[2];
    if (pipe(fds) != 0) return;
    const pid_t parent = ParentToDieWith();
    pid_ = fork();
    if (pid_ == 0) {
      DieWithParent(parent);
      dup2(fds[1], STDOUT_FILENO);
      close(fds[0]);
      close(fds[1]);
      execv(binary.c_str(), argv.data());
      _exit(127);
    }
    close(fds[1]);
    FILE* out = fdopen(fds[0], "r");
    char line[256] = {0};
    if (out != nullptr && fgets(line, sizeof(line), out) != nullptr) {
      std::string s(line);
      const size_t colon = s.rfind(':');
      int port = 0;
      if (colon != std::string::npos && absl::SimpleAtoi(s.substr(colon + 1), &port)) {
        address_ = absl::StrCat("127.0.0.1:", port);
      }
    }
    if (out != nullptr) fclose(out);
  }
  // 127.0.0.1:PORT, or empty when the process did not start.
  const std::string& address() const { return address_; }

 private:
  std::string address_;
};

#ifdef TESSERA_SHARD_BIN
// Shard `index` of `shards`.
class ShardProcess : public ServerProcess {
 public:
  ShardProcess(int index, int shards)
      : ServerProcess(TESSERA_SHARD_BIN, {absl::StrCat("--shard_index=", index),
                                          absl::StrCat("--num_shards=", shards)}) {}
};
#endif

// Waits (bounded) until the server at `address` answers its health check as SERVING.
inline bool WaitHealthy(const std::string& address, int seconds = 10) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_wait_for_ready(true);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  grpc::health::v1::HealthCheckResponse resp;
  return health->Check(&ctx, {}, &resp).ok() &&
         resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

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
    std::vector<std::string> args = {"--shards=" + list, "--data_dir=" + root + "/coordinator"};
    if (!coordinator_port.empty()) args.push_back("--port=" + coordinator_port);
    coordinator = std::make_unique<ServerProcess>(TESSERA_COORDINATOR_BIN, args);
    const std::string& a = coordinator->address();
    if (a.empty() || !WaitHealthy(a)) return false;
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
    shards[k] = std::make_unique<ServerProcess>(TESSERA_SHARD_BIN, args);
    const std::string& a = shards[k]->address();
    if (a.empty() || !WaitHealthy(a)) return false;
    if (ports.size() <= static_cast<size_t>(k)) ports.push_back(a.substr(a.rfind(':') + 1));
    return true;
  }
  void KillAll() {
    coordinator.reset();
    shards.clear();
  }

  const int n;
  const std::string root;
  std::vector<std::string> ports;
  std::string coordinator_port;
  std::vector<std::unique_ptr<ServerProcess>> shards;
  std::unique_ptr<ServerProcess> coordinator;
};
#endif

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_SHARD_PROCESS_H_
