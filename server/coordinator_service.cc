#include "server/coordinator_service.h"

#include "absl/strings/str_cat.h"
#include "embedding/batch_ops.h"
#include "embedding/embedding_table.h"
#include "embedding/status.h"
#include "server/lookup_request.h"
#include "server/status.h"

namespace tessera::server {

CoordinatorService::CoordinatorService(client::ShardRouter* router, uint64_t shard_map_version,
                                       const CoordinatorOptions& options)
    : router_(router), version_(shard_map_version), options_(options) {}

void CoordinatorService::SetShardMapVersion(uint64_t version) {
  version_.store(version);
  router_->set_shard_map_version(version);
}

absl::StatusOr<v1::TableConfig> CoordinatorService::Config(const std::string& table) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = configs_.find(table);
  if (it == configs_.end()) {
    return absl::NotFoundError(absl::StrCat("table '", table, "' not found"));
  }
  return it->second;
}

absl::Status CoordinatorService::CheckBatch(const std::string& table, int ids) const {
  if (ids > options_.max_batch_ids) {
    return absl::ResourceExhaustedError(absl::StrCat("table '", table, "': batch of ", ids,
                                                     " ids is over the limit of ",
                                                     options_.max_batch_ids));
  }
  return absl::OkStatus();
}

grpc::Status CoordinatorService::CreateTable(grpc::ServerContext*,
                                             const v1::CreateTableRequest* request,
                                             v1::CreateTableResponse* response) {
  const v1::TableConfig& config = request->config();
  absl::Status s = embedding::ValidateTableConfig(config);
  if (!s.ok()) return ToGrpcStatus(s);
  absl::MutexLock create(&create_mu_);
  if (Config(config.name()).ok()) {
    return ToGrpcStatus(
        absl::AlreadyExistsError(absl::StrCat("table '", config.name(), "' already exists")));
  }
  s = router_->CreateTable(config);
  if (!s.ok()) return ToGrpcStatus(s);
  absl::MutexLock lock(&mu_);
  configs_[config.name()] = config;
  *response->mutable_config() = config;
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ListTables(grpc::ServerContext*, const v1::ListTablesRequest*,
                                            v1::ListTablesResponse* response) {
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [name, config] : configs_) *response->add_tables() = config;
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetShardMap(grpc::ServerContext*, const v1::GetShardMapRequest*,
                                             v1::ShardMap* response) {
  response->set_version(version_.load());
  for (int k = 0; k < router_->num_shards(); ++k) {
    v1::ShardInfo* s = response->add_shards();
    s->set_index(k);
    s->set_address(router_->addresses()[k]);
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Lookup(grpc::ServerContext*, const v1::LookupRequest* request,
                                        v1::LookupResponse* response) {
  absl::StatusOr<v1::TableConfig> config = Config(request->table());
  if (!config.ok()) return ToGrpcStatus(config.status());
  absl::Status s = CheckBatch(request->table(), request->ids_size());
  if (!s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<LookupView> view = PrepareLookup(*request, config->dim(), response);
  if (!view.ok()) return ToGrpcStatus(view.status());
  s = view->pooled ? router_->PooledLookup(*config, view->ids, view->offsets, view->weights,
                                           request->pooling(), view->out, request->read_only())
                   : router_->Lookup(*config, view->ids, view->out, request->read_only());
  if (!s.ok()) {
    response->Clear();
    return ToGrpcStatus(s);
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::PushGradients(grpc::ServerContext*,
                                               const v1::PushGradientsRequest* request,
                                               v1::PushGradientsResponse* response) {
  absl::StatusOr<v1::TableConfig> config = Config(request->table());
  if (!config.ok()) return ToGrpcStatus(config.status());
  absl::Status s = CheckBatch(request->table(), request->ids_size());
  if (!s.ok()) return ToGrpcStatus(s);
  s = embedding::CheckRowsSize(request->table(), "gradients", request->gradients_size(),
                               request->ids_size(), config->dim(), "ids");
  if (!s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<int64_t> updated = router_->PushGradients(
      *config, absl::Span<const int64_t>(request->ids().data(), request->ids_size()),
      absl::Span<const float>(request->gradients().data(), request->gradients_size()),
      request->step());
  if (!updated.ok()) return ToGrpcStatus(updated.status());
  response->set_rows_updated(*updated);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Stats(grpc::ServerContext*, const v1::StatsRequest* request,
                                       v1::StatsResponse* response) {
  if (!request->table().empty()) {
    absl::StatusOr<v1::TableConfig> config = Config(request->table());
    if (!config.ok()) return ToGrpcStatus(config.status());
  }
  absl::StatusOr<std::vector<v1::TableStats>> stats = router_->Stats(request->table());
  if (!stats.ok()) return ToGrpcStatus(stats.status());
  for (const auto& t : *stats) *response->add_tables() = t;
  return grpc::Status::OK;
}

}  // namespace tessera::server
