#ifndef TESSERA_EMBEDDING_COLLECTION_H_
#define TESSERA_EMBEDDING_COLLECTION_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tessera/v1/config.pb.h"

namespace tessera::embedding {

struct LookupOptions {
  // Create rows that do not exist yet (training). When false, a missing row reads as its
  // initial weights and nothing is stored (evaluation, serving).
  bool insert_missing = true;
};

// What a table holds right now.
struct TableUsage {
  int64_t rows = 0;          // stored rows over all shards
  int64_t memory_bytes = 0;  // bytes of rows and id maps
  int64_t evictions = 0;     // rows evicted for room since the process started
  int64_t expirations = 0;   // rows dropped by their TTL since the process started
  // The memory budget the table's rows count against (0: none), shared with the other
  // tables of its collection, and what all their rows take of it.
  int64_t budget_bytes = 0;
  int64_t budget_used_bytes = 0;
  // Feature admission: gradients dropped for ids not admitted, since the process started.
  int64_t admission_refused = 0;
};

// A durable snapshot of a model's tables (or of every table) of a collection.
struct CheckpointInfo {
  std::string model;            // "" = every table of the collection
  int64_t step = 0;
  int64_t rows = 0;             // rows stored in it
  int64_t bytes = 0;            // bytes on disk
  int64_t created_unix_ms = 0;  // when it was completed
  double seconds = 0;           // how long the Checkpoint or Restore call took
  std::vector<std::string> shards;  // a cluster's: the shard servers it spans
};

// How a lookup grouped one part's ids, kept for the gradients and the push of the same
// ids: the part's distinct ids (grouped by shard), which of them each id of the part is,
// and each shard's range. A caller that hands one to a lookup (TableBags::plan) finds it
// filled by a collection that plans (in process, grouped by shard; a smart client's
// router, ungrouped: shard_begin empty; the others leave it invalid); it can then compute
// the gradients of unique_ids in that order (pooling's backward over `inverse`) and push
// them with the plan (TableGradients::plan, ids = unique_ids), which skips the push's
// deduplication (and, in process, its routing).
struct IdPlan {
  bool valid = false;
  std::vector<int64_t> unique_ids;   // distinct ids, grouped by shard
  std::vector<int32_t> inverse;      // (ids) position of each id of the part in unique_ids
  std::vector<int32_t> shard_begin;  // (shards + 1) each shard's range of unique_ids
  uint64_t seed = 0;                 // the table seed and shard count they were grouped by
  int num_shards = 0;
  // IdsFingerprint of unique_ids as the collection left them: a push whose plan's ids were
  // changed since is routed afresh, not by the plan's ranges.
  uint64_t fingerprint = 0;
};

// One table's part of a multi-table lookup (a key of a KeyedJaggedTensor).
struct TableBags {
  std::string table;
  absl::Span<const int64_t> ids;
  absl::Span<const int32_t> offsets;  // CSR (bags+1) over ids; empty = one row per id
  absl::Span<const float> weights;    // empty, or one per id (needs offsets)
  v1::Pooling pooling = v1::SUM;
  absl::Span<float> out;              // (bags, dim), or (ids, dim) without offsets
  IdPlan* plan = nullptr;             // optional: filled as IdPlan says
};

class CheckedPush;  // batch_ops.h

// One table's part of a multi-table push.
struct TableGradients {
  std::string table;
  absl::Span<const int64_t> ids;
  absl::Span<const float> gradients;  // (ids, dim); repeated ids are summed
  // Optional: the plan of the lookup these gradients answer, with ids == plan->unique_ids
  // (the same memory). A collection that made it applies the rows without deduplicating or
  // routing them again; any other ignores it.
  const IdPlan* plan = nullptr;
};

// Who sends a push, for exactly-once delivery: a collection that has applied a request id
// applies it again as a no-op. {0, 0} = no id (every call is applied).
struct RequestId {
  uint64_t client_id = 0;
  uint64_t sequence = 0;
  bool empty() const { return client_id == 0 || sequence == 0; }
};

// One part (table) of a push under a request id, applied under shard map version
// `map_version` (0: not said).
struct PushTag {
  RequestId request;
  uint32_t part = 0;
  uint64_t map_version = 0;
};

// A push part on durable record (RecordedPush), with the table it updated.
struct RecordedPart {
  PushTag tag;
  std::string table;
};

// A random 64-bit id, never 0: a client's id in its RequestIds, a shard's incarnation.
uint64_t RandomNonZeroId();

// A data-parallel trainer's place in its job, for pushes through a cluster: each shard
// applies a step once all `workers` have pushed it, their gradients summed in worker
// order, and answers every worker then (SyncGroup in embedding_service.proto).
struct PushSync {
  std::string job;
  int worker = 0;
  int workers = 1;  // 1: no group, the push is applied at once
  std::chrono::milliseconds timeout{30000};  // how long a shard waits for the others
  bool active() const { return workers > 1; }
};

struct PushOptions {
  RequestId request_id;  // set by callers that retry (the remote client sets its own)
  PushSync sync;         // collections in this process refuse an active one
  // Every id of the push was looked up, creating its rows, by this caller's lookup of the
  // same step: a remote collection skips the round that checks each shard's part before
  // any applies (the lookup passed the same checks there). Leave false when unsure.
  bool after_lookup = false;
  // Check every part as the push would be checked (tables, sizes, finite values, room for
  // the rows it would create) and apply nothing: OK means the push would not be refused
  // for them now (a check, not a reservation: a concurrent push may take the room). A
  // collection that cannot tell room checks the rest; remote ones refuse it (Unimplemented).
  bool check_only = false;
  // Optional: where a collection that knows them puts each part's rows updated (its
  // distinct ids), one per part, once the batch applied; others leave it as it was.
  std::vector<int64_t>* rows_updated = nullptr;
  // The shard map version the push is applied under: a collection that records pushes
  // (RecordedPush) records part i of a push with a request_id as PushTag{request_id, i,
  // map_version}, and answers a part on record with its recorded rows, unapplied.
  uint64_t map_version = 0;
  // Optional: the push's parts as checked where they entered this process (CheckPush, made
  // over the same parts): a collection that sums them scans only the sums of repeated ids.
  const CheckedPush* checked = nullptr;
};

// FailedPrecondition for an active options.sync: what a collection in this process says.
absl::Status RefuseSync(const PushOptions& options);

// Named blobs stored with a checkpoint (the trainer's dense parameters and optimizer state).
using Attachments = std::map<std::string, std::string>;

// Rows of one table as exported or imported (a chunk of them), in parallel arrays.
struct RowBlock {
  int dim = 0;
  int state_floats = 0;  // per row in `state`; 0 when the block carries no optimizer state
  std::vector<int64_t> ids;
  std::vector<float> weights;  // (ids, dim)
  std::vector<float> state;    // (ids, state_floats), or empty
  std::vector<int64_t> last_steps;     // (ids): step of the last update, -1 = never
  std::vector<int64_t> update_counts;  // (ids)
  size_t size() const { return ids.size(); }
  // Adds one row: weights (dim) and, when the block carries state, state (state_floats).
  void Append(int64_t id, const float* w, const float* state, int64_t last_step,
              int64_t update_count) {
    ids.push_back(id);
    weights.insert(weights.end(), w, w + dim);
    if (state_floats > 0) this->state.insert(this->state.end(), state, state + state_floats);
    last_steps.push_back(last_step);
    update_counts.push_back(update_count);
  }
  // Empties it, keeping dim and state_floats.
  void Clear() {
    ids.clear();
    weights.clear();
    state.clear();
    last_steps.clear();
    update_counts.clear();
  }
};

struct ExportOptions {
  int64_t since_step = -1;  // rows updated at or after this step; -1: every stored row
  bool with_state = false;  // include optimizer state (to resume training from an import)
  size_t chunk_rows = 1 << 16;  // rows per block handed to the sink
  // Only the rows of these ids (those stored; a reshard's rows updated during its copy);
  // empty: every row.
  absl::Span<const int64_t> ids;
};

// A model is a namespace of tables: model "ads" owns the tables named "ads.<anything>", and
// its checkpoints hold those tables (and its attachments) only, so jobs that share a
// collection cannot touch each other's rows. Model "" stands for every table (an
// operator's checkpoint of the whole collection). A model name is 1-64 of [A-Za-z0-9_-].
absl::Status ValidateModelName(absl::string_view model);
// True when `table` belongs to `model` ("" owns every table).
bool TableOfModel(absl::string_view table, absl::string_view model);

struct CheckpointOptions {
  std::string model;  // whose checkpoint, of which tables ("" = every table)
  // Replace a complete checkpoint of the same step. For a coordinator whose cluster
  // checkpoint never completed (the shards that finished theirs hold orphans); callers
  // otherwise get AlreadyExists.
  bool replace = false;
};

// "checkpoint 5", or "checkpoint 5 of model 'ads'": how messages name one.
std::string CheckpointName(absl::string_view model, int64_t step);
// "tessera-cli restore --model=ads --step=5" ("--all_models" without a model): the command
// that messages give for restoring one.
std::string RestoreCommand(absl::string_view model, int64_t step);

// What a restore must find in the checkpoint before it changes anything.
struct RestoreOptions {
  std::string model;  // whose checkpoint, and which tables it replaces ("" = every table)
  // Attachments the checkpoint must hold, and ones whose content must equal the value
  // given: otherwise FailedPrecondition, and nothing is restored.
  std::vector<std::string> required_attachments;
  Attachments expected_attachments;
  // Check that the checkpoint exists, passes the checks above and reads whole (every file,
  // its checksums), and restore nothing: OK means a restore of it would not fail for what
  // it holds. A coordinator asks every shard so before any restores.
  bool verify_only = false;
  // With model "": confirms that every model is to be rolled back. A coordinator refuses
  // a whole-cluster restore without it (InvalidArgument), so that one call with no model
  // cannot roll back the other jobs of a shared cluster.
  bool all_models = false;
};

// FailedPrecondition unless `attachments` (of checkpoint `step`) satisfies `options`. When
// both an expected value and the checkpoint's are words of `key=value` (a run's
// signature), they match when every key the checkpoint records has the same value (a key
// it lacks was not recorded when it was written), and the message names each key that
// differs with both values.
absl::Status CheckRestorable(int64_t step, const Attachments& attachments,
                             const RestoreOptions& options);

class Checkpointing;

// A set of named embedding tables, each partitioned over shards by ShardOf(). The
// trainer and tools program against this interface; the in-process implementation
// below holds the shards in this process, and a remote one talks to shard servers, so
// a batch looks the same either way.
//
// Thread safety: implementations are safe for concurrent calls.
class EmbeddingCollection {
 public:
  virtual ~EmbeddingCollection() = default;

  // Creates a table on every shard. AlreadyExists for a taken name, InvalidArgument for
  // a bad config.
  virtual absl::Status CreateTable(const v1::TableConfig& config) = 0;

  // The configs of all tables, sorted by name.
  virtual absl::StatusOr<std::vector<v1::TableConfig>> ListTables() const = 0;

  // Rows of `ids` into `out` (ids.size(), dim). NotFound for an unknown table,
  // InvalidArgument when out's size is not ids.size() * dim.
  virtual absl::Status Lookup(absl::string_view table, absl::Span<const int64_t> ids,
                              absl::Span<float> out, const LookupOptions& options = {}) = 0;

  // Pooled bags of `ids` over CSR `offsets` (bags+1), with optional per-id `weights`
  // (empty or ids.size()), into `out` (bags, dim). InvalidArgument for bad offsets,
  // weights or output size.
  virtual absl::Status PooledLookup(absl::string_view table, absl::Span<const int64_t> ids,
                                    absl::Span<const int32_t> offsets,
                                    absl::Span<const float> weights, v1::Pooling pooling,
                                    absl::Span<float> out, const LookupOptions& options = {}) = 0;

  // Applies gradients (ids.size(), dim); repeated ids are summed and their row updated
  // once. InvalidArgument for a size mismatch or a NaN/Inf value, in which case no row
  // of the table changes.
  virtual absl::Status PushGradients(absl::string_view table, absl::Span<const int64_t> ids,
                                     absl::Span<const float> gradients, int64_t step) = 0;

  // Every table of `tables` in one call (remote collections: one request per shard).
  // Each part as Lookup (no offsets) or PooledLookup would answer it; the first failure is
  // returned, and `out` of the failed and later parts is undefined.
  virtual absl::Status LookupBatch(absl::Span<const TableBags> tables,
                                   const LookupOptions& options = {});

  // Applies every table of `tables`, as PushGradients would, at `step`. Every part is
  // checked (table, sizes, finite values) before any is applied, so InvalidArgument or
  // NotFound changes no row. A failure after that (a shard down) may leave some parts
  // applied: calling again with the same options.request_id completes the push without
  // applying any part twice (where the collection deduplicates: remote ones do).
  virtual absl::Status PushBatch(absl::Span<const TableGradients> tables, int64_t step,
                                 const PushOptions& options = {});
  // PushBatch(push, step, push_options), then LookupBatch(lookups, options): the lookup
  // reads the push applied, and a push refused is returned before anything is looked up.
  // A remote collection sends both in one round trip (FusesPushAndLookup); the rest make
  // the two calls.
  virtual absl::Status PushThenLookup(absl::Span<const TableGradients> push, int64_t step,
                                      const PushOptions& push_options,
                                      absl::Span<const TableBags> lookups,
                                      const LookupOptions& options = {});
  // True when PushThenLookup takes one round trip where the two calls take two.
  virtual bool FusesPushAndLookup() const { return false; }
  // Rows and memory of `table`; NotFound for an unknown table.
  virtual absl::StatusOr<TableUsage> Usage(absl::string_view table) const = 0;

  virtual int num_shards() const = 0;

  // How many times a shard holding this collection's rows was seen to come back with a
  // new incarnation (restarted: its CHECKPOINT tables went back to their newest
  // checkpoint, a memory-only shard to initial rows). Collections in this process never
  // restart: 0.
  virtual int64_t ShardRestarts() const { return 0; }

  // Hands every stored row of `table` (or those updated since options.since_step) to
  // `sink`, options.chunk_rows at a time, in no particular order; a sink error stops the
  // export and is returned. Rows never stored equal their initial weights and are not
  // exported. NotFound for an unknown table.
  virtual absl::Status ExportRows(absl::string_view table, const ExportOptions& options,
                                  const std::function<absl::Status(const RowBlock&)>& sink);
  // Stores `rows` in `table` exactly as given (creating or overwriting them; rows without
  // state get the optimizer's initial state), durable as the table's pushes are.
  // InvalidArgument for a dim or state size that is not the table's or a non-finite
  // value (nothing stored), NotFound for an unknown table.
  virtual absl::Status ImportRows(absl::string_view table, const RowBlock& rows);

  // Puts the optimizer fields that `changes` sets into `table`'s config (AlterOptimizer):
  // its next pushes use them, and collections with storage keep them (their checkpoints
  // too). Returns the config now. NotFound for an unknown table, InvalidArgument for
  // another optimizer type or a bad value (nothing changed); collections that cannot,
  // Unimplemented.
  virtual absl::StatusOr<v1::TableConfig> AlterTable(absl::string_view table,
                                                     const v1::OptimizerConfig& changes);

  // Removes `table` and every row of it. NotFound for an unknown table. Checkpoints that
  // hold it keep it (restoring one brings it back).
  virtual absl::Status DropTable(absl::string_view table) = 0;

  // The collection's checkpoints, when it has storage (a data directory, or servers that
  // have one); null when it has none. It lives as long as the collection.
  virtual Checkpointing* checkpointing() { return nullptr; }
};

// A collection's checkpoints: what a collection with storage offers beside its data and
// admin calls (EmbeddingCollection::checkpointing()). Thread-safe.
class Checkpointing {
 public:
  virtual ~Checkpointing() = default;
  // Writes the tables of options.model ("" = every table), as of now, and `attachments` as
  // that model's checkpoint `step`; callers stop pushing to those tables while it runs (a
  // step barrier). The checkpoint exists once this returns OK. AlreadyExists when the
  // model has a complete checkpoint of that step (one is never overwritten, unless
  // options.replace).
  virtual absl::StatusOr<CheckpointInfo> Checkpoint(int64_t step, const Attachments& attachments,
                                                    const CheckpointOptions& options = {}) = 0;
  // Replaces the tables of options.model with its checkpoint `step` (-1: its newest
  // complete one): tables of the model created since are dropped, dropped ones come back,
  // other tables are untouched. Fills `attachments` (may be null). NotFound when there is
  // no such checkpoint, FailedPrecondition when it fails options' checks (nothing changed).
  virtual absl::StatusOr<CheckpointInfo> Restore(int64_t step, Attachments* attachments,
                                                 const RestoreOptions& options = {}) = 0;
  // Complete checkpoints of every model, oldest (first created) first.
  virtual absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints() const = 0;
};

// `tables`' checkpoints, or FailedPrecondition "this collection has no storage ..." when it
// has none.
absl::StatusOr<Checkpointing*> CheckpointsOf(EmbeddingCollection& tables);

}  // namespace tessera::embedding

#endif  // TESSERA_EMBEDDING_COLLECTION_H_
