// DurableCollection's restores: a model's tables replaced by a checkpoint's, and recovery
// of an interrupted restore.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status.h"
#include "embedding/embedding_table.h"
#include "embedding/optimizer.h"
#include "embedding/row_math.h"
#include "embedding/storage/durable_collection.h"
#include "embedding/storage/files.h"
#include "embedding/storage/internal/durable_store.h"
#include "embedding/storage/row_codec.h"

namespace tessera::storage {

namespace fs = std::filesystem;

using storage_internal::Clock;
using storage_internal::CopyRows;
using storage_internal::InfoOf;
using storage_internal::kManifest;
using storage_internal::kRowsPerBatch;
using storage_internal::OpenCheckpointStore;
using storage_internal::ReadCatalog;
using storage_internal::SecondsSince;

// The first line of a restore marker for another shard count's checkpoints.
constexpr char kResharded[] = "resharded";

absl::StatusOr<DurableCollection::ModelRows> DurableCollection::ReadModel(
    const std::vector<std::string>& dirs, const CheckpointManifest& m, bool resharded) {
  // Each table of the checkpoint gets a fresh id here (a source's may name another table
  // by now) and the rows of every source that this collection owns.
  // Another shard count's directories are its shards' in shard order: from each, only
  // the rows that shard owned (a copy it held of another's row, taken while a reshard
  // copied, is not the row).
  ModelRows out;
  const int sources = static_cast<int>(dirs.size());
  for (int k = 0; k < sources; ++k) {
    const std::string& dir = dirs[k];
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<KvStore> source,
                             OpenCheckpointStore(options_.open_store, dir));
    TESSERA_ASSIGN_OR_RETURN(auto catalog, ReadCatalog(*source));
    for (const auto& [from_id, config] : catalog) {
      if (std::find(m.tables.begin(), m.tables.end(), config.name()) == m.tables.end()) continue;
      auto it = out.tables.find(config.name());
      if (it == out.tables.end()) {
        const uint32_t id = next_table_id_++;
        v1::TableConfig here = config;
        if (resharded && here.max_rows() > 0) {
          // A shard's part of the row budget, split over the old shards, split over the new.
          const int64_t total = here.max_rows() * static_cast<int64_t>(dirs.size());
          here.set_max_rows((total + options_.cluster_num_shards - 1) /
                            options_.cluster_num_shards);
        }
        out.writes.push_back(KvWrite{CatalogKey(id), EncodeCatalogEntry(here)});
        it = out.tables.emplace(config.name(), std::make_pair(id, here)).first;
      }
      const v1::TableConfig& c = it->second.second;
      TESSERA_RETURN_IF_ERROR(
          CopyRows(*source, from_id, it->second.first, &out.writes, [&](int64_t row_id) {
            return embedding::ShardOfRow(c, row_id, options_.cluster_num_shards) ==
                       options_.cluster_shard_index &&
                   (!resharded || embedding::ShardOfRow(c, row_id, sources) == k);
          }));
    }
  }
  return out;
}

absl::Status DurableCollection::ApplyModel(const std::vector<std::string>& dirs,
                                           const CheckpointManifest& m, bool resharded,
                                           ModelRows rows) {
  const auto start = Clock::now();
  // A marker first (the directories, a line each, after a line "resharded" for another
  // shard count's): a crash before the end redoes the whole restore on the next open.
  TESSERA_RETURN_IF_ERROR(WriteFileAtomically(
      RestoringPath(),
      absl::StrCat(resharded ? absl::StrCat(kResharded, "\n") : "", absl::StrJoin(dirs, "\n"))));
  std::vector<KvWrite> writes;
  std::vector<std::string> mine;
  for (const auto& [name, t] : tables_) {
    if (embedding::TableOfModel(name, m.model)) mine.push_back(name);
  }
  for (const std::string& name : mine) TESSERA_RETURN_IF_ERROR(ForgetTable(name, &writes));
  writes.insert(writes.end(), std::make_move_iterator(rows.writes.begin()),
                std::make_move_iterator(rows.writes.end()));
  for (size_t begin = 0; begin < writes.size(); begin += kRowsPerBatch) {
    const size_t n = std::min(writes.size() - begin, static_cast<size_t>(kRowsPerBatch));
    TESSERA_RETURN_IF_ERROR(store_->Write(absl::MakeConstSpan(writes).subspan(begin, n),
                                          /*sync=*/false));
  }
  TESSERA_RETURN_IF_ERROR(store_->Write({}, /*sync=*/true));
  for (const auto& [name, entry] : rows.tables) {
    TESSERA_RETURN_IF_ERROR(memory_->CreateTable(entry.second));
    auto [it, inserted] = tables_.emplace(name, MakeTable(entry.first, entry.second));
    TESSERA_RETURN_IF_ERROR(LoadRows(it->first, it->second, start));
  }
  return RemoveTree(RestoringPath());
}

absl::Status DurableCollection::RestoreModel(const std::vector<std::string>& dirs,
                                             const CheckpointManifest& m, bool resharded) {
  TESSERA_ASSIGN_OR_RETURN(ModelRows rows, ReadModel(dirs, m, resharded));
  return ApplyModel(dirs, m, resharded, std::move(rows));
}

absl::Status DurableCollection::ReadAndApplyModel(const std::vector<std::string>& dirs,
                                                  const CheckpointManifest& m, bool resharded,
                                                  bool verify_only, const std::string& what) {
  // Read whole before anything changes: a checkpoint that cannot be read (a corrupt or
  // missing file) leaves every table as it was and the server serving.
  absl::StatusOr<ModelRows> rows = ReadModel(dirs, m, resharded);
  if (!rows.ok()) return Unreadable(m, absl::StrJoin(dirs, ", "), rows.status());
  if (verify_only) return absl::OkStatus();
  absl::Status s = ApplyModel(dirs, m, resharded, *std::move(rows));
  if (!s.ok()) {
    broken_ =
        Annotate(s, absl::StrCat(what, " stopped half-way; restart the server, which finishes it"));
    return broken_;
  }
  return absl::OkStatus();
}

absl::Status DurableCollection::Unreadable(const CheckpointManifest& m, const std::string& where,
                                           const absl::Status& read) const {
  // The newest older checkpoint of the model that is complete here.
  int64_t older = -1;
  for (const auto& [dir, c] : CompleteCheckpoints()) {
    if (c.model == m.model && c.step < m.step) older = std::max(older, c.step);
  }
  return Annotate(
      read,
      absl::StrCat(embedding::CheckpointName(m.model, m.step), " (", where,
                   ") cannot be read whole; nothing was restored, every table serves as it "
                   "was",
                   older < 0 ? std::string("; there is no older complete checkpoint here")
                             : absl::StrCat("; the newest older complete one here is step ", older,
                                            " (", embedding::RestoreCommand(m.model, older), ")")));
}

absl::Status DurableCollection::VerifyStore(const std::string& dir) const {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<KvStore> source,
                           OpenCheckpointStore(options_.open_store, dir));
  // Every key and value read: the store checks each block's checksum as it reads it.
  return source->Scan("", [](absl::string_view, absl::string_view) { return absl::OkStatus(); });
}

absl::Status DurableCollection::FinishInterruptedRestore() {
  absl::StatusOr<std::string> marker = ReadFile(RestoringPath());
  if (absl::IsNotFound(marker.status())) return absl::OkStatus();
  TESSERA_RETURN_IF_ERROR(marker.status());
  std::vector<std::string> dirs = absl::StrSplit(*marker, '\n', absl::SkipEmpty());
  const bool resharded = !dirs.empty() && dirs[0] == kResharded;
  if (resharded) dirs.erase(dirs.begin());
  if (dirs.empty()) return RemoveTree(RestoringPath());
  TESSERA_ASSIGN_OR_RETURN(CheckpointManifest m,
                           ReadManifest(absl::StrCat(dirs[0], "/", kManifest)));
  Log(absl::StrCat("tessera: the restore of ", absl::StrJoin(dirs, ", "),
                   " was interrupted; finishing it"));
  return RestoreModel(dirs, m, resharded);
}

absl::StatusOr<CheckpointManifest> DurableCollection::ManifestOfDirs(
    const std::vector<std::string>& dirs) {
  if (dirs.empty()) {
    return absl::InvalidArgumentError("reading shards' checkpoints needs their directories");
  }
  std::vector<CheckpointManifest> manifests;
  for (const std::string& dir : dirs) {
    absl::StatusOr<CheckpointManifest> m = ReadManifest(absl::StrCat(dir, "/", kManifest));
    if (!m.ok()) {
      return absl::NotFoundError(
          absl::StrCat("no complete checkpoint in ", dir, ": ", m.status().message()));
    }
    manifests.push_back(*std::move(m));
  }
  const CheckpointManifest& m = manifests[0];
  for (size_t i = 1; i < manifests.size(); ++i) {
    if (manifests[i].step != m.step || manifests[i].model != m.model) {
      return absl::InvalidArgumentError(absl::StrCat(
          dirs[i], " holds ", embedding::CheckpointName(manifests[i].model, manifests[i].step),
          ", ", dirs[0], " holds ", embedding::CheckpointName(m.model, m.step),
          ": one checkpoint is read from every shard"));
    }
  }
  return m;
}

absl::Status DurableCollection::ExportCheckpointRows(
    const std::vector<std::string>& dirs, absl::string_view table,
    const embedding::ExportOptions& options, v1::TableConfig* config,
    const std::function<absl::Status(const embedding::RowBlock&)>& sink) const {
  TESSERA_ASSIGN_OR_RETURN(const CheckpointManifest m, ManifestOfDirs(dirs));
  const std::string which = embedding::CheckpointName(m.model, m.step);
  if (std::find(m.tables.begin(), m.tables.end(), table) == m.tables.end()) {
    return absl::NotFoundError(absl::StrCat(which, " holds no table '", table, "'"));
  }
  const int sources = static_cast<int>(dirs.size());
  int here = 0, shards = 1;
  {
    absl::MutexLock lock(&mu_);  // the place changes under it
    here = options_.cluster_shard_index;
    shards = options_.cluster_num_shards;
  }
  bool found = false;
  for (int k = 0; k < sources; ++k) {
    // On the same shard count a shard owns what it owned then: its own directory alone.
    if (sources == shards && k != here) continue;
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<KvStore> source,
                             OpenCheckpointStore(options_.open_store, dirs[k]));
    TESSERA_ASSIGN_OR_RETURN(auto catalog, ReadCatalog(*source));
    auto it = std::find_if(catalog.begin(), catalog.end(),
                           [&](const auto& entry) { return entry.second.name() == table; });
    if (it == catalog.end()) continue;  // no row of it there
    const v1::TableConfig& c = it->second;
    if (!found) *config = c;
    found = true;
    embedding::RowBlock block;
    block.dim = c.dim();
    const int state_floats =
        embedding::row_math::StateFloatsOf(embedding::KindOf(c.optimizer().type()), c.dim());
    block.state_floats = options.with_state ? state_floats : 0;
    DecodedRow row;
    TESSERA_RETURN_IF_ERROR(Annotate(
        source->Scan(
            RowPrefix(it->first),
            [&](absl::string_view key, absl::string_view value) -> absl::Status {
              uint32_t table_id = 0;
              int64_t id = 0;
              if (!ParseRowKey(key, &table_id, &id) || table_id != it->first) {
                return absl::DataLossError(absl::StrCat("table '", table, "': malformed row key"));
              }
              if (embedding::ShardOfRow(c, id, shards) != here ||
                  embedding::ShardOfRow(c, id, sources) != k) {
                return absl::OkStatus();
              }
              TESSERA_RETURN_IF_ERROR(DecodeRow(table, id, value, c.dim(), state_floats, &row));
              if (row.meta.last_step < options.since_step) return absl::OkStatus();
              block.Append(id, row.weights.data(), row.state.data(), row.meta.last_step,
                           row.meta.update_count);
              if (block.size() < options.chunk_rows) return absl::OkStatus();
              TESSERA_RETURN_IF_ERROR(sink(block));
              block.Clear();
              return absl::OkStatus();
            }),
        absl::StrCat(which, " in ", dirs[k])));
    if (block.size() > 0) TESSERA_RETURN_IF_ERROR(sink(block));
  }
  if (!found) {
    return absl::NotFoundError(absl::StrCat(which, " in ", dirs[sources == shards ? here : 0],
                                            " holds no table '", table, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<embedding::CheckpointInfo> DurableCollection::RestoreFromShards(
    const std::vector<std::string>& dirs, embedding::Attachments* attachments,
    const embedding::RestoreOptions& options) {
  const auto start = Clock::now();
  TESSERA_ASSIGN_OR_RETURN(const CheckpointManifest m, ManifestOfDirs(dirs));
  if (options.model != m.model) {
    return absl::InvalidArgumentError(
        absl::StrCat("the directories hold ", embedding::CheckpointName(m.model, m.step),
                     "; the restore names model '", options.model, "'"));
  }
  embedding::Attachments blobs;
  TESSERA_RETURN_IF_ERROR(ReadAttachments(dirs[0], m, &blobs));
  TESSERA_RETURN_IF_ERROR(embedding::CheckRestorable(m.step, blobs, options));
  absl::MutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(Usable());
  TESSERA_RETURN_IF_ERROR(
      ReadAndApplyModel(dirs, m, /*resharded=*/true, options.verify_only,
                        absl::StrCat("restore from ", dirs.size(), " shards' checkpoints")));
  if (options.verify_only) return InfoOf(m);
  if (attachments != nullptr) *attachments = std::move(blobs);
  embedding::CheckpointInfo info = InfoOf(m);
  info.seconds = SecondsSince(start);
  Log(absl::StrCat("tessera: restored ", embedding::CheckpointName(m.model, m.step), " from ",
                   dirs.size(), " shards' checkpoints in ", absl::StrFormat("%.2f", info.seconds),
                   " s"));
  return info;
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
    TESSERA_RETURN_IF_ERROR(ReadAndApplyModel({dir}, chosen->second, /*resharded=*/false,
                                              options.verify_only,
                                              absl::StrCat("restore of ", dir)));
    if (options.verify_only) return InfoOf(chosen->second);
  } else {
    if (absl::Status read = VerifyStore(dir); !read.ok()) {
      return Unreadable(chosen->second, dir, read);
    }
    if (options.verify_only) return InfoOf(chosen->second);
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
    // The restored checkpoint is the state now, whatever was interrupted before. What
    // cannot be removed is only disk space: say so and go on.
    for (const std::string& stale : {live + ".old", InProgressPath(), RestoringPath()}) {
      const absl::Status removed = RemoveTree(stale);
      if (!removed.ok()) {
        std::fprintf(stderr, "tessera: restore of %s left %s behind: %s\n", dir.c_str(),
                     stale.c_str(), removed.ToString().c_str());
      }
    }
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
