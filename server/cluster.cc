#include "server/cluster.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "embedding/batch_ops.h"
#include "embedding/embedding_table.h"
#include "embedding/table_config.h"
#include "google/protobuf/util/message_differencer.h"
#include "wire/row_chunk.h"

namespace tessera::server {

Cluster::Cluster(client::ShardRouter* router, uint64_t shard_map_version,
                 const ClusterOptions& options, storage::CoordinatorStore* store)
    : router_(router),
      version_(shard_map_version),
      options_(options),
      store_(store),
      readmit_target_(std::make_shared<ReadmitTarget>()) {
  {
    absl::MutexLock lock(&readmit_target_->mu);
    readmit_target_->cluster = this;
  }
  WatchShards(router);
  if (store_ == nullptr) return;
  const v1::CoordinatorState state = store_->state();
  absl::MutexLock lock(&mu_);
  for (const auto& t : state.tables()) {
    configs_[t.name()] = std::make_shared<const v1::TableConfig>(t);
  }
}

void Cluster::WatchShards(client::ShardRouter* router) {
  auto reprovision = [target = readmit_target_](int k) {
    absl::MutexLock lock(&target->mu);
    if (target->cluster != nullptr) target->cluster->Reprovision(k);
  };
  // A shard back after failing its health checks, or one seen answering with a new
  // incarnation (back before the health checks noticed): either may have come back empty.
  router->SetReadmitCallback(reprovision);
  router->SetRestartCallback(reprovision);
}

// The router may be gone already (it is not the cluster's): leave it alone, and make a
// callback it still runs find no cluster.
Cluster::~Cluster() {
  absl::MutexLock lock(&readmit_target_->mu);
  readmit_target_->cluster = nullptr;
}

absl::Status Cluster::NeedStore() const {
  if (store_ != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "this coordinator has no --data_dir, so it cannot record cluster checkpoints");
}

v1::CoordinatorState Cluster::StateLocked() const {
  v1::CoordinatorState state;
  for (const auto& [name, config] : configs_) *state.add_tables() = *config;
  state.set_shard_map_version(version_.load());
  for (const auto& a : live()->addresses()) state.add_shards(a);
  return state;
}

void Cluster::SetShardMapVersion(uint64_t version) {
  version_.store(version);
  live()->set_shard_map_version(version);
}

absl::StatusOr<std::shared_ptr<const v1::TableConfig>> Cluster::ConfigOf(
    const std::string& table) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = configs_.find(table);
  if (it == configs_.end()) {
    return absl::NotFoundError(absl::StrCat("table '", table, "' not found"));
  }
  return it->second;
}

absl::StatusOr<v1::TableConfig> Cluster::Config(const std::string& table) const {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<const v1::TableConfig> config, ConfigOf(table));
  return *config;
}

std::vector<v1::TableConfig> Cluster::Tables() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<v1::TableConfig> out;
  for (const auto& [name, config] : configs_) out.push_back(*config);
  return out;
}

absl::Status Cluster::CreateTable(const v1::TableConfig& config) {
  TESSERA_RETURN_IF_ERROR(embedding::ValidateTableConfig(config));
  TESSERA_RETURN_IF_ERROR(embedding::RequireHostPlacement(config));
  absl::MutexLock create(&create_mu_);
  if (absl::StatusOr<v1::TableConfig> held = Config(config.name()); held.ok()) {
    if (!google::protobuf::util::MessageDifferencer::Equals(*held, config)) {
      return absl::AlreadyExistsError(
          absl::StrCat("table '", config.name(), "' already exists with another config: ",
                       absl::StrJoin(embedding::TableConfigDifferences(*held, config), "; ")));
    }
    // The same table again (a retry, or a create that failed on some shard): make sure
    // every shard has it; shards answer OK for a table they hold with this config.
    return live()->CreateTable(config);
  }
  {
    absl::ReaderMutexLock lock(&mu_);
    if (static_cast<int64_t>(configs_.size()) >= options_.max_tables) {
      return absl::ResourceExhaustedError(absl::StrCat("table '", config.name(),
                                                       "': the cluster holds ", configs_.size(),
                                                       " tables, its limit (--max_tables)"));
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
    TESSERA_RETURN_IF_ERROR(Annotate(store_->Save(state), "cannot record the new table"));
  }
  absl::Status s = live()->CreateTable(config);
  if (!s.ok()) {
    if (store_ != nullptr) {
      // The registry goes back to what it was; if that fails too, the table stays recorded
      // and a retry of the create (or a restart's re-provisioning) finishes it.
      absl::ReaderMutexLock lock(&mu_);
      if (absl::Status undone = store_->Save(StateLocked()); !undone.ok()) {
        std::fprintf(stderr, "tessera: table '%s' stays recorded after its create failed: %s\n",
                     config.name().c_str(), undone.ToString().c_str());
      }
    }
    return s;
  }
  absl::MutexLock lock(&mu_);
  configs_[config.name()] = std::make_shared<const v1::TableConfig>(config);
  return absl::OkStatus();
}

absl::StatusOr<v1::TableConfig> Cluster::AlterTable(const std::string& table,
                                                    const v1::OptimizerConfig& changes) {
  absl::MutexLock create(&create_mu_);
  TESSERA_ASSIGN_OR_RETURN(v1::TableConfig config, Config(table));
  TESSERA_ASSIGN_OR_RETURN(v1::TableConfig altered, embedding::AlterOptimizer(config, changes));
  TESSERA_RETURN_IF_ERROR(
      Annotate(live()->AlterTable(table, changes),
               absl::StrCat("alter of table '", table, "' not finished; retry")));
  absl::MutexLock lock(&mu_);
  configs_[table] = std::make_shared<const v1::TableConfig>(altered);
  if (store_ != nullptr) {
    TESSERA_RETURN_IF_ERROR(Annotate(store_->Save(StateLocked()), "cannot record the alter"));
  }
  return altered;
}

absl::Status Cluster::DropTable(const std::string& table) {
  absl::MutexLock create(&create_mu_);
  TESSERA_RETURN_IF_ERROR(Config(table).status());
  // Shards first: a drop that fails half-way is still registered, and repeating it
  // finishes it (a shard without the table counts as done).
  TESSERA_RETURN_IF_ERROR(Annotate(
      live()->DropTable(table), absl::StrCat("drop of table '", table, "' not finished; retry")));
  absl::MutexLock lock(&mu_);
  configs_.erase(table);
  if (store_ != nullptr) {
    TESSERA_RETURN_IF_ERROR(Annotate(store_->Save(StateLocked()), "cannot record the drop"));
  }
  return absl::OkStatus();
}

absl::Status Cluster::ExportRows(const v1::ExportRowsRequest& request,
                                 const std::function<absl::Status(const v1::RowChunk&)>& sink) {
  TESSERA_RETURN_IF_ERROR(Config(request.table()).status());
  client::ShardRouter* router = live();
  for (int k = 0; k < router->num_shards(); ++k) {
    TESSERA_RETURN_IF_ERROR(router->ExportFrom(k, request, sink));
  }
  return absl::OkStatus();
}

absl::Status Cluster::ImportRows(const std::string& table, const embedding::RowBlock& rows) {
  TESSERA_ASSIGN_OR_RETURN(v1::TableConfig config, Config(table));
  // Checked whole here, so no shard stores part of a block another refuses.
  TESSERA_RETURN_IF_ERROR(embedding::CheckRowBlock(
      table, config.dim(), rows.state.empty() ? 0 : rows.state_floats, rows));
  absl::ReaderMutexLock barrier(&barrier_mu_);
  return live()->ImportRows(config, rows);
}

void Cluster::Reprovision(int k) {
  const std::vector<v1::TableConfig> configs = Tables();
  absl::MutexLock create(&create_mu_);
  int failed = 0;
  for (const v1::TableConfig& config : configs) {
    // Idempotent: a table the shard holds (loaded from its data directory) is left as is.
    absl::Status s = live()->CreateTableOn(k, config);
    if (!s.ok()) {
      ++failed;
      std::fprintf(stderr, "tessera: shard %d: cannot re-create table '%s': %s\n", k,
                   config.name().c_str(), std::string(s.message()).c_str());
    }
  }
  std::fprintf(stderr, "tessera: shard %d back: its %zu tables checked, %d failed\n", k,
               configs.size(), failed);
}

absl::Status Cluster::LookupBatch(absl::Span<const v1::TableConfig> configs,
                                  absl::Span<const embedding::TableBags> parts, bool read_only,
                                  v1::BatchLookupResponse* forward) {
  return live()->LookupBatch(configs, parts, read_only, forward);
}

absl::Status Cluster::RegisterSyncGroup(const embedding::PushSync& sync) {
  absl::ReaderMutexLock barrier(&barrier_mu_);
  return live()->RegisterSyncGroup(sync, {}, /*again=*/true);
}

absl::StatusOr<std::vector<int64_t>> Cluster::PushBatch(const embedding::CheckedPush& push,
                                                        int64_t step,
                                                        const embedding::RequestId& id,
                                                        const embedding::PushSync& sync,
                                                        bool after_lookup) {
  absl::ReaderMutexLock barrier(&barrier_mu_);
  return live()->PushBatch(push, step, id, sync, after_lookup);
}

absl::StatusOr<std::vector<int64_t>> Cluster::PushThenLookup(
    const embedding::CheckedPush& push, int64_t step, const embedding::RequestId& id,
    bool after_lookup, absl::Span<const v1::TableConfig> configs,
    absl::Span<const embedding::TableBags> parts, bool read_only,
    v1::BatchLookupResponse* forward) {
  absl::ReaderMutexLock barrier(&barrier_mu_);
  return live()->PushThenLookup(push, step, id, after_lookup, configs, parts, read_only, forward);
}

absl::StatusOr<std::vector<v1::TableStats>> Cluster::Stats(const std::string& table) {
  if (!table.empty()) TESSERA_RETURN_IF_ERROR(Config(table).status());
  return live()->Stats(table);
}

absl::StatusOr<storage::CheckpointManifest> Cluster::Checkpoint(
    int64_t step, const embedding::Attachments& attachments, const std::string& model) {
  TESSERA_RETURN_IF_ERROR(NeedStore());
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint step must be >= 0, got ", step));
  }
  if (!model.empty()) TESSERA_RETURN_IF_ERROR(embedding::ValidateModelName(model));
  for (const auto& [name, blob] : attachments) {
    TESSERA_RETURN_IF_ERROR(storage::ValidateAttachmentName(name));
  }
  if (!model.empty() && TablesOf(model).empty()) {
    return absl::NotFoundError(absl::StrCat("model '", model,
                                            "' has no tables (its tables are "
                                            "named '",
                                            model, ".*'): nothing to checkpoint"));
  }
  // Refused before any shard takes one (the store refuses it again when it commits).
  if (store_->FindCheckpoint(step, nullptr, model).ok()) {
    return absl::AlreadyExistsError(
        absl::StrCat(embedding::CheckpointName(model, step),
                     " exists already; checkpoints are never overwritten: pick another step"));
  }
  absl::MutexLock barrier(&barrier_mu_);
  v1::CheckpointRequest request;
  request.set_step(step);
  request.set_model(model);
  // This coordinator has no such checkpoint: what shards hold of that step is from one
  // that never completed, and is replaced.
  request.set_replace(true);
  absl::StatusOr<std::vector<v1::CheckpointInfo>> shards = live()->CheckpointShards(request);
  if (!shards.ok()) return Annotate(shards.status(), "checkpoint not taken");
  storage::CheckpointManifest m;
  m.model = model;
  m.step = step;
  for (const auto& info : *shards) {
    m.rows += info.rows();
    m.bytes += info.bytes();
    // Each shard's checkpoint directory, for a restore onto another shard count.
    if (info.dirs_size() == 1) m.shard_dirs.push_back(info.dirs(0));
  }
  if (m.shard_dirs.size() != shards->size()) m.shard_dirs.clear();  // all of them or none
  m.shards = live()->addresses();
  m.tables = TablesOf(model);
  return store_->CommitCheckpoint(m, attachments);
}

std::vector<std::string> Cluster::TablesOf(const std::string& model) const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [name, config] : configs_) {
    if (embedding::TableOfModel(name, model)) out.push_back(name);
  }
  return out;
}

absl::Status Cluster::CheckWholeClusterRestore(const embedding::RestoreOptions& options) const {
  if (!options.model.empty() || options.all_models) return absl::OkStatus();
  std::set<std::string> models;
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [name, config] : configs_) {
    models.insert(name.substr(0, std::min(name.find('.'), name.size())));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "a restore without a model rolls back every model of the cluster (", configs_.size(),
      " tables of ", models.size(), " models: ", absl::StrJoin(models, ", "),
      "); name the model to restore (tessera-cli restore --model=NAME), or confirm a "
      "whole-cluster restore with all_models (tessera-cli restore --all_models)"));
}

RestoredTables Cluster::RestoreOutcome(const storage::CheckpointManifest& m) const {
  RestoredTables out;
  const std::vector<std::string> registered = TablesOf(m.model);
  const std::set<std::string> before(registered.begin(), registered.end());
  const std::set<std::string> after(m.tables.begin(), m.tables.end());
  for (const std::string& name : after) {
    (before.count(name) > 0 ? out.rolled_back : out.brought_back).push_back(name);
  }
  for (const std::string& name : before) {
    if (after.count(name) == 0) out.dropped.push_back(name);
  }
  return out;
}

absl::StatusOr<storage::CheckpointManifest> Cluster::Restore(
    int64_t step, embedding::Attachments* attachments, const embedding::RestoreOptions& options,
    RestoredTables* outcome) {
  TESSERA_RETURN_IF_ERROR(NeedStore());
  if (!options.model.empty()) TESSERA_RETURN_IF_ERROR(embedding::ValidateModelName(options.model));
  TESSERA_RETURN_IF_ERROR(CheckWholeClusterRestore(options));
  embedding::Attachments blobs;
  TESSERA_ASSIGN_OR_RETURN(storage::CheckpointManifest m,
                           store_->FindCheckpoint(step, &blobs, options.model));
  // Checked here, before any shard changes.
  TESSERA_RETURN_IF_ERROR(embedding::CheckRestorable(m.step, blobs, options));
  const std::string which = embedding::CheckpointName(m.model, m.step);
  if (options.verify_only) {
    // Read, nothing changed: no barrier, training goes on meanwhile.
    TESSERA_RETURN_IF_ERROR(CheckSourcesRecorded(m));
    TESSERA_RETURN_IF_ERROR(Annotate(ReadOnEveryShard(m), absl::StrCat(which, " cannot be read")));
    if (attachments != nullptr) *attachments = std::move(blobs);
    return m;
  }
  // In the lock order (cluster.h): the registry's lock before the barrier, as a reshard
  // takes them.
  absl::MutexLock create(&create_mu_);
  absl::MutexLock barrier(&barrier_mu_);  // also keeps the shard map as it is
  if (options_.pause) options_.pause("restore: locked");
  TESSERA_RETURN_IF_ERROR(CheckSourcesRecorded(m));
  const RestoredTables changes = RestoreOutcome(m);
  // Every shard reads the checkpoint whole first: one that cannot (a corrupt or missing
  // file) changes no shard.
  if (absl::Status s = ReadOnEveryShard(m); !s.ok()) {
    return Annotate(
        s, absl::StrCat("restore of ", which, " refused, no shard changed", OlderCheckpoint(m)));
  }
  absl::StatusOr<std::vector<v1::CheckpointInfo>> shards =
      live()->RestoreShards(RestoreRequestOf(m));
  if (!shards.ok()) {
    return Annotate(shards.status(), absl::StrCat("restore of ", which,
                                                  " failed after every shard read it; retry it"));
  }
  TESSERA_RETURN_IF_ERROR(Annotate(AdoptRestoredTables(m),
                                   absl::StrCat("restore of ", which,
                                                ": the shards are "
                                                "restored, the table registry is not; retry it")));
  if (attachments != nullptr) *attachments = std::move(blobs);
  if (outcome != nullptr) *outcome = changes;
  return m;
}

v1::RestoreRequest Cluster::RestoreRequestOf(const storage::CheckpointManifest& m) const {
  v1::RestoreRequest request;
  request.set_step(m.step);
  request.set_model(m.model);
  request.set_all_models(m.model.empty());
  // Taken on another map: every shard reads every old shard's directory.
  if (m.shards != live()->addresses()) {
    for (const std::string& dir : m.shard_dirs) request.add_source_dirs(dir);
  }
  return request;
}

bool Cluster::SourcesRecorded(const storage::CheckpointManifest& m) const {
  return m.shards == live()->addresses() || m.shard_dirs.size() == m.shards.size();
}

absl::Status Cluster::CheckSourcesRecorded(const storage::CheckpointManifest& m) const {
  // Taken on another shard map (another count, or shards replaced or moved by a reshard):
  // every shard reads every old shard's checkpoint directory and keeps the rows it owns
  // now.
  if (SourcesRecorded(m)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint ", m.step, " was taken on shards ", absl::StrJoin(m.shards, ","),
      ", this cluster has ", absl::StrJoin(live()->addresses(), ","),
      ", and it does not "
      "record the shards' checkpoint directories (taken by an older coordinator); restore "
      "it on its shards"));
}

absl::Status Cluster::ReadOnEveryShard(const storage::CheckpointManifest& m) const {
  v1::RestoreRequest verify = RestoreRequestOf(m);
  verify.set_verify_only(true);
  return live()->RestoreShards(verify).status();
}

std::string Cluster::OlderCheckpoint(const storage::CheckpointManifest& m) const {
  std::vector<storage::CheckpointManifest> older;
  for (const storage::CheckpointManifest& c : store_->ListCheckpoints()) {
    if (c.model == m.model && c.step < m.step) older.push_back(c);
  }
  if (older.empty()) return " (the model has no older checkpoint)";
  std::sort(older.begin(), older.end(),
            [](const auto& a, const auto& b) { return a.step > b.step; });
  // Named only once every shard has read it whole (the newest three are tried).
  std::vector<int64_t> unreadable;
  for (size_t i = 0; i < older.size() && i < 3; ++i) {
    const storage::CheckpointManifest& c = older[i];
    if (!SourcesRecorded(c) || !ReadOnEveryShard(c).ok()) {
      unreadable.push_back(c.step);
      continue;
    }
    return absl::StrCat(
        " (the newest older checkpoint of the model that every shard reads is step ", c.step, ": ",
        embedding::RestoreCommand(m.model, c.step),
        unreadable.empty() ? ""
                           : absl::StrCat("; step(s) ", absl::StrJoin(unreadable, ", "),
                                          " do not read on every shard either"),
        ")");
  }
  return absl::StrCat(" (no older checkpoint of the model reads on every shard: step(s) ",
                      absl::StrJoin(unreadable, ", "), " tried)");
}

absl::Status Cluster::AdoptRestoredTables(const storage::CheckpointManifest& m) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<v1::TableConfig> held, live()->ListTablesOn(0));
  absl::MutexLock lock(&mu_);
  std::map<std::string, std::shared_ptr<const v1::TableConfig>> before;
  before.swap(configs_);
  for (auto& [name, config] : before) {
    if (!embedding::TableOfModel(name, m.model)) configs_[name] = std::move(config);
  }
  for (v1::TableConfig config : held) {
    if (!embedding::TableOfModel(config.name(), m.model)) continue;
    if (std::find(m.tables.begin(), m.tables.end(), config.name()) == m.tables.end()) continue;
    // A shard holds its part of the row budget; the registry keeps the whole table's.
    auto registered = before.find(config.name());
    if (registered != before.end()) {
      config.set_max_rows(registered->second->max_rows());
    } else {
      config.set_max_rows(config.max_rows() * static_cast<int64_t>(live()->addresses().size()));
    }
    const std::string name = config.name();  // before the move below
    configs_[name] = std::make_shared<const v1::TableConfig>(std::move(config));
  }
  return store_->Save(StateLocked());
}

absl::StatusOr<std::vector<storage::CheckpointManifest>> Cluster::ListCheckpoints() const {
  TESSERA_RETURN_IF_ERROR(NeedStore());
  return store_->ListCheckpoints();
}

}  // namespace tessera::server
