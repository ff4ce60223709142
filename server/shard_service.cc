#include "server/shard_service.h"

#include "absl/strings/str_cat.h"
#include "client/checkpoint_proto.h"
#include "embedding/batch_ops.h"
#include "embedding/sharding.h"
#include "embedding/status.h"
#include "server/lookup_request.h"
#include "server/status.h"

namespace tessera::server {

using client::ToProto;

ShardService::ShardService(embedding::EmbeddingCollection* tables, const ShardOptions& options)
    : tables_(tables), options_(options), version_(options.shard_map_version) {
  (void)ReloadConfigs();
}

absl::Status ShardService::ReloadConfigs() {
  // Tables loaded from disk carry this shard's part of max_rows (what CreateTable stored).
  absl::StatusOr<std::vector<v1::TableConfig>> tables = tables_->ListTables();
  if (!tables.ok()) return tables.status();
  absl::MutexLock lock(&mu_);
  configs_.clear();
  for (const auto& c : *tables) {
    configs_[c.name()] = c;
    counters_[c.name()];
  }
  return absl::OkStatus();
}

grpc::Status ShardService::Checkpoint(grpc::ServerContext* context,
                                      const v1::CheckpointRequest* request,
                                      v1::CheckpointResponse* response) {
  if (grpc::Status denied = options_.auth.Check(*context, Access::kWrite); !denied.ok()) {
    return denied;
  }
  embedding::Attachments attachments(request->attachments().begin(), request->attachments().end());
  absl::StatusOr<embedding::CheckpointInfo> info =
      tables_->Checkpoint(request->step(), attachments);
  if (!info.ok()) {
    return ToGrpcStatus(Annotate(info.status(), absl::StrCat("shard ", options_.shard_index)));
  }
  ToProto(*info, response->mutable_checkpoint());
  return grpc::Status::OK;
}

grpc::Status ShardService::Restore(grpc::ServerContext* context, const v1::RestoreRequest* request,
                                   v1::RestoreResponse* response) {
  if (grpc::Status denied = options_.auth.Check(*context, Access::kWrite); !denied.ok()) {
    return denied;
  }
  embedding::Attachments attachments;
  absl::StatusOr<embedding::CheckpointInfo> info = tables_->Restore(request->step(), &attachments);
  if (!info.ok()) {
    return ToGrpcStatus(Annotate(info.status(), absl::StrCat("shard ", options_.shard_index)));
  }
  absl::Status s = ReloadConfigs();
  if (!s.ok()) return ToGrpcStatus(s);
  ToProto(*info, response->mutable_checkpoint());
  for (auto& [name, blob] : attachments) (*response->mutable_attachments())[name] = blob;
  return grpc::Status::OK;
}

grpc::Status ShardService::ListCheckpoints(grpc::ServerContext* context,
                                           const v1::ListCheckpointsRequest*,
                                           v1::ListCheckpointsResponse* response) {
  if (grpc::Status denied = options_.auth.Check(*context, Access::kRead); !denied.ok()) {
    return denied;
  }
  absl::StatusOr<std::vector<embedding::CheckpointInfo>> list = tables_->ListCheckpoints();
  if (!list.ok()) return ToGrpcStatus(list.status());
  for (const auto& info : *list) ToProto(info, response->add_checkpoints());
  return grpc::Status::OK;
}

absl::StatusOr<v1::TableConfig> ShardService::Config(const std::string& table) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = configs_.find(table);
  if (it == configs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("table '", table, "' not found on shard ", options_.shard_index));
  }
  return it->second;
}

absl::Status ShardService::CheckRequest(const v1::TableConfig& config, int ids_size,
                                        const google::protobuf::RepeatedField<int64_t>& ids,
                                        uint64_t version) const {
  if (ids_size > options_.max_batch_ids) {
    return absl::ResourceExhaustedError(absl::StrCat("table '", config.name(), "': batch of ",
                                                     ids_size, " ids is over the limit of ",
                                                     options_.max_batch_ids));
  }
  const uint64_t serving = version_.load();
  if (version != 0 && version != serving) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard_index, ": request built on shard map version ",
                     version, ", this shard serves version ", serving, "; refresh the shard map"));
  }
  if (options_.num_shards > 1) {
    for (const int64_t id : ids) {
      const int owner = embedding::ShardOf(id, config.seed(), options_.num_shards);
      if (owner != options_.shard_index) {
        return absl::FailedPreconditionError(
            absl::StrCat("table '", config.name(), "': id ", id, " belongs to shard ", owner,
                         ", not shard ", options_.shard_index, "; refresh the shard map"));
      }
    }
  }
  return absl::OkStatus();
}

grpc::Status ShardService::CreateTable(grpc::ServerContext* context,
                                       const v1::CreateTableRequest* request,
                                       v1::CreateTableResponse* response) {
  if (grpc::Status denied = options_.auth.Check(*context, Access::kWrite); !denied.ok()) {
    return denied;
  }
  {
    absl::ReaderMutexLock lock(&mu_);
    if (static_cast<int64_t>(configs_.size()) >= options_.max_tables &&
        configs_.count(request->config().name()) == 0) {
      return ToGrpcStatus(absl::ResourceExhaustedError(
          absl::StrCat("table '", request->config().name(), "': this shard holds ", configs_.size(),
                       " tables, its limit (--max_tables)")));
    }
  }
  // Each shard holds 1/num_shards of the rows, so of the row budget too.
  v1::TableConfig local = request->config();
  if (local.max_rows() > 0) {
    local.set_max_rows((local.max_rows() + options_.num_shards - 1) / options_.num_shards);
  }
  absl::Status s = tables_->CreateTable(local);
  if (!s.ok()) return ToGrpcStatus(s);
  absl::MutexLock lock(&mu_);
  configs_[request->config().name()] = request->config();
  counters_[request->config().name()];
  *response->mutable_config() = request->config();
  return grpc::Status::OK;
}

grpc::Status ShardService::ListTables(grpc::ServerContext* context, const v1::ListTablesRequest*,
                                      v1::ListTablesResponse* response) {
  if (grpc::Status denied = options_.auth.Check(*context, Access::kRead); !denied.ok()) {
    return denied;
  }
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [name, config] : configs_) *response->add_tables() = config;
  return grpc::Status::OK;
}

grpc::Status ShardService::Lookup(grpc::ServerContext* context, const v1::LookupRequest* request,
                                  v1::LookupResponse* response) {
  if (grpc::Status denied = options_.auth.Check(*context, Access::kRead); !denied.ok()) {
    return denied;
  }
  absl::StatusOr<v1::TableConfig> config = Config(request->table());
  if (!config.ok()) return ToGrpcStatus(config.status());
  absl::Status s =
      CheckRequest(*config, request->ids_size(), request->ids(), request->shard_map_version());
  if (!s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<LookupView> view = PrepareLookup(*request, config->dim(), response);
  if (!view.ok()) return ToGrpcStatus(view.status());
  embedding::LookupOptions options;
  options.insert_missing = !request->read_only();
  s = view->pooled ? tables_->PooledLookup(request->table(), view->ids, view->offsets,
                                           view->weights, request->pooling(), view->out, options)
                   : tables_->Lookup(request->table(), view->ids, view->out, options);
  if (!s.ok()) {
    response->Clear();
    return ToGrpcStatus(s);
  }
  absl::MutexLock lock(&mu_);
  counters_[request->table()].lookups += request->ids_size();
  return grpc::Status::OK;
}

grpc::Status ShardService::PushGradients(grpc::ServerContext* context,
                                         const v1::PushGradientsRequest* request,
                                         v1::PushGradientsResponse* response) {
  if (grpc::Status denied = options_.auth.Check(*context, Access::kWrite); !denied.ok()) {
    return denied;
  }
  absl::StatusOr<v1::TableConfig> config = Config(request->table());
  if (!config.ok()) return ToGrpcStatus(config.status());
  absl::Status s =
      CheckRequest(*config, request->ids_size(), request->ids(), request->shard_map_version());
  if (!s.ok()) return ToGrpcStatus(s);
  const absl::Span<const int64_t> ids(request->ids().data(), request->ids_size());
  s = tables_->PushGradients(
      request->table(), ids,
      absl::Span<const float>(request->gradients().data(), request->gradients_size()),
      request->step());
  if (!s.ok()) return ToGrpcStatus(s);
  thread_local std::vector<int64_t> unique;
  thread_local std::vector<int32_t> inverse;
  embedding::Unique(ids, &unique, &inverse);
  response->set_rows_updated(static_cast<int64_t>(unique.size()));
  absl::MutexLock lock(&mu_);
  counters_[request->table()].updates += static_cast<int64_t>(unique.size());
  return grpc::Status::OK;
}

grpc::Status ShardService::Stats(grpc::ServerContext* context, const v1::StatsRequest* request,
                                 v1::StatsResponse* response) {
  if (grpc::Status denied = options_.auth.Check(*context, Access::kRead); !denied.ok()) {
    return denied;
  }
  std::map<std::string, Counters> counters;
  {
    absl::ReaderMutexLock lock(&mu_);
    if (!request->table().empty() && configs_.count(request->table()) == 0) {
      return ToGrpcStatus(absl::NotFoundError(absl::StrCat(
          "table '", request->table(), "' not found on shard ", options_.shard_index)));
    }
    counters = counters_;
  }
  for (const auto& [name, c] : counters) {
    if (!request->table().empty() && name != request->table()) continue;
    absl::StatusOr<embedding::TableUsage> usage = tables_->Usage(name);
    if (!usage.ok()) return ToGrpcStatus(usage.status());
    v1::TableStats* t = response->add_tables();
    t->set_table(name);
    t->set_shard_index(options_.shard_index);
    t->set_rows(usage->rows);
    t->set_memory_bytes(usage->memory_bytes);
    t->set_lookups(c.lookups);
    t->set_updates(c.updates);
    t->set_evictions(usage->evictions);
  }
  // Servers without storage have no checkpoints to report.
  absl::StatusOr<std::vector<embedding::CheckpointInfo>> list = tables_->ListCheckpoints();
  if (list.ok()) {
    for (const auto& info : *list) ToProto(info, response->add_checkpoints());
  }
  return grpc::Status::OK;
}

}  // namespace tessera::server
