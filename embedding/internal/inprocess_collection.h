#ifndef TESSERA_EMBEDDING_INTERNAL_INPROCESS_COLLECTION_H_
#define TESSERA_EMBEDDING_INTERNAL_INPROCESS_COLLECTION_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "embedding/collection.h"
#include "embedding/embedding_table.h"
#include "embedding/inprocess_collection.h"
#include "embedding/memory_budget.h"

namespace tessera::embedding_internal {

// embedding::InProcessCollection's implementation (see embedding/inprocess_collection.h).
class InProcessCollectionImpl final : public embedding::InProcessCollection {
 public:
  InProcessCollectionImpl(int num_shards, std::shared_ptr<base::ThreadPool> pool,
                          int64_t memory_limit, int cluster_index = 0, int cluster_shards = 1)
      : num_shards_(num_shards),
        cluster_index_(cluster_index),
        cluster_shards_(cluster_shards),
        pool_(std::move(pool)),
        memory_(memory_limit > 0 ? std::make_unique<embedding::MemoryBudget>(memory_limit)
                                 : nullptr) {}

  absl::Status CreateTable(const v1::TableConfig& config) override;
  absl::StatusOr<std::vector<v1::TableConfig>> ListTables() const override;
  absl::Status Lookup(absl::string_view table, absl::Span<const int64_t> ids, absl::Span<float> out,
                      const embedding::LookupOptions& options) override;
  absl::Status PooledLookup(absl::string_view table, absl::Span<const int64_t> ids,
                            absl::Span<const int32_t> offsets, absl::Span<const float> weights,
                            v1::Pooling pooling, absl::Span<float> out,
                            const embedding::LookupOptions& options) override;
  // Each part's shape checked once, then the parts gathered in parallel (the base class
  // checks each again in PooledLookup, one after another).
  absl::Status LookupBatch(absl::Span<const embedding::TableBags> tables,
                           const embedding::LookupOptions& options) override;
  // Every part summed and checked, and every shard's room for its new rows checked, before
  // any part applies (without the base class's ListTables); the parts in parallel.
  absl::Status PushBatch(absl::Span<const embedding::TableGradients> tables, int64_t step,
                         const embedding::PushOptions& options = {}) override;
  bool AppliesBatchWhole() const override { return true; }
  absl::Status PushGradients(absl::string_view table, absl::Span<const int64_t> ids,
                             absl::Span<const float> gradients, int64_t step) override;
  absl::Status PushSummed(absl::string_view table, const embedding::SummedGradients& gradients,
                          int64_t step) override;
  absl::StatusOr<embedding::TableUsage> Usage(absl::string_view table) const override;
  absl::Status DropTable(absl::string_view table) override;
  absl::StatusOr<v1::TableConfig> AlterTable(absl::string_view table,
                                             const v1::OptimizerConfig& changes) override;
  absl::Status ExportRows(absl::string_view table, const embedding::ExportOptions& options,
                          const std::function<absl::Status(const embedding::RowBlock&)>& sink)
      override;
  // Imported rows are marked dirty: a durable collection's next checkpoint writes them.
  absl::Status ImportRows(absl::string_view table, const embedding::RowBlock& rows) override;
  int num_shards() const override { return num_shards_; }
  absl::Status Repartition(int shard_index, int num_shards) override;
  // Fixed-vocabulary tables take moving rows into layouts for the next place (moving_).
  absl::Status ImportMovingRows(absl::string_view table, const embedding::RowBlock& rows,
                                int shard_index, int num_shards) override;
  absl::Status SwitchPlace(int shard_index, int num_shards) override;
  absl::Status DropMovingRows() override;
  absl::Status SetRowBudget(absl::string_view table, int64_t max_rows) override;

  const std::vector<std::unique_ptr<embedding::EmbeddingTable>>* ShardsOf(
      absl::string_view table) const override;
  const std::vector<std::unique_ptr<embedding::EmbeddingTable>>* MovingShardsOf(
      absl::string_view table) const override;

 private:
  struct ShardedTable {
    v1::TableConfig config;
    std::vector<std::unique_ptr<embedding::EmbeddingTable>> shards;
    // The cluster's shard count its layout is for: a fixed vocabulary's ids route to
    // shards by it (ShardOfRow's `outer`).
    int outer = 1;
  };

  // Shared: a call that found a table keeps it alive while a DropTable removes it.
  using TablePtr = std::shared_ptr<ShardedTable>;
  absl::StatusOr<TablePtr> Find(absl::string_view table) const;
  // The shard tables of `config` laid out for cluster shard `index` of `count`, their
  // memory counted against the budget (ResourceExhausted when it has no room).
  absl::StatusOr<TablePtr> MakeTable(const v1::TableConfig& config, int index, int count) const;
  static absl::Status CheckPlace(int shard_index, int num_shards);
  // Stores `rows` in `t` exactly as given (ImportRows).
  absl::Status ImportInto(const ShardedTable& t, const embedding::RowBlock& rows);
  // A push's summed gradients for one table, grouped by shard (with one shard, as summed).
  struct RoutedPush {
    std::vector<int32_t> shard_begin;  // (num_shards + 1): each shard's range below
    std::vector<int64_t> ids;          // the summed ids grouped by shard
    std::vector<float> rows;           // their gradient rows
  };
  // One part of a PushBatch: its table, and its gradients summed, checked and routed, or
  // (planned) checked in the order of the lookup's plan.
  struct PushPart {
    TablePtr table;
    bool planned = false;
    embedding::SummedGradients summed;
    RoutedPush routed;
  };
  // True when `part` carries a plan this collection made for its table's seed and shards,
  // its ids the plan's own and as the lookup left them.
  bool PlannedHere(const ShardedTable& t, const embedding::TableGradients& part) const;
  // With a memory budget shared by the shards, the rows a whole checked batch would create
  // must fit in it together (each shard checked only its own).
  absl::Status CheckBatchMemory(absl::Span<const embedding::TableGradients> tables,
                                absl::Span<const PushPart> parts) const;
  // How many of `ids` (distinct, grouped by shard as shard_begin says) have no row.
  int64_t MissingByShard(const ShardedTable& t, absl::Span<const int32_t> shard_begin,
                         absl::Span<const int64_t> ids) const;
  // A planned part's checks: ids x dim finite gradients (unless `given` checked), and every
  // shard's room.
  absl::Status CheckPlanned(const ShardedTable& t, const embedding::TableGradients& part,
                            embedding::Gradients given);
  // Applies a planned part's gradients shard by shard, straight from the caller's buffer.
  absl::Status ApplyPlanned(ShardedTable& t, const embedding::IdPlan& plan,
                            absl::Span<const float> gradients, int64_t step);
  // Groups `g` by shard into `out` and checks every shard's room for its new rows.
  // Changes no row.
  absl::Status RouteSummed(const ShardedTable& t, const embedding::SummedGradients& g,
                           RoutedPush* out);
  // Every shard's room for its range of `ids` (grouped by shard as shard_begin says).
  absl::Status CheckRoomByShard(const ShardedTable& t, absl::Span<const int32_t> shard_begin,
                                absl::Span<const int64_t> ids) const;
  // Applies `rows` of `ids` (grouped by shard) shard by shard, each shard's part all or
  // nothing; a shard that kept some rows does not stop the others.
  absl::Status ApplyByShard(ShardedTable& t, absl::Span<const int32_t> shard_begin,
                            absl::Span<const int64_t> ids, const float* rows, int64_t step);
  // Applies routed gradients shard by shard (each shard's part all or nothing).
  absl::Status ApplyRouted(ShardedTable& t, const embedding::SummedGradients& g,
                           const RoutedPush& routed, int64_t step);
  // A lookup whose shape the caller checked: gathers the part's rows, pooled into its
  // bags when it has offsets.
  absl::Status LookupChecked(ShardedTable& t, const embedding::TableBags& part,
                             const embedding::LookupOptions& options);
  // Deduplicates `ids` and groups the distinct ones by shard into *plan.
  void PlanIds(const ShardedTable& t, absl::Span<const int64_t> ids,
               embedding::IdPlan* plan) const;
  // Gathers the rows of plan.unique_ids into `rows` (unique, dim), each shard its range.
  absl::Status GatherPlanned(ShardedTable& t, const embedding::IdPlan& plan, float* rows,
                             bool insert_missing);

  // ResourceExhausted when what table `t` takes from creation (a fixed vocabulary's
  // arrays, an admission sketch) does not fit the memory budget (before it counts it).
  absl::Status CheckReservedMemory(const ShardedTable& t) const;
  // Forgets the rows of dynamic tables that the current place does not own, when
  // unsettled_ says some may be here.
  void ForgetStrays();
  const int num_shards_;
  // InProcessOptions::cluster_shard_index and cluster_num_shards (Repartition changes them).
  std::atomic<int> cluster_index_;
  std::atomic<int> cluster_shards_;
  const std::shared_ptr<base::ThreadPool> pool_;
  // Every table's rows count against it (none: no budget). Declared before the tables,
  // so that it outlives them.
  const std::unique_ptr<embedding::MemoryBudget> memory_;
  mutable absl::Mutex mu_;
  std::map<std::string, TablePtr, std::less<>> tables_ ABSL_GUARDED_BY(mu_);
  // Fixed-vocabulary tables laid out for shard moving_index_ of moving_count_, filled by
  // ImportMovingRows while a reshard copies (SwitchPlace adopts them).
  std::map<std::string, TablePtr, std::less<>> moving_ ABSL_GUARDED_BY(mu_);
  int moving_index_ ABSL_GUARDED_BY(mu_) = -1;
  int moving_count_ ABSL_GUARDED_BY(mu_) = 0;
  // Rows of dynamic tables that the current place does not own may be here: SwitchPlace
  // changed the place (and Repartition has not forgotten the old place's rows yet), or a
  // reshard's ImportMovingRows brought rows of the next place (DropMovingRows forgets them
  // when the reshard is given up).
  std::atomic<bool> unsettled_{false};
};

}  // namespace tessera::embedding_internal

#endif  // TESSERA_EMBEDDING_INTERNAL_INPROCESS_COLLECTION_H_
