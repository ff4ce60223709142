#ifndef TESSERA_SERVER_CLUSTER_H_
#define TESSERA_SERVER_CLUSTER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "client/shard_router.h"
#include "embedding/collection.h"
#include "embedding/storage/coordinator_store.h"

namespace tessera::server {

struct ClusterOptions {
  int32_t max_tables = 1024;  // tables held; creating one more is ResourceExhausted
  // Called at named points, for tests that interleave two operations: "reshard: copied"
  // (a reshard holds the registry's lock, not yet the barrier) and "restore: locked" (a
  // restore holds both). Null in the servers.
  std::function<void(absl::string_view point)> pause;
};

// What a reshard did.
struct ReshardOutcome {
  uint64_t version = 0;    // of the map served now
  int64_t rows_moved = 0;
  int64_t pushes_kept = 0;  // applied pushes handed to the new map's shards
  int64_t rows_caught_up = 0;     // updated during the copy, sent again while serving
  int64_t rows_copied_again = 0;  // updated during the catch-up, sent again while frozen
  double seconds = 0;
  double frozen_seconds = 0;  // pushes held back (freeze to commit)
  std::chrono::steady_clock::time_point frozen_at;
};

// What a restore did to the registry's tables (of its model, or of every model).
struct RestoredTables {
  std::vector<std::string> rolled_back;   // there before and after: rows as checkpointed
  std::vector<std::string> brought_back;  // dropped since the checkpoint, there again
  std::vector<std::string> dropped;       // created since the checkpoint, gone
};

// What the coordinator knows and decides about the cluster: the table registry (durable
// with a CoordinatorStore), the create protocol (recorded first, then created on every
// shard, idempotently), re-provisioning of shards that come back empty, the checkpoint
// barrier (pushes routed here wait while a checkpoint or restore runs) and cluster
// checkpoints (every shard takes its own, then the store writes the manifest that makes
// it exist). CoordinatorService adapts it to the wire. Thread-safe.
class Cluster {
 public:
  // `router` and `store` (null: nothing durable, no checkpoints) must outlive the
  // cluster. Tables recorded in `store` are served at once.
  Cluster(client::ShardRouter* router, uint64_t shard_map_version, const ClusterOptions& options,
          storage::CoordinatorStore* store);
  ~Cluster();

  // Registers `config` and creates it on every shard. The same config again is OK (and
  // completes a create that failed on some shard); AlreadyExists for another config under
  // the name, InvalidArgument for a bad one, ResourceExhausted past max_tables.
  absl::Status CreateTable(const v1::TableConfig& config);
  // Drops `table` on every shard, then from the registry. NotFound when it is not
  // registered.
  absl::Status DropTable(const std::string& table);
  // Alters `table`'s optimizer on every shard, then in the registry (saved). Returns the
  // config now. A change that failed on some shard is completed by repeating it (shards
  // that have it already answer OK); NotFound for an unknown table, InvalidArgument for
  // another type or a bad value (checked before any shard changes).
  absl::StatusOr<v1::TableConfig> AlterTable(const std::string& table,
                                             const v1::OptimizerConfig& changes);
  // Streams every shard's export of request.table() into `sink`, shard after shard.
  absl::Status ExportRows(const v1::ExportRowsRequest& request,
                          const std::function<absl::Status(const v1::RowChunk&)>& sink);
  // Stores `rows` of `table` on the shards that own them.
  absl::Status ImportRows(const std::string& table, const embedding::RowBlock& rows);
  // Every registered table, by name.
  std::vector<v1::TableConfig> Tables() const;
  // The config of `table`, or NotFound.
  absl::StatusOr<v1::TableConfig> Config(const std::string& table) const;
  // The same, as held: never changed in place (a change registers a new one), so that a
  // request's decoder copies it only when it changed (server::ConfigRef).
  absl::StatusOr<std::shared_ptr<const v1::TableConfig>> ConfigOf(const std::string& table) const;

  uint64_t shard_map_version() const { return version_.load(); }
  // Advertise (and route with) another shard-map version from now on.
  void SetShardMapVersion(uint64_t version);
  // The router of the map served now (a reshard replaces it; replaced ones live on).
  const client::ShardRouter& router() const { return *router_.load(); }

  // Moves the cluster to the shards `shards` (in shard order): every old shard is frozen
  // (pushes wait), the rows whose owner changes move with their optimizer state, the
  // pushes the old shards applied go to every new shard (a retry is applied once), map
  // version v+1 is published and the old shards commit to it. Runs alone (at the barrier,
  // no creates meanwhile). A failure before the publish aborts it (nothing changed but
  // copies on the new shards); one after it is finished by repeating the call.
  // InvalidArgument for a bad list, FailedPrecondition for a new shard that is not ready
  // or an old shard holding rows of a table the coordinator does not know (it cannot
  // commit: the reshard is then finished by repeating it once the table is gone).
  absl::StatusOr<ReshardOutcome> Reshard(const std::vector<std::string>& shards);

  // Asks every shard the place it serves (a SETTLE phase, which changes nothing): one that
  // serves this map's version at another place than this map gives it (another shard
  // count or order), or a newer version, is FailedPrecondition naming both and the flags;
  // every request routed by this map would be refused there. Shards that do not answer
  // now are not checked (their health checks see to them).
  absl::Status CheckShardPlaces();

  // Routes a lookup (see ShardRouter::LookupBatch, and its `forward`).
  absl::Status LookupBatch(absl::Span<const v1::TableConfig> configs,
                           absl::Span<const embedding::TableBags> parts, bool read_only,
                           v1::BatchLookupResponse* forward = nullptr);
  // Registers `sync`'s group with every shard (ShardRouter::RegisterSyncGroup).
  absl::Status RegisterSyncGroup(const embedding::PushSync& sync);
  // Routes a push under request `id` (a new one when empty), waiting while a checkpoint
  // or restore runs: all or nothing, as ShardRouter::PushBatch says.
  absl::StatusOr<std::vector<int64_t>> PushBatch(const embedding::CheckedPush& push, int64_t step,
                                                 const embedding::RequestId& id,
                                                 const embedding::PushSync& sync = {},
                                                 bool after_lookup = false);

  // Routes a push and then a lookup in one round trip (ShardRouter::PushThenLookup),
  // waiting while a checkpoint or restore runs, as PushBatch does.
  absl::StatusOr<std::vector<int64_t>> PushThenLookup(const embedding::CheckedPush& push,
                                                      int64_t step, const embedding::RequestId& id,
                                                      bool after_lookup,
                                                      absl::Span<const v1::TableConfig> configs,
                                                      absl::Span<const embedding::TableBags> parts,
                                                      bool read_only,
                                                      v1::BatchLookupResponse* forward = nullptr);

  // Every serving shard's stats of `table` (empty: every table); NotFound for an unknown
  // table.
  absl::StatusOr<std::vector<v1::TableStats>> Stats(const std::string& table);

  // Checkpoint `step` of `model`'s tables ("" = every table) on every shard and its
  // manifest, at the barrier. FailedPrecondition without a store, InvalidArgument for a
  // negative step or a bad model or attachment name, NotFound for a model with no tables,
  // AlreadyExists for a step the model has a checkpoint of.
  absl::StatusOr<storage::CheckpointManifest> Checkpoint(int64_t step,
                                                         const embedding::Attachments& attachments,
                                                         const std::string& model = "");
  // Every shard's tables of options.model back to its checkpoint `step` (-1: the newest),
  // at the barrier; the registry follows (tables of the model created since are gone,
  // dropped ones back). Fills `attachments`. NotFound when there is none,
  // FailedPrecondition (nothing restored) when it fails options' checks.
  // InvalidArgument, with nothing restored, for options.model "" without
  // options.all_models. Fills `outcome` (when given) with the tables it rolled back,
  // brought back and dropped. With options.verify_only: every shard reads the checkpoint
  // whole, nothing changes (and no barrier holds training back); `attachments` filled.
  absl::StatusOr<storage::CheckpointManifest> Restore(int64_t step,
                                                      embedding::Attachments* attachments,
                                                      const embedding::RestoreOptions& options = {},
                                                      RestoredTables* outcome = nullptr);
  // Complete cluster checkpoints, oldest first; FailedPrecondition without a store.
  absl::StatusOr<std::vector<storage::CheckpointManifest>> ListCheckpoints() const;

  // Creates on shard k every registered table it lacks (a shard without a data directory
  // comes back empty); the router calls it when it re-admits shard k.
  void Reprovision(int k);

 private:
  absl::Status NeedStore() const;
  // The registered tables of `model` ("": every table), sorted by name.
  std::vector<std::string> TablesOf(const std::string& model) const;
  // InvalidArgument for a restore of every model that does not say so (options.all_models),
  // naming the models it would roll back.
  absl::Status CheckWholeClusterRestore(const embedding::RestoreOptions& options) const;
  // What restoring `m` does to the registry as it is now.
  RestoredTables RestoreOutcome(const storage::CheckpointManifest& m) const;
  // The durable state with configs_ as they are now.
  v1::CoordinatorState StateLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // After shards restored `m`: the registry's tables of m.model become the checkpoint's
  // (configs as shard 0 holds them, with the whole table's row budget), saved to the store.
  // " (the newest older checkpoint of the model that every shard reads is step N: the
  // command)", each shard having read it whole (verify_only; the newest three older ones
  // are tried), or that there is none, for a message about a checkpoint `m` that cannot be
  // restored.
  std::string OlderCheckpoint(const storage::CheckpointManifest& m) const;
  // The shards' RestoreRequest of checkpoint `m` (with the old shards' directories when it
  // was taken on another map).
  v1::RestoreRequest RestoreRequestOf(const storage::CheckpointManifest& m) const;
  // False for a checkpoint taken on another map that does not record its shards'
  // directories (an older coordinator's): the shards of this map cannot read it.
  bool SourcesRecorded(const storage::CheckpointManifest& m) const;
  // SourcesRecorded, or FailedPrecondition saying why the shards cannot read it.
  absl::Status CheckSourcesRecorded(const storage::CheckpointManifest& m) const;
  // Every shard reads its part of checkpoint `m` whole (verify_only), changing nothing.
  absl::Status ReadOnEveryShard(const storage::CheckpointManifest& m) const;
  absl::Status AdoptRestoredTables(const storage::CheckpointManifest& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(create_mu_);

  // What the router's readmit callback reaches this cluster through: the callback may
  // outlive the cluster, and then finds none. Its mutex is held while Reprovision runs,
  // so the destructor waits for one in flight.
  struct ReadmitTarget {
    absl::Mutex mu;
    Cluster* cluster ABSL_GUARDED_BY(mu) = nullptr;
  };

  // Sets the readmit and restart callbacks of `router` to re-provision its shards.
  void WatchShards(client::ShardRouter* router);
  client::ShardRouter* live() const { return router_.load(); }
  // A published reshard whose old shards did not all commit: what finishing it needs.
  struct UnfinishedReshard {
    client::ShardRouter* old = nullptr;
    v1::ReshardRequest commit;         // applied pushes, version, map size
    std::vector<int32_t> new_index;    // per old shard: its place in the new map, -1 = none
    std::vector<int32_t> only_new;     // places of the new map no old shard takes
  };
  // Commits every old shard of `u` (idempotent); FailedPrecondition naming those that fail.
  absl::Status CommitOldShards(const UnfinishedReshard& u);
  // The reshard's first half, while the old map serves on: every table on every new shard,
  // the old shards told to COPY, and the rows that change owner copied into `next`. Then,
  // at the barrier: the old shards frozen, the rows updated since copied again, and the
  // new shards handed the applied pushes. Abort the old shards on failure; fill *u, *out.
  // u->new_index and u->only_new: where each shard of `old` goes in `next`, and the places
  // of `next` no old shard takes.
  static void PlaceShards(const client::ShardRouter& old, const client::ShardRouter& next,
                          UnfinishedReshard* u);
  // Every shard of `next` given every table of `configs`, those only in `next` emptied
  // first (EmptyNewShard).
  absl::Status ProvisionNewMap(client::ShardRouter* next,
                               const std::vector<v1::TableConfig>& configs,
                               const UnfinishedReshard& u);
  // The COPY phase `copy` on shard k of `next` (a shard no old one is); FailedPrecondition,
  // it aborted, naming the flags it needs, when it serves another map version.
  absl::Status StartCopyOnNewShard(client::ShardRouter* next, int k,
                                   const v1::ReshardRequest& copy);
  // Drops every table shard k of `next` (a shard no old one is) holds: it joins empty.
  absl::Status EmptyNewShard(client::ShardRouter* next, int k);
  absl::Status PrepareReshard(client::ShardRouter* next, UnfinishedReshard* u,
                              ReshardOutcome* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(create_mu_);
  absl::Status FreezeAndCatchUp(client::ShardRouter* next, UnfinishedReshard* u,
                                ReshardOutcome* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(barrier_mu_);
  void AbortReshard(const UnfinishedReshard& u, int frozen);
  // Copies into `next` the rows of every table that leave each old shard j: all of them
  // (changed[j] -1), none (0), or those changed in the round it ended (> 0); adds them to
  // *moved; aborts on failure.
  absl::Status MoveRows(client::ShardRouter* next, const std::vector<v1::TableConfig>& configs,
                        const UnfinishedReshard& u, const std::vector<int64_t>& changed,
                        int64_t* moved);

  std::atomic<client::ShardRouter*> router_;
  std::vector<std::unique_ptr<client::ShardRouter>> routers_ ABSL_GUARDED_BY(create_mu_);
  std::unique_ptr<UnfinishedReshard> unfinished_ ABSL_GUARDED_BY(create_mu_);
  std::chrono::steady_clock::time_point frozen_until_;  // the last reshard's commits answered
  std::atomic<uint64_t> version_;
  const ClusterOptions options_;
  storage::CoordinatorStore* store_;
  mutable absl::Mutex mu_;
  // Lock order: create_mu_, then barrier_mu_, then mu_ (a reshard holds the first two, a
  // restore all three; taking them the other way round once hung the coordinator).
  absl::Mutex create_mu_ ABSL_ACQUIRED_BEFORE(barrier_mu_);  // one CreateTable (or
                                                             // re-provisioning) at a time
  absl::Mutex barrier_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // shared: routed pushes; exclusive:
                                                     // checkpoint and restore
  std::map<std::string, std::shared_ptr<const v1::TableConfig>> configs_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<ReadmitTarget> readmit_target_;
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_CLUSTER_H_
