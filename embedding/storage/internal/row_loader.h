#ifndef TESSERA_EMBEDDING_STORAGE_INTERNAL_ROW_LOADER_H_
#define TESSERA_EMBEDDING_STORAGE_INTERNAL_ROW_LOADER_H_

// Loads a table's stored rows into its in-memory shards on all cores: the calling thread
// scans the store (RocksDB iterates in key order on one thread) and hands batches of raw
// rows to worker threads, which check and decode them and insert them a stripe at a time
// (EmbeddingTable::PutRows).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "embedding/embedding_table.h"
#include "embedding/storage/kv_store.h"

namespace tessera::storage_internal {

using storage::KvStore;

struct RowLoad {
  std::string table;      // the table's name, for errors
  uint32_t table_id = 0;  // its id in the store's keys
  // The cluster's shard count above these shards (rows are routed by
  // embedding::ShardOfRow of the shards' table config).
  int cluster_num_shards = 1;
  // This collection's place in the cluster: rows that it does not own (left by a reshard
  // that stopped before its commit) are not loaded.
  int cluster_shard_index = 0;
  int threads = 0;        // workers; 0 = one per core
  // Called on the scanning thread after every `progress_every` rows handed out.
  std::function<void(int64_t rows)> progress;
  int64_t progress_every = 1'000'000;
};

// Loads every row of table `load.table_id` in `store` into `shards` (one table per
// shard, ShardOfRow order). Returns the first error of any thread (a corrupt row names the
// table and row, an unreadable store says after which row) and then stops; rows loaded
// before it stay. `*loaded` counts the rows stored, `*outside` those skipped as another
// place's.
absl::Status LoadRowsInParallel(
    const KvStore& store, const RowLoad& load,
    const std::vector<std::unique_ptr<embedding::EmbeddingTable>>& shards, int64_t* loaded,
    int64_t* outside);

}  // namespace tessera::storage_internal

#endif  // TESSERA_EMBEDDING_STORAGE_INTERNAL_ROW_LOADER_H_
