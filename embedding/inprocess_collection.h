#ifndef TESSERA_EMBEDDING_INPROCESS_COLLECTION_H_
#define TESSERA_EMBEDDING_INPROCESS_COLLECTION_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "embedding/batch_ops.h"
#include "embedding/collection.h"
#include "embedding/embedding_table.h"

namespace tessera::embedding {

// An EmbeddingCollection whose shards live in this process (no network): a request is
// deduplicated once, split by ShardOf() into per-shard id lists, served by each shard's
// EmbeddingTable and merged back in the caller's order. Pooling happens after the merge,
// over the unique rows in batch order, so results are bit-identical whatever the shard
// count. Thread-safe.
//
// A collection that builds on it (storage::DurableCollection keeps every row in one and
// writes changed rows through to disk) reaches its shard tables through ShardsOf.
class InProcessCollection : public EmbeddingCollection {
 public:
  // The shard tables of `table`, one per shard in shard order; null when the table is
  // unknown. Valid until the table is dropped: callers that drop tables concurrently must
  // hold their own lock around both.
  virtual const std::vector<std::unique_ptr<EmbeddingTable>>* ShardsOf(
      absl::string_view table) const = 0;

  // Applies gradients already summed and checked (SumGradients) to `table`, as PushGradients
  // would: for a caller that needed them summed first (a write-through table snapshots the
  // rows they touch). NotFound for an unknown table.
  virtual absl::Status PushSummed(absl::string_view table, const SummedGradients& gradients,
                                  int64_t step) = 0;
};

// A collection of `num_shards` shards in this process. InvalidArgument outside [1, 4096].
absl::StatusOr<std::unique_ptr<InProcessCollection>> NewInProcessCollection(int num_shards);

}  // namespace tessera::embedding

#endif  // TESSERA_EMBEDDING_INPROCESS_COLLECTION_H_
