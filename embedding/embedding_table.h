#ifndef TESSERA_EMBEDDING_EMBEDDING_TABLE_H_
#define TESSERA_EMBEDDING_EMBEDDING_TABLE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "embedding/memory_budget.h"
#include "embedding/optimizer.h"
#include "embedding/row_meta.h"
#include "embedding/sharding.h"
#include "embedding/table_config.h"
#include "tessera/v1/config.pb.h"

namespace tessera::embedding_internal {
class AdmissionFilter;
class FixedRows;
class ReaderEpochs;
class RowInitializer;
class RowStore;
class Stripe;
struct StripePlan;
// The writer lock of `stripe` (Stripe::mu), named where Stripe is not defined so that the
// table's *Locked functions can require it (clang's -Wthread-safety checks the callers).
absl::Mutex& StripeMutex(Stripe& stripe);
}  // namespace tessera::embedding_internal

namespace tessera::embedding {

// A copy of one stored row.
struct RowSnapshot {
  std::vector<float> weights;  // (dim)
  std::vector<float> state;    // (optimizer StateFloats())
  RowMeta meta;
};

// Where a table's evicted rows go and come back from (a durable collection's store).
// Called with the row's stripe lock held: implementations must not call into the table.
class RowSpill {
 public:
  virtual ~RowSpill() = default;
  // Keeps evicted row `id`; `dirty`: changed since it was last stored. On error the row
  // stays in memory and the call that needed room fails with that error.
  virtual absl::Status Evict(int64_t id, const float* weights, const float* state,
                             const RowMeta& meta, bool dirty) = 0;
  // A row that is not in memory: true with (dim) weights, (StateFloats()) state and meta
  // filled when one is kept, and `dirty` when it must be stored again at the next
  // checkpoint; false when there is none.
  virtual absl::StatusOr<bool> Fetch(int64_t id, float* weights, float* state, RowMeta* meta,
                                     bool* dirty) = 0;
  // Row `id` expired (TTL): forget any kept copy.
  virtual void Drop(int64_t id) = 0;
};

// One embedding table (or one shard's part of it): a dynamic vocabulary over arbitrary
// 64-bit ids. A row is created on first touch with weights that are a pure function of
// (table seed, id), so the same id gets the same row whatever the shard, the request
// order or the process. Ids never collide: the id->row map stores a one-to-one hash of
// the full id.
//
// Storage at the rows' payload size (embedding/internal/row_store.h): weights (dim, in
// the config's dtype, unpadded) in one array; optimizer state (fp32) and 8 bytes of meta
// in another; a dirty bit. A row never moves. Its meta keeps the update count (saturating
// at 2^32 - 1) and the low 32 bits of the last update step, widened against the newest
// step the table has seen: a row's last step reads right while it lies within 2^32 steps
// of that. The id map takes 12.8 bytes a slot at a load of 0.85-0.94, 0.55-0.6 for rows
// of 256 bytes or more (stripe.h, IdMap::LoadFor).
//
// Thread safety: the id space is split into 64 stripes by a hash of the id, each with
// its own absl::Mutex, open-addressing map and slabs (embedding/internal/stripe.h).
// Updates, row creation and eviction hold the stripe's mutex. Lookups take no lock: they
// read map and rows optimistically under the stripe's sequence number and read again
// when an update was in flight, so they never see a half-applied update and never block
// writers or each other. Every method is safe to call concurrently.
//
// fp16 / bf16 tables store half-size weights and widen them to fp32 at every boundary:
// lookups, the optimizer (whose math is fp32) and the RowFn callbacks all see floats.
// An update rounds the new weights back stochastically, with random bits that are a pure
// function of (table seed, id, the row's update count), so small updates are not lost
// and a run replays bit for bit whatever the shard count.
// The ids of a fixed-vocabulary table that one table object holds: those congruent to
// `index` modulo `count`, `count` being the shards of every level together (ShardOfRow).
struct VocabularyPart {
  int64_t index = 0;
  int64_t count = 1;
};

class EmbeddingTable {
 public:
  static constexpr int kNumStripes = 64;

  // Creates an empty table. `row_budget` caps the rows this table may hold (0 = no cap).
  // A fixed-vocabulary table (config.vocabulary_size() > 0) holds the ids of `part`, in
  // arrays addressed by id (embedding/internal/fixed_rows.h), takes no row budget and
  // refuses other ids with InvalidArgument; lookups never store rows.
  static absl::StatusOr<std::unique_ptr<EmbeddingTable>> Create(const v1::TableConfig& config,
                                                                int64_t row_budget = 0,
                                                                VocabularyPart part = {});
  ~EmbeddingTable();
  EmbeddingTable(const EmbeddingTable&) = delete;
  EmbeddingTable& operator=(const EmbeddingTable&) = delete;

  const v1::TableConfig& config() const { return config_; }
  const std::string& name() const { return config_.name(); }
  int dim() const { return dim_; }
  int64_t row_budget() const { return row_budget_.load(std::memory_order_relaxed); }
  // Another row budget from now on (0 = none; a reshard splits a table's anew). A table
  // with eviction holding more rows evicts down to it now (to disk with a spill); one
  // without takes no new row until it holds fewer. Not for fixed-vocabulary tables.
  absl::Status SetRowBudget(int64_t row_budget);
  int64_t num_rows() const { return num_rows_.load(std::memory_order_relaxed); }
  // The optimizer updates use now (SetOptimizer may replace it; the one returned stays
  // valid for the table's lifetime).
  const Optimizer& optimizer() const { return *optimizer_.load(std::memory_order_acquire); }
  // Updates from now on use the optimizer of `config` (AlterTable): its type must be the
  // table's (InvalidArgument otherwise, or for a bad value). Safe during updates: each row
  // update uses one optimizer or the other; replaced ones are kept until the table goes.
  absl::Status SetOptimizer(const v1::OptimizerConfig& config);
  // Bytes held by rows and the id maps, and ReservedBytes().
  int64_t MemoryBytes() const;
  // Bytes the table takes from creation, which its memory budget counts from the start:
  // a fixed vocabulary's arrays (whole) and an admission sketch.
  int64_t ReservedBytes() const;
  bool fixed_vocabulary() const { return fixed_ != nullptr; }
  // InvalidArgument naming the first of `ids` a fixed-vocabulary table does not hold
  // (outside its vocabulary, or another shard's); OK for a dynamic table.
  absl::Status CheckIds(absl::Span<const int64_t> ids) const;

  // With an eviction policy (config().eviction()) a full table evicts a sampled least
  // recently (LRU, by last update step) or least frequently (LFU, by update count)
  // updated row to make room, instead of refusing the new one. Evicted rows go to
  // `spill`, and rows missing from memory are looked for there before being created
  // (null: evicted rows are dropped and start again from their initial weights). Set
  // before first use; `spill` must outlive the table.
  void set_spill(RowSpill* spill) { spill_ = spill; }
  // Counts this table's rows against `budget` (shared with other tables; it must outlive
  // the table): a new row past it is refused, or for a table with eviction makes room.
  // Set before the table holds rows.
  // A fixed-vocabulary table counts its arrays whole from here on.
  void set_memory_budget(MemoryBudget* budget);
  // Bytes a row counts against a memory budget: its stored size and its map slot's share.
  int64_t row_bytes() const { return row_bytes_; }
  // What a row of a dynamic table of `config` takes of memory: weights, optimizer state and
  // meta (without its map slot: 13.6-15 bytes, 21-22 for rows of 256 bytes or more).
  static int64_t StoredRowBytes(const v1::TableConfig& config);
  int64_t evictions() const { return evictions_.load(std::memory_order_relaxed); }
  // Feature admission: gradients dropped because their id has no row and was not admitted
  // (config().admission()); counted per id and push.
  int64_t refused_ids() const { return refused_ids_.load(std::memory_order_relaxed); }
  int64_t expirations() const { return expirations_.load(std::memory_order_relaxed); }

  // Copies the weights of each id into `out` (ids.size(), dim). Missing rows are created
  // when `insert_missing`, else their initial weights are written and nothing is stored.
  // A table with admission (config().admission()) never creates rows here: its rows are
  // made by the pushes that admit them.
  // ResourceExhausted when a new row would pass the row budget; rows earlier in the
  // batch have then been copied and the rest of `out` is unspecified.
  absl::Status Lookup(absl::Span<const int64_t> ids, float* out, bool insert_missing = true);

  // Applies one optimizer step to each row. `ids` must be distinct (see PushGradients
  // for batches with repeats); `grads` (ids.size(), dim) is each row's summed gradient;
  // missing rows are created first. InvalidArgument when any gradient is NaN or Inf,
  // ResourceExhausted when a new row would pass the budget; in both cases no row
  // changes. `step` is recorded as the rows' last step. With admission, a missing row is
  // created only when its id is admitted (counted here, once per call), else its gradient
  // is dropped (refused_ids()). A row whose update would make a
  // weight or state value non-finite keeps its values: the others are updated and the
  // answer is an InvalidArgument marked PartlyApplied (base/status.h).
  absl::Status ApplyUniqueGradients(absl::Span<const int64_t> ids, const float* grads,
                                    int64_t step);
  // ApplyUniqueGradients of gradients already checked: a SummedGradients, or one shard's
  // share of one. Not scanned again (TESSERA_DCHECK in debug builds).
  absl::Status ApplyCheckedGradients(absl::Span<const int64_t> ids, const float* grads,
                                     int64_t step);

  // OK when the rows that updating distinct `ids` would create fit the row budget (always
  // for tables without one, or that evict to make room); otherwise the ResourceExhausted
  // that ApplyUniqueGradients would return. A check, not a reservation: a concurrent
  // update may take the room before the caller uses it. Lets a caller that updates
  // several tables as one (the in-process shards of a collection) refuse the whole batch.
  absl::Status CheckRoomFor(absl::Span<const int64_t> ids) const;
  // How many rows updating `ids` (distinct) would create: ids without a row (and, with
  // admission, that their next push admits).
  int64_t MissingRows(absl::Span<const int64_t> ids) const;

  // Like ApplyUniqueGradients, but `ids` may repeat: gradients of one id are summed in
  // batch order and its row is updated once.
  absl::Status PushGradients(absl::Span<const int64_t> ids, const float* grads, int64_t step);

  // A copy of the row of `id`; NotFound when it does not exist.
  absl::StatusOr<RowSnapshot> ReadRow(int64_t id) const;

  // The weights a new row of `id` starts with: (dim).
  void InitialWeights(int64_t id, float* out) const;

  // `weights` (dim) and `state` are valid during the call only (a half-precision table
  // hands out widened copies).
  using RowFn = std::function<void(int64_t id, const float* weights, const float* state,
                                   const RowMeta& meta)>;

  // Calls fn for every stored row, one stripe at a time under its reader lock. fn must
  // not call back into the table.
  void ForEachRow(const RowFn& fn) const;

  // Calls fn for each id of `ids` that has a row, under its stripe's reader lock; ids
  // without a row are skipped. fn must not call back into the table.
  void ReadRows(absl::Span<const int64_t> ids, const RowFn& fn) const;

  // Stores a row exactly as given (loading from disk, undoing an update): creates it or
  // overwrites it. `weights` (dim), `state` (optimizer StateFloats()). InvalidArgument on
  // a size mismatch, ResourceExhausted when a new row would pass the row budget. The row
  // is marked dirty (for the next checkpoint) only when `mark_dirty` (an import).
  absl::Status PutRow(int64_t id, absl::Span<const float> weights, absl::Span<const float> state,
                      const RowMeta& meta, bool mark_dirty = false);

  // Sizes the id maps for about `rows` rows in all, so that loading that many grows
  // none of them; a hint (rows beyond it are still taken). ResourceExhausted when out of
  // memory.
  absl::Status Reserve(int64_t rows);

  // PutRow (not marking dirty) for a batch: `weights` (ids.size(), dim), `state`
  // (ids.size(), StateFloats()), `metas` (ids.size()); the rows of one stripe under one
  // lock. ResourceExhausted when a new row would pass the row budget: rows of the batch
  // may have been stored before it.
  absl::Status PutRows(absl::Span<const int64_t> ids, const float* weights, const float* state,
                       absl::Span<const RowMeta> metas);

  // Drops the in-memory row of `id`, if any, without handing it to the spill: its next
  // read finds what the spill keeps, or initial weights (undoing an update).
  void Forget(int64_t id);

  // Dirty rows: rows changed by an optimizer update since the last ClearDirty(). A
  // checkpoint writes these and nothing else; rows only ever looked up equal their
  // initial weights and need no storing.
  // Calls fn for every dirty row, one stripe at a time under its reader lock.
  void ForEachDirtyRow(const RowFn& fn) const;
  int64_t DirtyRows() const;
  // Marks every row clean. Callers make sure no update runs between ForEachDirtyRow and
  // this (the collection holds its checkpoint lock).
  void ClearDirty();

 private:
  using Stripe = embedding_internal::Stripe;
  using Row = uint32_t;  // a row number in rows_ (embedding_internal::kNoRow: none)

  EmbeddingTable(const v1::TableConfig& config, int64_t row_budget,
                 std::unique_ptr<Optimizer> optimizer);

  // The row budget and the memory budget, accounted here and nowhere else. TakeRows
  // counts `n` new rows, or counts nothing and returns ResourceExhausted when they would
  // pass either budget; AdjustRows corrects the count by `delta` (rows erased, reserved
  // but not created, or created by tables that evict to stay within their budget).
  absl::Status TakeRows(int64_t n);
  void AdjustRows(int64_t delta) {
    num_rows_.fetch_add(delta, std::memory_order_relaxed);
    if (memory_ != nullptr) memory_->Add(delta * row_bytes_);
  }
  // Whether new rows must be counted before they are made: a row budget, or a memory
  // budget without room for `new_rows` more.
  bool CountsAhead(int64_t new_rows) const {
    return row_budget() > 0 ||
           (memory_ != nullptr && !memory_->HasRoomFor(new_rows * row_bytes_));
  }
  absl::Status MemoryBudgetError(int64_t rows) const;

  // The row of `id` in `stripe`, created and initialised when missing (budget taken);
  // ResourceExhausted when the budget is spent or memory runs out.
  absl::StatusOr<Row> FindOrInsertLocked(Stripe& stripe, int64_t id, uint64_t hash)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(embedding_internal::StripeMutex(stripe));
  // A new row of `id` (not present), budget already taken; kNoRow when out of memory.
  Row InsertLocked(Stripe& stripe, int64_t id, uint64_t hash)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(embedding_internal::StripeMutex(stripe));
  // Eviction tables: the row of `id` (not in memory), made room for by evicting another
  // when the table is full, read from the spill when kept there, else initialised.
  absl::StatusOr<Row> InsertManagedLocked(Stripe& stripe, int64_t id, uint64_t hash)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(embedding_internal::StripeMutex(stripe));
  // Evicts one sampled row of `stripe`; OK without evicting when the stripe is empty.
  absl::Status EvictOneLocked(Stripe& stripe)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(embedding_internal::StripeMutex(stripe));
  // PutRow under the stripe's writer lock (`h`: the id's map hash); `weights` (dim),
  // `state` (StateFloats()).
  absl::Status PutRowLocked(Stripe& stripe, uint64_t h, const float* weights,
                            const float* state, const RowMeta& meta, bool mark_dirty)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(embedding_internal::StripeMutex(stripe));
  // Removes the row of the id of map hash `hash` from `stripe` and frees it.
  void EraseLocked(Stripe& stripe, uint64_t hash)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(embedding_internal::StripeMutex(stripe));
  void MarkDirtyLocked(Stripe& stripe, Row row)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(embedding_internal::StripeMutex(stripe));
  // Whether the spill keeps a row of `id` (false without a spill), with its weights in
  // `weights` (dim) when not null.
  absl::StatusOr<bool> ReadSpilled(int64_t id, float* weights) const;
  // Fixed-vocabulary tables (embedding/internal/fixed_rows.cc).
  Stripe& FixedStripe(int64_t row) const;
  absl::Status FixedLookup(absl::Span<const int64_t> ids, float* out) const;
  // The weights of `row` (of `id`) into `out` (dim): stored, or initial when never stored.
  void ReadFixedRow(int64_t id, int64_t row, float* out) const;
  // Ids [b, e) of a lookup: read guarded against writers at work (FixedLookupGuarded), or
  // copied out with no check (CopyFixedRows).
  void FixedLookupGuarded(absl::Span<const int64_t> ids, size_t b, size_t e, float* out) const;
  void CopyFixedRows(absl::Span<const int64_t> ids, size_t b, size_t e, float* out) const;
  // Copies a row's stored weights out as fp32.
  void CopyStoredWeights(const float* stored, float* out) const;
  absl::Status FixedApply(absl::Span<const int64_t> ids, const float* grads, int64_t step);
  // Row `row` (of `id`) stored with its initial weights and state.
  void FixedInitLocked(int64_t id, int64_t row);
  bool FixedUpdateLocked(int64_t id, int64_t row, const float* grad, float* scratch);
  absl::Status FixedPutRow(int64_t id, const float* weights, const float* state,
                           const RowMeta& meta, bool mark_dirty);
  void FixedForEach(const RowFn& fn, bool dirty_only) const;
  // ForEachRow / ForEachDirtyRow of a dynamic table: a scan of every stripe's map.
  void ScanRows(const RowFn& fn, bool dirty_only) const;
  void FixedForget(int64_t id);
  void FixedClearDirty();
  // Updates (ApplyUniqueGradients) for eviction tables: one id at a time, as a row found
  // early in a batch may be evicted to make room for a later one.
  absl::Status ApplyManaged(absl::Span<const int64_t> ids, const float* grads, int64_t step);
  // Updates for tables without eviction: the batch grouped by stripe, with prefetching.
  absl::Status ApplyBatch(absl::Span<const int64_t> ids, const float* grads, int64_t step);
  // Brings the map slots and rows of every id of `plan` towards the cache in one pipeline
  // across the stripes' groups (the groups' own probes pipeline within a group only, and a
  // shard's part of a batch spreads thin over the stripes). Finds without locks and keeps
  // nothing; needs a ReaderScope.
  void WarmRows(const embedding_internal::StripePlan& plan, bool for_write) const;
  // Prefetches the map buckets of the ids from `from` on in `plan` that the next chunk's
  // probes read first (in whichever stripes they are): called before a chunk's rows are
  // used, so that the next chunk does not start by waiting for them. Only a hint: it may
  // touch a map a writer replaces meanwhile (a prefetch never faults).
  void PrefetchNextBuckets(const embedding_internal::StripePlan& plan, int from) const;
  // Copies the weights of the rows found for group [b, e) of `plan` into `out`.
  void CopyGroup(const embedding_internal::StripePlan& plan, int b, int e, float* out) const;
  // TTL: drops every row not updated since step - ttl.
  void ExpireRows(int64_t step);
  void InitRow(int64_t id, Row row) const;
  float* WeightsOf(Row row) const;
  float* StateOf(Row row) const;
  // The row's meta, its last step widened (see the class comment).
  RowMeta MetaOf(Row row) const;
  // Stores `meta` as the row's; the table's newest step must be at least its last step.
  void SetMeta(Row row, const RowMeta& meta) const;
  // Raises the newest step the table has seen to `step`.
  void NoteStep(int64_t step);
  // Widens stored weights `stored` into `out` (dim).
  void CopyWeightsOut(const float* stored, float* out) const;
  // Stored weights as floats: themselves for fp32, else widened into a thread-local
  // buffer that the next call reuses.
  const float* WeightsView(const float* stored) const;
  // Stores `w` (dim) as weights at `stored`, rounded to nearest.
  void StoreWeights(const float* w, float* stored) const;
  // One optimizer step on `row` with gradient `grad` (dim; not changed); records `step`.
  // When the step would make a weight or a state value non-finite (a gradient too large
  // for the learning rate) the row is left as it was and false is returned
  // (Optimizer::UpdateFinite). `scratch`: ScratchFloats().
  bool UpdateRowLocked(Stripe& stripe, int64_t id, Row row, const float* grad, int64_t step,
                       float* scratch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(embedding_internal::StripeMutex(stripe));
  size_t ScratchFloats() const { return 2 * static_cast<size_t>(dim_); }
  // InvalidArgument for `refused` rows whose update UpdateRowLocked refused.
  absl::Status NonFiniteUpdateError(int64_t refused, int64_t first_id) const;
  absl::Status BudgetError() const;
  absl::Status OutOfMemoryError() const;

  v1::TableConfig config_;
  int dim_;
  v1::Dtype dtype_;
  int state_floats_;
  int weight_floats_;  // floats the stored weights take (dim, or dim / 2 for half precision)
  int read_lines_;     // cache lines a lookup of a fixed-vocabulary row reads
  std::atomic<int64_t> row_budget_;
  std::atomic<const Optimizer*> optimizer_;
  absl::Mutex optimizers_mu_;  // one SetOptimizer at a time
  // Every optimizer the table has used: updates in flight may hold any of them.
  std::vector<std::unique_ptr<Optimizer>> optimizers_ ABSL_GUARDED_BY(optimizers_mu_);
  std::unique_ptr<embedding_internal::RowInitializer> initializer_;
  // Feature admission (config().admission()); null when every id gets a row. Each
  // stripe's slice of its sketch is guarded by that stripe's lock.
  std::unique_ptr<embedding_internal::AdmissionFilter> admission_;
  std::atomic<int64_t> refused_ids_{0};
  // A fixed vocabulary's rows (null for a dynamic table).
  std::unique_ptr<embedding_internal::FixedRows> fixed_;
  std::atomic<int64_t> num_rows_{0};
  v1::EvictionPolicy policy_ = v1::EVICTION_NONE;
  int64_t ttl_steps_ = 0;
  RowSpill* spill_ = nullptr;
  MemoryBudget* memory_ = nullptr;
  int64_t row_bytes_ = 0;
  std::atomic<int64_t> latest_step_{-1};  // newest step pushed or stored
  std::atomic<int64_t> dirty_rows_{0};    // dirty bits set (dynamic tables)
  std::atomic<int64_t> next_sweep_{0};    // step of the next TTL sweep
  std::atomic<int64_t> evictions_{0};
  std::atomic<int64_t> expirations_{0};
  // Lock-free lookups in flight (behind a pointer: the type is the table's own).
  const std::unique_ptr<embedding_internal::ReaderEpochs> readers_;
  std::unique_ptr<embedding_internal::RowStore> rows_;  // a dynamic table's rows
  std::unique_ptr<Stripe[]> stripes_;
};

}  // namespace tessera::embedding

#endif  // TESSERA_EMBEDDING_EMBEDDING_TABLE_H_
