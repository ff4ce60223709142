#include "server/coordinator_service.h"

#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "embedding/batch_ops.h"
#include "embedding/embedding_table.h"
#include "embedding/status.h"
#include "google/protobuf/util/message_differencer.h"
#include "server/lookup_request.h"
#include "server/status.h"

namespace tessera::server {

namespace {

void ToProto(const storage::CheckpointManifest& m, double seconds, v1::CheckpointInfo* out) {
  out->set_step(m.step);
  out->set_rows(m.rows);
  out->set_bytes(m.bytes);
  out->set_created_unix_ms(m.created_unix_ms);
  out->set_seconds(seconds);
  for (const auto& s : m.shards) out->add_shards(s);
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

CoordinatorService::CoordinatorService(client::ShardRouter* router, uint64_t shard_map_version,
                                       const CoordinatorOptions& options,
                                       storage::CoordinatorStore* store)
    : router_(router), version_(shard_map_version), options_(options), store_(store) {
  router_->SetReadmitCallback([this](int k) { Reprovision(k); });
  if (store_ == nullptr) return;
  const v1::CoordinatorState state = store_->state();
  absl::MutexLock lock(&mu_);
  for (const auto& t : state.tables()) configs_[t.name()] = t;
}

CoordinatorService::~CoordinatorService() { router_->SetReadmitCallback(nullptr); }

void CoordinatorService::Reprovision(int k) {
  std::vector<v1::TableConfig> configs;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [name, config] : configs_) configs.push_back(config);
  }
  absl::MutexLock create(&create_mu_);
  int failed = 0;
  for (const v1::TableConfig& config : configs) {
    // Idempotent: a table the shard holds (loaded from its data directory) is left as is.
    absl::Status s = router_->CreateTableOn(k, config);
    if (!s.ok()) {
      ++failed;
      std::fprintf(stderr, "tessera: shard %d: cannot re-create table '%s': %s\n", k,
                   config.name().c_str(), std::string(s.message()).c_str());
    }
  }
  std::fprintf(stderr, "tessera: shard %d re-admitted: its %zu tables checked, %d failed\n", k,
               configs.size(), failed);
}

absl::Status CoordinatorService::NeedStore() const {
  if (store_ != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "this coordinator has no --data_dir, so it cannot record cluster checkpoints");
}

v1::CoordinatorState CoordinatorService::StateLocked() const {
  v1::CoordinatorState state;
  for (const auto& [name, config] : configs_) *state.add_tables() = config;
  state.set_shard_map_version(version_.load());
  for (const auto& a : router_->addresses()) state.add_shards(a);
  return state;
}

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

absl::Status CoordinatorService::CheckBatch(const std::string& table, int64_t ids) const {
  if (ids > options_.max_batch_ids) {
    return absl::ResourceExhaustedError(absl::StrCat(table, ": batch of ", ids,
                                                     " ids is over the limit of ",
                                                     options_.max_batch_ids));
  }
  return absl::OkStatus();
}

grpc::Status CoordinatorService::CreateTable(grpc::ServerContext* context,
                                             const v1::CreateTableRequest* request,
                                             v1::CreateTableResponse* response) {
  if (grpc::Status denied = options_.auth.Check(*context, Access::kWrite); !denied.ok()) {
    return denied;
  }
  const v1::TableConfig& config = request->config();
  absl::Status s = embedding::ValidateTableConfig(config);
  if (!s.ok()) return ToGrpcStatus(s);
  absl::MutexLock create(&create_mu_);
  if (absl::StatusOr<v1::TableConfig> held = Config(config.name()); held.ok()) {
    if (!google::protobuf::util::MessageDifferencer::Equals(*held, config)) {
      return ToGrpcStatus(absl::AlreadyExistsError(
          absl::StrCat("table '", config.name(), "' already exists with another config")));
    }
    // The same table again (a retry, or a create that failed on some shard): make sure
    // every shard has it; shards answer OK for a table they hold with this config.
    s = router_->CreateTable(config);
    if (!s.ok()) return ToGrpcStatus(s);
    *response->mutable_config() = config;
    return grpc::Status::OK;
  }
  {
    absl::ReaderMutexLock lock(&mu_);
    if (static_cast<int64_t>(configs_.size()) >= options_.max_tables) {
      return ToGrpcStatus(absl::ResourceExhaustedError(
          absl::StrCat("table '", config.name(), "': the cluster holds ", configs_.size(),
                       " tables, its limit (--max_tables)")));
    }
  }
  if (store_ != nullptr) {
    // Recorded before the shards create it: a table the shards hold is never unknown to
    // a restarted coordinator.
    v1::CoordinatorState state;
    {
      absl::ReaderMutexLock lock(&mu_);
      state = StateLocked();
    }
    *state.add_tables() = config;
    s = store_->Save(state);
    if (!s.ok()) return ToGrpcStatus(Annotate(s, "cannot record the new table"));
  }
  s = router_->CreateTable(config);
  if (!s.ok()) {
    if (store_ != nullptr) {
      absl::ReaderMutexLock lock(&mu_);
      (void)store_->Save(StateLocked());
    }
    return ToGrpcStatus(s);
  }
  absl::MutexLock lock(&mu_);
  configs_[config.name()] = config;
  *response->mutable_config() = config;
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ListTables(grpc::ServerContext* context,
                                            const v1::ListTablesRequest*,
                                            v1::ListTablesResponse* response) {
  if (grpc::Status denied = options_.auth.Check(*context, Access::kRead); !denied.ok()) {
    return denied;
  }
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [name, config] : configs_) *response->add_tables() = config;
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetShardMap(grpc::ServerContext* context,
                                             const v1::GetShardMapRequest*,
                                             v1::ShardMap* response) {
  if (grpc::Status denied = options_.auth.Check(*context, Access::kRead); !denied.ok()) {
    return denied;
  }
  response->set_version(version_.load());
  for (int k = 0; k < router_->num_shards(); ++k) {
    v1::ShardInfo* s = response->add_shards();
    s->set_index(k);
    s->set_address(router_->addresses()[k]);
    s->set_serving(router_->serving(k));
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Lookup(grpc::ServerContext* context,
                                        const v1::LookupRequest* request,
                                        v1::LookupResponse* response) {
  return Serve(context, Access::kRead, [&]() -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(v1::TableConfig config, Config(request->table()));
    TESSERA_RETURN_IF_ERROR(
        CheckBatch(absl::StrCat("table '", request->table(), "'"), request->ids_size()));
    TESSERA_ASSIGN_OR_RETURN(LookupView view, PrepareLookup(*request, config.dim(), response));
    embedding::TableBags part{request->table(), view.ids, view.offsets, view.weights,
                              request->pooling(), view.out};
    absl::Status s = router_->LookupBatch({&config, 1}, {&part, 1}, request->read_only());
    if (!s.ok()) response->Clear();
    return s;
  });
}

grpc::Status CoordinatorService::BatchLookup(grpc::ServerContext* context,
                                             const v1::BatchLookupRequest* request,
                                             v1::BatchLookupResponse* response) {
  return Serve(context, Access::kRead, [&]() -> absl::Status {
    thread_local DecodedBatch batch;
    TESSERA_RETURN_IF_ERROR(PrepareBatchLookup(
        *request, [&](const std::string& t) { return Config(t); }, response, &batch));
    TESSERA_RETURN_IF_ERROR(CheckBatch("batched lookup", batch.total_ids));
    absl::Status s = router_->LookupBatch(batch.configs, batch.lookups, request->read_only());
    if (!s.ok()) response->Clear();
    return s;
  });
}

absl::StatusOr<std::vector<int64_t>> CoordinatorService::RoutePush(const DecodedBatch& batch,
                                                                   int64_t step,
                                                                   const v1::RequestId& id) {
  absl::ReaderMutexLock barrier(&barrier_mu_);
  return router_->PushBatch(batch.configs, batch.pushes, step, {id.client_id(), id.sequence()});
}

grpc::Status CoordinatorService::PushGradients(grpc::ServerContext* context,
                                               const v1::PushGradientsRequest* request,
                                               v1::PushGradientsResponse* response) {
  return Serve(context, Access::kWrite, [&]() -> absl::Status {
    thread_local DecodedBatch batch;
    batch.configs.clear();
    TESSERA_ASSIGN_OR_RETURN(v1::TableConfig config, Config(request->table()));
    batch.configs.push_back(std::move(config));
    TESSERA_RETURN_IF_ERROR(
        CheckBatch(absl::StrCat("table '", request->table(), "'"), request->ids_size()));
    batch.pushes.assign(
        1, {request->table(), absl::MakeConstSpan(request->ids().data(), request->ids_size()),
            absl::MakeConstSpan(request->gradients().data(), request->gradients_size())});
    TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> updated,
                             RoutePush(batch, request->step(), request->request_id()));
    response->set_rows_updated(updated[0]);
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::BatchPush(grpc::ServerContext* context,
                                           const v1::BatchPushRequest* request,
                                           v1::BatchPushResponse* response) {
  return Serve(context, Access::kWrite, [&]() -> absl::Status {
    thread_local DecodedBatch batch;
    TESSERA_RETURN_IF_ERROR(PrepareBatchPush(
        *request, [&](const std::string& t) { return Config(t); }, &batch));
    TESSERA_RETURN_IF_ERROR(CheckBatch("batched push", batch.total_ids));
    TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> updated,
                             RoutePush(batch, request->step(), request->request_id()));
    for (const int64_t u : updated) response->add_rows_updated(u);
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::Stats(grpc::ServerContext* context,
                                       const v1::StatsRequest* request,
                                       v1::StatsResponse* response) {
  if (grpc::Status denied = options_.auth.Check(*context, Access::kRead); !denied.ok()) {
    return denied;
  }
  if (!request->table().empty()) {
    absl::StatusOr<v1::TableConfig> config = Config(request->table());
    if (!config.ok()) return ToGrpcStatus(config.status());
  }
  absl::StatusOr<std::vector<v1::TableStats>> stats = router_->Stats(request->table());
  if (!stats.ok()) return ToGrpcStatus(stats.status());
  for (const auto& t : *stats) *response->add_tables() = t;
  if (store_ != nullptr) {
    for (const auto& m : store_->ListCheckpoints()) ToProto(m, 0, response->add_checkpoints());
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Checkpoint(grpc::ServerContext* context,
                                            const v1::CheckpointRequest* request,
                                            v1::CheckpointResponse* response) {
  if (grpc::Status denied = options_.auth.Check(*context, Access::kWrite); !denied.ok()) {
    return denied;
  }
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = NeedStore();
  if (!s.ok()) return ToGrpcStatus(s);
  if (request->step() < 0) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("checkpoint step must be >= 0, got ", request->step())));
  }
  embedding::Attachments attachments(request->attachments().begin(), request->attachments().end());
  for (const auto& [name, blob] : attachments) {
    s = storage::ValidateAttachmentName(name);
    if (!s.ok()) return ToGrpcStatus(s);
  }
  absl::MutexLock barrier(&barrier_mu_);
  absl::StatusOr<std::vector<v1::CheckpointInfo>> shards =
      router_->CheckpointShards(request->step());
  if (!shards.ok()) return ToGrpcStatus(Annotate(shards.status(), "checkpoint not taken"));
  storage::CheckpointManifest m;
  m.step = request->step();
  for (const auto& info : *shards) {
    m.rows += info.rows();
    m.bytes += info.bytes();
  }
  m.shards = router_->addresses();
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [name, config] : configs_) m.tables.push_back(name);
  }
  absl::StatusOr<storage::CheckpointManifest> committed = store_->CommitCheckpoint(m, attachments);
  if (!committed.ok()) return ToGrpcStatus(committed.status());
  ToProto(*committed, SecondsSince(start), response->mutable_checkpoint());
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Restore(grpc::ServerContext* context,
                                         const v1::RestoreRequest* request,
                                         v1::RestoreResponse* response) {
  if (grpc::Status denied = options_.auth.Check(*context, Access::kWrite); !denied.ok()) {
    return denied;
  }
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = NeedStore();
  if (!s.ok()) return ToGrpcStatus(s);
  embedding::Attachments attachments;
  absl::StatusOr<storage::CheckpointManifest> m =
      store_->FindCheckpoint(request->step(), &attachments);
  if (!m.ok()) return ToGrpcStatus(m.status());
  if (m->shards.size() != router_->addresses().size()) {
    return ToGrpcStatus(absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", m->step, " spans ", m->shards.size(),
                     " shards, this cluster has ", router_->addresses().size())));
  }
  absl::MutexLock barrier(&barrier_mu_);
  absl::StatusOr<std::vector<v1::CheckpointInfo>> shards = router_->RestoreShards(m->step);
  if (!shards.ok()) {
    return ToGrpcStatus(Annotate(
        shards.status(), absl::StrCat("restore of checkpoint ", m->step, " failed; retry it")));
  }
  ToProto(*m, SecondsSince(start), response->mutable_checkpoint());
  for (auto& [name, blob] : attachments) (*response->mutable_attachments())[name] = blob;
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ListCheckpoints(grpc::ServerContext* context,
                                                 const v1::ListCheckpointsRequest*,
                                                 v1::ListCheckpointsResponse* response) {
  if (grpc::Status denied = options_.auth.Check(*context, Access::kRead); !denied.ok()) {
    return denied;
  }
  absl::Status s = NeedStore();
  if (!s.ok()) return ToGrpcStatus(s);
  for (const auto& m : store_->ListCheckpoints()) ToProto(m, 0, response->add_checkpoints());
  return grpc::Status::OK;
}

}  // namespace tessera::server
