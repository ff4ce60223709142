#ifndef TESSERA_SERVER_COORDINATOR_SERVICE_H_
#define TESSERA_SERVER_COORDINATOR_SERVICE_H_

#include <cstdint>
#include <vector>

#include "client/shard_router.h"
#include "embedding/storage/coordinator_store.h"
#include "server/auth.h"
#include "server/cluster.h"
#include "server/lookup_request.h"
#include "server/rendezvous_store.h"
#include "server/sync_groups.h"
#include "tessera/v1/embedding_service.grpc.pb.h"

namespace tessera::server {

struct CoordinatorOptions {
  int64_t max_batch_ids = 1 << 20;  // ids per request; more is RESOURCE_EXHAUSTED
  int32_t max_tables = 1024;        // tables held; creating one more is RESOURCE_EXHAUSTED
  CallAuthorizer auth;              // the token each call must carry (default: none)
};

// The Coordinator gRPC service: checks each call's token and the batch limits, converts
// requests to calls on a Cluster (the table registry, create protocol, checkpoint barrier
// and cluster checkpoints) and answers back. Thread-safe.
class CoordinatorService final : public v1::Coordinator::Service {
 public:
  // `router` and `store` (null: nothing durable, no checkpoints) must outlive the
  // service. Tables recorded in `store` are served at once.
  CoordinatorService(client::ShardRouter* router, uint64_t shard_map_version,
                     const CoordinatorOptions& options, storage::CoordinatorStore* store = nullptr);

  // Advertise (and route with) another shard-map version from now on.
  void SetShardMapVersion(uint64_t version) { cluster_.SetShardMapVersion(version); }
  // At start-up: the shards serve the places this map gives them (Cluster::CheckShardPlaces).
  absl::Status CheckShardPlaces() { return cluster_.CheckShardPlaces(); }

  grpc::Status CreateTable(grpc::ServerContext* context, const v1::CreateTableRequest* request,
                           v1::CreateTableResponse* response) override;
  grpc::Status ListTables(grpc::ServerContext* context, const v1::ListTablesRequest* request,
                          v1::ListTablesResponse* response) override;
  grpc::Status AlterTable(grpc::ServerContext* context, const v1::AlterTableRequest* request,
                          v1::AlterTableResponse* response) override;
  grpc::Status DropTable(grpc::ServerContext* context, const v1::DropTableRequest* request,
                         v1::DropTableResponse* response) override;
  grpc::Status ExportRows(grpc::ServerContext* context, const v1::ExportRowsRequest* request,
                          grpc::ServerWriter<v1::RowChunk>* writer) override;
  grpc::Status ImportRows(grpc::ServerContext* context, const v1::ImportRowsRequest* request,
                          v1::ImportRowsResponse* response) override;
  grpc::Status GetShardMap(grpc::ServerContext* context, const v1::GetShardMapRequest* request,
                           v1::ShardMap* response) override;
  grpc::Status Reshard(grpc::ServerContext* context, const v1::ReshardClusterRequest* request,
                       v1::ReshardClusterResponse* response) override;
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
  grpc::Status StoreSet(grpc::ServerContext* context, const v1::StoreSetRequest* request,
                        v1::StoreSetResponse* response) override;
  grpc::Status StoreGet(grpc::ServerContext* context, const v1::StoreGetRequest* request,
                        v1::StoreGetResponse* response) override;
  grpc::Status StoreAdd(grpc::ServerContext* context, const v1::StoreAddRequest* request,
                        v1::StoreAddResponse* response) override;
  // Registers the group here and with every shard; a sync push of a group that no job
  // registered here is refused FAILED_PRECONDITION before it reaches a shard.
  grpc::Status RegisterSyncGroup(grpc::ServerContext* context,
                                 const v1::RegisterSyncGroupRequest* request,
                                 v1::RegisterSyncGroupResponse* response) override;

 private:
  template <typename Handler>
  grpc::Status Serve(grpc::ServerContext* context, Access access, const Handler& handler) const {
    return ServeCall(options_.auth, *context, access, handler);
  }
  // The push `request` carries (BatchLookupRequest.push): checked here as BatchPush
  // checks one, then routed with its lookup (decoded in `lookup`) in one round trip (the
  // answers forwarded into `forward` when given); the push's answer in *answer.
  absl::Status PushThenLookup(const v1::BatchLookupRequest& request, const DecodedBatch& lookup,
                              v1::BatchLookupResponse* forward, v1::BatchPushResponse* answer);
  // A routed push's answer: the rows updated per table, and the incarnation digest and map
  // version it was routed under.
  void AnswerPush(const std::vector<int64_t>& updated, v1::BatchPushResponse* response) const;
  // ResourceExhausted for a batch over the limit, FailedPrecondition for a request built on
  // another shard map version than the one served (`version` 0: not checked).
  absl::Status CheckBatch(const std::string& what, int64_t ids, uint64_t version) const;
  AnswerLimit Limit() const {
    return {options_.max_batch_ids, "tessera-coordinator --max_batch_ids"};
  }
  ConfigLookup Configs() const {
    return [this](const std::string& t, std::shared_ptr<TableCounters>*) {
      return cluster_.ConfigOf(t);
    };
  }

  const CoordinatorOptions options_;
  Cluster cluster_;
  RendezvousStore rendezvous_;
  SyncGroups groups_{"the coordinator"};
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_COORDINATOR_SERVICE_H_
