#include "server/serving.h"

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/support/log.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/reflection_v1.h"

namespace tessera::server {
namespace {

sigset_t ShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

// A v1 reflection service listing `service` and the services every server has; it lives as
// long as the process (a grpc::Server does not own its services).
grpc::Service* ReflectionFor(const std::string& service) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* kept = new std::vector<std::unique_ptr<ReflectionV1>>();
  std::vector<std::string> names = {"grpc.health.v1.Health",
                                    "grpc.reflection.v1alpha.ServerReflection",
                                    "grpc.reflection.v1.ServerReflection"};
  if (!service.empty()) names.insert(names.begin(), service);
  absl::MutexLock lock(&mu);
  kept->push_back(std::make_unique<ReflectionV1>(std::move(names)));
  return kept->back().get();
}

// gRPC's lines logged while a server starts, held back: a port that cannot be bound is
// logged as a whole error tree, where StartServer's own message says what to do.
struct HeldLine {
  gpr_log_func_args args;  // its message points into `text` when passed on
  std::string text;
};
absl::Mutex held_mu(absl::kConstInit);
std::vector<HeldLine>* held ABSL_GUARDED_BY(held_mu) = nullptr;

// gRPC's own format: "E1206 04:30:33.252831 chttp2_server.cc:1045] message".
void WriteLine(const gpr_log_func_args& args) {
  const absl::Time now = absl::Now();
  const char* file = std::strrchr(args.file, '/');
  std::fprintf(stderr, "%s%s %s:%d] %s\n", gpr_log_severity_string(args.severity),
               absl::FormatTime("%m%d %H:%M:%E6S", now, absl::UTCTimeZone()).c_str(),
               file == nullptr ? args.file : file + 1, args.line, args.message);
}

// Installed once a server starts: holds lines while one starts, writes them otherwise.
void HoldLine(gpr_log_func_args* args) {
  absl::MutexLock lock(&held_mu);
  if (held == nullptr) {
    WriteLine(*args);
    return;
  }
  held->push_back(HeldLine{*args, args->message});
}

// Runs `start` with gRPC's log lines held; passes them on when a server started.
std::unique_ptr<grpc::Server> StartQuietly(
    const std::function<std::unique_ptr<grpc::Server>()>& start, const int* port) {
  std::vector<HeldLine> lines;
  {
    absl::MutexLock lock(&held_mu);
    held = &lines;
  }
  gpr_set_log_function(HoldLine);
  std::unique_ptr<grpc::Server> server = start();
  absl::MutexLock lock(&held_mu);
  held = nullptr;
  if (server == nullptr || *port == 0) return server;
  for (HeldLine& line : lines) {
    line.args.message = line.text.c_str();
    WriteLine(line.args);
  }
  return server;
}

}  // namespace

absl::StatusOr<std::unique_ptr<grpc::Server>> StartServer(grpc::Service* service,
                                                          const ListenOptions& options, int* port) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--port must be in [0, 65535] (0 picks a free one), got ", options.port));
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  const std::string address = absl::StrCat(options.host, ":", options.port);
  builder.AddListeningPort(
      address, options.credentials ? options.credentials : grpc::InsecureServerCredentials(), port);
  // gRPC sets SO_REUSEPORT by default: a second server on a taken port would start and
  // take a share of the connections. One server per port, or none.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.RegisterService(service);
  if (options.reflection) builder.RegisterService(ReflectionFor(options.service_name));
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  creators.push_back(observability::RpcLogInterceptors(options.shard_index));
  if (options.metrics != nullptr) creators.push_back(options.metrics->RpcInterceptors());
  builder.experimental().SetInterceptorCreators(std::move(creators));
  std::unique_ptr<grpc::Server> server =
      StartQuietly([&builder] { return builder.BuildAndStart(); }, port);
  if (server == nullptr || *port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", address,
        options.port != 0 ? " (is another server on that port? pick a free --port)" : ""));
  }
  if (!options.service_name.empty() && server->GetHealthCheckService() != nullptr) {
    server->GetHealthCheckService()->SetServingStatus(options.service_name, true);
  }
  return server;
}

void BlockShutdownSignals() {
  const sigset_t set = ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void ServeUntilShutdownSignal(grpc::Server* server, const std::string& name) {
  const sigset_t set = ShutdownSignals();
  int signal = 0;
  sigwait(&set, &signal);
  std::cerr << name << ": signal " << signal << ", shutting down" << std::endl;
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server->Wait();
}

}  // namespace tessera::server
