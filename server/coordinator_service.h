#ifndef TESSERA_SERVER_COORDINATOR_SERVICE_H_
#define TESSERA_SERVER_COORDINATOR_SERVICE_H_

#include <atomic>
#include <map>
#include <string>

#include "absl/synchronization/mutex.h"
#include "client/shard_router.h"
#include "embedding/storage/coordinator_store.h"
#include "server/auth.h"
#include "server/lookup_request.h"
#include "tessera/v1/embedding_service.grpc.pb.h"

namespace tessera::server {

struct CoordinatorOptions {
  int64_t max_batch_ids = 1 << 20;  // ids per request; more is RESOURCE_EXHAUSTED
  int32_t max_tables = 1024;        // tables held; creating one more is RESOURCE_EXHAUSTED
  CallAuthorizer auth;              // the token each call must carry (default: none)
};

// The Coordinator gRPC service: owns table configs and the versioned shard map, checks
// requests, and hands routing to a ShardRouter. With a CoordinatorStore, table configs
// survive restarts and Checkpoint/Restore coordinate cluster checkpoints: every shard
// takes its own, then the store writes the manifest that makes the checkpoint exist.
// Pushes routed through the coordinator wait while a checkpoint or restore runs.
// Thread-safe.
class CoordinatorService final : public v1::Coordinator::Service {
 public:
  // `router` and `store` (null: nothing durable, no checkpoints) must outlive the
  // service. Tables recorded in `store` are served at once.
  CoordinatorService(client::ShardRouter* router, uint64_t shard_map_version,
                     const CoordinatorOptions& options, storage::CoordinatorStore* store = nullptr);

  ~CoordinatorService() override;

  // Creates on shard k every table of the registry it lacks (a shard without a data
  // directory comes back empty); called when the router re-admits shard k.
  void Reprovision(int k);

  // Advertise (and route with) another shard-map version from now on.
  void SetShardMapVersion(uint64_t version);

  grpc::Status CreateTable(grpc::ServerContext* context, const v1::CreateTableRequest* request,
                           v1::CreateTableResponse* response) override;
  grpc::Status ListTables(grpc::ServerContext* context, const v1::ListTablesRequest* request,
                          v1::ListTablesResponse* response) override;
  grpc::Status GetShardMap(grpc::ServerContext* context, const v1::GetShardMapRequest* request,
                           v1::ShardMap* response) override;
  grpc::Status Lookup(grpc::ServerContext* context, const v1::LookupRequest* request,
                      v1::LookupResponse* response) override;
  grpc::Status PushGradients(grpc::ServerContext* context, const v1::PushGradientsRequest* request,
                             v1::PushGradientsResponse* response) override;
  grpc::Status BatchLookup(grpc::ServerContext* context, const v1::BatchLookupRequest* request,
                           v1::BatchLookupResponse* response) override;
  grpc::Status BatchPush(grpc::ServerContext* context, const v1::BatchPushRequest* request,
                         v1::BatchPushResponse* response) override;
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
  absl::Status NeedStore() const;
  // The durable state with configs_ as they are now.
  v1::CoordinatorState StateLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::StatusOr<v1::TableConfig> Config(const std::string& table) const;
  absl::Status CheckBatch(const std::string& table, int64_t ids) const;
  // Routes a decoded push to the shards under request `id` (a new one when empty), at
  // the checkpoint barrier's shared side.
  absl::StatusOr<std::vector<int64_t>> RoutePush(const DecodedBatch& batch, int64_t step,
                                                 const v1::RequestId& id);
  template <typename Handler>
  grpc::Status Serve(grpc::ServerContext* context, Access access, const Handler& handler) const {
    return ServeCall(options_.auth, *context, access, handler);
  }

  client::ShardRouter* router_;
  std::atomic<uint64_t> version_;
  const CoordinatorOptions options_;
  mutable absl::Mutex mu_;
  absl::Mutex create_mu_;  // one CreateTable at a time, so shards agree on configs
  storage::CoordinatorStore* store_;
  absl::Mutex barrier_mu_;  // shared: routed pushes; exclusive: checkpoint and restore
  std::map<std::string, v1::TableConfig> configs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_COORDINATOR_SERVICE_H_
