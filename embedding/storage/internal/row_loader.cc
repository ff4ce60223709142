#include "embedding/storage/internal/row_loader.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "embedding/embedding_table.h"
#include "embedding/storage/row_codec.h"

namespace tessera::storage_internal {

using storage::KvStore;
using storage::DecodeRowInto;
using storage::ParseRowKey;
using storage::RowPrefix;
namespace {

constexpr size_t kBatchRows = 4096;
// Bytes of a stored row besides its floats: key, value header, checksum.
constexpr int64_t kStoredRowOverhead = 13 + 28 + 4;

// Raw rows as scanned: ids and the values' bytes back to back.
struct RawBatch {
  std::vector<int64_t> ids;
  std::vector<uint32_t> ends;  // (ids) end of each value in `bytes`
  std::string bytes;
};

// A bounded queue of batches between the scanner and the workers.
class BatchQueue {
 public:
  explicit BatchQueue(size_t capacity) : capacity_(capacity) {}

  // False (the batch dropped) once the queue was stopped.
  bool Push(RawBatch batch) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &BatchQueue::HasRoom));
    if (stopped_) return false;
    batches_.push_back(std::move(batch));
    return true;
  }
  // False when the queue is closed and empty, or stopped.
  bool Pop(RawBatch* batch) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &BatchQueue::HasWork));
    if (stopped_ || batches_.empty()) return false;
    *batch = std::move(batches_.front());
    batches_.pop_front();
    return true;
  }
  // No more batches: workers finish what is queued.
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  // Something failed: everyone stops now.
  void Stop() {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }

 private:
  bool HasRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopped_ || batches_.size() < capacity_;
  }
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopped_ || closed_ || !batches_.empty();
  }

  absl::Mutex mu_;
  const size_t capacity_;
  std::deque<RawBatch> batches_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

// The first error of any thread.
class FirstError {
 public:
  void Set(absl::Status status) {
    absl::MutexLock lock(&mu_);
    if (status_.ok()) status_ = std::move(status);
  }
  absl::Status Get() {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// Decodes a batch and stores it, shard by shard. Per-thread buffers.
absl::Status StoreBatch(const RawBatch& batch, const RowLoad& load,
                        const std::vector<std::unique_ptr<embedding::EmbeddingTable>>& shards) {
  const int dim = shards[0]->dim();
  const int sf = shards[0]->optimizer().StateFloats();
  const int n_shards = static_cast<int>(shards.size());
  const v1::TableConfig& config = shards[0]->config();
  struct ShardRows {
    std::vector<int64_t> ids;
    std::vector<float> weights, state;
    std::vector<embedding::RowMeta> metas;
  };
  thread_local std::vector<ShardRows> by_shard;
  by_shard.resize(n_shards);
  for (ShardRows& r : by_shard) {
    r.ids.clear();
    r.weights.clear();
    r.state.clear();
    r.metas.clear();
  }
  uint32_t begin = 0;
  for (size_t i = 0; i < batch.ids.size(); ++i) {
    const int64_t id = batch.ids[i];
    const absl::string_view value(batch.bytes.data() + begin, batch.ends[i] - begin);
    begin = batch.ends[i];
    ShardRows& r = by_shard[n_shards == 1 ? 0
                                          : embedding::ShardOfRow(config, id, n_shards,
                                                                  load.cluster_num_shards)];
    r.ids.push_back(id);
    r.weights.resize(r.weights.size() + dim);
    r.state.resize(r.state.size() + sf);
    r.metas.emplace_back();
    TESSERA_RETURN_IF_ERROR(DecodeRowInto(load.table, id, value, dim, sf,
                                          r.weights.data() + r.weights.size() - dim,
                                          r.state.data() + r.state.size() - sf, &r.metas.back()));
  }
  for (int k = 0; k < n_shards; ++k) {
    const ShardRows& r = by_shard[k];
    if (r.ids.empty()) continue;
    TESSERA_RETURN_IF_ERROR(Annotate(
        shards[k]->PutRows(r.ids, r.weights.data(), r.state.data(), r.metas), "loading from disk"));
  }
  return absl::OkStatus();
}

// Sizes the id maps once for the rows the store holds, instead of doubling them (and
// faulting in and filling each new map) over and over while they arrive.
absl::Status ReserveStoredRows(
    const KvStore& store, const RowLoad& load,
    const std::vector<std::unique_ptr<embedding::EmbeddingTable>>& shards) {
  const int dim = shards[0]->dim();
  const int64_t row_bytes =
      kStoredRowOverhead + 4 * (static_cast<int64_t>(dim) + shards[0]->optimizer().StateFloats());
  const int64_t expected = store.ApproximateBytesOf(RowPrefix(load.table_id)) / row_bytes;
  if (expected <= 0) return absl::OkStatus();
  for (const auto& shard : shards) {
    TESSERA_RETURN_IF_ERROR(shard->Reserve(expected / static_cast<int64_t>(shards.size())));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LoadRowsInParallel(
    const KvStore& store, const RowLoad& load,
    const std::vector<std::unique_ptr<embedding::EmbeddingTable>>& shards, int64_t* loaded,
    int64_t* outside) {
  const int threads = load.threads > 0
                          ? load.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  TESSERA_RETURN_IF_ERROR(ReserveStoredRows(store, load, shards));
  BatchQueue queue(2 * static_cast<size_t>(threads));
  FirstError error;
  std::atomic<int64_t> stored{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w) {
    workers.emplace_back([&] {
      RawBatch batch;
      while (queue.Pop(&batch)) {
        absl::Status s = StoreBatch(batch, load, shards);
        if (!s.ok()) {
          error.Set(std::move(s));
          queue.Stop();
          return;
        }
        stored.fetch_add(static_cast<int64_t>(batch.ids.size()), std::memory_order_relaxed);
      }
    });
  }
  const v1::TableConfig& config = shards[0]->config();
  *outside = 0;
  RawBatch batch;
  int64_t scanned = 0;
  int64_t last_id = 0;
  absl::Status scan =
      store.Scan(RowPrefix(load.table_id), [&](absl::string_view key, absl::string_view value) {
        uint32_t table_id = 0;
        int64_t id = 0;
        if (!ParseRowKey(key, &table_id, &id) || table_id != load.table_id) {
          return absl::DataLossError(
              absl::StrCat("table '", load.table, "': malformed row key in the store"));
        }
        if (++scanned % load.progress_every == 0 && load.progress) load.progress(scanned);
        if (embedding::ShardOfRow(config, id, load.cluster_num_shards) !=
            load.cluster_shard_index) {
          ++*outside;
          return absl::OkStatus();
        }
        batch.ids.push_back(id);
        batch.bytes.append(value.data(), value.size());
        batch.ends.push_back(static_cast<uint32_t>(batch.bytes.size()));
        last_id = id;
        if (batch.ids.size() == kBatchRows) {
          if (!queue.Push(std::move(batch))) return absl::CancelledError("a worker failed");
          batch = RawBatch();
        }
        return absl::OkStatus();
      });
  if (scan.ok() && !batch.ids.empty()) queue.Push(std::move(batch));
  if (scan.ok()) {
    queue.Close();
  } else {
    queue.Stop();
  }
  for (std::thread& t : workers) t.join();
  *loaded = stored.load();
  // A worker's error first: it is why the scan stopped.
  TESSERA_RETURN_IF_ERROR(error.Get());
  if (!scan.ok() && !absl::StartsWith(scan.message(), "table '")) {
    // The store's own checks (block checksums) fail below the row level: say where.
    return absl::Status(scan.code(), absl::StrCat("table '", load.table, "': stored rows ",
                                                  scanned > 0 ? absl::StrCat("after row ", last_id)
                                                              : std::string("from the first"),
                                                  " are unreadable: ", scan.message()));
  }
  return scan;
}

}  // namespace tessera::storage_internal
