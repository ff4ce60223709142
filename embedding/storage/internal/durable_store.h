#ifndef TESSERA_EMBEDDING_STORAGE_INTERNAL_DURABLE_STORE_H_
#define TESSERA_EMBEDDING_STORAGE_INTERNAL_DURABLE_STORE_H_

// What storage::DurableCollection's files share: its stores' catalog, copies and erasures
// of a table's rows, checkpoint stores opened for reading, and the clock of its progress
// lines.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "embedding/collection.h"
#include "embedding/storage/checkpoint_manifest.h"
#include "embedding/storage/kv_store.h"
#include "tessera/v1/config.pb.h"

namespace tessera::storage_internal {

using Clock = std::chrono::steady_clock;

inline constexpr int64_t kRowsPerBatch = 1 << 16;    // rows per store write while flushing
inline constexpr int64_t kProgressRows = 1'000'000;  // a progress line every this many rows
inline constexpr absl::string_view kManifest = "MANIFEST";

int64_t NowUnixMs();
double SecondsSince(Clock::time_point start);

// A checkpoint's manifest as the collection reports it.
embedding::CheckpointInfo InfoOf(const storage::CheckpointManifest& m);

// The catalog of `store`: (table id, config) of every table.
absl::StatusOr<std::vector<std::pair<uint32_t, v1::TableConfig>>> ReadCatalog(
    const storage::KvStore& store);

// Appends puts of every row of table `from_id` in `source` under table id `to_id`.
absl::Status CopyRows(const storage::KvStore& source, uint32_t from_id, uint32_t to_id,
                      std::vector<storage::KvWrite>* writes,
                      const std::function<bool(int64_t id)>& keep = nullptr);

// Appends deletes of every key under `prefix`.
absl::Status EraseAll(const storage::KvStore& store, const std::string& prefix,
                      std::vector<storage::KvWrite>* writes);

// Opens the store of a checkpoint for reading, leaving its files as they are.
absl::StatusOr<std::unique_ptr<storage::KvStore>> OpenCheckpointStore(
    const storage::KvStoreFactory& open, const std::string& dir);

}  // namespace tessera::storage_internal

#endif  // TESSERA_EMBEDDING_STORAGE_INTERNAL_DURABLE_STORE_H_
