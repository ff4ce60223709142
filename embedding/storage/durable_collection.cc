#include "embedding/storage/durable_collection.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "embedding/batch_ops.h"
#include "embedding/embedding_table.h"
#include "embedding/sharding.h"
#include "base/status.h"
#include "embedding/table_config.h"
#include "embedding/storage/files.h"
#include "embedding/storage/internal/row_loader.h"
#include "embedding/storage/row_codec.h"

namespace tessera::storage {
namespace {

namespace fs = std::filesystem;
using embedding::EmbeddingTable;
using Clock = std::chrono::steady_clock;

constexpr int64_t kRowsPerBatch = 1 << 16;    // rows per store write while flushing
constexpr int64_t kProgressRows = 1'000'000;  // a progress line every this many rows
constexpr absl::string_view kManifest = "MANIFEST";

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

embedding::CheckpointInfo InfoOf(const CheckpointManifest& m) {
  embedding::CheckpointInfo info;
  info.model = m.model;
  info.step = m.step;
  info.rows = m.rows;
  info.bytes = m.bytes;
  info.created_unix_ms = m.created_unix_ms;
  return info;
}

// The catalog of `store`: (table id, config) of every table.
absl::StatusOr<std::vector<std::pair<uint32_t, v1::TableConfig>>> ReadCatalog(
    const KvStore& store) {
  std::vector<std::pair<uint32_t, v1::TableConfig>> catalog;
  TESSERA_RETURN_IF_ERROR(Annotate(
      store.Scan(CatalogPrefix(),
                 [&](absl::string_view key, absl::string_view value) {
                   if (key.size() != 5)
                     return absl::DataLossError("malformed catalog key in the store");
                   const uint32_t id =
                       (static_cast<uint32_t>(static_cast<unsigned char>(key[1])) << 24) |
                       (static_cast<uint32_t>(static_cast<unsigned char>(key[2])) << 16) |
                       (static_cast<uint32_t>(static_cast<unsigned char>(key[3])) << 8) |
                       static_cast<uint32_t>(static_cast<unsigned char>(key[4]));
                   TESSERA_ASSIGN_OR_RETURN(v1::TableConfig config,
                                            DecodeCatalogEntry(id, value));
                   catalog.emplace_back(id, std::move(config));
                   return absl::OkStatus();
                 }),
      "reading the table catalog"));
  return catalog;
}

// Appends puts of every row of table `from_id` in `source` under table id `to_id`.
absl::Status CopyRows(const KvStore& source, uint32_t from_id, uint32_t to_id,
                      std::vector<KvWrite>* writes) {
  return source.Scan(RowPrefix(from_id), [&](absl::string_view key, absl::string_view value) {
    uint32_t table_id = 0;
    int64_t id = 0;
    if (!ParseRowKey(key, &table_id, &id)) return absl::OkStatus();
    writes->push_back(KvWrite{RowKey(to_id, id), std::string(value)});
    return absl::OkStatus();
  });
}

// Appends deletes of every key under `prefix`.
absl::Status EraseAll(const KvStore& store, const std::string& prefix,
                      std::vector<KvWrite>* writes) {
  return store.Scan(prefix, [&](absl::string_view key, absl::string_view) {
    writes->push_back(KvWrite{std::string(key), "", /*erase=*/true});
    return absl::OkStatus();
  });
}

// Opens the store of a checkpoint for reading, leaving its files as they are.
absl::StatusOr<std::unique_ptr<KvStore>> OpenCheckpointStore(const KvStoreFactory& open,
                                                             const std::string& dir) {
  KvStoreOptions o;
  o.create_if_missing = false;
  o.read_only = true;
  return open(dir + "/db", o);
}

}  // namespace

// Evicted rows of one table to and from the store. Called under a stripe lock of the
// table; it touches only the store.
class DurableCollection::Spill final : public embedding::RowSpill {
 public:
  Spill(KvStore* store, uint32_t table_id, const v1::TableConfig& config, int state_floats)
      : store_(store),
        table_id_(table_id),
        name_(config.name()),
        dim_(config.dim()),
        state_floats_(state_floats),
        write_through_(config.durability() == v1::WRITE_THROUGH) {}

  absl::Status Evict(int64_t id, const float* weights, const float* state,
                     const embedding::RowMeta& meta, bool dirty) override {
    if (!dirty) return absl::OkStatus();  // the store has it, or it is still initial
    KvWrite w;
    // Write-through rows belong in the durable rows; checkpoint rows changed since the
    // checkpoint must not be, until the next one.
    w.key = write_through_ ? RowKey(table_id_, id) : SpillKey(table_id_, id);
    EncodeRow(weights, dim_, state, state_floats_, meta, &w.value);
    return Annotate(store_->Write({w}, /*sync=*/false),
                    absl::StrCat("table '", name_, "': evicting row ", id));
  }

  absl::StatusOr<bool> Fetch(int64_t id, float* weights, float* state, embedding::RowMeta* meta,
                             bool* dirty) override {
    std::optional<std::string> value;
    *dirty = false;
    if (!write_through_) {
      TESSERA_ASSIGN_OR_RETURN(value, store_->Get(SpillKey(table_id_, id)));
      *dirty = value.has_value();
    }
    if (!value.has_value()) {
      TESSERA_ASSIGN_OR_RETURN(value, store_->Get(RowKey(table_id_, id)));
    }
    if (!value.has_value()) return false;
    DecodedRow row;
    TESSERA_RETURN_IF_ERROR(DecodeRow(name_, id, *value, dim_, state_floats_, &row));
    std::copy(row.weights.begin(), row.weights.end(), weights);
    std::copy(row.state.begin(), row.state.end(), state);
    *meta = row.meta;
    return true;
  }

  void Drop(int64_t id) override {
    (void)store_->Write({KvWrite{RowKey(table_id_, id), "", /*erase=*/true},
                         KvWrite{SpillKey(table_id_, id), "", /*erase=*/true}},
                        /*sync=*/false);
  }

 private:
  KvStore* const store_;
  const uint32_t table_id_;
  const std::string name_;
  const int dim_, state_floats_;
  const bool write_through_;
};

DurableCollection::DurableCollection(const DurableOptions& options) : options_(options) {}

DurableCollection::Table DurableCollection::MakeTable(uint32_t id, const v1::TableConfig& config) {
  Table t;
  t.id = id;
  t.config = config;
  t.write_mu = std::make_unique<absl::Mutex>();
  const auto& shards = *memory_->ShardsOf(config.name());
  t.spill = std::make_unique<Spill>(store_.get(), id, config, shards[0]->optimizer().StateFloats());
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
  TESSERA_ASSIGN_OR_RETURN(memory_, embedding::NewInProcessCollection(options_.num_shards));
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
    load.seed = t.config.seed();
    load.progress_every = kProgressRows;
    const int64_t before = rows_loaded_;
    load.progress = [&](int64_t rows) {
      Log(absl::StrCat("tessera: loaded ", before + rows, " rows from ", LivePath(), " (",
                       absl::StrFormat("%.1f", SecondsSince(start)), " s)"));
    };
    int64_t loaded = 0;
    absl::Status status = storage_internal::LoadRowsInParallel(*store_, load, shards, &loaded);
    rows_loaded_ += loaded;
    return status;
  }
  // A table with eviction holds what fits, in key order, and reads the rest from disk
  // when used.
  DecodedRow row;
  const int dim = t.config.dim();
  const int state_floats = shards[0]->optimizer().StateFloats();
  int64_t last_id = 0;
  bool any = false;
  absl::Status scanned =
      store_->Scan(RowPrefix(t.id), [&](absl::string_view key, absl::string_view value) {
        uint32_t table_id = 0;
        int64_t id = 0;
        if (!ParseRowKey(key, &table_id, &id) || table_id != t.id) {
          return absl::DataLossError(
              absl::StrCat("table '", name, "': malformed row key in the store"));
        }
        TESSERA_RETURN_IF_ERROR(DecodeRow(name, id, value, dim, state_floats, &row));
        const int shard = embedding::ShardOf(id, t.config.seed(), options_.num_shards);
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
  // The store's own checks (block checksums) fail below the row level: say where.
  if (!scanned.ok() && !absl::StartsWith(scanned.message(), "table '")) {
    scanned = absl::Status(scanned.code(), absl::StrCat("table '", name, "': stored rows ",
                                                        any ? absl::StrCat("after row ", last_id)
                                                            : std::string("from the first"),
                                                        " are unreadable: ", scanned.message()));
  }
  return scanned;
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

absl::StatusOr<v1::TableConfig> DurableCollection::AlterTable(
    absl::string_view table, const v1::OptimizerConfig& changes) {
  absl::MutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(Usable());
  auto it = tables_.find(table);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("table '", table, "' not found"));
  }
  Table& t = it->second;
  TESSERA_ASSIGN_OR_RETURN(v1::TableConfig altered, embedding::AlterOptimizer(t.config, changes));
  TESSERA_RETURN_IF_ERROR(Annotate(
      store_->Write({KvWrite{CatalogKey(t.id), EncodeCatalogEntry(altered)}}, /*sync=*/true),
      absl::StrCat("table '", table, "': cannot store its new config (nothing changed)")));
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
  if (t->config.durability() != v1::WRITE_THROUGH) return memory_->ImportRows(table, rows);
  absl::MutexLock ordered(t->write_mu.get());
  TESSERA_RETURN_IF_ERROR(memory_->ImportRows(table, rows));
  const auto& shards = *memory_->ShardsOf(table);
  const int sf = shards[0]->optimizer().StateFloats();
  std::vector<KvWrite> writes;
  writes.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    shards[embedding::ShardOf(rows.ids[i], t->config.seed(), options_.num_shards)]->ReadRows(
        {&rows.ids[i], 1},
        [&](int64_t id, const float* w, const float* st, const embedding::RowMeta& m) {
          KvWrite kv;
          kv.key = RowKey(t->id, id);
          EncodeRow(w, t->config.dim(), st, sf, m, &kv.value);
          writes.push_back(std::move(kv));
        });
  }
  return Annotate(store_->Write(writes, /*sync=*/true),
                  absl::StrCat("table '", table, "': imported rows not on disk"));
}

absl::Status DurableCollection::RestoreModel(const std::string& dir, const CheckpointManifest& m) {
  const auto start = Clock::now();
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<KvStore> source,
                           OpenCheckpointStore(options_.open_store, dir));
  TESSERA_ASSIGN_OR_RETURN(auto catalog, ReadCatalog(*source));
  // A marker first: a crash before the end redoes the whole restore on the next open.
  TESSERA_RETURN_IF_ERROR(WriteFileAtomically(RestoringPath(), dir));
  std::vector<KvWrite> writes;
  std::vector<std::string> mine;
  for (const auto& [name, t] : tables_) {
    if (embedding::TableOfModel(name, m.model)) mine.push_back(name);
  }
  for (const std::string& name : mine) TESSERA_RETURN_IF_ERROR(ForgetTable(name, &writes));
  std::vector<std::pair<uint32_t, v1::TableConfig>> restored;
  for (const auto& [from_id, config] : catalog) {
    if (std::find(m.tables.begin(), m.tables.end(), config.name()) == m.tables.end()) continue;
    // Fresh ids: the checkpoint's may name another table here by now.
    const uint32_t id = next_table_id_++;
    writes.push_back(KvWrite{CatalogKey(id), EncodeCatalogEntry(config)});
    TESSERA_RETURN_IF_ERROR(CopyRows(*source, from_id, id, &writes));
    restored.emplace_back(id, config);
  }
  source.reset();
  for (size_t begin = 0; begin < writes.size(); begin += kRowsPerBatch) {
    const size_t n = std::min(writes.size() - begin, static_cast<size_t>(kRowsPerBatch));
    TESSERA_RETURN_IF_ERROR(store_->Write(absl::MakeConstSpan(writes).subspan(begin, n),
                                          /*sync=*/false));
  }
  TESSERA_RETURN_IF_ERROR(store_->Write({}, /*sync=*/true));
  for (const auto& [id, config] : restored) {
    TESSERA_RETURN_IF_ERROR(memory_->CreateTable(config));
    auto [it, inserted] = tables_.emplace(config.name(), MakeTable(id, config));
    TESSERA_RETURN_IF_ERROR(LoadRows(it->first, it->second, start));
  }
  return RemoveTree(RestoringPath());
}

absl::Status DurableCollection::FinishInterruptedRestore() {
  absl::StatusOr<std::string> dir = ReadFile(RestoringPath());
  if (absl::IsNotFound(dir.status())) return absl::OkStatus();
  TESSERA_RETURN_IF_ERROR(dir.status());
  TESSERA_ASSIGN_OR_RETURN(CheckpointManifest m, ReadManifest(absl::StrCat(*dir, "/", kManifest)));
  Log(absl::StrCat("tessera: the restore of ", *dir, " was interrupted; finishing it"));
  return RestoreModel(*dir, m);
}

absl::Status DurableCollection::RecoverInterruptedCheckpoint() {
  // The marker is a file beside the store, so that no checkpoint of the store holds it.
  absl::StatusOr<std::string> marker = ReadFile(InProgressPath());
  if (absl::IsNotFound(marker.status())) return absl::OkStatus();
  TESSERA_RETURN_IF_ERROR(marker.status());
  // "<step>" or "<model> <step>": the checkpoint's tables were being flushed, so their rows
  // in the live store may be a mix of two checkpoints. Each goes back to the newest
  // complete checkpoint that holds it (none: its initial rows).
  const size_t space = marker->find(' ');
  const std::string model = space == std::string::npos ? "" : marker->substr(0, space);
  const auto complete = CompleteCheckpoints();
  Log(absl::StrCat("tessera: checkpoint ", *marker, " was interrupted; its checkpoint tables in ",
                   LivePath(), " go back to their newest complete checkpoint"));
  std::map<std::string, std::unique_ptr<KvStore>> sources;  // by checkpoint directory
  std::map<std::string, std::vector<std::pair<uint32_t, v1::TableConfig>>> catalogs;
  for (const auto& [name, t] : tables_) {
    if (t.config.durability() != v1::CHECKPOINT || !embedding::TableOfModel(name, model)) continue;
    std::vector<KvWrite> writes;
    TESSERA_RETURN_IF_ERROR(EraseAll(*store_, RowPrefix(t.id), &writes));
    const std::pair<std::string, CheckpointManifest>* newest = nullptr;
    for (const auto& c : complete) {
      const auto& names = c.second.tables;
      if (std::find(names.begin(), names.end(), name) != names.end()) newest = &c;
    }
    if (newest != nullptr) {
      const std::string& dir = newest->first;
      if (sources.count(dir) == 0) {
        TESSERA_ASSIGN_OR_RETURN(sources[dir], OpenCheckpointStore(options_.open_store, dir));
        TESSERA_ASSIGN_OR_RETURN(catalogs[dir], ReadCatalog(*sources[dir]));
      }
      for (const auto& [from_id, config] : catalogs[dir]) {
        if (config.name() == name) TESSERA_RETURN_IF_ERROR(CopyRows(*sources[dir], from_id, t.id, &writes));
      }
    }
    TESSERA_RETURN_IF_ERROR(store_->Write(writes, /*sync=*/false));
  }
  sources.clear();
  TESSERA_RETURN_IF_ERROR(store_->Write({}, /*sync=*/true));  // the rewrite is durable first
  return RemoveTree(InProgressPath());
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
    (void)store_->Write({KvWrite{CatalogKey(id), "", /*erase=*/true}}, /*sync=*/true);
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

absl::StatusOr<embedding::TableUsage> DurableCollection::Usage(absl::string_view table) const {
  absl::ReaderMutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(Usable());
  return memory_->Usage(table);
}

absl::Status DurableCollection::PushGradients(absl::string_view table,
                                              absl::Span<const int64_t> ids,
                                              absl::Span<const float> gradients, int64_t step) {
  return Push(table, ids, gradients, step, nullptr);
}

absl::Status DurableCollection::PushGradientsRecorded(absl::string_view table,
                                                      absl::Span<const int64_t> ids,
                                                      absl::Span<const float> gradients,
                                                      int64_t step,
                                                      const embedding::PushTag& tag) {
  return Push(table, ids, gradients, step, &tag);
}

absl::Status DurableCollection::Push(absl::string_view table, absl::Span<const int64_t> ids,
                                     absl::Span<const float> gradients, int64_t step,
                                     const embedding::PushTag* tag) {
  absl::ReaderMutexLock lock(&mu_);
  TESSERA_ASSIGN_OR_RETURN(const Table* t, Find(table));
  if (t->config.durability() != v1::WRITE_THROUGH) {
    return memory_->PushGradients(table, ids, gradients, step);
  }
  return WriteThroughPush(*t, ids, gradients, step, tag);
}

std::optional<int64_t> DurableCollection::RecordedPush(const embedding::PushTag& tag) const {
  absl::MutexLock lock(&record_mu_);
  auto it = records_.find(KeyOf(tag));
  if (it == records_.end()) return std::nullopt;
  return it->second;
}

absl::Status DurableCollection::LoadPushRecords() {
  std::vector<std::tuple<uint64_t, embedding::PushTag, int64_t>> found;  // order, tag, rows
  TESSERA_RETURN_IF_ERROR(Annotate(
      store_->Scan(PushRecordPrefix(),
                   [&](absl::string_view key, absl::string_view value) {
                     embedding::PushTag tag;
                     uint64_t order = 0;
                     int64_t rows = 0;
                     if (!ParsePushRecordKey(key, &tag) || !DecodePushRecord(value, &order, &rows)) {
                       return absl::DataLossError("malformed push record in the store");
                     }
                     found.emplace_back(order, tag, rows);
                     return absl::OkStatus();
                   }),
      "reading the push records"));
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
  std::vector<KvWrite> trimmed;
  while (found.size() - trimmed.size() > options_.push_records) {
    trimmed.push_back(KvWrite{PushRecordKey(std::get<1>(found[trimmed.size()])), "", true});
  }
  if (!trimmed.empty()) TESSERA_RETURN_IF_ERROR(store_->Write(trimmed, /*sync=*/true));
  absl::MutexLock lock(&record_mu_);
  records_.clear();
  record_order_.clear();
  next_record_ = found.empty() ? 1 : std::get<0>(found.back()) + 1;
  for (size_t i = trimmed.size(); i < found.size(); ++i) {
    const auto& [order, tag, rows] = found[i];
    records_[KeyOf(tag)] = rows;
    record_order_.push_back(tag);
  }
  return absl::OkStatus();
}

absl::Status DurableCollection::WriteThroughPush(const Table& t, absl::Span<const int64_t> ids,
                                                 absl::Span<const float> gradients, int64_t step,
                                                 const embedding::PushTag* tag) {
  absl::MutexLock order(t.write_mu.get());
  const std::string& name = t.config.name();
  const auto& shards = *memory_->ShardsOf(name);
  const int n = options_.num_shards;
  std::vector<int64_t> unique;
  std::vector<int32_t> inverse;
  embedding::Unique(ids, &unique, &inverse);
  // The rows as they are now, to undo the push if the disk refuses it.
  struct Before {
    bool existed = false;
    std::vector<float> weights, state;
    embedding::RowMeta meta;
  };
  std::map<int64_t, Before> before;
  for (const int64_t id : unique) before[id];
  for (const int64_t id : unique) {
    shards[embedding::ShardOf(id, t.config.seed(), n)]->ReadRows(
        {&id, 1}, [&](int64_t rid, const float* w, const float* s, const embedding::RowMeta& m) {
          Before& b = before[rid];
          const int dim = t.config.dim();
          const int sf = shards[0]->optimizer().StateFloats();
          b.existed = true;
          b.weights.assign(w, w + dim);
          b.state.assign(s, s + sf);
          b.meta = m;
        });
  }
  // Undoes the push in memory: rows that were not in memory are forgotten, so their next
  // read finds the stored value (or initial weights) again.
  auto undo = [&] {
    for (auto& [id, b] : before) {
      auto& shard = shards[embedding::ShardOf(id, t.config.seed(), n)];
      // A row that cannot be put back (out of memory) is forgotten instead: its next
      // read finds its stored value, which the refused write did not change.
      if (!b.existed || !shard->PutRow(id, b.weights, b.state, b.meta).ok()) shard->Forget(id);
    }
  };
  absl::Status applied = memory_->PushGradients(name, ids, gradients, step);
  if (!applied.ok()) {
    undo();
    if (tessera::IsPartlyApplied(applied)) {  // undone: not partly applied any more
      return absl::Status(applied.code(),
                          absl::StrCat(applied.message(),
                                       " [write-through table: the whole push was undone, "
                                       "no row changed]"));
    }
    return applied;
  }
  std::vector<KvWrite> writes;
  writes.reserve(unique.size());
  for (const int64_t id : unique) {
    shards[embedding::ShardOf(id, t.config.seed(), n)]->ReadRows(
        {&id, 1}, [&](int64_t rid, const float* w, const float* s, const embedding::RowMeta& m) {
          KvWrite kv;
          kv.key = RowKey(t.id, rid);
          EncodeRow(w, t.config.dim(), s, shards[0]->optimizer().StateFloats(), m, &kv.value);
          writes.push_back(std::move(kv));
        });
  }
  if (tag != nullptr) {
    // The record goes in the same write as the rows: after a crash both are there or
    // neither is. The oldest records beyond the limit go with it (a failed write leaves
    // them in the store; the next open trims them).
    absl::MutexLock lock(&record_mu_);
    writes.push_back(KvWrite{PushRecordKey(*tag),
                             EncodePushRecord(next_record_++, static_cast<int64_t>(unique.size()))});
    while (!record_order_.empty() && record_order_.size() + 1 > options_.push_records) {
      writes.push_back(KvWrite{PushRecordKey(record_order_.front()), "", /*erase=*/true});
      records_.erase(KeyOf(record_order_.front()));
      record_order_.pop_front();
    }
  }
  absl::Status s = store_->Write(writes, /*sync=*/true);
  if (s.ok()) {
    if (tag != nullptr) {
      absl::MutexLock lock(&record_mu_);
      records_[KeyOf(*tag)] = static_cast<int64_t>(unique.size());
      record_order_.push_back(*tag);
    }
    return absl::OkStatus();
  }
  undo();
  return absl::Status(s.code(), absl::StrCat("table '", name,
                                             "': write-through push not applied, the disk "
                                             "refused it: ",
                                             s.message()));
}

absl::StatusOr<int64_t> DurableCollection::FlushDirtyRows(const std::string& model) {
  int64_t written = 0;
  std::vector<KvWrite> writes;
  // Rows evicted since the last checkpoint join the durable rows first; rows in memory,
  // newer where both exist, are written after them.
  for (const auto& [name, t] : tables_) {
    if (!embedding::TableOfModel(name, model)) continue;
    const uint32_t spilled_table = t.id;  // clang 14 cannot capture a structured binding
    TESSERA_RETURN_IF_ERROR(
        store_->Scan(SpillPrefix(t.id), [&](absl::string_view key, absl::string_view value) {
          uint32_t table_id = 0;
          int64_t id = 0;
          if (!ParseRowKey(key, &table_id, &id)) return absl::OkStatus();
          writes.push_back(KvWrite{RowKey(spilled_table, id), std::string(value)});
          writes.push_back(KvWrite{std::string(key), "", /*erase=*/true});
          return absl::OkStatus();
        }));
  }
  // Flushed rows need no log: the checkpoint that follows puts them in table files, and
  // a crash before it loses only what a crash before a checkpoint may lose.
  if (!writes.empty()) {
    TESSERA_RETURN_IF_ERROR(store_->WriteUnlogged(writes));
    written += static_cast<int64_t>(writes.size() / 2);
    writes.clear();
  }
  // Each table's dirty rows in key order (ids as unsigned, as the big-endian keys sort),
  // so the store's memtable takes each key next to the one before: a third of the flush
  // went to finding each key's place otherwise. The rows cannot move meanwhile: every
  // other call waits for the checkpoint.
  struct Dirty {
    uint64_t id;
    const float* weights;
    const float* state;
    embedding::RowMeta meta;
  };
  std::vector<Dirty> dirty;
  std::vector<float> widened;  // fp16 / bf16 tables: the weights the callbacks lent
  for (const auto& [name, t] : tables_) {
    if (!embedding::TableOfModel(name, model)) continue;
    const auto& shards = *memory_->ShardsOf(name);
    const int dim = t.config.dim();
    const int sf = shards[0]->optimizer().StateFloats();
    // A half-precision table hands out weights widened into a buffer it reuses: keep
    // copies.
    const bool copy_weights = t.config.dtype() != v1::FP32;
    dirty.clear();
    widened.clear();
    if (copy_weights) {
      int64_t rows = 0;
      for (const auto& shard : shards) rows += shard->DirtyRows();
      widened.reserve(static_cast<size_t>(rows) * dim);
    }
    for (const auto& shard : shards) {
      shard->ForEachDirtyRow(
          [&](int64_t id, const float* w, const float* st, const embedding::RowMeta& m) {
            if (copy_weights) widened.insert(widened.end(), w, w + dim);
            dirty.push_back(Dirty{static_cast<uint64_t>(id), w, st, m});
          });
    }
    if (copy_weights) {
      for (size_t i = 0; i < dirty.size(); ++i) dirty[i].weights = widened.data() + i * dim;
    }
    std::sort(dirty.begin(), dirty.end(),
              [](const Dirty& a, const Dirty& b) { return a.id < b.id; });
    for (size_t begin = 0; begin < dirty.size(); begin += kRowsPerBatch) {
      const size_t end = std::min(dirty.size(), begin + static_cast<size_t>(kRowsPerBatch));
      writes.resize(end - begin);
      for (size_t i = begin; i < end; ++i) {
        KvWrite& kv = writes[i - begin];
        kv.key = RowKey(t.id, static_cast<int64_t>(dirty[i].id));
        EncodeRow(dirty[i].weights, dim, dirty[i].state, sf, dirty[i].meta, &kv.value);
      }
      TESSERA_RETURN_IF_ERROR(store_->WriteUnlogged(writes));
      written += static_cast<int64_t>(writes.size());
    }
  }
  // Only now, with every row in the store, are the rows clean. (Checkpoint() flushes them
  // to disk next; if that fails, the checkpoint fails and a restart comes back as of the
  // one before, which is what losing these rows means.)
  for (const auto& [name, t] : tables_) {
    if (!embedding::TableOfModel(name, model)) continue;
    for (const auto& shard : *memory_->ShardsOf(name)) shard->ClearDirty();
  }
  return written;
}

absl::StatusOr<embedding::CheckpointInfo> DurableCollection::Checkpoint(
    int64_t step, const embedding::Attachments& attachments,
    const embedding::CheckpointOptions& options) {
  const std::string& model = options.model;
  if (step < 0)
    return absl::InvalidArgumentError(absl::StrCat("checkpoint step must be >= 0, got ", step));
  if (!model.empty()) TESSERA_RETURN_IF_ERROR(embedding::ValidateModelName(model));
  for (const auto& [name, blob] : attachments)
    TESSERA_RETURN_IF_ERROR(ValidateAttachmentName(name));
  const auto start = Clock::now();
  absl::MutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(Usable());
  const auto complete = CompleteCheckpoints();
  if (!options.replace) TESSERA_RETURN_IF_ERROR(RefuseOverwrite(complete, model, step));
  // Until the manifest is written the live store may hold part of this checkpoint's rows;
  // a restart in between recovers those tables from their previous checkpoint.
  TESSERA_RETURN_IF_ERROR(WriteFileAtomically(
      InProgressPath(), model.empty() ? absl::StrCat(step) : absl::StrCat(model, " ", step)));
  TESSERA_ASSIGN_OR_RETURN(const int64_t flushed, FlushDirtyRows(model));
  TESSERA_RETURN_IF_ERROR(store_->Write({KvWrite{MetaKey("checkpoint_step"), absl::StrCat(step)}},
                                        /*sync=*/true));
  const std::string dir = CheckpointDir(step, model);
  TESSERA_RETURN_IF_ERROR(RemoveTree(dir));  // an incomplete (or replaced) one of this step
  std::error_code ec;
  fs::create_directories(dir + "/attachments", ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  TESSERA_RETURN_IF_ERROR(store_->Checkpoint(dir + "/db"));
  CheckpointManifest m;
  m.model = model;
  m.step = step;
  m.sequence = NextCheckpointSequence(complete);
  for (const auto& [name, t] : tables_) {
    if (!embedding::TableOfModel(name, model)) continue;
    m.tables.push_back(name);
    TESSERA_ASSIGN_OR_RETURN(embedding::TableUsage u, memory_->Usage(name));
    m.rows += u.rows;
  }
  for (const auto& [name, blob] : attachments) {
    TESSERA_RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(dir, "/attachments/", name), blob));
    m.attachments.push_back(name);
  }
  m.bytes = TreeBytes(dir);
  m.created_unix_ms = NowUnixMs();
  TESSERA_RETURN_IF_ERROR(
      WriteFileAtomically(absl::StrCat(dir, "/", kManifest), EncodeManifest(m)));
  TESSERA_RETURN_IF_ERROR(RemoveTree(InProgressPath()));
  ApplyRetention();
  embedding::CheckpointInfo info = InfoOf(m);
  info.seconds = SecondsSince(start);
  Log(absl::StrCat("tessera: ", embedding::CheckpointName(model, step), " written to ", dir, ": ",
                   flushed,
                   " dirty rows flushed, ", m.bytes, " bytes, ",
                   absl::StrFormat("%.2f", info.seconds), " s"));
  return info;
}

std::vector<std::pair<std::string, CheckpointManifest>> DurableCollection::CompleteCheckpoints()
    const {
  return ListCompleteCheckpoints(options_.data_dir + "/checkpoints",
                                 [this](const std::string& line) { Log(line); });
}

void DurableCollection::ApplyRetention() {
  if (options_.keep_checkpoints == 0) return;
  for (const std::string& dir : RetiredCheckpoints(CompleteCheckpoints(), options_.keep_checkpoints)) {
    absl::Status s = RemoveTree(dir);
    if (!s.ok()) Log(absl::StrCat("tessera: warning: ", s.message()));
  }
}

absl::StatusOr<std::vector<embedding::CheckpointInfo>> DurableCollection::ListCheckpoints() const {
  std::vector<embedding::CheckpointInfo> out;
  for (const auto& [dir, m] : CompleteCheckpoints()) out.push_back(InfoOf(m));
  return out;
}

absl::StatusOr<embedding::CheckpointInfo> DurableCollection::Restore(
    int64_t step, embedding::Attachments* attachments, const embedding::RestoreOptions& options) {
  const auto start = Clock::now();
  absl::MutexLock lock(&mu_);
  const auto complete = CompleteCheckpoints();
  TESSERA_ASSIGN_OR_RETURN(
      const auto* chosen,
      ChooseCheckpoint(complete, step, options_.data_dir + "/checkpoints", options.model));
  const std::string& dir = chosen->first;
  embedding::Attachments blobs;
  TESSERA_RETURN_IF_ERROR(ReadAttachments(dir, chosen->second, &blobs));
  // Checked before anything changes.
  TESSERA_RETURN_IF_ERROR(embedding::CheckRestorable(chosen->second.step, blobs, options));
  if (!options.model.empty()) {
    TESSERA_RETURN_IF_ERROR(Usable());
    absl::Status s = RestoreModel(dir, chosen->second);
    if (!s.ok()) {
      broken_ = Annotate(s, absl::StrCat("restore of ", dir, " stopped half-way; restart the "
                                         "server, which finishes it"));
      return broken_;
    }
  } else {
    // Copy first, while the live store is still whole; then swap directories.
    const std::string live = LivePath();
    TESSERA_RETURN_IF_ERROR(RemoveTree(live + ".restore"));
    TESSERA_RETURN_IF_ERROR(CopyTree(dir + "/db", live + ".restore"));
    store_.reset();
    std::error_code ec;
    fs::rename(live, live + ".old", ec);
    if (!ec) fs::rename(live + ".restore", live, ec);
    if (ec) {
      broken_ = absl::InternalError(absl::StrCat("restore of ", dir, " failed swapping ", live,
                                                 ": ", ec.message(), "; restart the server"));
      return broken_;
    }
    (void)RemoveTree(live + ".old");
    // The restored checkpoint is the state now, whatever was interrupted before.
    (void)RemoveTree(InProgressPath());
    (void)RemoveTree(RestoringPath());
    absl::Status s = OpenAndLoad();
    if (!s.ok()) {
      broken_ = Annotate(s, absl::StrCat("restore of ", dir));
      return broken_;
    }
    broken_ = absl::OkStatus();
  }
  if (attachments != nullptr) *attachments = std::move(blobs);
  embedding::CheckpointInfo info = InfoOf(chosen->second);
  info.seconds = SecondsSince(start);
  Log(absl::StrCat("tessera: restored ", embedding::CheckpointName(options.model, info.step),
                   " from ", dir, " in ", absl::StrFormat("%.2f", info.seconds), " s"));
  return info;
}

}  // namespace tessera::storage
