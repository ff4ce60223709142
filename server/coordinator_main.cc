// tessera-coordinator: owns table configs and the shard map, and routes lookups and
// gradient pushes to the shards. Serves Coordinator, gRPC health and reflection.

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/shard_router.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "server/coordinator_service.h"
#include "server/serving.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "address to bind (loopback unless told otherwise)");
ABSL_FLAG(int, port, 0, "port to listen on; 0 picks a free one and prints it");
ABSL_FLAG(std::string, shards, "", "comma-separated host:port of shards 0, 1, ...");
ABSL_FLAG(uint64_t, shard_map_version, 1, "version of the shard map the shards serve");
ABSL_FLAG(int64_t, max_batch_ids, 1 << 20, "ids per request before RESOURCE_EXHAUSTED");
ABSL_FLAG(int, shard_deadline_ms, 10000, "deadline of each call to a shard");
ABSL_FLAG(int, max_message_bytes, 256 << 20, "largest gRPC message accepted or sent");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Routes Tessera lookups and pushes to shards: --shards=127.0.0.1:7001,127.0.0.1:7002");
  absl::ParseCommandLine(argc, argv);
  std::vector<std::string> shards =
      absl::StrSplit(absl::GetFlag(FLAGS_shards), ',', absl::SkipEmpty());
  if (shards.empty()) {
    std::cerr << "tessera-coordinator: --shards is required (host:port,...)\n";
    return 1;
  }
  tessera::client::RouterOptions ro;
  ro.deadline = std::chrono::milliseconds(absl::GetFlag(FLAGS_shard_deadline_ms));
  ro.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  ro.shard_map_version = absl::GetFlag(FLAGS_shard_map_version);
  tessera::client::ShardRouter router(shards, ro);
  tessera::server::CoordinatorOptions co;
  co.max_batch_ids = absl::GetFlag(FLAGS_max_batch_ids);
  tessera::server::CoordinatorService service(&router, ro.shard_map_version, co);

  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  tessera::server::BlockShutdownSignals();
  tessera::server::ListenOptions listen;
  listen.host = absl::GetFlag(FLAGS_host);
  listen.port = absl::GetFlag(FLAGS_port);
  listen.max_message_bytes = ro.max_message_bytes;
  int port = 0;
  auto server = tessera::server::StartServer(&service, listen, &port);
  if (!server.ok()) {
    std::cerr << "tessera-coordinator: " << server.status().message() << "\n";
    return 1;
  }
  std::cout << "tessera-coordinator: " << shards.size() << " shard(s), listening on " << listen.host
            << ":" << port << std::endl;
  tessera::server::ServeUntilShutdownSignal(server->get(), "tessera-coordinator");
  return 0;
}
