#ifndef TESSERA_SERVER_SERVING_H_
#define TESSERA_SERVER_SERVING_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/channel_policy.h"
#include "grpcpp/grpcpp.h"
#include "observability/logging.h"
#include "observability/metrics.h"

namespace tessera::server {

struct ListenOptions {
  std::string host = "127.0.0.1";     // loopback unless told otherwise
  int port = 0;                       // 0 picks a free port
  int max_message_bytes = client::kMaxMessageBytes;  // largest message accepted or sent
  std::shared_ptr<grpc::ServerCredentials>
      credentials;             // TLS (MakeServerCredentials); null: plaintext
  observability::Metrics* metrics =
      nullptr;                 // counts and times every RPC when set; must outlive the server
  int shard_index = -1;        // named in the RPC log lines; -1: not a shard
  // The service's full name ("tessera.v1.EmbeddingShard"): health checks for it are answered
  // SERVING as for "" (clients in other languages ask by name).
  std::string service_name;
  // Serve gRPC reflection, v1alpha (grpc++_reflection's plugin: the caller has called
  // grpc::reflection::InitProtoReflectionServerBuilderPlugin()) and v1 (ReflectionV1).
  bool reflection = false;
};

// Starts a gRPC server for `service` with the default health service enabled, and sets
// `*port` to the port it bound. InvalidArgument for a port outside [0, 65535], Unavailable
// when it cannot listen, a port in use by another process included (SO_REUSEPORT is off).
absl::StatusOr<std::unique_ptr<grpc::Server>> StartServer(grpc::Service* service,
                                                          const ListenOptions& options, int* port);

// Blocks SIGTERM and SIGINT in this and every later thread; call before StartServer.
void BlockShutdownSignals();

// Waits until SIGTERM or SIGINT arrives, then lets calls in flight finish (up to 5 s)
// and stops the server.
void ServeUntilShutdownSignal(grpc::Server* server, const std::string& name);

}  // namespace tessera::server

#endif  // TESSERA_SERVER_SERVING_H_
