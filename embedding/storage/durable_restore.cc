// DurableCollection's restores: a model's tables replaced by a checkpoint's, and recovery
// of an interrupted restore.

#include "embedding/storage/durable_collection.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status.h"
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
