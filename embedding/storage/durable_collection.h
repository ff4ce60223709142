#ifndef TESSERA_EMBEDDING_STORAGE_DURABLE_COLLECTION_H_
#define TESSERA_EMBEDDING_STORAGE_DURABLE_COLLECTION_H_

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/thread_pool.h"
#include "embedding/batch_ops.h"
#include "embedding/collection.h"
#include "embedding/inprocess_collection.h"
#include "embedding/shard_tables.h"
#include "embedding/storage/checkpoint_manifest.h"
#include "embedding/storage/kv_store.h"

namespace tessera::storage {

// The in-memory collection's options (shards, threads, memory budget, place in a cluster),
// and where and how the rows are kept on disk.
struct DurableOptions : embedding::InProcessOptions {
  std::string data_dir;      // required: the live store and checkpoints
  int keep_checkpoints = 3;  // newest complete checkpoints kept; 0 = all
  KvStoreFactory open_store = OpenRocksDbStore;
  // Write-through push parts kept on record by request id (PushGradientsRecorded), newest
  // first; older ones are erased with the write that records a new one.
  size_t push_records = 1 << 16;
  // Warnings and progress lines (skipped checkpoints, load progress); stderr if unset.
  std::function<void(const std::string&)> log;
};

// An EmbeddingCollection whose rows live in memory and on disk under `data_dir`:
//
//   <data_dir>/db/                       the live store (KvStore; RocksDB by default)
//   <data_dir>/checkpoints/<step>/db/    a copy of the store as of checkpoint <step>
//   <data_dir>/checkpoints/<step>/attachments/<name>
//   <data_dir>/checkpoints/<step>/MANIFEST  written last: without it there is no checkpoint
//   <data_dir>/checkpoints/<model>.<step>/  the same for a model's checkpoint: its manifest
//                                        lists the model's tables, and only they are
//                                        written before it and restored from it
//
// Table configs are in the store's catalog; opening a data directory brings back every
// table with every stored row, checking each row's checksum (DataLoss names the table
// and row of a corrupt one). Rows that were only ever looked up are not stored: they
// equal their deterministic initial weights and come back as such.
//
// Durability per table (TableConfig.durability): CHECKPOINT tables write their dirty rows
// at each Checkpoint() (a crash loses the updates since); WRITE_THROUGH tables write the
// rows of every push, synced to the write-ahead log, before PushGradients returns OK, and
// undo the push in memory when the write fails, so memory never runs ahead of disk.
//
// Tables with an eviction policy and a row budget hold their hot rows in memory: rows
// evicted to make room are written to the store (CHECKPOINT tables: to a spill area that
// the next checkpoint folds in, so a restart still comes back as of that checkpoint) and
// read back on their next lookup.
//
// Retention keeps the newest `keep_checkpoints` of each model by creation order. Restoring a
// model replaces its tables only (rows copied from the checkpoint's store under fresh
// table ids; a crash half-way redoes it on the next open); restoring the whole collection
// swaps the live store.
//
// Thread-safe. Lookups and pushes run concurrently; CreateTable, DropTable, Checkpoint and
// Restore run alone (they wait for calls in flight and hold new ones back: the step
// barrier).
// Write-through pushes to one table are serialized, so the disk sees them in order.
class DurableCollection final : public embedding::ShardTables, public embedding::Checkpointing {
 public:
  // Opens or creates the collection in options.data_dir. FailedPrecondition when the
  // directory cannot be written or its store not opened, DataLoss for a corrupt row or
  // catalog entry.
  static absl::StatusOr<std::unique_ptr<DurableCollection>> Open(const DurableOptions& options);
  ~DurableCollection() override;

  absl::Status CreateTable(const v1::TableConfig& config) override;
  absl::StatusOr<std::vector<v1::TableConfig>> ListTables() const override;
  absl::Status Lookup(absl::string_view table, absl::Span<const int64_t> ids, absl::Span<float> out,
                      const embedding::LookupOptions& options) override;
  absl::Status PooledLookup(absl::string_view table, absl::Span<const int64_t> ids,
                            absl::Span<const int32_t> offsets, absl::Span<const float> weights,
                            v1::Pooling pooling, absl::Span<float> out,
                            const embedding::LookupOptions& options) override;
  // The in-memory collection's batched lookup (its shapes checked once, its parts in
  // parallel), under one reader lock.
  absl::Status LookupBatch(absl::Span<const embedding::TableBags> tables,
                           const embedding::LookupOptions& options) override;
  absl::Status PushGradients(absl::string_view table, absl::Span<const int64_t> ids,
                             absl::Span<const float> gradients, int64_t step) override;
  // Whole or not at all: every part is checked first (the in-memory collection's check,
  // room included), and the write-through parts are written in one synced write, undone
  // together if it fails. Parts on record under options.request_id are answered, not
  // applied again (PushOptions::map_version).
  absl::Status PushBatch(absl::Span<const embedding::TableGradients> tables, int64_t step,
                         const embedding::PushOptions& options) override;
  // WRITE_THROUGH tables store `tag` in the same synced write as the push's rows; others
  // apply the push and record nothing (their rows go back to a checkpoint on a restart).
  absl::Status PushGradientsRecorded(absl::string_view table, absl::Span<const int64_t> ids,
                                     absl::Span<const float> gradients, int64_t step,
                                     const embedding::PushTag& tag) override;
  std::optional<int64_t> RecordedPush(const embedding::PushTag& tag) const override;
  std::vector<embedding::RecordedPart> RecordedPushes() const override;
  bool AppliesBatchWhole() const override { return true; }
  absl::Status KeepServerState(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> ServerState(absl::string_view key) const override;
  absl::StatusOr<embedding::TableUsage> Usage(absl::string_view table) const override;
  absl::Status DropTable(absl::string_view table) override;
  // The new config is in the catalog (synced) before the pushes use it, so a restart keeps
  // it; a checkpoint holds the config of its moment.
  absl::StatusOr<v1::TableConfig> AlterTable(absl::string_view table,
                                             const v1::OptimizerConfig& changes) override;
  // Rows in memory, and for tables with eviction the rows kept on disk too.
  absl::Status ExportRows(absl::string_view table, const embedding::ExportOptions& options,
                          const std::function<absl::Status(const embedding::RowBlock&)>& sink)
      override;
  // WRITE_THROUGH tables write the rows (synced) before returning; CHECKPOINT tables at
  // the next checkpoint.
  absl::Status ImportRows(absl::string_view table, const embedding::RowBlock& rows) override;
  int num_shards() const override { return options_.num_shards; }

  embedding::Checkpointing* checkpointing() override { return this; }
  absl::StatusOr<embedding::CheckpointInfo> Checkpoint(int64_t step,
                                                       const embedding::Attachments& attachments,
                                                       const embedding::CheckpointOptions& options =
                                                           {}) override;
  absl::StatusOr<embedding::CheckpointInfo> Restore(
      int64_t step, embedding::Attachments* attachments,
      const embedding::RestoreOptions& options = {}) override;
  absl::StatusOr<std::vector<embedding::CheckpointInfo>> ListCheckpoints() const override;

  // Restores a checkpoint taken on another set of shards: `dirs` are the directories of
  // one checkpoint (its MANIFEST in each; the same model and step) of each shard of that
  // cluster, in shard order, readable here. This collection, shard
  // options().cluster_shard_index of cluster_num_shards, takes from them the rows it owns
  // now (embedding::ShardOfRow), each from the directory of the shard that owned it then, in
  // place of its tables of the checkpoint's model (every table for a whole-collection
  // checkpoint). `options.model` must name the checkpoint's model. Attachments come from
  // the first directory. InvalidArgument for directories of different checkpoints;
  // NotFound for one without a complete checkpoint. A crash during it is finished on the
  // next open, as for Restore.
  absl::StatusOr<embedding::CheckpointInfo> RestoreFromShards(
      const std::vector<std::string>& dirs, embedding::Attachments* attachments,
      const embedding::RestoreOptions& options = {});

  // Reads table `table` of the checkpoint in `dirs` (as RestoreFromShards takes them)
  // without restoring it: `config` gets the table's config as the checkpoint holds it, then
  // `sink` the rows this collection owns now, each from the directory of the shard that
  // owned it then (of `options`, since_step, with_state and chunk_rows count). NotFound for
  // a directory without a complete checkpoint or a table the checkpoint lacks;
  // InvalidArgument as RestoreFromShards. Reads files only: the tables serve on meanwhile.
  absl::Status ExportCheckpointRows(
      const std::vector<std::string>& dirs, absl::string_view table,
      const embedding::ExportOptions& options, v1::TableConfig* config,
      const std::function<absl::Status(const embedding::RowBlock&)>& sink) const;

  // Forgets the rows it no longer owns (in memory, on disk and spilled), then writes
  // every dirty row (synced), so that rows imported for the new place survive a restart.
  absl::Status Repartition(int shard_index, int num_shards) override;
  // A write-through table writes the moving rows of ids its current place does not own
  // (synced) before returning: a crash before the commit leaves them on disk, where a
  // fixed vocabulary's rows outside the place are not loaded.
  absl::Status ImportMovingRows(absl::string_view table, const embedding::RowBlock& rows,
                                int shard_index, int num_shards) override;
  absl::Status SwitchPlace(int shard_index, int num_shards) override;
  // Also erases from disk the rows of ids this place does not own that a reshard's imports
  // wrote or an interrupted reshard left (not loaded at open).
  absl::Status DropMovingRows() override;
  // The catalog takes the new config (synced) before the memory tables take the budget.
  absl::Status SetRowBudget(absl::string_view table, int64_t max_rows) override;

  // Rows loaded from disk by the last Open or Restore.
  int64_t rows_loaded() const;
  // The directory of checkpoint `step` of `model` (complete or not).
  std::string CheckpointDir(int64_t step, const std::string& model = "") const;

 private:
  struct Table {
    uint32_t id = 0;
    v1::TableConfig config;
    std::unique_ptr<absl::Mutex> write_mu;  // orders write-through pushes
    std::unique_ptr<embedding::RowSpill> spill;  // evicted rows <-> the store
  };
  // The in-memory tables of `config` (just created or loaded) and their spill.
  Table MakeTable(uint32_t id, const v1::TableConfig& config) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  explicit DurableCollection(const DurableOptions& options);
  using Clock = std::chrono::steady_clock;

  // Opens the live store and loads the catalog and every row into fresh memory.
  absl::Status OpenAndLoad() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Loads the stored rows of `t` into its (empty) memory tables.
  absl::Status LoadRows(const std::string& name, const Table& t, Clock::time_point start)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // LoadRows skipped `rows` rows of `table` that this place does not own: strays_, logged.
  void NoteStrays(const std::string& table, int64_t rows);
  // Forgets table `name` in memory and appends the deletes of its catalog entry, rows and
  // spilled rows to `writes`.
  absl::Status ForgetTable(const std::string& name, std::vector<KvWrite>* writes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The manifest of the one checkpoint `dirs` hold (every shard's of one step and model):
  // NotFound for a directory without a complete one, InvalidArgument for different ones.
  static absl::StatusOr<CheckpointManifest> ManifestOfDirs(const std::vector<std::string>& dirs);
  // Replaces the tables of `m.model` with those of the checkpoint in `dirs` (one
  // checkpoint of each shard of a cluster, or this collection's own): the rows this
  // collection owns in its cluster (all of them outside one).
  // `resharded`: `dirs` are the checkpoints of every shard of another shard count (a
  // table's per-shard row budget is split anew).
  absl::Status RestoreModel(const std::vector<std::string>& dirs, const CheckpointManifest& m,
                            bool resharded = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RestoreModel's halves: every row of the checkpoint this collection owns, read whole
  // (changing nothing but the next table id), then those rows put in place of the model's
  // tables (a failure there stops the restore half-way; the next open finishes it).
  struct ModelRows {
    std::vector<KvWrite> writes;  // catalog entries and rows, under fresh table ids
    std::map<std::string, std::pair<uint32_t, v1::TableConfig>> tables;  // by name
  };
  absl::StatusOr<ModelRows> ReadModel(const std::vector<std::string>& dirs,
                                      const CheckpointManifest& m, bool resharded)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ApplyModel(const std::vector<std::string>& dirs, const CheckpointManifest& m,
                          bool resharded, ModelRows rows) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RestoreModel with every row read before anything changes (Unreadable when they cannot
  // be; with `verify_only` nothing more), a failure half-way marking the collection broken
  // with `what` ("restore of DIR") stopped half-way.
  absl::Status ReadAndApplyModel(const std::vector<std::string>& dirs, const CheckpointManifest& m,
                                 bool resharded, bool verify_only, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `read` (why checkpoint `m` at `where` could not be read), saying that nothing was
  // restored and naming the model's newest older checkpoint complete here.
  absl::Status Unreadable(const CheckpointManifest& m, const std::string& where,
                          const absl::Status& read) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when the checkpoint store in `dir` opens and every key and value reads.
  absl::Status VerifyStore(const std::string& dir) const;
  // Finishes a model restore that a crash interrupted (its marker names the checkpoint).
  absl::Status FinishInterruptedRestore() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<const Table*> Find(absl::string_view table) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The table to change (AlterTable, SetRowBudget), or NotFound.
  absl::StatusOr<Table*> FindToChange(absl::string_view table) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `config` as the catalog entry of `t` (synced); `what` names the change.
  absl::Status StoreConfig(const Table& t, const v1::TableConfig& config, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Usable() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Appends the rows of `ids` that `shards` (table `t`'s, laid out for a cluster of `outer`
  // shards) hold, encoded as the store's writes of them (ids without a row: none).
  void AppendRowWrites(const Table& t,
                       const std::vector<std::unique_ptr<embedding::EmbeddingTable>>& shards,
                       int outer, absl::Span<const int64_t> ids, std::vector<KvWrite>* writes) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Imports `rows` of table `t` with `import` (the memory tables' ImportRows or
  // ImportMovingRows) and, for a write-through table, writes them (synced), in order with
  // its pushes.
  absl::Status ImportWrittenThrough(const Table& t, const embedding::RowBlock& rows,
                                    const std::function<absl::Status()>& import)
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // ImportMovingRows for a fixed-vocabulary table.
  absl::Status ImportMovingLocked(const Table& t, const embedding::RowBlock& rows, int shard_index,
                                  int num_shards) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status SwitchPlaceLocked(int shard_index, int num_shards)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets, in memory and on disk (spilled rows too), the rows of ids this place does not
  // own, when unsettled_ or strays_ says some may be here.
  absl::Status ForgetStraysLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a crash during a checkpoint: CHECKPOINT tables' rows back to the newest complete
  // checkpoint (the live store may hold part of the interrupted one).
  absl::Status RecoverInterruptedCheckpoint() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A push part on record (the store's 'P' keys): its rows updated, map version and table.
  struct Record {
    int64_t rows = 0;
    uint64_t map_version = 0;
    std::string table;
  };
  // A write-through push part being applied: its gradients summed, and the rows they touch
  // as they were before it (to undo it).
  struct Before {
    bool existed = false;
    std::vector<float> weights, state;
    embedding::RowMeta meta;
  };
  struct WrittenPart {
    const Table* t = nullptr;
    embedding::SummedGradients summed;
    std::map<int64_t, Before> before;
  };
  // Sums the gradients of table `t`'s part into part->summed (checked as `given` says) and
  // snapshots its rows.
  absl::Status SnapshotPart(const Table& t, absl::Span<const int64_t> ids,
                            absl::Span<const float> gradients, embedding::Gradients given,
                            WrittenPart* part) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Puts the part's rows back as they were in memory: rows that were not in memory are
  // forgotten, so their next read finds the stored value (or initial weights) again.
  void UndoPart(const WrittenPart& part) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The writes of the part's rows and, when `tag` is given, of its push record.
  void AppendPartWrites(const WrittenPart& part, const embedding::PushTag* tag,
                        std::vector<KvWrite>* writes) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Holds the push records of `written` (their store write succeeded).
  void HoldRecords(std::vector<std::pair<embedding::PushTag, Record>> written);
  // PushBatch of a batch with write-through parts (through[i]: part i's table when it is
  // WRITE_THROUGH, else null): every part checked, the write-through parts applied in
  // memory and written with their records in one synced write (all undone if anything
  // fails), then the other parts.
  absl::Status WriteThroughBatch(absl::Span<const embedding::TableGradients> tables,
                                 const std::vector<const Table*>& through, int64_t step,
                                 const embedding::PushOptions& options)
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // `tag` (may be null) is recorded with the rows.
  absl::Status WriteThroughPush(const Table& t, absl::Span<const int64_t> ids,
                                absl::Span<const float> gradients, int64_t step,
                                const embedding::PushTag* tag) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status Push(absl::string_view table, absl::Span<const int64_t> ids,
                    absl::Span<const float> gradients, int64_t step,
                    const embedding::PushTag* tag);
  // Loads the push records of the live store (trimmed to options_.push_records).
  absl::Status LoadPushRecords() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes every dirty row of `model`'s tables to the live store and marks it clean;
  // returns rows written.
  // `logged`: through the write-ahead log, synced (no checkpoint follows to flush them).
  absl::StatusOr<int64_t> FlushDirtyRows(const std::string& model, bool logged = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FlushDirtyRows' part for table `t`: its dirty rows, in key order, through `write`;
  // returns rows written.
  absl::StatusOr<int64_t> WriteDirtyRows(
      const Table& t, const std::function<absl::Status(absl::Span<const KvWrite>)>& write)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes into `dir`/db the store a checkpoint of `model` ("": every table) holds: the
  // live store's catalog entries and rows of its tables, and nothing of other models'.
  absl::Status SnapshotInto(const std::string& model, const std::string& dir)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SnapshotInto's store of one model: its catalog entries and rows written into a store at
  // `staging`, whose checkpoint goes to `db`.
  absl::Status StageModel(const std::string& model, const std::string& staging,
                          const std::string& db) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Complete checkpoints with their manifests, oldest first; torn ones are logged.
  std::vector<std::pair<std::string, CheckpointManifest>> CompleteCheckpoints() const;
  void ApplyRetention() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Log(const std::string& line) const;
  std::string LivePath() const;
  std::string InProgressPath() const;  // exists while a checkpoint is being taken
  std::string RestoringPath() const;   // exists while a model restore is being applied

  DurableOptions options_;  // its placement (cluster_*) changes under mu_ (Repartition)
  mutable absl::Mutex mu_;
  std::unique_ptr<KvStore> store_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<embedding::InProcessCollection> memory_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Table, std::less<>> tables_ ABSL_GUARDED_BY(mu_);
  uint32_t next_table_id_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t rows_loaded_ ABSL_GUARDED_BY(mu_) = 0;
  // SwitchPlace changed the place, and Repartition has not yet forgotten the rows the new
  // place does not own.
  bool unsettled_ ABSL_GUARDED_BY(mu_) = false;
  // Rows of ids the current place does not own may be on disk or in memory: a reshard's
  // imports brought them (under mu_ shared), or Open found some (left by a reshard that
  // stopped before its commit). ForgetStraysLocked erases them.
  std::atomic<bool> strays_{false};
  absl::Status broken_ ABSL_GUARDED_BY(mu_);  // set when a restore could not reopen the store
  // The push records of the store ('P' keys), and their order, oldest first.
  using RecordKey = std::tuple<uint64_t, uint64_t, uint32_t>;
  static RecordKey KeyOf(const embedding::PushTag& t) {
    return {t.request.client_id, t.request.sequence, t.part};
  }
  mutable absl::Mutex record_mu_;
  std::map<RecordKey, Record> records_ ABSL_GUARDED_BY(record_mu_);
  std::deque<embedding::PushTag> record_order_ ABSL_GUARDED_BY(record_mu_);
  uint64_t next_record_ ABSL_GUARDED_BY(record_mu_) = 1;
};

}  // namespace tessera::storage

#endif  // TESSERA_EMBEDDING_STORAGE_DURABLE_COLLECTION_H_
