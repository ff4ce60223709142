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

ShardService::ShardService(embedding::EmbeddingCollection* tables, const ShardOptions& options)
    : tables_(tables),
      options_(options),
      incarnation_(embedding::RandomNonZeroId()),
      version_(options.shard_map_version),
      journal_(options.push_window),
      moved_(options.push_window * 4),
      index_(options.shard_index),
      num_shards_(options.num_shards),
      groups_(absl::StrCat("shard ", options.shard_index)),
      steps_(absl::StrCat("shard ", options.shard_index), options.max_sync_waiting) {
  // Unlisted tables are refused as unknown until a restore lists them again: say why.
  if (absl::Status s = ReloadConfigs(); !s.ok()) {
    std::fprintf(stderr, "tessera: shard %d: cannot list the tables it holds: %s\n", index_.load(),
                 s.ToString().c_str());
  }
  // The pushes handed over by reshards before a restart: retries of them still skip the
  // rows that took them.
  absl::StatusOr<std::string> kept = tables_->ServerState(kMovedPushesKey);
  absl::Status s = kept.ok() ? moved_.AddSerialized(*kept) : kept.status();
  if (!s.ok()) {
    std::fprintf(stderr, "tessera: shard %d: cannot read the pushes of earlier maps: %s\n",
                 index_.load(), s.ToString().c_str());
  }
}

ShardService::~ShardService() {
  absl::MutexLock lock(&repartition_mu_);
  if (repartition_.joinable()) repartition_.join();
}

absl::Status ShardService::SplitRowBudgets(const std::map<std::string, int64_t>& row_budgets,
                                           int32_t num_shards) {
  for (const auto& [table, whole] : row_budgets) {
    const int64_t part = num_shards > 0 ? (whole + num_shards - 1) / num_shards : 0;
    absl::Status s = tables_->SetRowBudget(table, part);
    if (!s.ok() && !absl::IsNotFound(s)) return s;  // a table dropped meanwhile has none
  }
  return absl::OkStatus();
}

void ShardService::StartRepartition(int32_t index, int32_t num_shards,
                                    std::map<std::string, int64_t> row_budgets) {
  absl::MutexLock lock(&repartition_mu_);
  if (repartition_.joinable()) repartition_.join();
  repartition_index_ = index;
  repartition_shards_ = num_shards;
  repartition_ = std::thread([this, index, num_shards, budgets = std::move(row_budgets)] {
    absl::Status s = tables_->Repartition(index, num_shards);
    // Then the budgets of the new map (fewer rows to evict down once those that left went).
    if (s.ok()) s = SplitRowBudgets(budgets, num_shards);
    if (!s.ok()) {
      std::fprintf(stderr, "tessera: shard %d: the rows that left it are not all dropped: %s\n",
                   index, s.ToString().c_str());
    }
    repartitioned_ = s;
  });
}

absl::Status ShardService::FinishRepartition() {
  absl::MutexLock lock(&repartition_mu_);
  if (!repartition_.joinable()) return absl::OkStatus();
  repartition_.join();
  if (repartitioned_.ok()) return absl::OkStatus();
  repartitioned_ = tables_->Repartition(repartition_index_, repartition_shards_);
  return Annotate(repartitioned_, absl::StrCat("shard ", index_.load(),
                                               ": the rows that left it are not all dropped"));
}

absl::Status ShardService::ReloadConfigs() {
  // Tables loaded from disk carry this shard's part of max_rows (what CreateTable stored).
  absl::StatusOr<std::vector<v1::TableConfig>> tables = tables_->ListTables();
  if (!tables.ok()) return tables.status();
  absl::MutexLock lock(&mu_);
  configs_.clear();
  std::map<std::string, std::shared_ptr<TableCounters>> counters;
  for (const auto& c : *tables) {
    configs_[c.name()] = c;
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
    absl::StatusOr<embedding::CheckpointInfo> info =
        tables_->Checkpoint(request->step(), attachments, options);
    if (!info.ok()) return Annotate(info.status(), absl::StrCat("shard ", index_.load()));
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
    return tables_->Restore(request.step(), attachments, wire::RestoreOptionsOf(request));
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
    if (!info.ok()) return Annotate(info.status(), absl::StrCat("shard ", index_.load()));
    // Every row is the checkpoint's now: pushes remembered as applied no longer are. (A
    // model's restore leaves the other models' pushes on record: their rows stand.)
    if (request->model().empty()) {
      journal_.Clear();
      moved_.Clear();
      TESSERA_RETURN_IF_ERROR(KeepMovedPushes());
    }
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
          absl::StrCat("table '", request->table(), "' not found on shard ", index_.load()));
    }
    TESSERA_RETURN_IF_ERROR(altered.status());
    absl::MutexLock lock(&mu_);
    auto it = configs_.find(request->table());
    if (it != configs_.end()) *it->second.mutable_optimizer() = altered->optimizer();
    *response->mutable_config() = it != configs_.end() ? it->second : *altered;
    return absl::OkStatus();
  });
}

grpc::Status ShardService::DropTable(grpc::ServerContext* context,
                                     const v1::DropTableRequest* request, v1::DropTableResponse*) {
  return Serve(context, Access::kWrite, [&]() -> absl::Status {
    absl::Status s = tables_->DropTable(request->table());
    if (absl::IsNotFound(s)) {
      return absl::NotFoundError(
          absl::StrCat("table '", request->table(), "' not found on shard ", index_.load()));
    }
    TESSERA_RETURN_IF_ERROR(s);
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
    embedding::ExportOptions options;
    options.since_step = request->since_step();
    options.with_state = request->with_state();
    if (request->chunk_rows() > 0) options.chunk_rows = static_cast<size_t>(request->chunk_rows());
    TESSERA_ASSIGN_OR_RETURN(const v1::TableConfig config, Config(request->table()));
    const v1::MovingRows& moving = request->moving();
    // A fixed vocabulary's rows are laid out by place: those it keeps move too (into its
    // layout for the new place), so every row goes.
    const bool keep = moving.num_shards() > 0 && config.vocabulary_size() == 0;
    if (moving.num_shards() > 0) {
      absl::MutexLock lock(&changed_mu_);
      copied_.insert(request->table());
    }
    std::vector<int64_t> changed;
    if (moving.changed_only()) {
      {
        absl::MutexLock lock(&changed_mu_);
        auto it = to_send_.find(request->table());
        if (it != to_send_.end()) changed = it->second;
      }
      if (changed.empty()) return absl::OkStatus();
      options.ids = changed;
    }
    v1::RowChunk chunk;
    embedding::RowBlock leaving;
    return tables_->ExportRows(request->table(), options, [&](const embedding::RowBlock& all) {
      const embedding::RowBlock* b = &all;
      if (moving.num_shards() > 0) {
        // Only the rows that leave this shard for the new map.
        leaving.dim = all.dim;
        leaving.state_floats = all.state_floats;
        leaving.Clear();
        for (size_t i = 0; i < all.size(); ++i) {
          if (keep && embedding::ShardOfRow(config, all.ids[i], moving.num_shards()) ==
                          moving.keep_index()) {
            continue;
          }
          leaving.Append(all.ids[i], &all.weights[i * all.dim],
                         all.state_floats > 0 ? &all.state[i * all.state_floats] : nullptr,
                         all.last_steps[i], all.update_counts[i]);
        }
        if (leaving.size() == 0) return absl::OkStatus();
        b = &leaving;
      }
      wire::ToChunk(*b, &chunk);
      if (!writer->Write(chunk)) return absl::CancelledError("the caller went away");
      return absl::OkStatus();
    });
  });
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
        MovingRowsOf(request->shard_map_version()) ? Traffic::kImport : Traffic::kPush;
    TESSERA_RETURN_IF_ERROR(Enter(traffic, request->shard_map_version(), *context));
    Admitted admitted(this, traffic);
    TESSERA_ASSIGN_OR_RETURN(v1::TableConfig config, Config(request->table()));
    TESSERA_ASSIGN_OR_RETURN(embedding::RowBlock rows, wire::FromChunk(request->rows()));
    // During a reshard, rows moving here come stamped with the new map, for this shard's
    // place in it.
    uint64_t version = request->shard_map_version();
    int32_t index = -1;
    int32_t shards = -1;
    {
      absl::MutexLock lock(&gate_mu_);
      if (pending_version_ != 0 && version != 0 && version == pending_version_) {
        if (pending_index_ < 0) {
          return absl::FailedPreconditionError(absl::StrCat("shard ", index_.load(),
                                                            " leaves the map at version ", version,
                                                            ": it takes no rows"));
        }
        version = 0;
        index = pending_index_;
        shards = pending_shards_;
      }
    }
    TESSERA_RETURN_IF_ERROR(CheckBatch(absl::StrCat("table '", request->table(), "'"),
                                       static_cast<int64_t>(rows.size()), version));
    TESSERA_RETURN_IF_ERROR(CheckOwnership(config, rows.ids, index, shards));
    TESSERA_RETURN_IF_ERROR(index < 0
                                ? tables_->ImportRows(request->table(), rows)
                                : tables_->ImportMovingRows(request->table(), rows, index, shards));
    // A caller's import (not the reshard's own) changes rows a reshard's copy may have sent.
    if (index < 0) NoteChanged(config, rows.ids);
    response->set_rows(static_cast<int64_t>(rows.size()));
    return absl::OkStatus();
  });
}

grpc::Status ShardService::ListCheckpoints(grpc::ServerContext* context,
                                           const v1::ListCheckpointsRequest*,
                                           v1::ListCheckpointsResponse* response) {
  return Serve(context, Access::kRead, [&]() -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(std::vector<embedding::CheckpointInfo> list,
                             tables_->ListCheckpoints());
    for (const auto& info : list) wire::ToProto(info, response->add_checkpoints());
    return absl::OkStatus();
  });
}

absl::StatusOr<v1::TableConfig> ShardService::Config(
    const std::string& table, std::shared_ptr<TableCounters>* counters) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = configs_.find(table);
  if (it == configs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("table '", table, "' not found on shard ", index_.load()));
  }
  if (counters != nullptr) {
    auto c = counters_.find(table);
    *counters = c != counters_.end() ? c->second : nullptr;
  }
  return it->second;
}

absl::Status ShardService::CheckBatch(const std::string& table, int64_t ids,
                                      uint64_t version) const {
  if (ids > options_.max_batch_ids) {
    return absl::ResourceExhaustedError(
        absl::StrCat(table, ": batch of ", ids, " ids is over shard ", index_.load(),
                     "'s limit of ", options_.max_batch_ids,
                     " (tessera-shard --max_batch_ids): send smaller batches, or "
                     "raise the limit"));
  }
  const uint64_t serving = version_.load();
  if (version != 0 && version != serving) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", index_.load(), ": request built on shard map version ", version,
                     ", this shard serves version ", serving, "; refresh the shard map"));
  }
  return absl::OkStatus();
}

absl::Status ShardService::CheckOwnership(const v1::TableConfig& config,
                                          absl::Span<const int64_t> ids, int32_t index,
                                          int32_t num_shards) const {
  TESSERA_RETURN_IF_ERROR(embedding::CheckVocabulary(config, ids));
  if (index < 0) {
    index = index_.load();
    num_shards = num_shards_.load();
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
      local.set_max_rows((local.max_rows() + num_shards_.load() - 1) / num_shards_.load());
    }
    // The same table again is done already (a retried or re-driven create): OK. Tables
    // loaded from disk carry this shard's part of max_rows.
    auto held = [&]() -> absl::StatusOr<bool> {
      absl::ReaderMutexLock lock(&mu_);
      auto it = configs_.find(config.name());
      if (it == configs_.end()) return false;
      using google::protobuf::util::MessageDifferencer;
      if (MessageDifferencer::Equals(it->second, config) ||
          MessageDifferencer::Equals(it->second, local)) {
        return true;
      }
      return absl::AlreadyExistsError(
          absl::StrCat("table '", config.name(), "' already exists on shard ", index_.load(),
                       " with another config: ",
                       absl::StrJoin(embedding::TableConfigDifferences(it->second, local), "; ")));
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
      configs_.try_emplace(config.name(), config);
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
    for (const auto& [name, config] : configs_) *response->add_tables() = config;
    return absl::OkStatus();
  });
}

grpc::Status ShardService::Lookup(grpc::ServerContext* context, const v1::LookupRequest* request,
                                  v1::LookupResponse* response) {
  return Serve(context, Access::kRead, [&]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(Enter(Traffic::kRead, request->shard_map_version(), *context));
    Admitted admitted(this, Traffic::kRead);
    std::shared_ptr<TableCounters> counters;
    TESSERA_ASSIGN_OR_RETURN(v1::TableConfig config, Config(request->table(), &counters));
    TESSERA_RETURN_IF_ERROR(CheckBatch(absl::StrCat("table '", request->table(), "'"),
                                       request->ids_size(), request->shard_map_version()));
    TESSERA_RETURN_IF_ERROR(
        CheckOwnership(config, absl::MakeConstSpan(request->ids().data(), request->ids_size())));
    TESSERA_ASSIGN_OR_RETURN(
        LookupView view, PrepareLookup(*request, config.dim(), options_.max_batch_ids, response));
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
  return Serve(context, Access::kRead, [&]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(Enter(Traffic::kRead, request->shard_map_version(), *context));
    Admitted admitted(this, Traffic::kRead);
    thread_local DecodedBatch batch;
    TESSERA_RETURN_IF_ERROR(
        PrepareBatchLookup(*request, Configs(), options_.max_batch_ids, response, &batch));
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
            absl::StrCat("table '", request->table(), "' not found on shard ", index_.load()));
      }
      counters = counters_;
    }
    for (const auto& [name, c] : counters) {
      if (!request->table().empty() && name != request->table()) continue;
      TESSERA_ASSIGN_OR_RETURN(embedding::TableUsage usage, tables_->Usage(name));
      v1::TableStats* t = response->add_tables();
      t->set_table(name);
      t->set_shard_index(index_.load());
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
    absl::StatusOr<std::vector<embedding::CheckpointInfo>> list = tables_->ListCheckpoints();
    if (list.ok()) {
      for (const auto& info : *list) wire::ToProto(info, response->add_checkpoints());
    }
    return absl::OkStatus();
  });
}

bool ShardService::MovingRowsOf(uint64_t version) {
  absl::MutexLock lock(&gate_mu_);
  return version != 0 && version == pending_version_;
}

absl::Status ShardService::Enter(Traffic traffic, uint64_t version,
                                 const grpc::ServerContextBase& context) {
  // Waits no longer than shortly before the caller gives up, so that it hears why.
  const absl::Time deadline =
      std::min(absl::FromChrono(context.deadline()) - absl::Milliseconds(250),
               absl::Now() + absl::Minutes(2));
  absl::MutexLock lock(&gate_mu_);
  auto waits = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(gate_mu_) {
    if (committing_) return true;
    if (!frozen_) return false;
    if (traffic == Traffic::kPush) return true;
    return traffic == Traffic::kRead && version != 0 && version == pending_version_;
  };
  while (waits()) {
    if (gate_cv_.WaitWithDeadline(&gate_mu_, deadline) && waits()) {
      return absl::UnavailableError(absl::StrCat("shard ", index_.load(),
                                                 " is moving rows to shard map version ",
                                                 pending_version_, " (a reshard); retry"));
    }
  }
  if (left_) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", index_.load(), " is no longer in the shard map (it left at version ",
                     version_.load(), "); refresh the shard map"));
  }
  ++(traffic == Traffic::kPush ? pushes_in_flight_ : reads_in_flight_);
  return absl::OkStatus();
}

void ShardService::Leave(Traffic traffic) {
  absl::MutexLock lock(&gate_mu_);
  // Freeze and Commit await the counts with conditions, which the mutex checks itself.
  --(traffic == Traffic::kPush ? pushes_in_flight_ : reads_in_flight_);
}

void ShardService::NoteChanged(const v1::TableConfig& config, absl::Span<const int64_t> ids) {
  // Read after the rows changed: a push that finds it false changed them before COPY set
  // it, so before the copy read them (COPY's store happens before the copy's reads).
  if (!noting_.load()) return;
  int32_t index = 0;
  int32_t shards = 1;
  {
    absl::MutexLock lock(&gate_mu_);
    if (!tracking_) return;
    index = pending_index_;
    shards = pending_shards_;
  }
  absl::MutexLock lock(&changed_mu_);
  absl::flat_hash_set<int64_t>& changed = changed_[config.name()];
  // A fixed vocabulary's rows all move (ExportRows), those this shard keeps too.
  const bool all = config.vocabulary_size() > 0;
  for (const int64_t id : ids) {
    if (all || embedding::ShardOfRow(config, id, shards) != index) changed.insert(id);
  }
}

int64_t ShardService::EndRound() {
  absl::MutexLock lock(&changed_mu_);
  int64_t n = 0;
  to_send_.clear();
  for (auto& [table, ids] : changed_) {
    to_send_[table].assign(ids.begin(), ids.end());
    n += static_cast<int64_t>(ids.size());
  }
  changed_.clear();
  return n;
}

grpc::Status ShardService::Reshard(grpc::ServerContext* context, const v1::ReshardRequest* request,
                                   v1::ReshardResponse* response) {
  return Serve(context, Access::kWrite, [&]() -> absl::Status {
    const int32_t m = request->num_shards();
    if (request->version() == 0 || m < 1 || request->shard_index() < -1 ||
        request->shard_index() >= m) {
      return absl::InvalidArgumentError(absl::StrCat("reshard: version ", request->version(),
                                                     ", shard ", request->shard_index(), " of ", m,
                                                     " is not a place in a shard map"));
    }
    // A phase of the next reshard waits until the last one's rows are dropped.
    TESSERA_RETURN_IF_ERROR(FinishRepartition());
    switch (request->phase()) {
      case v1::ReshardRequest::COPY:
        TESSERA_RETURN_IF_ERROR(Copy(*request, response));
        break;
      case v1::ReshardRequest::SETTLE:
        break;  // FinishRepartition above
      case v1::ReshardRequest::FREEZE:
        TESSERA_RETURN_IF_ERROR(Freeze(*request, response));
        break;
      case v1::ReshardRequest::COMMIT:
        TESSERA_RETURN_IF_ERROR(Commit(*request));
        break;
      case v1::ReshardRequest::ABORT: {
        // The budgets of the map it serves again.
        TESSERA_RETURN_IF_ERROR(SplitRowBudgets(
            {request->row_budgets().begin(), request->row_budgets().end()}, num_shards_.load()));
        absl::MutexLock lock(&gate_mu_);
        if (!committing_ && pending_version_ == request->version()) {
          frozen_ = false;
          tracking_ = false;
          noting_.store(false);
          pending_version_ = 0;
          gate_cv_.SignalAll();
          // The rows that came for the next map go (the old owners kept theirs): a shard
          // keeps no copy of a row it does not own. On an error it serves on, and the next
          // reshard's first COPY tries again.
          TESSERA_RETURN_IF_ERROR(Annotate(tables_->DropMovingRows(),
                                           absl::StrCat("shard ", index_.load(),
                                                        ": the rows moved here for the given-up "
                                                        "shard map")));
        }
        break;
      }
      default:
        return absl::InvalidArgumentError(
            "reshard: phase must be COPY, FREEZE, COMMIT, SETTLE or ABORT");
    }
    response->set_version(version_.load());
    response->set_shard_index(index_.load());
    response->set_num_shards(num_shards_.load());
    return absl::OkStatus();
  });
}

absl::Status ShardService::Copy(const v1::ReshardRequest& request, v1::ReshardResponse* response) {
  response->set_changed_rows(0);
  // Rows arrive while they move: no budget refuses (or evicts) them until the commit.
  TESSERA_RETURN_IF_ERROR(SplitRowBudgets(
      {request.row_budgets().begin(), request.row_budgets().end()}, /*num_shards=*/0));
  if (version_.load() >= request.version()) {
    // A shard of the new map: the rows that came so far are written now, while the old
    // map serves, and not while pushes wait at the commit.
    if (index_.load() != request.shard_index() || num_shards_.load() != request.num_shards()) {
      return absl::OkStatus();
    }
    return Annotate(tables_->Repartition(request.shard_index(), request.num_shards()),
                    absl::StrCat("shard ", index_.load(), ": the rows moved here"));
  }
  absl::MutexLock lock(&gate_mu_);
  if (pending_version_ != 0 && pending_version_ != request.version()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", index_.load(), " is moving to shard map version ", pending_version_,
                     ", not ", request.version(), "; finish or abort that reshard first"));
  }
  // A COPY after the first starts another round: what changed in the last one.
  response->set_changed_rows(tracking_ ? EndRound() : -1);
  if (!tracking_) {
    // The first: what an earlier reshard left is not this one's.
    TESSERA_RETURN_IF_ERROR(Annotate(
        tables_->DropMovingRows(),
        absl::StrCat("shard ", index_.load(), ": the rows an earlier reshard moved here")));
    absl::MutexLock changed(&changed_mu_);
    copied_.clear();
  }
  tracking_ = true;
  noting_.store(true);
  pending_version_ = request.version();
  pending_index_ = request.shard_index();
  pending_shards_ = request.num_shards();
  return absl::OkStatus();
}

absl::Status ShardService::Freeze(const v1::ReshardRequest& request,
                                  v1::ReshardResponse* response) {
  const uint64_t serving = version_.load();
  response->set_changed_rows(-1);
  if (serving < request.version()) {
    absl::MutexLock lock(&gate_mu_);
    if (pending_version_ != 0 && pending_version_ != request.version()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", index_.load(), " is moving to shard map version ", pending_version_, ", not ",
          request.version(), "; finish or abort that reshard first"));
    }
    frozen_ = true;
    pending_version_ = request.version();
    pending_index_ = request.shard_index();
    pending_shards_ = request.num_shards();
    // Pushes in flight finish under the map they were checked against.
    gate_mu_.Await(absl::Condition(
        +[](int64_t* n) { return *n == 0; }, &pushes_in_flight_));
    // Every push has noted what it changed before it left.
    if (tracking_) response->set_changed_rows(EndRound());
    // Its own pushes, under its place in the map it serves.
    for (const PushJournal::Applied& a : journal_.AppliedPushes()) {
      v1::AppliedPush* p = response->add_applied();
      // Journaled under JournalId: the client's id back (the mix is its own inverse).
      const embedding::RequestId client = JournalId(a.id);
      p->mutable_request_id()->set_client_id(client.client_id);
      p->mutable_request_id()->set_sequence(client.sequence);
      p->set_owner(index_.load());
      p->set_num_shards(num_shards_.load());
      for (const std::string& t : a.tables) p->add_tables(t);
    }
    // And those on durable record, which a restart took out of its journal.
    for (v1::AppliedPush& p :
         RecordedUnder(tables_->RecordedPushes(), serving, index_.load(), num_shards_.load())) {
      *response->add_applied() = std::move(p);
    }
  } else if (serving > request.version()) {
    return absl::FailedPreconditionError(absl::StrCat("shard ", index_.load(),
                                                      " serves shard map version ", serving,
                                                      ", newer than ", request.version()));
  }
  // Those it kept from earlier reshards (a repeated FREEZE after its COMMIT: only these).
  for (v1::AppliedPush& p : moved_.All()) *response->add_applied() = std::move(p);
  return absl::OkStatus();
}

absl::Status ShardService::Commit(const v1::ReshardRequest& request) {
  moved_.Add(request.applied());
  // On disk before the new map is served: a shard restarted after the commit still skips
  // the rows that took a retried push under the old map.
  TESSERA_RETURN_IF_ERROR(KeepMovedPushes());
  const uint64_t serving = version_.load();
  if (serving == request.version() && index_.load() == request.shard_index() &&
      num_shards_.load() == request.num_shards()) {
    // A shard only in the new map (started on it), or a repeated commit: the rows copied
    // here are written (a CHECKPOINT table's would wait for a checkpoint), those that left
    // dropped.
    absl::Status s = tables_->Repartition(request.shard_index(), request.num_shards());
    if (s.ok()) {
      s = SplitRowBudgets({request.row_budgets().begin(), request.row_budgets().end()},
                          request.num_shards());
    }
    return Annotate(s, absl::StrCat("shard ", index_.load(), ": the rows moved"));
  }
  if (serving >= request.version()) return absl::OkStatus();  // committed already
  {
    absl::MutexLock lock(&gate_mu_);
    if (!frozen_ || pending_version_ != request.version() ||
        pending_index_ != request.shard_index() || pending_shards_ != request.num_shards()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", index_.load(), " was not frozen for shard ", request.shard_index(), " of ",
          request.num_shards(), " at version ", request.version(), "; freeze it first"));
    }
    committing_ = true;
    gate_mu_.Await(absl::Condition(
        +[](ShardService* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->gate_mu_) {
          return s->reads_in_flight_ == 0 && s->pushes_in_flight_ == 0;
        },
        this));
    absl::Status s = CheckCopied();
    if (s.ok() && options_.on_placement) {
      s = options_.on_placement(request.shard_index(), request.num_shards(), request.version());
    }
    // Tables laid out by place serve the new one from here (recorded first: a restart
    // opens the data directory at it, where the moving rows were written).
    if (s.ok() && request.shard_index() >= 0) {
      s = tables_->SwitchPlace(request.shard_index(), request.num_shards());
    }
    if (!s.ok()) {
      committing_ = false;  // still frozen: the coordinator repeats the commit, or aborts
      gate_cv_.SignalAll();
      return Annotate(s, absl::StrCat("shard ", index_.load(), ": reshard not committed"));
    }
    if (request.shard_index() >= 0) {
      index_.store(request.shard_index());
      num_shards_.store(request.num_shards());
    } else {
      left_ = true;
    }
    version_.store(request.version());
    // Its journal speaks of its place in the old map; what it said is in moved_ now.
    journal_.Clear();
    committing_ = false;
    frozen_ = false;
    tracking_ = false;
    noting_.store(false);
    pending_version_ = 0;
    gate_cv_.SignalAll();
  }
  // Serving the new map already: the rows that left are no longer asked for, and go now.
  if (request.shard_index() >= 0) {
    StartRepartition(request.shard_index(), request.num_shards(),
                     {request.row_budgets().begin(), request.row_budgets().end()});
  }
  return absl::OkStatus();
}

absl::Status ShardService::CheckCopied() {
  TESSERA_ASSIGN_OR_RETURN(std::vector<v1::TableConfig> tables, tables_->ListTables());
  std::set<std::string> copied;
  {
    absl::MutexLock lock(&changed_mu_);
    copied = copied_;
  }
  for (const v1::TableConfig& t : tables) {
    if (copied.count(t.name()) > 0) continue;
    absl::StatusOr<embedding::TableUsage> usage = tables_->Usage(t.name());
    if (!usage.ok() || usage->rows == 0) continue;  // dropped meanwhile, or nothing to lose
    return absl::FailedPreconditionError(absl::StrCat(
        "table '", t.name(), "' holds ", usage->rows, " rows on shard ", index_.load(),
        " that the reshard did not copy (the coordinator does not know the table): create it "
        "through the coordinator or drop it, then repeat the reshard"));
  }
  return absl::OkStatus();
}

}  // namespace tessera::server
