#include "server/serving.h"

#include <signal.h>

#include <chrono>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "grpcpp/health_check_service_interface.h"

namespace tessera::server {
namespace {

sigset_t ShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
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
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  creators.push_back(base::RpcLogInterceptors(options.shard_index));
  if (options.metrics != nullptr) creators.push_back(options.metrics->RpcInterceptors());
  builder.experimental().SetInterceptorCreators(std::move(creators));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
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
