#include "benchmarks/bench/local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace tessera::bench {
namespace {

bool WaitHealthy(const std::string& address, int seconds) {
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_wait_for_ready(true);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  grpc::health::v1::HealthCheckResponse resp;
  return health->Check(&ctx, {}, &resp).ok() &&
         resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

}  // namespace

absl::StatusOr<LocalCluster::Process> LocalCluster::Spawn(const std::string& binary,
                                                          const std::string& name,
                                                          std::vector<std::string> args) {
  if (access(binary.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(binary, " not found; build it first"));
  }
  args.insert(args.begin(), {binary, "--port=0"});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fds[2];
  if (pipe(fds) != 0) return absl::InternalError("pipe failed");
  Process p;
  p.name = name;
  p.pid = fork();
  if (p.pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  close(fds[1]);
  FILE* out = fdopen(fds[0], "r");
  char line[256] = {0};
  if (out != nullptr && fgets(line, sizeof(line), out) != nullptr) {
    const std::string s(line);
    int port = 0;
    const size_t colon = s.rfind(':');
    if (colon != std::string::npos && absl::SimpleAtoi(s.substr(colon + 1), &port)) {
      p.address = absl::StrCat("127.0.0.1:", port);
    }
  }
  if (out != nullptr) fclose(out);
  processes_.push_back(p);  // stopped by the destructor whatever happens next
  if (p.address.empty() || !WaitHealthy(p.address, 20)) {
    return absl::UnavailableError(absl::StrCat(name, " (", binary, ") did not start"));
  }
  return p;
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
  for (const Process& p : processes_) kill(p.pid, SIGTERM);
  for (const Process& p : processes_) {
    for (int i = 0; i < 50; ++i) {
      if (waitpid(p.pid, nullptr, WNOHANG) == p.pid) break;
      if (i == 49) {
        kill(p.pid, SIGKILL);
        waitpid(p.pid, nullptr, 0);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

}  // namespace tessera::bench
