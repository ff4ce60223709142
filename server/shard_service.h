#ifndef TESSERA_SERVER_SHARD_SERVICE_H_
#define TESSERA_SERVER_SHARD_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

#include "absl/synchronization/mutex.h"
#include "embedding/collection.h"
#include "server/auth.h"
#include "tessera/v1/embedding_service.grpc.pb.h"

namespace tessera::server {

struct ShardOptions {
  int32_t shard_index = 0;          // this shard's place in the shard map
  int32_t num_shards = 1;           // shards in the map
  uint64_t shard_map_version = 1;   // requests naming another version are refused
  int64_t max_batch_ids = 1 << 20;  // ids per request; more is RESOURCE_EXHAUSTED
  int32_t max_tables = 1024;        // tables held; creating one more is RESOURCE_EXHAUSTED
  CallAuthorizer auth;              // the token each call must carry (default: none)
};

// The EmbeddingShard gRPC service: converts requests to calls on the embedding core held
// by this process (`tables`, its part of every table) and statuses back, and checks
// what only the service knows: batch limits, the shard-map version, and that every id
// belongs to this shard. Thread-safe; gRPC calls it from many threads.
class ShardService final : public v1::EmbeddingShard::Service {
 public:
  // `tables` must outlive the service. Tables it already holds (loaded from disk) are
  // served at once.
  ShardService(embedding::EmbeddingCollection* tables, const ShardOptions& options);

  // Serve another shard-map version from now on (the map was rebalanced).
  void SetShardMapVersion(uint64_t version) { version_.store(version); }

  grpc::Status CreateTable(grpc::ServerContext* context, const v1::CreateTableRequest* request,
                           v1::CreateTableResponse* response) override;
  grpc::Status ListTables(grpc::ServerContext* context, const v1::ListTablesRequest* request,
                          v1::ListTablesResponse* response) override;
  grpc::Status Lookup(grpc::ServerContext* context, const v1::LookupRequest* request,
                      v1::LookupResponse* response) override;
  grpc::Status PushGradients(grpc::ServerContext* context, const v1::PushGradientsRequest* request,
                             v1::PushGradientsResponse* response) override;
  grpc::Status Stats(grpc::ServerContext* context, const v1::StatsRequest* request,
                     v1::StatsResponse* response) override;
  grpc::Status Checkpoint(grpc::ServerContext* context, const v1::CheckpointRequest* request,
                          v1::CheckpointResponse* response) override;
  grpc::Status Restore(grpc::ServerContext* context, const v1::RestoreRequest* request,
                       v1::RestoreResponse* response) override;
  grpc::Status ListCheckpoints(grpc::ServerContext* context,
                               const v1::ListCheckpointsRequest* request,
                               v1::ListCheckpointsResponse* response) override;

 private:
  struct Counters {
    int64_t lookups = 0;
    int64_t updates = 0;
  };

  // The table's config, or NotFound.
  absl::StatusOr<v1::TableConfig> Config(const std::string& table) const;
  // Checks batch size, map version and id ownership.
  absl::Status CheckRequest(const v1::TableConfig& config, int ids_size,
                            const google::protobuf::RepeatedField<int64_t>& ids,
                            uint64_t version) const;

  // Serves exactly the tables `tables_` holds (after start-up or a restore).
  absl::Status ReloadConfigs();

  embedding::EmbeddingCollection* tables_;
  const ShardOptions options_;
  std::atomic<uint64_t> version_;
  mutable absl::Mutex mu_;
  std::map<std::string, v1::TableConfig> configs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Counters> counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_SHARD_SERVICE_H_
