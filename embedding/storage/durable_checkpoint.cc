// DurableCollection's checkpoints: dirty rows flushed into the live store, copied into a
// checkpoint directory under a manifest, retention, and recovery of an interrupted one.

#include "embedding/storage/durable_collection.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status.h"
#include "embedding/storage/files.h"
#include "embedding/storage/internal/durable_store.h"
#include "embedding/storage/row_codec.h"
#include "embedding/table_config.h"

namespace tessera::storage {

namespace fs = std::filesystem;

using storage_internal::Clock;
using storage_internal::CopyRows;
using storage_internal::EraseAll;
using storage_internal::InfoOf;
using storage_internal::kManifest;
using storage_internal::kRowsPerBatch;
using storage_internal::NowUnixMs;
using storage_internal::OpenCheckpointStore;
using storage_internal::ReadCatalog;
using storage_internal::SecondsSince;

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
        if (config.name() == name)
          TESSERA_RETURN_IF_ERROR(CopyRows(*sources[dir], from_id, t.id, &writes));
      }
    }
    TESSERA_RETURN_IF_ERROR(store_->Write(writes, /*sync=*/false));
  }
  sources.clear();
  TESSERA_RETURN_IF_ERROR(store_->Write({}, /*sync=*/true));  // the rewrite is durable first
  return RemoveTree(InProgressPath());
}

absl::StatusOr<int64_t> DurableCollection::WriteDirtyRows(
    const Table& t, const std::function<absl::Status(absl::Span<const KvWrite>)>& write) {
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
  std::vector<KvWrite> writes;
  int64_t written = 0;
  const auto& shards = *memory_->ShardsOf(t.config.name());
  const int dim = t.config.dim();
  const int sf = shards[0]->optimizer().StateFloats();
  // A half-precision table hands out weights widened into a buffer it reuses: keep
  // copies.
  const bool copy_weights = t.config.dtype() != v1::FP32;
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
  std::sort(dirty.begin(), dirty.end(), [](const Dirty& a, const Dirty& b) { return a.id < b.id; });
  for (size_t begin = 0; begin < dirty.size(); begin += kRowsPerBatch) {
    const size_t end = std::min(dirty.size(), begin + static_cast<size_t>(kRowsPerBatch));
    writes.resize(end - begin);
    for (size_t i = begin; i < end; ++i) {
      KvWrite& kv = writes[i - begin];
      kv.key = RowKey(t.id, static_cast<int64_t>(dirty[i].id));
      EncodeRow(dirty[i].weights, dim, dirty[i].state, sf, dirty[i].meta, &kv.value);
    }
    TESSERA_RETURN_IF_ERROR(write(writes));
    written += static_cast<int64_t>(writes.size());
  }
  return written;
}

absl::StatusOr<int64_t> DurableCollection::FlushDirtyRows(const std::string& model,
                                                           bool logged) {
  int64_t written = 0;
  std::vector<KvWrite> writes;
  KvStore* store = store_.get();
  auto write = [store, logged](absl::Span<const KvWrite> w) {
    return logged ? store->Write(w, /*sync=*/true) : store->WriteUnlogged(w);
  };
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
    TESSERA_RETURN_IF_ERROR(write(writes));
    written += static_cast<int64_t>(writes.size() / 2);
    writes.clear();
  }
  for (const auto& [name, t] : tables_) {
    if (!embedding::TableOfModel(name, model)) continue;
    TESSERA_ASSIGN_OR_RETURN(const int64_t rows, WriteDirtyRows(t, write));
    written += rows;
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

absl::Status DurableCollection::SnapshotInto(const std::string& model, const std::string& dir) {
  bool others = false;  // the store holds tables of other models
  for (const auto& [name, t] : tables_) others = others || !embedding::TableOfModel(name, model);
  // The whole store (every table is the checkpoint's): its files hard-linked.
  if (!others) return store_->Checkpoint(dir + "/db");
  // One model among others: its catalog entries and rows alone, staged unlogged in a store
  // of their own, whose checkpoint flushes them into table files. A hard-linked copy of the
  // whole store would hold (and keep on disk while it is kept) every other model's rows.
  const std::string staging = dir + "/staging";
  absl::Status s = StageModel(model, staging, dir + "/db");
  absl::Status removed = RemoveTree(staging);
  TESSERA_RETURN_IF_ERROR(s);
  return removed;
}

absl::Status DurableCollection::StageModel(const std::string& model, const std::string& staging,
                                           const std::string& db) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<KvStore> out, options_.open_store(staging, {}));
  std::vector<KvWrite> writes;
  KvStore* to = out.get();
  auto add = [&writes, to](absl::string_view key, absl::string_view value) {
    writes.push_back(KvWrite{std::string(key), std::string(value)});
    if (writes.size() < static_cast<size_t>(kRowsPerBatch)) return absl::OkStatus();
    absl::Status w = to->WriteUnlogged(writes);
    writes.clear();
    return w;
  };
  for (const auto& [name, t] : tables_) {
    if (!embedding::TableOfModel(name, model)) continue;
    TESSERA_ASSIGN_OR_RETURN(std::optional<std::string> entry, store_->Get(CatalogKey(t.id)));
    if (entry.has_value()) TESSERA_RETURN_IF_ERROR(add(CatalogKey(t.id), *entry));
    TESSERA_RETURN_IF_ERROR(store_->Scan(RowPrefix(t.id), add));
  }
  TESSERA_RETURN_IF_ERROR(out->WriteUnlogged(writes));
  return out->Checkpoint(db);
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
  TESSERA_RETURN_IF_ERROR(SnapshotInto(model, dir));
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
  for (const std::string& dir :
       RetiredCheckpoints(CompleteCheckpoints(), options_.keep_checkpoints)) {
    absl::Status s = RemoveTree(dir);
    if (!s.ok()) Log(absl::StrCat("tessera: warning: ", s.message()));
  }
}

absl::StatusOr<std::vector<embedding::CheckpointInfo>> DurableCollection::ListCheckpoints() const {
  std::vector<embedding::CheckpointInfo> out;
  for (const auto& [dir, m] : CompleteCheckpoints()) out.push_back(InfoOf(m));
  return out;
}

}  // namespace tessera::storage
