#ifndef TESSERA_CLIENT_EMBEDDING_CLIENT_H_
#define TESSERA_CLIENT_EMBEDDING_CLIENT_H_

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "client/channel_policy.h"
#include "client/object_pool.h"
#include "client/reconnecting_stub.h"
#include "client/shard_router.h"
#include "embedding/collection.h"
#include "embedding/table_config.h"
#include "tessera/v1/embedding_service.grpc.pb.h"
#include "wire/grpc_status.h"

namespace tessera::client {

struct ClientOptions {
  // kCoordinator sends everything to the coordinator; kSmart fetches the shard map and
  // talks to the shards directly on the hot path (one hop instead of two).
  enum class Mode { kCoordinator, kSmart };
  Mode mode = Mode::kCoordinator;
  std::chrono::milliseconds deadline{10000};                      // per call
  RetryPolicy retry;  // of calls that find a server UNAVAILABLE (8, 50 ms doubling to 1 s)
  std::chrono::milliseconds checkpoint_deadline = kCheckpointDeadline;  // Checkpoint and Restore
  int max_message_bytes = kMaxMessageBytes;                       // gRPC send/receive limit
  wire::ClientSecurity security;  // TLS and token for the coordinator and the shards
  // Connect waits up to `deadline` for the coordinator to come up (a job started beside its
  // cluster); false: its first call fails at once when it is not there (a command line tool).
  bool wait_for_coordinator = true;
  // Smart mode: runs a batch's per-table work (deduplication, placing on shards, merging
  // answers) a table to a thread; null: the calling thread.
  std::shared_ptr<base::ThreadPool> pool;
};

// The remote EmbeddingCollection: the trainer and tools use it exactly like the in-process
// one. Calls that fail with UNAVAILABLE are retried with exponential backoff; in smart
// mode a FAILED_PRECONDITION (stale shard map) refreshes the map and retries once.
// Thread-safe.
class EmbeddingClient final : public embedding::EmbeddingCollection,
                              public embedding::Checkpointing {
 public:
  // Connects to the coordinator at `address` (host:port) and, in smart mode, fetches the
  // shard map. UNAVAILABLE when the coordinator cannot be reached within the deadline.
  static absl::StatusOr<std::unique_ptr<EmbeddingClient>> Connect(const std::string& address,
                                                                  const ClientOptions& options);

  absl::Status CreateTable(const v1::TableConfig& config) override;
  absl::StatusOr<std::vector<v1::TableConfig>> ListTables() const override;
  // The config of `table`, as this client last listed it (listed again when it has none);
  // NotFound naming it when the cluster has no such table.
  absl::StatusOr<v1::TableConfig> Config(absl::string_view table) const;
  absl::Status Lookup(absl::string_view table, absl::Span<const int64_t> ids, absl::Span<float> out,
                      const embedding::LookupOptions& options) override;
  absl::Status PooledLookup(absl::string_view table, absl::Span<const int64_t> ids,
                            absl::Span<const int32_t> offsets, absl::Span<const float> weights,
                            v1::Pooling pooling, absl::Span<float> out,
                            const embedding::LookupOptions& options) override;
  absl::Status PushGradients(absl::string_view table, absl::Span<const int64_t> ids,
                             absl::Span<const float> gradients, int64_t step) override;
  // One request per shard (smart mode) or one to the coordinator for every table.
  absl::Status LookupBatch(absl::Span<const embedding::TableBags> tables,
                           const embedding::LookupOptions& options = {}) override;
  // Every push carries a request id (options.request_id, or a new one of this client's)
  // and is retried with it, so a retry never applies a part twice.
  absl::Status PushBatch(absl::Span<const embedding::TableGradients> tables, int64_t step,
                         const embedding::PushOptions& options = {}) override;
  // The push rides on the lookup (BatchLookupRequest.push): one round trip per shard (smart
  // mode) or one to the coordinator, retried whole under the push's one request id. A sync
  // group's push or a check round goes as two calls.
  absl::Status PushThenLookup(absl::Span<const embedding::TableGradients> push, int64_t step,
                              const embedding::PushOptions& push_options,
                              absl::Span<const embedding::TableBags> lookups,
                              const embedding::LookupOptions& options = {}) override;
  bool FusesPushAndLookup() const override { return true; }
  absl::StatusOr<embedding::TableUsage> Usage(absl::string_view table) const override;
  int num_shards() const override;
  // Smart mode: the shards' incarnations as the router sees them; coordinator mode: the
  // coordinator's digest of them.
  int64_t ShardRestarts() const override;
  // A fresh request id of this client's (random client id, next sequence), for callers
  // that want to repeat a push themselves after a failure.
  embedding::RequestId NextRequestId();
  // Through the coordinator, shard after shard (not the hot path).
  absl::Status ExportRows(absl::string_view table, const embedding::ExportOptions& options,
                          const std::function<absl::Status(const embedding::RowBlock&)>& sink)
      override;
  absl::Status ImportRows(absl::string_view table, const embedding::RowBlock& rows) override;
  // Drops the table on every shard and from the coordinator's registry.
  absl::Status DropTable(absl::string_view table) override;
  absl::StatusOr<v1::TableConfig> AlterTable(absl::string_view table,
                                             const v1::OptimizerConfig& changes) override;
  // Cluster checkpoints through the coordinator (which needs a --data_dir).
  embedding::Checkpointing* checkpointing() override { return this; }
  absl::StatusOr<embedding::CheckpointInfo> Checkpoint(
      int64_t step, const embedding::Attachments& attachments,
      const embedding::CheckpointOptions& options = {}) override;
  absl::StatusOr<embedding::CheckpointInfo> Restore(
      int64_t step, embedding::Attachments* attachments,
      const embedding::RestoreOptions& options = {}) override;
  absl::StatusOr<std::vector<embedding::CheckpointInfo>> ListCheckpoints() const override;
  // Restore, answering also what it did to each table: rolled back, brought back, dropped.
  absl::StatusOr<v1::RestoreResponse> RestoreTables(int64_t step,
                                                    const embedding::RestoreOptions& options);

  // An operator's calls (tessera-cli). Per-shard statistics of `table` ("": every table)
  // and the cluster's checkpoints; the shard map; a move of the cluster onto `shards` (the
  // new map, in shard order) while it trains on, sent once (never retried).
  absl::StatusOr<v1::StatsResponse> Stats(absl::string_view table) const;
  absl::StatusOr<v1::ShardMap> ShardMap() const;
  absl::StatusOr<v1::ReshardClusterResponse> Reshard(const std::vector<std::string>& shards);

  // The coordinator's rendezvous store (data-parallel trainers): sets `key`; returns the
  // values of `keys` once all exist (DeadlineExceeded after `timeout`, naming those
  // missing); adds to a counter and returns its new value.
  absl::Status StoreSet(const std::string& key, const std::string& value);
  absl::StatusOr<std::vector<std::string>> StoreGet(const std::vector<std::string>& keys,
                                                    std::chrono::milliseconds timeout);
  absl::StatusOr<int64_t> StoreAdd(const std::string& key, int64_t delta);

 private:
  EmbeddingClient(const std::string& address, grpc::ChannelArguments args,
                  std::shared_ptr<grpc::ChannelCredentials> credentials,
                  const ClientOptions& options);

  std::unique_ptr<grpc::ClientContext> NewContext() const { return NewContext(options_.deadline); }
  std::unique_ptr<grpc::ClientContext> NewContext(std::chrono::milliseconds deadline) const;
  // A call's configs, one per table it names, kept from the calling thread's last call
  // where they are the same: `held[i]` is the cache's config that configs[i] copies
  // (embedding::SetConfigSlot; cached configs are never changed in place).
  struct ConfigSlots {
    std::vector<v1::TableConfig> configs;
    std::vector<embedding::ConfigRef> held;
  };
  // The configs of `tables` (in `slots`), each checked to be looked up as it is shaped.
  absl::StatusOr<absl::Span<const v1::TableConfig>> CheckedLookups(
      absl::Span<const embedding::TableBags> tables, ConfigSlots* slots) const;
  // Runs `call` until it succeeds, fails with a code retrying cannot fix, or retries run out.
  absl::Status WithRetries(const std::function<absl::Status()>& call) const;
  // One unary call of the coordinator's service, through WithRetries (`resp` cleared before
  // each attempt).
  template <typename Request, typename Response>
  absl::Status CallCoordinator(grpc::Status (v1::Coordinator::Stub::*method)(grpc::ClientContext*,
                                                                             const Request&,
                                                                             Response*),
                               const Request& req, Response* resp,
                               std::chrono::milliseconds deadline) const {
    return WithRetries([&] {
      resp->Clear();
      auto ctx = NewContext(deadline);
      return wire::FromGrpcStatus((coordinator_.Get().get()->*method)(ctx.get(), req, resp));
    });
  }
  template <typename Request, typename Response>
  absl::Status CallCoordinator(grpc::Status (v1::Coordinator::Stub::*method)(grpc::ClientContext*,
                                                                             const Request&,
                                                                             Response*),
                               const Request& req, Response* resp) const {
    return CallCoordinator(method, req, resp, options_.deadline);
  }
  absl::Status RefreshShardMap();
  // Coordinator mode: registers `sync`'s group with the coordinator unless this client did
  // already (or `again`: after a push of it was refused FAILED_PRECONDITION).
  absl::Status RegisterSyncGroup(const embedding::PushSync& sync, bool again);
  // A shard answered with a new incarnation (smart mode): asks the coordinator to create
  // again, on every shard that lacks them, the tables of its registry (a memory-only shard
  // that restarted is empty). Failures are logged; the caller's call reports its own.
  void ReprovisionThroughCoordinator();
  // Smart mode: runs `call` on the current router (which retries failed shards itself),
  // again once on a fresh router after a stale shard map.
  absl::Status OnShards(const std::function<absl::Status(ShardRouter&)>& call);
  // The configs of `tables`' tables, in order, in `slots`.
  template <typename Part>
  absl::StatusOr<absl::Span<const v1::TableConfig>> Configs(absl::Span<const Part> tables,
                                                            ConfigSlots* slots) const;
  // Config() as the cache holds it.
  absl::StatusOr<std::shared_ptr<const v1::TableConfig>> ConfigOf(absl::string_view table) const;
  // Coordinator-mode lookup messages, reused between calls (see ObjectPool).
  struct LookupMessages {
    v1::BatchLookupRequest request;
    v1::BatchLookupResponse response;
  };

  ClientOptions options_;
  mutable ReconnectingStub<v1::Coordinator> coordinator_;
  mutable absl::Mutex mu_;
  mutable std::map<std::string, std::shared_ptr<const v1::TableConfig>, std::less<>> configs_
      ABSL_GUARDED_BY(mu_);
  std::shared_ptr<ShardRouter> router_ ABSL_GUARDED_BY(mu_);  // smart mode
  int num_shards_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t retired_router_restarts_ ABSL_GUARDED_BY(mu_) = 0;  // of routers replaced
  // Coordinator mode: the sync groups registered, job -> workers.
  std::map<std::string, int> sync_groups_ ABSL_GUARDED_BY(mu_);
  // Coordinator mode: its last incarnation digest (of the shards of map `map_version`),
  // and how often it changed under one map.
  void NoteCoordinatorDigest(uint64_t digest, uint64_t map_version);
  std::atomic<uint64_t> digest_{0};
  std::atomic<uint64_t> map_version_{0};
  std::atomic<int64_t> coordinator_restarts_{0};
  const uint64_t client_id_;  // of this client's request ids: random
  std::atomic<uint64_t> next_sequence_{1};
  ObjectPool<LookupMessages> lookup_messages_{[] { return std::make_unique<LookupMessages>(); }};
};

}  // namespace tessera::client

#endif  // TESSERA_CLIENT_EMBEDDING_CLIENT_H_
