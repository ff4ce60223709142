#include "embedding/storage/durable_collection.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status.h"
#include "embedding/batch_ops.h"
#include "embedding/sharding.h"
#include "embedding/storage/files.h"
#include "embedding/storage/internal/durable_store.h"
#include "embedding/storage/internal/row_loader.h"
#include "embedding/storage/internal/store_spill.h"
#include "embedding/storage/row_codec.h"
#include "embedding/table_config.h"

namespace tessera::storage {

namespace fs = std::filesystem;

using storage_internal::Clock;
using storage_internal::EraseAll;
using storage_internal::kProgressRows;
using storage_internal::ReadCatalog;
using storage_internal::SecondsSince;

DurableCollection::DurableCollection(const DurableOptions& options) : options_(options) {}

DurableCollection::Table DurableCollection::MakeTable(uint32_t id, const v1::TableConfig& config) {
  Table t;
  t.id = id;
  t.config = config;
  t.write_mu = std::make_unique<absl::Mutex>();
  const auto& shards = *memory_->ShardsOf(config.name());
  t.spill = std::make_unique<storage_internal::StoreSpill>(store_.get(), id, config,
                                                           shards[0]->optimizer().StateFloats());
  for (const auto& shard : shards) shard->set_spill(t.spill.get());
  return t;
}

DurableCollection::~DurableCollection() = default;

void DurableCollection::Log(const std::string& line) const {
  if (options_.log) {
    options_.log(line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

std::string DurableCollection::LivePath() const { return options_.data_dir + "/db"; }

std::string DurableCollection::InProgressPath() const {
  return options_.data_dir + "/CHECKPOINT-IN-PROGRESS";
}

std::string DurableCollection::RestoringPath() const {
  return options_.data_dir + "/RESTORE-IN-PROGRESS";
}

std::string DurableCollection::CheckpointDir(int64_t step, const std::string& model) const {
  return absl::StrCat(options_.data_dir, "/checkpoints/", CheckpointDirName(model, step));
}

absl::StatusOr<std::unique_ptr<DurableCollection>> DurableCollection::Open(
    const DurableOptions& options) {
  if (options.data_dir.empty()) return absl::InvalidArgumentError("data_dir must be set");
  if (options.num_shards < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_shards must be >= 1, got ", options.num_shards));
  }
  if (options.keep_checkpoints < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep_checkpoints must be >= 0, got ", options.keep_checkpoints));
  }
  TESSERA_RETURN_IF_ERROR(EnsureWritableDirectory(options.data_dir));
  std::unique_ptr<DurableCollection> c(new DurableCollection(options));
  // A restore that stopped half-way: the old live store is still whole under db.old
  // until the new one is in place, so fall back to it; a partial copy is dropped.
  const std::string live = c->LivePath();
  std::error_code ec;
  if (!fs::exists(live, ec) && fs::exists(live + ".old", ec)) {
    fs::rename(live + ".old", live, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot recover ", live, ": ", ec.message()));
  }
  TESSERA_RETURN_IF_ERROR(RemoveTree(live + ".old"));
  TESSERA_RETURN_IF_ERROR(RemoveTree(live + ".restore"));
  absl::MutexLock lock(&c->mu_);
  TESSERA_RETURN_IF_ERROR(c->OpenAndLoad());
  return c;
}

absl::Status DurableCollection::OpenAndLoad() {
  const auto start = Clock::now();
  TESSERA_ASSIGN_OR_RETURN(store_, options_.open_store(LivePath(), KvStoreOptions()));
  TESSERA_ASSIGN_OR_RETURN(memory_, embedding::NewInProcessCollection(options_));
  tables_.clear();
  next_table_id_ = 1;
  rows_loaded_ = 0;
  TESSERA_ASSIGN_OR_RETURN(auto catalog, ReadCatalog(*store_));
  for (const auto& [id, config] : catalog) {
    TESSERA_RETURN_IF_ERROR(memory_->CreateTable(config));
    tables_.emplace(config.name(), MakeTable(id, config));
    next_table_id_ = std::max(next_table_id_, id + 1);
    // Rows evicted after the newest checkpoint are updates that checkpoint does not have:
    // a restart comes back as of the checkpoint, so they go.
    std::vector<KvWrite> spilled;
    TESSERA_RETURN_IF_ERROR(EraseAll(*store_, SpillPrefix(id), &spilled));
    if (!spilled.empty()) TESSERA_RETURN_IF_ERROR(store_->Write(spilled, /*sync=*/true));
  }
  TESSERA_RETURN_IF_ERROR(RecoverInterruptedCheckpoint());
  TESSERA_RETURN_IF_ERROR(LoadPushRecords());
  for (const auto& [name, t] : tables_) TESSERA_RETURN_IF_ERROR(LoadRows(name, t, start));
  if (rows_loaded_ > 0 || !tables_.empty()) {
    const double seconds = SecondsSince(start);
    Log(absl::StrCat("tessera: loaded ", tables_.size(), " tables and ", rows_loaded_,
                     " rows from ", LivePath(), " in ", absl::StrFormat("%.2f", seconds), " s (",
                     absl::StrFormat("%.0f", rows_loaded_ / std::max(seconds, 1e-9)),
                     " rows/s)"));
  }
  return FinishInterruptedRestore();
}

absl::Status DurableCollection::LoadRows(const std::string& name, const Table& t,
                                         Clock::time_point start) {
  const auto& shards = *memory_->ShardsOf(name);
  const bool evicting = t.config.eviction().policy() != v1::EVICTION_NONE;
  if (!evicting) {
    // Every row goes to memory: on all cores.
    storage_internal::RowLoad load;
    load.table = name;
    load.table_id = t.id;
    load.cluster_num_shards = options_.cluster_num_shards;
    load.cluster_shard_index = options_.cluster_shard_index;
    load.progress_every = kProgressRows;
    const int64_t before = rows_loaded_;
    load.progress = [&](int64_t rows) {
      Log(absl::StrCat("tessera: loaded ", before + rows, " rows from ", LivePath(), " (",
                       absl::StrFormat("%.1f", SecondsSince(start)), " s)"));
    };
    int64_t loaded = 0, outside = 0;
    absl::Status status =
        storage_internal::LoadRowsInParallel(*store_, load, shards, &loaded, &outside);
    rows_loaded_ += loaded;
    NoteStrays(name, outside);
    return status;
  }
  // A table with eviction holds what fits, in key order, and reads the rest from disk
  // when used.
  DecodedRow row;
  const int dim = t.config.dim();
  const int state_floats = shards[0]->optimizer().StateFloats();
  int64_t last_id = 0, outside = 0;
  bool any = false;
  absl::Status scanned =
      store_->Scan(RowPrefix(t.id), [&](absl::string_view key, absl::string_view value) {
        mu_.AssertHeld();  // LoadRows holds it; the scan calls back on this thread
        uint32_t table_id = 0;
        int64_t id = 0;
        if (!ParseRowKey(key, &table_id, &id) || table_id != t.id) {
          return absl::DataLossError(
              absl::StrCat("table '", name, "': malformed row key in the store"));
        }
        if (embedding::ShardOfRow(t.config, id, options_.cluster_num_shards) !=
            options_.cluster_shard_index) {
          ++outside;  // another place's (a reshard that stopped before its commit)
          return absl::OkStatus();
        }
        TESSERA_RETURN_IF_ERROR(DecodeRow(name, id, value, dim, state_floats, &row));
        const int shard = embedding::ShardOfRow(t.config, id, options_.num_shards,
                                                  options_.cluster_num_shards);
        absl::Status put = shards[shard]->PutRow(id, row.weights, row.state, row.meta);
        if (absl::IsResourceExhausted(put)) return absl::OkStatus();
        TESSERA_RETURN_IF_ERROR(Annotate(put, "loading from disk"));
        if (++rows_loaded_ % kProgressRows == 0) {
          Log(absl::StrCat("tessera: loaded ", rows_loaded_, " rows from ", LivePath(), " (",
                           absl::StrFormat("%.1f", SecondsSince(start)), " s)"));
        }
        last_id = id;
        any = true;
        return absl::OkStatus();
      });
  NoteStrays(name, outside);
  // The store's own checks (block checksums) fail below the row level: say where.
  if (!scanned.ok() && !absl::StartsWith(scanned.message(), "table '")) {
    scanned = absl::Status(scanned.code(), absl::StrCat("table '", name, "': stored rows ",
                                                        any ? absl::StrCat("after row ", last_id)
                                                            : std::string("from the first"),
                                                        " are unreadable: ", scanned.message()));
  }
  return scanned;
}

void DurableCollection::NoteStrays(const std::string& table, int64_t rows) {
  if (rows == 0) return;
  strays_.store(true);
  Log(absl::StrCat("tessera: table '", table, "': ", rows, " stored rows of ids shard ",
                   options_.cluster_shard_index, " of ", options_.cluster_num_shards,
                   " does not own (left by a reshard that did not commit) are not loaded; the "
                   "next reshard, or an abort, erases them"));
}

absl::Status DurableCollection::ForgetTable(const std::string& name,
                                            std::vector<KvWrite>* writes) {
  auto it = tables_.find(name);
  if (it == tables_.end()) return absl::NotFoundError(absl::StrCat("table '", name, "' not found"));
  const uint32_t id = it->second.id;
  writes->push_back(KvWrite{CatalogKey(id), "", /*erase=*/true});
  TESSERA_RETURN_IF_ERROR(EraseAll(*store_, RowPrefix(id), writes));
  TESSERA_RETURN_IF_ERROR(EraseAll(*store_, SpillPrefix(id), writes));
  TESSERA_RETURN_IF_ERROR(memory_->DropTable(name));
  tables_.erase(it);
  return absl::OkStatus();
}

absl::Status DurableCollection::DropTable(absl::string_view table) {
  absl::MutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(Usable());
  if (tables_.find(table) == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("table '", table, "' not found"));
  }
  std::vector<KvWrite> writes;
  const std::string name(table);
  TESSERA_RETURN_IF_ERROR(ForgetTable(name, &writes));
  // The catalog entry goes in the same synced write as the rows: a restart finds the
  // table whole or not at all.
  return Annotate(store_->Write(writes, /*sync=*/true),
                  absl::StrCat("table '", name, "': dropped in memory, but the disk refused "
                               "the delete (it comes back on a restart)"));
}

absl::StatusOr<DurableCollection::Table*> DurableCollection::FindToChange(
    absl::string_view table) {
  TESSERA_RETURN_IF_ERROR(Usable());
  auto it = tables_.find(table);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("table '", table, "' not found"));
  }
  return &it->second;
}

absl::Status DurableCollection::StoreConfig(const Table& t, const v1::TableConfig& config,
                                            absl::string_view what) {
  return Annotate(
      store_->Write({KvWrite{CatalogKey(t.id), EncodeCatalogEntry(config)}}, /*sync=*/true),
      absl::StrCat("table '", t.config.name(), "': cannot store its new ", what,
                   " (nothing changed)"));
}

absl::StatusOr<v1::TableConfig> DurableCollection::AlterTable(
    absl::string_view table, const v1::OptimizerConfig& changes) {
  absl::MutexLock lock(&mu_);
  TESSERA_ASSIGN_OR_RETURN(Table * found, FindToChange(table));
  Table& t = *found;
  TESSERA_ASSIGN_OR_RETURN(v1::TableConfig altered, embedding::AlterOptimizer(t.config, changes));
  TESSERA_RETURN_IF_ERROR(StoreConfig(t, altered, "config"));
  TESSERA_ASSIGN_OR_RETURN(v1::TableConfig now, memory_->AlterTable(table, changes));
  t.config = now;
  return now;
}

absl::Status DurableCollection::ExportRows(
    absl::string_view table, const embedding::ExportOptions& options,
    const std::function<absl::Status(const embedding::RowBlock&)>& sink) {
  absl::ReaderMutexLock lock(&mu_);
  TESSERA_ASSIGN_OR_RETURN(const Table* t, Find(table));
  const bool evicting = t->config.eviction().policy() != v1::EVICTION_NONE;
  std::set<int64_t> in_memory;
  TESSERA_RETURN_IF_ERROR(memory_->ExportRows(table, options, [&](const embedding::RowBlock& b) {
    if (evicting) in_memory.insert(b.ids.begin(), b.ids.end());
    return sink(b);
  }));
  if (!evicting) return absl::OkStatus();
  // Rows evicted to disk: spilled ones (CHECKPOINT tables, newer) before the durable ones.
  const std::set<int64_t> wanted(options.ids.begin(), options.ids.end());
  const int dim = t->config.dim();
  const int sf = (*memory_->ShardsOf(table))[0]->optimizer().StateFloats();
  embedding::RowBlock block;
  block.dim = dim;
  block.state_floats = options.with_state ? sf : 0;
  DecodedRow row;
  auto add = [&](absl::string_view key, absl::string_view value) -> absl::Status {
    uint32_t table_id = 0;
    int64_t id = 0;
    if (!ParseRowKey(key, &table_id, &id) || !in_memory.insert(id).second) {
      return absl::OkStatus();
    }
    if (!wanted.empty() && wanted.count(id) == 0) return absl::OkStatus();
    TESSERA_RETURN_IF_ERROR(DecodeRow(t->config.name(), id, value, dim, sf, &row));
    if (options.since_step >= 0 && row.meta.last_step < options.since_step) return absl::OkStatus();
    block.Append(id, row.weights.data(), row.state.data(), row.meta.last_step,
                 row.meta.update_count);
    if (block.size() < std::max<size_t>(1, options.chunk_rows)) return absl::OkStatus();
    TESSERA_RETURN_IF_ERROR(sink(block));
    block.Clear();
    return absl::OkStatus();
  };
  if (t->config.durability() == v1::CHECKPOINT) {
    TESSERA_RETURN_IF_ERROR(store_->Scan(SpillPrefix(t->id), add));
  }
  TESSERA_RETURN_IF_ERROR(store_->Scan(RowPrefix(t->id), add));
  if (block.size() > 0) TESSERA_RETURN_IF_ERROR(sink(block));
  return absl::OkStatus();
}

absl::Status DurableCollection::ImportRows(absl::string_view table,
                                           const embedding::RowBlock& rows) {
  absl::ReaderMutexLock lock(&mu_);
  TESSERA_ASSIGN_OR_RETURN(const Table* t, Find(table));
  return ImportWrittenThrough(
      *t, rows, [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return memory_->ImportRows(table, rows); });
}

absl::Status DurableCollection::ImportWrittenThrough(const Table& t,
                                                     const embedding::RowBlock& rows,
                                                     const std::function<absl::Status()>& import) {
  if (t.config.durability() != v1::WRITE_THROUGH) return import();
  absl::MutexLock ordered(t.write_mu.get());
  TESSERA_RETURN_IF_ERROR(import());
  std::vector<KvWrite> writes;
  AppendRowWrites(t, *memory_->ShardsOf(t.config.name()), options_.cluster_num_shards, rows.ids,
                  &writes);
  return Annotate(store_->Write(writes, /*sync=*/true),
                  absl::StrCat("table '", t.config.name(), "': imported rows not on disk"));
}

void DurableCollection::AppendRowWrites(
    const Table& t, const std::vector<std::unique_ptr<embedding::EmbeddingTable>>& shards,
    int outer, absl::Span<const int64_t> ids, std::vector<KvWrite>* writes) const {
  const int sf = shards[0]->optimizer().StateFloats();
  writes->reserve(writes->size() + ids.size());
  for (const int64_t id : ids) {
    shards[embedding::ShardOfRow(t.config, id, options_.num_shards, outer)]->ReadRows(
        {&id, 1},
        [&](int64_t row_id, const float* w, const float* st, const embedding::RowMeta& m) {
          KvWrite kv;
          kv.key = RowKey(t.id, row_id);
          EncodeRow(w, t.config.dim(), st, sf, m, &kv.value);
          writes->push_back(std::move(kv));
        });
  }
}

absl::Status DurableCollection::SetRowBudget(absl::string_view table, int64_t max_rows) {
  absl::MutexLock lock(&mu_);
  TESSERA_ASSIGN_OR_RETURN(Table * found, FindToChange(table));
  Table& t = *found;
  if (t.config.vocabulary_size() > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("table '", table, "' has a fixed vocabulary: no row budget"));
  }
  v1::TableConfig changed = t.config;
  changed.set_max_rows(std::max<int64_t>(0, max_rows));
  TESSERA_RETURN_IF_ERROR(StoreConfig(t, changed, "row budget"));
  t.config = changed;
  return memory_->SetRowBudget(table, changed.max_rows());
}

absl::Status DurableCollection::ImportMovingRows(absl::string_view table,
                                                 const embedding::RowBlock& rows, int shard_index,
                                                 int num_shards) {
  {
    absl::ReaderMutexLock lock(&mu_);
    TESSERA_ASSIGN_OR_RETURN(const Table* t, Find(table));
    if (t->config.vocabulary_size() > 0) {
      return ImportMovingLocked(*t, rows, shard_index, num_shards);
    }
    // Rows of a dynamic table have one place; those of ids the current place does not own
    // are strays until the commit (DropMovingRows forgets them when the reshard is given
    // up). Noted before they are written: an error leaves some on disk.
    if (!embedding::OwnsAll(t->config, rows.ids, options_.cluster_shard_index,
                            options_.cluster_num_shards)) {
      strays_.store(true);
    }
    return ImportWrittenThrough(*t, rows, [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return memory_->ImportMovingRows(table, rows, shard_index, num_shards);
    });
  }
}

absl::Status DurableCollection::ImportMovingLocked(const Table& t, const embedding::RowBlock& rows,
                                                   int shard_index, int num_shards) {
  const std::string& name = t.config.name();
  if (t.config.durability() != v1::WRITE_THROUGH) {
    return memory_->ImportMovingRows(name, rows, shard_index, num_shards);
  }
  absl::MutexLock ordered(t.write_mu.get());
  TESSERA_RETURN_IF_ERROR(memory_->ImportMovingRows(name, rows, shard_index, num_shards));
  const auto* shards = memory_->MovingShardsOf(name);
  if (shards == nullptr) {
    return absl::InternalError(absl::StrCat("table '", name, "': moving rows were not kept"));
  }
  // The rows of ids this place owns are on disk already: its layout writes them through
  // (and catch-up rounds bring the moving copies up to them). The others go to disk now,
  // under the keys they keep after the move.
  std::vector<int64_t> arriving;
  for (const int64_t id : rows.ids) {
    if (embedding::ShardOfRow(t.config, id, options_.cluster_num_shards) !=
        options_.cluster_shard_index) {
      arriving.push_back(id);
    }
  }
  std::vector<KvWrite> writes;
  AppendRowWrites(t, *shards, num_shards, arriving, &writes);
  return Annotate(store_->Write(writes, /*sync=*/true),
                  absl::StrCat("table '", name, "': rows moving here not on disk"));
}

absl::Status DurableCollection::SwitchPlace(int shard_index, int num_shards) {
  absl::MutexLock lock(&mu_);
  return SwitchPlaceLocked(shard_index, num_shards);
}

absl::Status DurableCollection::SwitchPlaceLocked(int shard_index, int num_shards) {
  TESSERA_RETURN_IF_ERROR(Usable());
  if (shard_index == options_.cluster_shard_index && num_shards == options_.cluster_num_shards) {
    return absl::OkStatus();
  }
  TESSERA_RETURN_IF_ERROR(memory_->SwitchPlace(shard_index, num_shards));
  options_.cluster_shard_index = shard_index;
  options_.cluster_num_shards = num_shards;
  unsettled_ = true;
  return absl::OkStatus();
}

absl::Status DurableCollection::DropMovingRows() {
  absl::MutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(memory_->DropMovingRows());
  return ForgetStraysLocked();
}

absl::Status DurableCollection::Repartition(int shard_index, int num_shards) {
  absl::MutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(SwitchPlaceLocked(shard_index, num_shards));
  TESSERA_RETURN_IF_ERROR(ForgetStraysLocked());
  return Annotate(FlushDirtyRows("", /*logged=*/true).status(),
                  "rows that came to this shard are not all on its disk");
}

absl::Status DurableCollection::ForgetStraysLocked() {
  // Nothing to forget unless a switch left rows of the old place, or a reshard's imports
  // or an interrupted one's leftovers on disk are rows of another (a shard started on the
  // new map has none).
  if (!unsettled_ && !strays_.load()) return absl::OkStatus();
  const int shard_index = options_.cluster_shard_index;
  const int num_shards = options_.cluster_num_shards;
  std::vector<KvWrite> erases;
  for (const auto& [name, t] : tables_) {
    const v1::TableConfig& config = t.config;
    auto leaving = [&](absl::string_view key, absl::string_view) {
      uint32_t table_id = 0;
      int64_t id = 0;
      if (ParseRowKey(key, &table_id, &id) &&
          embedding::ShardOfRow(config, id, num_shards) != shard_index) {
        erases.push_back(KvWrite{std::string(key), "", /*erase=*/true});
      }
      return absl::OkStatus();
    };
    TESSERA_RETURN_IF_ERROR(store_->Scan(RowPrefix(t.id), leaving));
    TESSERA_RETURN_IF_ERROR(store_->Scan(SpillPrefix(t.id), leaving));
  }
  TESSERA_RETURN_IF_ERROR(memory_->Repartition(shard_index, num_shards));
  TESSERA_RETURN_IF_ERROR(Annotate(store_->Write(erases, /*sync=*/true),
                                   "rows this shard does not own are still on its disk"));
  unsettled_ = false;
  strays_.store(false);
  return absl::OkStatus();
}

absl::Status DurableCollection::Usable() const {
  if (!broken_.ok()) return broken_;
  return absl::OkStatus();
}

absl::StatusOr<const DurableCollection::Table*> DurableCollection::Find(
    absl::string_view table) const {
  TESSERA_RETURN_IF_ERROR(Usable());
  auto it = tables_.find(table);
  if (it == tables_.end())
    return absl::NotFoundError(absl::StrCat("table '", table, "' not found"));
  return &it->second;
}

int64_t DurableCollection::rows_loaded() const {
  absl::ReaderMutexLock lock(&mu_);
  return rows_loaded_;
}

absl::Status DurableCollection::CreateTable(const v1::TableConfig& config) {
  TESSERA_RETURN_IF_ERROR(embedding::ValidateTableConfig(config));
  if (!v1::Durability_IsValid(config.durability())) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", config.name(), "': unknown durability ", config.durability()));
  }
  absl::MutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(Usable());
  if (tables_.count(config.name()) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("table '", config.name(), "' already exists"));
  }
  const uint32_t id = next_table_id_;
  // The catalog entry is on disk before the table exists, so no acknowledged table is
  // ever missing after a restart.
  TESSERA_RETURN_IF_ERROR(
      Annotate(store_->Write({KvWrite{CatalogKey(id), EncodeCatalogEntry(config)}}, /*sync=*/true),
               absl::StrCat("table '", config.name(), "': cannot store its config")));
  absl::Status s = memory_->CreateTable(config);
  if (!s.ok()) {
    const absl::Status erased =
        store_->Write({KvWrite{CatalogKey(id), "", /*erase=*/true}}, /*sync=*/true);
    // The stale entry would come back as a table on the next open.
    if (!erased.ok()) {
      std::fprintf(stderr,
                   "tessera: table '%s' was not created, but its catalog entry stays: %s\n",
                   config.name().c_str(), erased.ToString().c_str());
    }
    return s;
  }
  tables_.emplace(config.name(), MakeTable(id, config));
  next_table_id_ = id + 1;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::TableConfig>> DurableCollection::ListTables() const {
  absl::ReaderMutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(Usable());
  return memory_->ListTables();
}

absl::Status DurableCollection::Lookup(absl::string_view table, absl::Span<const int64_t> ids,
                                       absl::Span<float> out,
                                       const embedding::LookupOptions& options) {
  absl::ReaderMutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(Usable());
  return memory_->Lookup(table, ids, out, options);
}

absl::Status DurableCollection::PooledLookup(absl::string_view table, absl::Span<const int64_t> ids,
                                             absl::Span<const int32_t> offsets,
                                             absl::Span<const float> weights, v1::Pooling pooling,
                                             absl::Span<float> out,
                                             const embedding::LookupOptions& options) {
  absl::ReaderMutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(Usable());
  return memory_->PooledLookup(table, ids, offsets, weights, pooling, out, options);
}

absl::Status DurableCollection::LookupBatch(absl::Span<const embedding::TableBags> tables,
                                            const embedding::LookupOptions& options) {
  absl::ReaderMutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(Usable());
  return memory_->LookupBatch(tables, options);
}

absl::StatusOr<embedding::TableUsage> DurableCollection::Usage(absl::string_view table) const {
  absl::ReaderMutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(Usable());
  return memory_->Usage(table);
}

}  // namespace tessera::storage
