#ifndef TESSERA_SERVER_SHARD_SERVICE_H_
#define TESSERA_SERVER_SHARD_SERVICE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "embedding/collection.h"
#include "embedding/shard_tables.h"
#include "server/auth.h"
#include "server/call_executor.h"
#include "server/lookup_request.h"
#include "server/push_applier.h"
#include "server/reshard_participant.h"
#include "tessera/v1/embedding_service.grpc.pb.h"
#include "wire/call_metadata.h"

namespace tessera::server {

struct ShardOptions {
  int32_t shard_index = 0;          // this shard's place in the shard map
  int32_t num_shards = 1;           // shards in the map
  uint64_t shard_map_version = 1;   // requests naming another version are refused
  int64_t max_batch_ids = 1 << 20;  // ids per request; more is RESOURCE_EXHAUSTED
  int32_t max_tables = 1024;        // tables held; creating one more is RESOURCE_EXHAUSTED
  size_t push_window = 1 << 16;     // request ids of recent pushes remembered (exactly-once)
  // The longest a sync-group push waits for the other workers, whatever its timeout_ms
  // asks: a client cannot park a request on this shard for longer.
  std::chrono::milliseconds max_sync_wait{60000};
  // Sync-group pushes waiting for their other workers at once (each holds its request,
  // not a thread); one more that would wait is RESOURCE_EXHAUSTED.
  int max_sync_waiting = 1024;
  CallAuthorizer auth;              // the token each call must carry (default: none)
  // Its tables are on a data directory (a restart keeps them): every answer says so
  // (wire::kStorageMetadata), for a caller's restart notice.
  bool data_dir = false;
  // Called at a reshard's COMMIT with this shard's new place (index -1: none) and map
  // version, before it serves them; an error stops the commit (shard_main records it in
  // the data directory's SHARD file).
  std::function<absl::Status(int index, int num_shards, uint64_t version)> on_placement;
  // The bound of the log of rows changed that serving replicas read (ReadChanges).
  size_t change_log_bytes = size_t{128} << 20;
};

// The EmbeddingShard gRPC service: converts requests to calls on the embedding core held
// by this process (`tables`, its part of every table) and statuses back, and checks
// what only the service knows: batch limits, the shard-map version, and that every id
// belongs to this shard. Pushes that carry a request id are applied at most once (see
// PushJournal); CreateTable of a table it holds with the same config is OK. Thread-safe;
// gRPC calls it from many threads.
class ShardService final
    : public v1::EmbeddingShard::WithCallbackMethod_BatchPush<v1::EmbeddingShard::Service> {
 public:
  // `tables` must outlive the service. Tables it already holds (loaded from disk) are
  // served at once.
  ShardService(embedding::ShardTables* tables, const ShardOptions& options);
  ~ShardService() override;

  // Random at each start, sent with every push answer: a client can tell a shard that
  // came back.
  uint64_t incarnation() const { return incarnation_; }

  // Serve another shard-map version from now on (the map was rebalanced).
  void SetShardMapVersion(uint64_t version) { reshard_.SetVersion(version); }
  uint64_t shard_map_version() const { return reshard_.version(); }

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
  grpc::Status Lookup(grpc::ServerContext* context, const v1::LookupRequest* request,
                      v1::LookupResponse* response) override;
  grpc::Status PushGradients(grpc::ServerContext* context, const v1::PushGradientsRequest* request,
                             v1::PushGradientsResponse* response) override;
  grpc::Status BatchLookup(grpc::ServerContext* context, const v1::BatchLookupRequest* request,
                           v1::BatchLookupResponse* response) override;
  // On the callback API: the push runs on a thread of this service's, and a sync-group
  // push that waits for its step's other workers holds no thread while it waits.
  grpc::ServerUnaryReactor* BatchPush(grpc::CallbackServerContext* context,
                                      const v1::BatchPushRequest* request,
                                      v1::BatchPushResponse* response) override;
  // BatchPush for a caller without a server (the request fuzzer): returns its answer.
  grpc::Status BatchPushNow(grpc::ServerContextBase* context, const v1::BatchPushRequest& request,
                            v1::BatchPushResponse* response);
  grpc::Status Stats(grpc::ServerContext* context, const v1::StatsRequest* request,
                     v1::StatsResponse* response) override;
  grpc::Status Checkpoint(grpc::ServerContext* context, const v1::CheckpointRequest* request,
                          v1::CheckpointResponse* response) override;
  grpc::Status Restore(grpc::ServerContext* context, const v1::RestoreRequest* request,
                       v1::RestoreResponse* response) override;
  grpc::Status ListCheckpoints(grpc::ServerContext* context,
                               const v1::ListCheckpointsRequest* request,
                               v1::ListCheckpointsResponse* response) override;
  grpc::Status Reshard(grpc::ServerContext* context, const v1::ReshardRequest* request,
                       v1::ReshardResponse* response) override;

  grpc::Status RegisterSyncGroup(grpc::ServerContext* context,
                                 const v1::RegisterSyncGroupRequest* request,
                                 v1::RegisterSyncGroupResponse* response) override;
  // The rows changed after a serving replica's cursor (server/change_log.h).
  grpc::Status ReadChanges(grpc::ServerContext* context, const v1::ReadChangesRequest* request,
                           v1::ReadChangesResponse* response) override;

  // Sync-group pushes waiting for their step's other workers, and threads running a push
  // now (tests and monitoring: a push that waits is not running).
  int sync_pushes_waiting() const { return pushes_.sync_pushes_waiting(); }
  int push_threads_busy() const { return calls_.busy(); }

 private:
  using Traffic = ReshardParticipant::Traffic;
  using Admitted = ReshardParticipant::Admitted;
  // Admits a data request through the reshard gate, until the call's deadline.
  absl::Status Enter(Traffic traffic, uint64_t version, const grpc::ServerContextBase& context);
  struct PushCall;  // one BatchPush, from its start to its answer
  class PushReactor;
  // Runs `call` to its answer, or to where it waits in its step (a sync-group push whose
  // other workers have not all pushed): call->finish is called once, now or later.
  void RunBatchPush(PushCall* call);
  // Admits the push (Enter), decodes it and checks its size and ownership.
  absl::Status AdmitBatchPush(PushCall* call);
  // A push that is not a sync group's: its check round, or its apply.
  absl::Status CheckOrApplyPush(PushCall* call);
  // A data-parallel worker's push (request.sync): answered once its step is applied.
  void StartSyncPush(PushCall* call);
  // Answers `call` with `status` (and this shard's incarnation when OK).
  void Answer(PushCall* call, const absl::Status& status);
  // The rows of `all` that leave this shard for the map `moving` describes (a fixed
  // vocabulary's all go), into *leaving.
  // ExportRows of a checkpoint's rows (request.checkpoint_dirs), read from its files.
  absl::Status ExportCheckpointRows(const v1::ExportRowsRequest& request,
                                    grpc::ServerWriter<v1::RowChunk>* writer);
  static void LeavingRows(const v1::TableConfig& config, const v1::MovingRows& moving,
                          const embedding::RowBlock& all, embedding::RowBlock* leaving);

  // Checks the caller's token for `access`, then runs `handler` and maps its status.
  // Every answer, refusals included, carries this process's incarnation in its trailing
  // metadata (wire::kIncarnationMetadata), so that a caller sees a restart even in an
  // answer such as NOT_FOUND from a memory-only shard that came back empty.
  template <typename Handler>
  grpc::Status Serve(grpc::ServerContextBase* context, Access access,
                     const Handler& handler) const {
    context->AddTrailingMetadata(wire::kIncarnationMetadata, absl::StrCat(incarnation_));
    context->AddTrailingMetadata(wire::kStorageMetadata, options_.data_dir ? "disk" : "memory");
    return ServeCall(options_.auth, *context, access, handler);
  }

  // The table's config, or NotFound.
  // `*counters` (when given): the table's counters.
  absl::StatusOr<ConfigRef> ConfigOf(const std::string& table,
                                     std::shared_ptr<TableCounters>* counters = nullptr) const;
  // ConfigOf(), copied.
  absl::StatusOr<v1::TableConfig> Config(const std::string& table,
                                         std::shared_ptr<TableCounters>* counters = nullptr) const;
  // ConfigOf(), as a batched request's decoder asks for it.
  ConfigLookup Configs() const {
    return [this](const std::string& t, std::shared_ptr<TableCounters>* counters) {
      return ConfigOf(t, counters);
    };
  }
  // Checks the ids of a request: their count against the limit, the map version.
  absl::Status CheckBatch(const std::string& table, int64_t ids, uint64_t version) const;
  AnswerLimit Limit() const { return {options_.max_batch_ids, "tessera-shard --max_batch_ids"}; }
  // Checks that every id belongs to this shard (shard `index` of `num_shards`; -1: its
  // place now).
  absl::Status CheckOwnership(const v1::TableConfig& config, absl::Span<const int64_t> ids,
                              int32_t index = -1, int32_t num_shards = -1) const;
  // Serves exactly the tables `tables_` holds (after start-up or a restore).
  absl::Status ReloadConfigs();

  // Restore: of this shard's own checkpoint, or from every old shard's (source_dirs).
  absl::StatusOr<embedding::CheckpointInfo> RestoreTables(const v1::RestoreRequest& request,
                                                          embedding::Attachments* attachments);
  embedding::ShardTables* tables_;
  const ShardOptions options_;
  const uint64_t incarnation_;  // random at each start: answers carry it
  mutable absl::Mutex mu_;
  std::map<std::string, ConfigRef> configs_ ABSL_GUARDED_BY(mu_);
  // Per table held; the map changes under the lock, the counts move without it.
  std::map<std::string, std::shared_ptr<TableCounters>> counters_ ABSL_GUARDED_BY(mu_);
  // Its place in the map and the reshard gate; before the pushes, whose waiting calls
  // leave the gate as the pushes go.
  ReshardParticipant reshard_;
  PushApplier pushes_;  // exactly once, across reshards; sync groups' steps
  // Runs pushes (BatchPush); last, so that it finishes the ones it holds before the
  // members they use go.
  CallExecutor calls_;
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_SHARD_SERVICE_H_
