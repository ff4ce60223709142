#ifndef TESSERA_EMBEDDING_INPROCESS_COLLECTION_H_
#define TESSERA_EMBEDDING_INPROCESS_COLLECTION_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/thread_pool.h"
#include "embedding/batch_ops.h"
#include "embedding/collection.h"
#include "embedding/embedding_table.h"
#include "embedding/shard_tables.h"

namespace tessera::embedding {

// An EmbeddingCollection whose shards live in this process (no network): a request is
// deduplicated once, split by ShardOf() into per-shard id lists, served by each shard's
// EmbeddingTable and merged back in the caller's order. Pooling happens after the merge,
// over the unique rows in batch order, so results are bit-identical whatever the shard
// count. A batch's tables are served on a pool of threads, each table's work on one of
// them. Thread-safe.
//
// A collection that builds on it (storage::DurableCollection keeps every row in one and
// writes changed rows through to disk) reaches its shard tables through ShardsOf.
class InProcessCollection : public ShardTables {
 public:
  // The shard tables of `table`, one per shard in shard order; null when the table is
  // unknown. Valid until the table is dropped: callers that drop tables concurrently must
  // hold their own lock around both.
  virtual const std::vector<std::unique_ptr<EmbeddingTable>>* ShardsOf(
      absl::string_view table) const = 0;
  // The shard tables that ImportMovingRows filled for `table`'s next place (a
  // fixed-vocabulary table during a reshard); null when it has none. Valid as ShardsOf's.
  virtual const std::vector<std::unique_ptr<EmbeddingTable>>* MovingShardsOf(
      absl::string_view table) const = 0;

  // Applies gradients already summed and checked (SumGradients) to `table`, as PushGradients
  // would: for a caller that needed them summed first (a write-through table snapshots the
  // rows they touch). NotFound for an unknown table.
  virtual absl::Status PushSummed(absl::string_view table, const SummedGradients& gradients,
                                  int64_t step) = 0;
};

struct InProcessOptions {
  int num_shards = 1;  // in [1, 4096]
  // Threads that serve a batch's tables in parallel (LookupBatch, PushBatch; a table's
  // work stays on one thread, so results do not depend on the count). 0 = the CPUs this
  // process may run on (base::AvailableCpus). Unused when `pool` is set.
  int threads = 0;
  // A pool shared with the caller (the trainer runs its own per-table work on it).
  std::shared_ptr<base::ThreadPool> pool;
  // Bytes every table's rows may take together (embedding/memory_budget.h): past it a new
  // row is refused, or evicts one in a table with eviction. 0 = DefaultMemoryBudget() (the
  // process's cgroup limit, else 90% of physical memory, less what serving needs);
  // negative = no budget.
  int64_t memory_limit = 0;
  // The place of this collection in a cluster: shard `cluster_shard_index` of
  // `cluster_num_shards` (a shard server's tables). Fixed-vocabulary tables hold that
  // shard's ids (every cluster_num_shards-th) densely; other tables do not depend on it.
  int cluster_shard_index = 0;
  int cluster_num_shards = 1;
};

// A collection of options.num_shards shards in this process. InvalidArgument for a shard
// count outside [1, 4096] or a bad thread count.
absl::StatusOr<std::unique_ptr<InProcessCollection>> NewInProcessCollection(
    const InProcessOptions& options);
// The same with `num_shards` shards and a thread per CPU.
absl::StatusOr<std::unique_ptr<InProcessCollection>> NewInProcessCollection(int num_shards);

}  // namespace tessera::embedding

#endif  // TESSERA_EMBEDDING_INPROCESS_COLLECTION_H_
