#include "server/coordinator_service.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "embedding/batch_ops.h"
#include "wire/checkpoint_proto.h"
#include "wire/push_proto.h"
#include "wire/row_chunk.h"

namespace tessera::server {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

ClusterOptions ClusterOptionsOf(const CoordinatorOptions& options) {
  ClusterOptions cluster;
  cluster.max_tables = options.max_tables;
  return cluster;
}

}  // namespace

CoordinatorService::CoordinatorService(client::ShardRouter* router, uint64_t shard_map_version,
                                       const CoordinatorOptions& options,
                                       storage::CoordinatorStore* store)
    : options_(options), cluster_(router, shard_map_version, ClusterOptionsOf(options), store) {}

absl::Status CoordinatorService::CheckBatch(const std::string& what, int64_t ids,
                                            uint64_t version) const {
  return CheckRequest(what, ids, Limit(), version, "the coordinator", cluster_.shard_map_version());
}

grpc::Status CoordinatorService::CreateTable(grpc::ServerContext* context,
                                             const v1::CreateTableRequest* request,
                                             v1::CreateTableResponse* response) {
  return Serve(context, Access::kWrite, [&]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(cluster_.CreateTable(request->config()));
    *response->mutable_config() = request->config();
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::ListTables(grpc::ServerContext* context,
                                            const v1::ListTablesRequest*,
                                            v1::ListTablesResponse* response) {
  return Serve(context, Access::kRead, [&]() -> absl::Status {
    for (auto& config : cluster_.Tables()) *response->add_tables() = std::move(config);
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::AlterTable(grpc::ServerContext* context,
                                            const v1::AlterTableRequest* request,
                                            v1::AlterTableResponse* response) {
  return Serve(context, Access::kWrite, [&]() -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(*response->mutable_config(),
                             cluster_.AlterTable(request->table(), request->optimizer()));
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::DropTable(grpc::ServerContext* context,
                                           const v1::DropTableRequest* request,
                                           v1::DropTableResponse*) {
  return Serve(context, Access::kWrite,
               [&]() -> absl::Status { return cluster_.DropTable(request->table()); });
}

grpc::Status CoordinatorService::ExportRows(grpc::ServerContext* context,
                                            const v1::ExportRowsRequest* request,
                                            grpc::ServerWriter<v1::RowChunk>* writer) {
  return Serve(context, Access::kRead, [&]() -> absl::Status {
    return cluster_.ExportRows(*request, [&](const v1::RowChunk& chunk) {
      if (!writer->Write(chunk)) return absl::CancelledError("the caller went away");
      return absl::OkStatus();
    });
  });
}

grpc::Status CoordinatorService::ImportRows(grpc::ServerContext* context,
                                            const v1::ImportRowsRequest* request,
                                            v1::ImportRowsResponse* response) {
  return Serve(context, Access::kWrite, [&]() -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(embedding::RowBlock rows, wire::FromChunk(request->rows()));
    TESSERA_RETURN_IF_ERROR(CheckBatch(absl::StrCat("table '", request->table(), "'"),
                                       static_cast<int64_t>(rows.size()),
                                       request->shard_map_version()));
    TESSERA_RETURN_IF_ERROR(cluster_.ImportRows(request->table(), rows));
    response->set_rows(static_cast<int64_t>(rows.size()));
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::GetShardMap(grpc::ServerContext* context,
                                             const v1::GetShardMapRequest*,
                                             v1::ShardMap* response) {
  return Serve(context, Access::kRead, [&]() -> absl::Status {
    const client::ShardRouter& router = cluster_.router();
    response->set_version(router.shard_map_version());  // the map's own, even mid-reshard
    for (int k = 0; k < router.num_shards(); ++k) {
      v1::ShardInfo* s = response->add_shards();
      s->set_index(k);
      s->set_address(router.addresses()[k]);
      s->set_serving(router.serving(k));
    }
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::Reshard(grpc::ServerContext* context,
                                         const v1::ReshardClusterRequest* request,
                                         v1::ReshardClusterResponse* response) {
  return Serve(context, Access::kWrite, [&]() -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(ReshardOutcome out,
                             cluster_.Reshard(std::vector<std::string>(request->shards().begin(),
                                                                       request->shards().end())));
    response->set_version(out.version);
    response->set_rows_moved(out.rows_moved);
    response->set_seconds(out.seconds);
    response->set_pushes_kept(out.pushes_kept);
    response->set_rows_copied_again(out.rows_copied_again);
    response->set_rows_caught_up(out.rows_caught_up);
    response->set_frozen_seconds(out.frozen_seconds);
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::Lookup(grpc::ServerContext* context,
                                        const v1::LookupRequest* request,
                                        v1::LookupResponse* response) {
  return Serve(context, Access::kRead, [&]() -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(v1::TableConfig config, cluster_.Config(request->table()));
    TESSERA_RETURN_IF_ERROR(CheckBatch(absl::StrCat("table '", request->table(), "'"),
                                       request->ids_size(), request->shard_map_version()));
    TESSERA_ASSIGN_OR_RETURN(LookupView view,
                             PrepareLookup(*request, config.dim(), Limit(), response));
    embedding::TableBags part{request->table(), view.ids,           view.offsets,
                              view.weights,     request->pooling(), view.out};
    absl::Status s = cluster_.LookupBatch({&config, 1}, {&part, 1}, request->read_only());
    if (!s.ok()) response->Clear();
    return s;
  });
}

grpc::Status CoordinatorService::BatchLookup(grpc::ServerContext* context,
                                             const v1::BatchLookupRequest* request,
                                             v1::BatchLookupResponse* response) {
  // A push riding on the lookup needs write access, as a BatchPush does.
  const Access access = request->has_push() ? Access::kWrite : Access::kRead;
  return Serve(context, access, [&]() -> absl::Status {
    thread_local DecodedBatch batch;
    // With shard_rows the shards' answers are forwarded as they come, for the caller to
    // merge: no answer is allocated here, and no row is read.
    const bool forward = request->shard_rows();
    TESSERA_RETURN_IF_ERROR(
        PrepareBatchLookup(*request, Configs(), Limit(), response, &batch, !forward));
    TESSERA_RETURN_IF_ERROR(
        CheckBatch("batched lookup", batch.total_ids, request->shard_map_version()));
    v1::BatchLookupResponse* forward_into = forward ? response : nullptr;
    absl::Status s;
    if (request->has_push()) {
      s = PushThenLookup(*request, batch, forward_into, response->mutable_push());
    } else {
      s = cluster_.LookupBatch(batch.configs, batch.lookups, request->read_only(), forward_into);
    }
    if (!s.ok()) response->Clear();
    const client::ShardRouter& router = cluster_.router();
    response->set_incarnation(router.IncarnationDigest());
    response->set_shard_map_version(router.shard_map_version());
    return s;
  });
}

absl::Status CoordinatorService::PushThenLookup(const v1::BatchLookupRequest& request,
                                                const DecodedBatch& lookup,
                                                v1::BatchLookupResponse* forward,
                                                v1::BatchPushResponse* answer) {
  TESSERA_RETURN_IF_ERROR(CheckPushBeforeLookup(request));
  const v1::BatchPushRequest& push = request.push();
  const bool read_only = request.read_only();
  thread_local DecodedBatch batch;
  TESSERA_RETURN_IF_ERROR(PrepareBatchPush(push, Configs(), &batch));
  TESSERA_RETURN_IF_ERROR(CheckBatch("batched push", batch.total_ids, push.shard_map_version()));
  TESSERA_ASSIGN_OR_RETURN(
      std::vector<int64_t> updated,
      cluster_.PushThenLookup(batch.checked, push.step(), wire::RequestIdOf(push.request_id()),
                              push.after_lookup(), lookup.configs, lookup.lookups, read_only,
                              forward));
  AnswerPush(updated, answer);
  return absl::OkStatus();
}

void CoordinatorService::AnswerPush(const std::vector<int64_t>& updated,
                                    v1::BatchPushResponse* response) const {
  for (const int64_t u : updated) response->add_rows_updated(u);
  const client::ShardRouter& router = cluster_.router();
  response->set_incarnation(router.IncarnationDigest());
  response->set_shard_map_version(router.shard_map_version());
}

grpc::Status CoordinatorService::PushGradients(grpc::ServerContext* context,
                                               const v1::PushGradientsRequest* request,
                                               v1::PushGradientsResponse* response) {
  return Serve(context, Access::kWrite, [&]() -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(v1::TableConfig config, cluster_.Config(request->table()));
    TESSERA_RETURN_IF_ERROR(CheckBatch(absl::StrCat("table '", request->table(), "'"),
                                       request->ids_size(), request->shard_map_version()));
    const embedding::TableGradients part{
        request->table(), absl::MakeConstSpan(request->ids().data(), request->ids_size()),
        absl::MakeConstSpan(request->gradients().data(), request->gradients_size())};
    TESSERA_ASSIGN_OR_RETURN(const embedding::CheckedPush push,
                             embedding::CheckPush({&config, 1}, {&part, 1}));
    TESSERA_ASSIGN_OR_RETURN(
        std::vector<int64_t> updated,
        cluster_.PushBatch(push, request->step(), wire::RequestIdOf(request->request_id())));
    response->set_rows_updated(updated[0]);
    response->set_incarnation(cluster_.router().IncarnationDigest());
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::BatchPush(grpc::ServerContext* context,
                                           const v1::BatchPushRequest* request,
                                           v1::BatchPushResponse* response) {
  return Serve(context, Access::kWrite, [&]() -> absl::Status {
    thread_local DecodedBatch batch;
    TESSERA_RETURN_IF_ERROR(PrepareBatchPush(*request, Configs(), &batch));
    TESSERA_RETURN_IF_ERROR(
        CheckBatch("batched push", batch.total_ids, request->shard_map_version()));
    // A data-parallel worker's push goes on to every shard with its group, once the job
    // registered it.
    const embedding::PushSync sync = wire::PushSyncOf(*request);
    if (sync.active()) TESSERA_RETURN_IF_ERROR(groups_.Check(sync.job, sync.workers));
    TESSERA_ASSIGN_OR_RETURN(
        std::vector<int64_t> updated,
        cluster_.PushBatch(batch.checked, request->step(), wire::RequestIdOf(request->request_id()),
                           sync, request->after_lookup()));
    AnswerPush(updated, response);
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::RegisterSyncGroup(grpc::ServerContext* context,
                                                   const v1::RegisterSyncGroupRequest* request,
                                                   v1::RegisterSyncGroupResponse* /*response*/) {
  return Serve(context, Access::kWrite, [&]() -> absl::Status {
    embedding::PushSync sync;
    sync.job = request->group().job();
    sync.workers = request->group().workers();
    TESSERA_RETURN_IF_ERROR(groups_.Register(sync.job, sync.workers));
    return cluster_.RegisterSyncGroup(sync);
  });
}

grpc::Status CoordinatorService::Stats(grpc::ServerContext* context,
                                       const v1::StatsRequest* request,
                                       v1::StatsResponse* response) {
  return Serve(context, Access::kRead, [&]() -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(std::vector<v1::TableStats> stats, cluster_.Stats(request->table()));
    for (auto& t : stats) *response->add_tables() = std::move(t);
    // A coordinator without a data directory has no checkpoints to report.
    absl::StatusOr<std::vector<storage::CheckpointManifest>> list = cluster_.ListCheckpoints();
    if (list.ok()) {
      for (const auto& m : *list) wire::ToProto(m, 0, response->add_checkpoints());
    }
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::Checkpoint(grpc::ServerContext* context,
                                            const v1::CheckpointRequest* request,
                                            v1::CheckpointResponse* response) {
  return Serve(context, Access::kWrite, [&]() -> absl::Status {
    const auto start = std::chrono::steady_clock::now();
    const embedding::Attachments attachments(request->attachments().begin(),
                                             request->attachments().end());
    TESSERA_ASSIGN_OR_RETURN(storage::CheckpointManifest m,
                             cluster_.Checkpoint(request->step(), attachments, request->model()));
    wire::ToProto(m, SecondsSince(start), response->mutable_checkpoint());
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::Restore(grpc::ServerContext* context,
                                         const v1::RestoreRequest* request,
                                         v1::RestoreResponse* response) {
  // A verify_only request reads and changes nothing.
  const Access access = request->verify_only() ? Access::kRead : Access::kWrite;
  return Serve(context, access, [&]() -> absl::Status {
    const auto start = std::chrono::steady_clock::now();
    embedding::Attachments attachments;
    RestoredTables outcome;
    TESSERA_ASSIGN_OR_RETURN(storage::CheckpointManifest m,
                             cluster_.Restore(request->step(), &attachments,
                                              wire::RestoreOptionsOf(*request), &outcome));
    wire::ToProto(m, SecondsSince(start), response->mutable_checkpoint());
    for (auto& name : outcome.rolled_back) response->add_rolled_back(std::move(name));
    for (auto& name : outcome.brought_back) response->add_brought_back(std::move(name));
    for (auto& name : outcome.dropped) response->add_dropped(std::move(name));
    for (auto& [name, blob] : attachments) (*response->mutable_attachments())[name] = blob;
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::ListCheckpoints(grpc::ServerContext* context,
                                                 const v1::ListCheckpointsRequest*,
                                                 v1::ListCheckpointsResponse* response) {
  return Serve(context, Access::kRead, [&]() -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(std::vector<storage::CheckpointManifest> list,
                             cluster_.ListCheckpoints());
    for (const auto& m : list) wire::ToProto(m, 0, response->add_checkpoints());
    return absl::OkStatus();
  });
}

// The rendezvous store: trainers of a job write and read it (kWrite: with auth, a
// read-only caller takes no part in training).
grpc::Status CoordinatorService::StoreSet(grpc::ServerContext* context,
                                          const v1::StoreSetRequest* request,
                                          v1::StoreSetResponse*) {
  return Serve(context, Access::kWrite,
               [&]() { return rendezvous_.Set(request->key(), request->value()); });
}

grpc::Status CoordinatorService::StoreGet(grpc::ServerContext* context,
                                          const v1::StoreGetRequest* request,
                                          v1::StoreGetResponse* response) {
  return Serve(context, Access::kWrite, [&]() -> absl::Status {
    const std::vector<std::string> keys(request->keys().begin(), request->keys().end());
    TESSERA_ASSIGN_OR_RETURN(
        std::vector<std::string> values,
        rendezvous_.Get(keys, std::chrono::milliseconds(request->timeout_ms())));
    for (auto& v : values) response->add_values(std::move(v));
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::StoreAdd(grpc::ServerContext* context,
                                          const v1::StoreAddRequest* request,
                                          v1::StoreAddResponse* response) {
  return Serve(context, Access::kWrite, [&]() -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(int64_t value, rendezvous_.Add(request->key(), request->delta()));
    response->set_value(value);
    return absl::OkStatus();
  });
}

}  // namespace tessera::server
