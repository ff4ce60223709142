#include "server/shard_service.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "base/check.h"
#include "base/status.h"
#include "embedding/batch_ops.h"
#include "embedding/embedding_table.h"
#include "embedding/sharding.h"
#include "embedding/storage/durable_collection.h"
#include "embedding/table_config.h"
#include "google/protobuf/util/message_differencer.h"
#include "wire/checkpoint_proto.h"
#include "wire/grpc_status.h"
#include "wire/packed_bytes.h"
#include "wire/push_proto.h"
#include "wire/row_chunk.h"

namespace tessera::server {

ShardService::ShardService(embedding::ShardTables* tables, const ShardOptions& options)
    : tables_(tables),
      options_(options),
      incarnation_(embedding::RandomNonZeroId()),
      reshard_(tables, &pushes_,
               {options.shard_index, options.num_shards, options.shard_map_version,
                options.on_placement}),
      pushes_(tables, &reshard_, Configs(),
              {absl::StrCat("shard ", options.shard_index), options.push_window,
               options.max_sync_waiting, options.max_sync_wait, options.change_log_bytes}) {
  // Unlisted tables are refused as unknown until a restore lists them again: say why.
  if (absl::Status s = ReloadConfigs(); !s.ok()) {
    std::fprintf(stderr, "tessera: shard %d: cannot list the tables it holds: %s\n",
                 reshard_.index(), s.ToString().c_str());
  }
}

ShardService::~ShardService() = default;

absl::Status ShardService::Enter(Traffic traffic, uint64_t version,
                                 const grpc::ServerContextBase& context) {
  return reshard_.Enter(traffic, version, absl::FromChrono(context.deadline()));
}

absl::Status ShardService::ReloadConfigs() {
  // Tables loaded from disk carry this shard's part of max_rows (what CreateTable stored).
  absl::StatusOr<std::vector<v1::TableConfig>> tables = tables_->ListTables();
  if (!tables.ok()) return tables.status();
  absl::MutexLock lock(&mu_);
  configs_.clear();
  std::map<std::string, std::shared_ptr<TableCounters>> counters;
  for (const auto& c : *tables) {
    configs_[c.name()] = std::make_shared<const v1::TableConfig>(c);
    // Tables no longer held leave the stats; those still held keep their counts.
    std::shared_ptr<TableCounters>& kept = counters_[c.name()];
    counters[c.name()] = kept != nullptr ? kept : std::make_shared<TableCounters>();
  }
  counters_ = std::move(counters);
  return absl::OkStatus();
}

grpc::Status ShardService::Checkpoint(grpc::ServerContext* context,
                                      const v1::CheckpointRequest* request,
                                      v1::CheckpointResponse* response) {
  return Serve(context, Access::kWrite, [&]() -> absl::Status {
    embedding::Attachments attachments(request->attachments().begin(),
                                       request->attachments().end());
    embedding::CheckpointOptions options;
    options.model = request->model();
    options.replace = request->replace();
    absl::StatusOr<embedding::Checkpointing*> checkpoints = embedding::CheckpointsOf(*tables_);
    absl::StatusOr<embedding::CheckpointInfo> info =
        checkpoints.ok() ? (*checkpoints)->Checkpoint(request->step(), attachments, options)
                         : absl::StatusOr<embedding::CheckpointInfo>(checkpoints.status());
    if (!info.ok()) return Annotate(info.status(), absl::StrCat("shard ", reshard_.index()));
    wire::ToProto(*info, response->mutable_checkpoint());
    // Where it lies, for a restore onto another shard count (which reads every shard's).
    if (auto* durable = dynamic_cast<storage::DurableCollection*>(tables_)) {
      response->mutable_checkpoint()->add_dirs(
          std::filesystem::absolute(durable->CheckpointDir(info->step, options.model)).string());
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<embedding::CheckpointInfo> ShardService::RestoreTables(
    const v1::RestoreRequest& request, embedding::Attachments* attachments) {
  if (request.source_dirs().empty()) {
    TESSERA_ASSIGN_OR_RETURN(embedding::Checkpointing * checkpoints,
                             embedding::CheckpointsOf(*tables_));
    return checkpoints->Restore(request.step(), attachments, wire::RestoreOptionsOf(request));
  }
  auto* durable = dynamic_cast<storage::DurableCollection*>(tables_);
  if (durable == nullptr) {
    return absl::FailedPreconditionError(
        "a restore from another shard count's checkpoint needs a shard with a data directory");
  }
  return durable->RestoreFromShards(
      std::vector<std::string>(request.source_dirs().begin(), request.source_dirs().end()),
      attachments, wire::RestoreOptionsOf(request));
}

grpc::Status ShardService::Restore(grpc::ServerContext* context, const v1::RestoreRequest* request,
                                   v1::RestoreResponse* response) {
  return Serve(context, Access::kWrite, [&]() -> absl::Status {
    embedding::Attachments attachments;
    absl::StatusOr<embedding::CheckpointInfo> info = RestoreTables(*request, &attachments);
    if (!info.ok()) return Annotate(info.status(), absl::StrCat("shard ", reshard_.index()));
    // Every row is the checkpoint's now: pushes remembered as applied no longer are. (A
    // model's restore leaves the other models' pushes on record: their rows stand.)
    if (request->model().empty()) TESSERA_RETURN_IF_ERROR(pushes_.ForgetAll());
    // Rows went back without a push: a replica reading the log starts again.
    pushes_.changes().Reset();
    TESSERA_RETURN_IF_ERROR(ReloadConfigs());
    wire::ToProto(*info, response->mutable_checkpoint());
    for (auto& [name, blob] : attachments) (*response->mutable_attachments())[name] = blob;
    return absl::OkStatus();
  });
}

grpc::Status ShardService::AlterTable(grpc::ServerContext* context,
                                      const v1::AlterTableRequest* request,
                                      v1::AlterTableResponse* response) {
  return Serve(context, Access::kWrite, [&]() -> absl::Status {
    absl::StatusOr<v1::TableConfig> altered =
        tables_->AlterTable(request->table(), request->optimizer());
    if (absl::IsNotFound(altered.status())) {
      return absl::NotFoundError(
          absl::StrCat("table '", request->table(), "' not found on shard ", reshard_.index()));
    }
    TESSERA_RETURN_IF_ERROR(altered.status());
    absl::MutexLock lock(&mu_);
    auto it = configs_.find(request->table());
    if (it != configs_.end()) {
      // A new config, not a change of the one requests may hold (ConfigRef).
      auto changed = std::make_shared<v1::TableConfig>(*it->second);
      *changed->mutable_optimizer() = altered->optimizer();
      it->second = std::move(changed);
    }
    *response->mutable_config() = it != configs_.end() ? *it->second : *altered;
    return absl::OkStatus();
  });
}

grpc::Status ShardService::DropTable(grpc::ServerContext* context,
                                     const v1::DropTableRequest* request, v1::DropTableResponse*) {
  return Serve(context, Access::kWrite, [&]() -> absl::Status {
    absl::Status s = tables_->DropTable(request->table());
    if (absl::IsNotFound(s)) {
      return absl::NotFoundError(
          absl::StrCat("table '", request->table(), "' not found on shard ", reshard_.index()));
    }
    TESSERA_RETURN_IF_ERROR(s);
    // A table of the same name made later starts from initial rows: replicas start again.
    pushes_.changes().Reset();
    absl::MutexLock lock(&mu_);
    configs_.erase(request->table());
    counters_.erase(request->table());
    return absl::OkStatus();
  });
}

grpc::Status ShardService::ExportRows(grpc::ServerContext* context,
                                      const v1::ExportRowsRequest* request,
                                      grpc::ServerWriter<v1::RowChunk>* writer) {
  return Serve(context, Access::kRead, [&]() -> absl::Status {
    if (!request->checkpoint_dirs().empty()) return ExportCheckpointRows(*request, writer);
    embedding::ExportOptions options;
    options.since_step = request->since_step();
    options.with_state = request->with_state();
    if (request->chunk_rows() > 0) options.chunk_rows = static_cast<size_t>(request->chunk_rows());
    TESSERA_ASSIGN_OR_RETURN(const v1::TableConfig config, Config(request->table()));
    const v1::MovingRows& moving = request->moving();
    if (moving.num_shards() > 0) reshard_.NoteCopied(request->table());
    std::vector<int64_t> changed;
    if (moving.changed_only()) {
      changed = reshard_.ChangedInLastRound(request->table());
      if (changed.empty()) return absl::OkStatus();
      options.ids = changed;
    }
    v1::RowChunk chunk;
    embedding::RowBlock leaving;
    return tables_->ExportRows(request->table(), options, [&](const embedding::RowBlock& all) {
      const embedding::RowBlock* b = &all;
      if (moving.num_shards() > 0) {
        LeavingRows(config, moving, all, &leaving);
        if (leaving.size() == 0) return absl::OkStatus();
        b = &leaving;
      }
      wire::ToChunk(*b, &chunk);
      if (!writer->Write(chunk)) return absl::CancelledError("the caller went away");
      return absl::OkStatus();
    });
  });
}

absl::Status ShardService::ExportCheckpointRows(const v1::ExportRowsRequest& request,
                                                grpc::ServerWriter<v1::RowChunk>* writer) {
  auto* durable = dynamic_cast<storage::DurableCollection*>(tables_);
  if (durable == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", reshard_.index(), " keeps no checkpoints (it runs without --data_dir)"));
  }
  embedding::ExportOptions options;
  options.since_step = request.since_step();
  options.with_state = request.with_state();
  if (request.chunk_rows() > 0) options.chunk_rows = static_cast<size_t>(request.chunk_rows());
  v1::TableConfig config;
  v1::RowChunk chunk;
  bool first = true;
  auto send = [&](const embedding::RowBlock& rows) -> absl::Status {
    wire::ToChunk(rows, &chunk);
    if (first)
      *chunk.mutable_config() = config;  // set before the first rows
    else
      chunk.clear_config();
    first = false;
    if (!writer->Write(chunk)) return absl::CancelledError("the caller went away");
    return absl::OkStatus();
  };
  TESSERA_RETURN_IF_ERROR(
      Annotate(durable->ExportCheckpointRows(
                   {request.checkpoint_dirs().begin(), request.checkpoint_dirs().end()},
                   request.table(), options, &config, send),
               absl::StrCat("shard ", reshard_.index())));
  if (!first) return absl::OkStatus();
  embedding::RowBlock none;  // no row of it here: its config still
  none.dim = config.dim();
  return send(none);
}

void ShardService::LeavingRows(const v1::TableConfig& config, const v1::MovingRows& moving,
                               const embedding::RowBlock& all, embedding::RowBlock* leaving) {
  // A fixed vocabulary's rows are laid out by place: those it keeps move too (into its
  // layout for the new place), so every row goes.
  const bool keep = config.vocabulary_size() == 0;
  leaving->dim = all.dim;
  leaving->state_floats = all.state_floats;
  leaving->Clear();
  for (size_t i = 0; i < all.size(); ++i) {
    if (keep &&
        embedding::ShardOfRow(config, all.ids[i], moving.num_shards()) == moving.keep_index()) {
      continue;
    }
    leaving->Append(all.ids[i], &all.weights[i * all.dim],
                    all.state_floats > 0 ? &all.state[i * all.state_floats] : nullptr,
                    all.last_steps[i], all.update_counts[i]);
  }
}

grpc::Status ShardService::ImportRows(grpc::ServerContext* context,
                                      const v1::ImportRowsRequest* request,
                                      v1::ImportRowsResponse* response) {
  return Serve(context, Access::kWrite, [&]() -> absl::Status {
    // A caller's import changes rows as a push does: while the shard is frozen for a
    // reshard it waits with the pushes (else the commit would drop what it wrote after the
    // last copy), and a freeze waits for it. The reshard's own rows (stamped with the map
    // they move to) pass.
    const Traffic traffic =
        reshard_.MovingRowsOf(request->shard_map_version()) ? Traffic::kImport : Traffic::kPush;
    TESSERA_RETURN_IF_ERROR(Enter(traffic, request->shard_map_version(), *context));
    Admitted admitted(&reshard_, traffic);
    TESSERA_ASSIGN_OR_RETURN(v1::TableConfig config, Config(request->table()));
    TESSERA_ASSIGN_OR_RETURN(embedding::RowBlock rows, wire::FromChunk(request->rows()));
    // During a reshard, rows moving here come stamped with the new map, for this shard's
    // place in it.
    uint64_t version = request->shard_map_version();
    int32_t index = -1;
    int32_t shards = -1;
    TESSERA_RETURN_IF_ERROR(reshard_.PlaceOfImport(&version, &index, &shards));
    TESSERA_RETURN_IF_ERROR(CheckBatch(absl::StrCat("table '", request->table(), "'"),
                                       static_cast<int64_t>(rows.size()), version));
    TESSERA_RETURN_IF_ERROR(CheckOwnership(config, rows.ids, index, shards));
    TESSERA_RETURN_IF_ERROR(index < 0
                                ? tables_->ImportRows(request->table(), rows)
                                : tables_->ImportMovingRows(request->table(), rows, index, shards));
    // A caller's import (not the reshard's own) changes rows a reshard's copy may have sent.
    if (index < 0) reshard_.NoteChanged(config, rows.ids);
    // Replicas read rows moving here once this shard serves them (the commit publishes).
    if (index < 0) {
      pushes_.changes().Append(request->table(), -1, rows.ids);
    } else {
      pushes_.changes().Hold(request->table(), rows.ids);
    }
    response->set_rows(static_cast<int64_t>(rows.size()));
    return absl::OkStatus();
  });
}

grpc::Status ShardService::ListCheckpoints(grpc::ServerContext* context,
                                           const v1::ListCheckpointsRequest*,
                                           v1::ListCheckpointsResponse* response) {
  return Serve(context, Access::kRead, [&]() -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(embedding::Checkpointing * checkpoints,
                             embedding::CheckpointsOf(*tables_));
    TESSERA_ASSIGN_OR_RETURN(std::vector<embedding::CheckpointInfo> list,
                             checkpoints->ListCheckpoints());
    for (const auto& info : list) wire::ToProto(info, response->add_checkpoints());
    return absl::OkStatus();
  });
}

absl::StatusOr<ConfigRef> ShardService::ConfigOf(const std::string& table,
                                                 std::shared_ptr<TableCounters>* counters) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = configs_.find(table);
  if (it == configs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("table '", table, "' not found on shard ", reshard_.index()));
  }
  if (counters != nullptr) {
    auto c = counters_.find(table);
    *counters = c != counters_.end() ? c->second : nullptr;
  }
  return it->second;
}

absl::StatusOr<v1::TableConfig> ShardService::Config(
    const std::string& table, std::shared_ptr<TableCounters>* counters) const {
  TESSERA_ASSIGN_OR_RETURN(ConfigRef config, ConfigOf(table, counters));
  return *config;
}

absl::Status ShardService::CheckBatch(const std::string& table, int64_t ids,
                                      uint64_t version) const {
  return CheckRequest(table, ids, Limit(), version, absl::StrCat("shard ", reshard_.index()),
                      reshard_.version());
}

absl::Status ShardService::CheckOwnership(const v1::TableConfig& config,
                                          absl::Span<const int64_t> ids, int32_t index,
                                          int32_t num_shards) const {
  TESSERA_RETURN_IF_ERROR(embedding::CheckVocabulary(config, ids));
  if (index < 0) {
    index = reshard_.index();
    num_shards = reshard_.num_shards();
  }
  if (num_shards <= 1) return absl::OkStatus();
  for (const int64_t id : ids) {
    const int owner = embedding::ShardOfRow(config, id, num_shards);
    if (owner != index) {
      return absl::FailedPreconditionError(absl::StrCat("table '", config.name(), "': id ", id,
                                                        " belongs to shard ", owner, ", not shard ",
                                                        index, "; refresh the shard map"));
    }
  }
  return absl::OkStatus();
}

grpc::Status ShardService::CreateTable(grpc::ServerContext* context,
                                       const v1::CreateTableRequest* request,
                                       v1::CreateTableResponse* response) {
  return Serve(context, Access::kWrite, [&]() -> absl::Status {
    const v1::TableConfig& config = request->config();
    // Each shard holds 1/num_shards of the rows, so of the row budget too.
    v1::TableConfig local = config;
    if (local.max_rows() > 0) {
      local.set_max_rows((local.max_rows() + reshard_.num_shards() - 1) / reshard_.num_shards());
    }
    // The same table again is done already (a retried or re-driven create): OK. Tables
    // loaded from disk carry this shard's part of max_rows.
    auto held = [&]() -> absl::StatusOr<bool> {
      absl::ReaderMutexLock lock(&mu_);
      auto it = configs_.find(config.name());
      if (it == configs_.end()) return false;
      using google::protobuf::util::MessageDifferencer;
      if (MessageDifferencer::Equals(*it->second, config) ||
          MessageDifferencer::Equals(*it->second, local)) {
        return true;
      }
      return absl::AlreadyExistsError(
          absl::StrCat("table '", config.name(), "' already exists on shard ", reshard_.index(),
                       " with another config: ",
                       absl::StrJoin(embedding::TableConfigDifferences(*it->second, local), "; ")));
    };
    TESSERA_ASSIGN_OR_RETURN(bool exists, held());
    if (!exists) {
      {
        absl::ReaderMutexLock lock(&mu_);
        if (static_cast<int64_t>(configs_.size()) >= options_.max_tables) {
          return absl::ResourceExhaustedError(absl::StrCat("table '", config.name(),
                                                           "': this shard holds ", configs_.size(),
                                                           " tables, its limit (--max_tables)"));
        }
      }
      absl::Status s = tables_->CreateTable(local);
      if (s.code() == absl::StatusCode::kAlreadyExists) {
        // Created by a concurrent call: the same config is still OK.
        TESSERA_ASSIGN_OR_RETURN(exists, held());
        if (!exists) return s;
      } else if (!s.ok()) {
        return s;
      }
      absl::MutexLock lock(&mu_);
      configs_.try_emplace(config.name(), std::make_shared<const v1::TableConfig>(config));
      if (counters_[config.name()] == nullptr) {
        counters_[config.name()] = std::make_shared<TableCounters>();
      }
    }
    *response->mutable_config() = config;
    return absl::OkStatus();
  });
}

grpc::Status ShardService::ListTables(grpc::ServerContext* context, const v1::ListTablesRequest*,
                                      v1::ListTablesResponse* response) {
  return Serve(context, Access::kRead, [&]() -> absl::Status {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [name, config] : configs_) *response->add_tables() = *config;
    return absl::OkStatus();
  });
}

grpc::Status ShardService::Lookup(grpc::ServerContext* context, const v1::LookupRequest* request,
                                  v1::LookupResponse* response) {
  return Serve(context, Access::kRead, [&]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(Enter(Traffic::kRead, request->shard_map_version(), *context));
    Admitted admitted(&reshard_, Traffic::kRead);
    std::shared_ptr<TableCounters> counters;
    TESSERA_ASSIGN_OR_RETURN(v1::TableConfig config, Config(request->table(), &counters));
    TESSERA_RETURN_IF_ERROR(CheckBatch(absl::StrCat("table '", request->table(), "'"),
                                       request->ids_size(), request->shard_map_version()));
    TESSERA_RETURN_IF_ERROR(
        CheckOwnership(config, absl::MakeConstSpan(request->ids().data(), request->ids_size())));
    TESSERA_ASSIGN_OR_RETURN(LookupView view,
                             PrepareLookup(*request, config.dim(), Limit(), response));
    embedding::LookupOptions options;
    options.insert_missing = !request->read_only();
    absl::Status s =
        view.pooled ? tables_->PooledLookup(request->table(), view.ids, view.offsets, view.weights,
                                            request->pooling(), view.out, options)
                    : tables_->Lookup(request->table(), view.ids, view.out, options);
    if (!s.ok()) {
      response->Clear();
      return s;
    }
    if (counters != nullptr) counters->lookups += request->ids_size();
    return absl::OkStatus();
  });
}

grpc::Status ShardService::BatchLookup(grpc::ServerContext* context,
                                       const v1::BatchLookupRequest* request,
                                       v1::BatchLookupResponse* response) {
  if (request->has_push()) {
    // The push first, as a BatchPush (its own access, map version and request id): the
    // lookup reads what it applied, and a repeat of the call applies it once.
    if (absl::Status s = CheckPushBeforeLookup(*request); !s.ok()) {
      return wire::ToGrpcStatus(s);
    }
    grpc::Status pushed = BatchPushNow(context, request->push(), response->mutable_push());
    if (!pushed.ok()) return pushed;
  }
  return Serve(context, Access::kRead, [&]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(Enter(Traffic::kRead, request->shard_map_version(), *context));
    Admitted admitted(&reshard_, Traffic::kRead);
    thread_local DecodedBatch batch;
    TESSERA_RETURN_IF_ERROR(PrepareBatchLookup(*request, Configs(), Limit(), response, &batch));
    TESSERA_RETURN_IF_ERROR(
        CheckBatch("batched lookup", batch.total_ids, request->shard_map_version()));
    for (size_t i = 0; i < batch.lookups.size(); ++i) {
      TESSERA_RETURN_IF_ERROR(CheckOwnership(batch.configs[i], batch.lookups[i].ids));
    }
    embedding::LookupOptions options;
    options.insert_missing = !request->read_only();
    absl::Status s = tables_->LookupBatch(batch.lookups, options);
    if (!s.ok()) {
      response->Clear();
      return s;
    }
    response->set_incarnation(incarnation_);
    for (size_t i = 0; i < batch.lookups.size(); ++i) {
      if (batch.counters[i] != nullptr) {
        batch.counters[i]->lookups += static_cast<int64_t>(batch.lookups[i].ids.size());
      }
    }
    return absl::OkStatus();
  });
}

grpc::Status ShardService::Stats(grpc::ServerContext* context, const v1::StatsRequest* request,
                                 v1::StatsResponse* response) {
  return Serve(context, Access::kRead, [&]() -> absl::Status {
    std::map<std::string, std::shared_ptr<TableCounters>> counters;
    {
      absl::ReaderMutexLock lock(&mu_);
      if (!request->table().empty() && configs_.count(request->table()) == 0) {
        return absl::NotFoundError(
            absl::StrCat("table '", request->table(), "' not found on shard ", reshard_.index()));
      }
      counters = counters_;
    }
    for (const auto& [name, c] : counters) {
      if (!request->table().empty() && name != request->table()) continue;
      TESSERA_ASSIGN_OR_RETURN(embedding::TableUsage usage, tables_->Usage(name));
      v1::TableStats* t = response->add_tables();
      t->set_table(name);
      t->set_shard_index(reshard_.index());
      t->set_rows(usage.rows);
      t->set_memory_bytes(usage.memory_bytes);
      t->set_lookups(c->lookups.load());
      t->set_updates(c->updates.load());
      t->set_evictions(usage.evictions);
      t->set_memory_budget_bytes(usage.budget_bytes);
      t->set_memory_budget_used_bytes(usage.budget_used_bytes);
      t->set_admission_refused(usage.admission_refused);
    }
    // Servers without storage have no checkpoints to report.
    embedding::Checkpointing* checkpoints = tables_->checkpointing();
    if (checkpoints == nullptr) return absl::OkStatus();
    absl::StatusOr<std::vector<embedding::CheckpointInfo>> list = checkpoints->ListCheckpoints();
    if (list.ok()) {
      for (const auto& info : *list) wire::ToProto(info, response->add_checkpoints());
    }
    return absl::OkStatus();
  });
}

grpc::Status ShardService::Reshard(grpc::ServerContext* context, const v1::ReshardRequest* request,
                                   v1::ReshardResponse* response) {
  return Serve(context, Access::kWrite, [&] { return reshard_.Handle(*request, response); });
}

}  // namespace tessera::server
