#ifndef TESSERA_EMBEDDING_SHARD_TABLES_H_
#define TESSERA_EMBEDDING_SHARD_TABLES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "embedding/collection.h"

namespace tessera::embedding {

// What a shard server asks of the tables it holds beyond EmbeddingCollection: pushes on
// durable record (exactly once across restarts), a value of the server's own kept with the
// rows, and a live reshard's moves of rows between places in the shard map. The
// in-process and the durable collections are ShardTables; a client or a device table is
// not, and so has none of these calls.
class ShardTables : public EmbeddingCollection {
 public:
  // True when PushBatch applies a batch whole or not at all: every part is checked before
  // any applies, and once one applies they all do (a failure after that comes as
  // PartlyApplied, its rows not to be applied again), and it fills options.rows_updated. A
  // server that journals a request's parts (server/push_journal.h) may then hand it the
  // batch in one call.
  virtual bool AppliesBatchWhole() const { return false; }

  // PushGradients, recording `tag` as applied: collections that make a table's pushes
  // durable before they return (WRITE_THROUGH) store the tag in the same write as the
  // rows, so RecordedPush() still knows it after a restart. The default records nothing.
  virtual absl::Status PushGradientsRecorded(absl::string_view table, absl::Span<const int64_t> ids,
                                             absl::Span<const float> gradients, int64_t step,
                                             const PushTag& tag);
  // The rows updated by push part `tag` when it is on durable record, nullopt otherwise.
  virtual std::optional<int64_t> RecordedPush(const PushTag& tag) const;
  // Every push part on durable record (none by default).
  virtual std::vector<RecordedPart> RecordedPushes() const { return {}; }

  // A value of the server's own (`key`: letters, digits, '_') kept with the rows, so that
  // it is there again when a durable collection reopens its store; written and synced
  // before it returns. The default keeps nothing: its rows do not outlive the process.
  virtual absl::Status KeepServerState(absl::string_view /*key*/, absl::string_view /*value*/) {
    return absl::OkStatus();
  }
  // The value last kept under `key` ("" when none).
  virtual absl::StatusOr<std::string> ServerState(absl::string_view /*key*/) const {
    return std::string();
  }

  // Makes this collection shard `shard_index` of `num_shards` of its cluster from now on (a
  // live reshard moved the rows it gains here already): SwitchPlace, unless done, then the
  // rows it no longer owns (ShardOfRow) are forgotten, in memory and on disk (nothing to
  // forget when it holds none), and a durable collection writes every dirty row, so that
  // rows moved here survive a restart (and the rows it kept come back as of the same
  // moment).
  virtual absl::Status Repartition(int shard_index, int num_shards) = 0;

  // A live reshard's rows for this collection's place in the next shard map (shard
  // `shard_index` of `num_shards`), while it serves its current place. A table laid out by
  // place (a fixed vocabulary: arrays of its part's ids) takes them into a second layout,
  // for that place, that SwitchPlace adopts: every row it is to hold there comes this way,
  // those it keeps too. Other tables take them as ImportRows does. A durable collection
  // writes through the rows of ids its current place does not own (its current layout
  // writes the others). Errors as ImportRows's.
  virtual absl::Status ImportMovingRows(absl::string_view table, const RowBlock& rows,
                                        int shard_index, int num_shards) = 0;
  // Serves shard `shard_index` of `num_shards` from now on, without copying a row: tables
  // laid out by place swap in the layout ImportMovingRows filled for it (an empty one where
  // no row came) and drop the old one; other tables keep their rows until Repartition. A
  // reshard calls it while requests wait. Nothing changes on an error (a layout that cannot
  // be made: ResourceExhausted).
  virtual absl::Status SwitchPlace(int shard_index, int num_shards) = 0;
  // Gives up what ImportMovingRows brought for another place (an aborted reshard): the
  // layouts kept for it, and the rows of other tables whose ids the current place does not
  // own (in memory and on disk), so that no stale copy of a row stays on a shard that does
  // not own it (a later reshard would move it on, a checkpoint would keep it).
  virtual absl::Status DropMovingRows() = 0;

  // Gives `table` the row budget `max_rows` (0: none) from now on, its config (and a durable
  // collection's catalog) saying so: a reshard lifts a table's budget while rows move and
  // splits it anew after (EmbeddingTable::SetRowBudget: a table with eviction evicts down
  // to it). NotFound for an unknown table, FailedPrecondition for a fixed vocabulary.
  virtual absl::Status SetRowBudget(absl::string_view table, int64_t max_rows) = 0;
};

}  // namespace tessera::embedding

#endif  // TESSERA_EMBEDDING_SHARD_TABLES_H_
