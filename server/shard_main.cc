// tessera-shard: one embedding shard server. Holds its part (ShardOf(id) == index) of
// every table, applies the optimizers, and serves EmbeddingShard, gRPC health and
// server reflection. With --data_dir its tables are durable there (RocksDB) and come
// back on restart; without, they live in memory only.

#include <iostream>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "base/command_line.h"
#include "base/status.h"
#include "client/channel_policy.h"
#include "embedding/collection.h"
#include "embedding/inprocess_collection.h"
#include "embedding/storage/durable_collection.h"
#include "embedding/storage/files.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "server/auth.h"
#include "server/serving.h"
#include "server/shard_service.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "address to bind (loopback unless told otherwise)");
ABSL_FLAG(int, port, 0, "port to listen on; 0 picks a free one and prints it");
ABSL_FLAG(int, shard_index, 0, "this shard's index in the shard map");
ABSL_FLAG(int, num_shards, 1, "shards in the shard map");
ABSL_FLAG(uint64_t, shard_map_version, 1, "shard map version this shard serves");
ABSL_FLAG(int64_t, max_batch_ids, 1 << 20, "ids per request before RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_sync_wait_ms, 60000,
          "longest a data-parallel worker's push waits for the other workers' (their "
          "--worker_timeout_s is capped by it), in [1, 3600000]");
ABSL_FLAG(int, max_sync_waiting, 1024,
          "data-parallel pushes that may wait for their other workers at once (each holds its "
          "request, not a thread), in [1, 1048576]; one more is RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, change_log_bytes, int64_t{128} << 20,
          "bytes of the log of rows changed that serving replicas read (ids, not rows); a "
          "replica that falls further behind starts again from a snapshot; 0 = no log (replicas "
          "cannot follow this shard)");
ABSL_FLAG(int, max_message_bytes, tessera::client::kMaxMessageBytes,
          "largest gRPC message accepted or sent");
ABSL_FLAG(int, max_tables, 1024,
          "tables this server holds; creating one more is RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, data_dir, "",
          "directory of this shard's store and checkpoints; empty = memory only, nothing "
          "survives a restart");
ABSL_FLAG(int, keep_checkpoints, 3, "newest complete checkpoints kept; 0 = all");
ABSL_FLAG(int, sparse_threads, 0,
          "threads that serve a batched request's tables in parallel; 0 = every CPU this "
          "process may run on (taskset -c 0 gives 1)");

ABSL_FLAG(int64_t, memory_limit, 0,
          "bytes this shard's rows may take: past it a new row is refused (RESOURCE_EXHAUSTED "
          "naming the table and the budget) or, in a table with eviction, evicts one; 0 = its "
          "cgroup's memory limit (else 90% of physical memory) less what serving needs; "
          "negative = no budget");

namespace {

// This shard's tables: in memory, or durable in `data_dir` (which must have been written
// for this place in the shard map).
absl::StatusOr<std::unique_ptr<tessera::embedding::ShardTables>> OpenTables(
    const std::string& data_dir, const tessera::server::ShardOptions& options) {
  const int threads = absl::GetFlag(FLAGS_sparse_threads);
  if (data_dir.empty()) {
    tessera::embedding::InProcessOptions in_memory;
    in_memory.threads = threads;
    in_memory.memory_limit = absl::GetFlag(FLAGS_memory_limit);
    in_memory.cluster_shard_index = options.shard_index;
    in_memory.cluster_num_shards = options.num_shards;
    TESSERA_ASSIGN_OR_RETURN(auto memory, tessera::embedding::NewInProcessCollection(in_memory));
    return std::unique_ptr<tessera::embedding::ShardTables>(std::move(memory));
  }
  // Rows belong to the shard ShardOf(id, num_shards) names: a data directory written for
  // another place in the map would serve the wrong rows.
  TESSERA_RETURN_IF_ERROR(tessera::storage::CheckShardPlacement(
      data_dir, options.shard_index, options.num_shards, options.shard_map_version));
  tessera::storage::DurableOptions durable;
  durable.data_dir = data_dir;
  durable.keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  durable.threads = threads;
  durable.memory_limit = absl::GetFlag(FLAGS_memory_limit);
  durable.cluster_shard_index = options.shard_index;
  durable.cluster_num_shards = options.num_shards;
  absl::StatusOr<std::unique_ptr<tessera::storage::DurableCollection>> opened =
      tessera::storage::DurableCollection::Open(durable);
  if (!opened.ok()) {
    return tessera::Annotate(opened.status(),
                             absl::StrCat("cannot start on data directory ", data_dir));
  }
  return std::unique_ptr<tessera::embedding::ShardTables>(*std::move(opened));
}

// The shard's options from its flags (and its TLS and token settings into *security);
// InvalidArgument names a flag outside its range.
absl::StatusOr<tessera::server::ShardOptions> ShardOptionsFromFlags(
    tessera::server::ServerSecurity* security) {
  tessera::server::ShardOptions options;
  options.shard_index = absl::GetFlag(FLAGS_shard_index);
  options.num_shards = absl::GetFlag(FLAGS_num_shards);
  options.shard_map_version = absl::GetFlag(FLAGS_shard_map_version);
  options.max_batch_ids = absl::GetFlag(FLAGS_max_batch_ids);
  options.max_tables = absl::GetFlag(FLAGS_max_tables);
  const int64_t wait = absl::GetFlag(FLAGS_max_sync_wait_ms);
  if (wait < 1 || wait > 3600000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_sync_wait_ms must be in [1, 3600000], got ", wait));
  }
  options.max_sync_wait = std::chrono::milliseconds(wait);
  const int waiting = absl::GetFlag(FLAGS_max_sync_waiting);
  if (waiting < 1 || waiting > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_sync_waiting must be in [1, 1048576], got ", waiting));
  }
  options.max_sync_waiting = waiting;
  const int64_t log_bytes = absl::GetFlag(FLAGS_change_log_bytes);
  if (log_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--change_log_bytes must be >= 0, got ", log_bytes));
  }
  options.change_log_bytes = static_cast<size_t>(log_bytes);
  TESSERA_ASSIGN_OR_RETURN(*security, tessera::server::ServerSecurityFromFlags());
  options.auth = tessera::server::CallAuthorizer(*security);
  if (options.num_shards < 1 || options.shard_index < 0 ||
      options.shard_index >= options.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shard_index must be in [0, --num_shards), got ", options.shard_index,
                     " of ", options.num_shards));
  }
  return options;
}

// --metrics_port: the shard's metrics with its tables' sizes (null without the flag).
absl::StatusOr<std::unique_ptr<tessera::observability::Metrics>> StartShardMetrics(
    tessera::embedding::EmbeddingCollection* tables) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<tessera::observability::Metrics> metrics,
                           tessera::observability::StartMetricsFromFlags("shard"));
  if (metrics != nullptr) {
    metrics->Watch(
        [tables](tessera::observability::Metrics& m) {
          m.ReadTables(tessera::observability::ReadingsOf(tables));
        },
        std::chrono::seconds(5));
  }
  return metrics;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::base::ParseCommandLine(argc, argv, "tessera-shard",
                                  "Serves one embedding shard over gRPC.");
  if (absl::Status s = tessera::observability::ConfigureLoggingFromFlags("tessera-shard");
      !s.ok()) {
    std::cerr << "tessera-shard: " << s.message() << "\n";
    return 1;
  }
  tessera::server::ServerSecurity security;
  absl::StatusOr<tessera::server::ShardOptions> parsed = ShardOptionsFromFlags(&security);
  if (!parsed.ok()) {
    std::cerr << "tessera-shard: " << parsed.status().message() << "\n";
    return 1;
  }
  tessera::server::ShardOptions options = *std::move(parsed);
  const std::string data_dir = absl::GetFlag(FLAGS_data_dir);
  absl::StatusOr<std::unique_ptr<tessera::embedding::ShardTables>> opened =
      OpenTables(data_dir, options);
  if (!opened.ok()) {
    std::cerr << "tessera-shard: " << opened.status().message() << "\n";
    return 1;
  }
  std::unique_ptr<tessera::embedding::ShardTables> tables = *std::move(opened);
  options.data_dir = !data_dir.empty();
  if (!data_dir.empty()) {
    // A reshard's new place is recorded before it is served: a restart must name it.
    options.on_placement = [data_dir](int index, int num_shards, uint64_t version) {
      return tessera::storage::RecordShardPlacement(data_dir, index, num_shards, version);
    };
  }
  tessera::server::ShardService service(tables.get(), options);
  absl::StatusOr<std::unique_ptr<tessera::observability::Metrics>> metrics =
      StartShardMetrics(tables.get());
  if (!metrics.ok()) {
    std::cerr << "tessera-shard: " << metrics.status().message() << "\n";
    return 1;
  }
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  tessera::server::BlockShutdownSignals();
  tessera::server::ListenOptions listen;
  listen.host = absl::GetFlag(FLAGS_host);
  listen.port = absl::GetFlag(FLAGS_port);
  listen.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  listen.credentials = tessera::server::MakeServerCredentials(security);
  listen.metrics = metrics->get();
  listen.shard_index = options.shard_index;
  listen.service_name = tessera::v1::EmbeddingShard::service_full_name();
  listen.reflection = true;
  int port = 0;
  auto server = tessera::server::StartServer(&service, listen, &port);
  if (!server.ok()) {
    std::cerr << "tessera-shard: " << server.status().message() << "\n";
    return 1;
  }
  std::cout << "tessera-shard " << options.shard_index << "/" << options.num_shards
            << ": listening on " << listen.host << ":" << port << std::endl;
  tessera::observability::Log(spdlog::level::info, "serving",
                              tessera::observability::LogFields()
                                  .Add("shard", options.shard_index)
                                  .Add("shards", options.num_shards)
                                  .Add("address", absl::StrCat(listen.host, ":", port))
                                  .Add("data_dir", data_dir.empty() ? "(memory)" : data_dir)
                                  .Add("tls", security.cert_chain.empty() ? "off" : "on")
                                  .Add("token", security.token.empty() ? "off" : "on"));
  tessera::server::ServeUntilShutdownSignal(server->get(), "tessera-shard");
  return 0;
}
