// tessera-coordinator: owns table configs and the shard map, and routes lookups and
// gradient pushes to the shards. Serves Coordinator, gRPC health and reflection. With
// --data_dir, table configs and cluster checkpoint manifests are durable there.

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/command_line.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "client/channel_policy.h"
#include "client/shard_router.h"
#include "embedding/storage/coordinator_store.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "observability/logging.h"
#include "observability/metrics.h"
#include "server/auth.h"
#include "server/coordinator_service.h"
#include "server/serving.h"
#include "wire/security_flags.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "address to bind (loopback unless told otherwise)");
ABSL_FLAG(int, port, 0, "port to listen on; 0 picks a free one and prints it");
ABSL_FLAG(std::string, shards, "", "comma-separated host:port of shards 0, 1, ...");
ABSL_FLAG(uint64_t, shard_map_version, 1, "version of the shard map the shards serve");
ABSL_FLAG(int64_t, max_batch_ids, 1 << 20, "ids per request before RESOURCE_EXHAUSTED");
ABSL_FLAG(int, shard_deadline_ms, 10000, "deadline of each call to a shard");
ABSL_FLAG(int, health_check_ms, 500,
          "interval of health checks of every shard (0 = none); a shard failing two in a row "
          "is reported UNAVAILABLE at once until it passes one again");
ABSL_FLAG(int, max_message_bytes, tessera::client::kMaxMessageBytes,
          "largest gRPC message accepted or sent");
ABSL_FLAG(int, max_tables, 1024,
          "tables this server holds; creating one more is RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, data_dir, "",
          "directory for table configs and checkpoint manifests; empty = nothing survives "
          "a restart and Checkpoint is refused");
ABSL_FLAG(int, keep_checkpoints, 3, "newest complete cluster checkpoints kept; 0 = all");
ABSL_FLAG(int, sparse_threads, 0,
          "threads that split a batched request by table (deduplicating, placing on shards, "
          "merging the answers); 0 = every CPU this process may run on");
ABSL_FLAG(int, shard_retries, tessera::client::kShardRetries,
          "retries of a shard call that fails UNAVAILABLE or DEADLINE_EXCEEDED, with backoff, "
          "before the coordinator answers with that error");

namespace tessera::server {
namespace {

// The router's options from the flags. InvalidArgument for --shard_retries out of range.
absl::StatusOr<client::RouterOptions> RouterOptionsFromFlags(
    const wire::ClientSecurity& to_shards) {
  client::RouterOptions ro;
  ro.security = to_shards;
  ro.deadline = std::chrono::milliseconds(absl::GetFlag(FLAGS_shard_deadline_ms));
  ro.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  ro.shard_map_version = absl::GetFlag(FLAGS_shard_map_version);
  ro.health_check_interval = std::chrono::milliseconds(absl::GetFlag(FLAGS_health_check_ms));
  // A shard that fails a call for a moment (a restart) is retried alone; clients see the
  // call fail only if it stays down.
  ro.retry.max_retries = absl::GetFlag(FLAGS_shard_retries);
  if (ro.retry.max_retries < 0 || ro.retry.max_retries > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shard_retries must be in [0, 100], got ", ro.retry.max_retries));
  }
  absl::StatusOr<std::shared_ptr<base::ThreadPool>> pool =
      base::NewThreadPool(absl::GetFlag(FLAGS_sparse_threads));
  TESSERA_RETURN_IF_ERROR(Annotate(pool.status(), "--sparse_threads"));
  ro.pool = *std::move(pool);
  return ro;
}

// The coordinator's record in `data_dir` (tables, checkpoints), with this start's shard
// list and map version saved in it.
absl::StatusOr<std::unique_ptr<storage::CoordinatorStore>> OpenStore(
    const std::string& data_dir, const std::vector<std::string>& shards, uint64_t version) {
  auto opened = storage::CoordinatorStore::Open(data_dir, absl::GetFlag(FLAGS_keep_checkpoints));
  if (!opened.ok()) {
    return absl::Status(opened.status().code(),
                        absl::StrCat("cannot start on data directory ", data_dir, ": ",
                                     opened.status().ToString()));
  }
  std::unique_ptr<storage::CoordinatorStore> store = *std::move(opened);
  v1::CoordinatorState state = store->state();
  const std::vector<std::string> before(state.shards().begin(), state.shards().end());
  if (state.shard_map_version() > version) {
    // Resharded since: the shards of the old map no longer serve it.
    return absl::FailedPreconditionError(absl::StrCat(
        "the cluster recorded in ", data_dir, " serves shard map version ",
        state.shard_map_version(), " on shards ", absl::StrJoin(before, ","),
        "; start with --shard_map_version=", state.shard_map_version(), " --shards=",
        absl::StrJoin(before, ",")));
  }
  if (!before.empty() && before != shards) {
    std::cerr << "tessera-coordinator: note: the shard list differs from the one recorded in "
              << data_dir << " (" << before.size() << " shards before, " << shards.size()
              << " now)\n";
  }
  state.clear_shards();
  for (const auto& a : shards) state.add_shards(a);
  state.set_shard_map_version(version);
  TESSERA_RETURN_IF_ERROR(store->Save(state));
  // stderr: the first stdout line is the one that names the port.
  std::cerr << "tessera-coordinator: " << state.tables_size() << " table(s) recorded in "
            << data_dir << std::endl;
  return store;
}

// tessera_shard_serving{shard, address}: 1 while a shard passes its health checks.
void WatchShardHealth(observability::Metrics* metrics, client::ShardRouter* router) {
  auto& serving = prometheus::BuildGauge()
                      .Name("tessera_shard_serving")
                      .Help("1 while the shard passes its health checks, else 0")
                      .Register(metrics->registry());
  metrics->Watch(
      [router, &serving](observability::Metrics&) {
        for (int k = 0; k < router->num_shards(); ++k) {
          serving.Add({{"shard", std::to_string(k)}, {"address", router->addresses()[k]}})
              .Set(router->serving(k) ? 1 : 0);
        }
      },
      std::chrono::seconds(1));
}

// Serves until SIGTERM or SIGINT; an error when it cannot start.
absl::Status Serve(const std::vector<std::string>& shards) {
  TESSERA_ASSIGN_OR_RETURN(const ServerSecurity security, ServerSecurityFromFlags());
  TESSERA_ASSIGN_OR_RETURN(const wire::ClientSecurity to_shards, wire::ClientSecurityFromFlags());
  TESSERA_ASSIGN_OR_RETURN(const client::RouterOptions ro, RouterOptionsFromFlags(to_shards));
  client::ShardRouter router(shards, ro);
  CoordinatorOptions co;
  co.max_batch_ids = absl::GetFlag(FLAGS_max_batch_ids);
  co.max_tables = absl::GetFlag(FLAGS_max_tables);
  co.auth = CallAuthorizer(security);
  std::unique_ptr<storage::CoordinatorStore> store;
  if (const std::string data_dir = absl::GetFlag(FLAGS_data_dir); !data_dir.empty()) {
    TESSERA_ASSIGN_OR_RETURN(store, OpenStore(data_dir, shards, ro.shard_map_version));
  }
  CoordinatorService service(&router, ro.shard_map_version, co, store.get());
  TESSERA_RETURN_IF_ERROR(service.CheckShardPlaces());
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<observability::Metrics> metrics,
                           observability::StartMetricsFromFlags("coordinator"));
  if (metrics != nullptr) WatchShardHealth(metrics.get(), &router);

  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  BlockShutdownSignals();
  ListenOptions listen;
  listen.host = absl::GetFlag(FLAGS_host);
  listen.port = absl::GetFlag(FLAGS_port);
  listen.max_message_bytes = ro.max_message_bytes;
  listen.credentials = MakeServerCredentials(security);
  listen.metrics = metrics.get();
  listen.service_name = v1::Coordinator::service_full_name();
  listen.reflection = true;
  int port = 0;
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<grpc::Server> server,
                           StartServer(&service, listen, &port));
  std::cout << "tessera-coordinator: " << shards.size() << " shard(s), listening on "
            << listen.host << ":" << port << std::endl;
  observability::Log(spdlog::level::info, "serving",
                     observability::LogFields()
                         .Add("shards", static_cast<long long>(shards.size()))
                         .Add("address", absl::StrCat(listen.host, ":", port))
                         .Add("tls", security.cert_chain.empty() ? "off" : "on")
                         .Add("token", security.token.empty() ? "off" : "on"));
  ServeUntilShutdownSignal(server.get(), "tessera-coordinator");
  return absl::OkStatus();
}

}  // namespace
}  // namespace tessera::server

int main(int argc, char** argv) {
  tessera::base::ParseCommandLine(
      argc, argv, "tessera-coordinator",
      "Routes Tessera lookups and pushes to shards: --shards=127.0.0.1:7001,127.0.0.1:7002");
  absl::Status s = tessera::observability::ConfigureLoggingFromFlags("tessera-coordinator");
  const std::vector<std::string> shards =
      absl::StrSplit(absl::GetFlag(FLAGS_shards), ',', absl::SkipEmpty());
  if (s.ok() && shards.empty()) {
    s = absl::InvalidArgumentError("--shards is required (host:port,...)");
  }
  if (s.ok()) s = tessera::server::Serve(shards);
  if (!s.ok()) {
    std::cerr << "tessera-coordinator: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
