#ifndef TESSERA_CLIENT_SHARD_ROUTER_H_
#define TESSERA_CLIENT_SHARD_ROUTER_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"
#include "client/channel_policy.h"
#include "client/object_pool.h"
#include "client/reconnecting_stub.h"
#include "embedding/collection.h"
#include "tessera/v1/embedding_service.grpc.pb.h"
#include "wire/security.h"

namespace tessera::client {

// How long one checkpoint, restore or export may take: the deadline every caller gives
// them (the clients, the router's calls to shards, the CLI; Python's _CHECKPOINT_TIMEOUT).
inline constexpr std::chrono::milliseconds kCheckpointDeadline = std::chrono::minutes(30);

struct RouterOptions {
  std::chrono::milliseconds deadline{10000};  // per shard call
  int max_message_bytes = kMaxMessageBytes;   // gRPC send/receive limit per channel
  uint64_t shard_map_version = 1;             // stamped on every shard request
  std::chrono::milliseconds checkpoint_deadline =
      kCheckpointDeadline;  // per shard checkpoint/restore
  // Interval of gRPC health checks of every shard; 0 = none. A shard failing two checks in
  // a row is down: calls needing it fail at once with UNAVAILABLE naming it, until a
  // check passes again and it is re-admitted.
  std::chrono::milliseconds health_check_interval{0};
  wire::ClientSecurity security;  // TLS and token for every shard call (default: plaintext, none)
  // Retries of a shard call that failed with UNAVAILABLE or DEADLINE_EXCEEDED: only that
  // shard's part is sent again (pushes with the same request id, so none applies twice).
  // None unless its owner says (the coordinator: --shard_retries; a client: its own).
  RetryPolicy retry = RetryPolicy::None();
  // Runs a batch's per-table planning and merging a table to a thread (the results do not
  // depend on its size); null: the calling thread does it all.
  std::shared_ptr<base::ThreadPool> pool;
};

// A stub of the shard at `address`, on a channel with `security` (TLS, token) and the
// message limit `max_message_bytes`: the router's, and a serving replica's.
std::unique_ptr<ReconnectingStub<v1::EmbeddingShard>> NewShardStub(
    const std::string& address, const wire::ClientSecurity& security, int max_message_bytes);

// The grpc::Status of a shard call as an absl::Status naming the shard.
absl::Status FromShardStatus(const grpc::Status& status, int shard, const std::string& address);

// Talks to every shard of a shard map: deduplicates a batch, splits it by ShardOf(),
// sends each shard one request carrying its part of every table of the batch, calls the
// shards in parallel and merges their answers in the caller's order. A pooled table whose
// bags hold more ids than it has distinct ids has its bags pooled on the shards (each
// sends its partial sums); otherwise the shards send each distinct row once and the
// router pools them, exactly as the in-process collection does. Shards that fail with a
// transient code are retried alone. Used by the coordinator and by the smart client.
// Thread-safe.
class ShardRouter {
 public:
  ShardRouter(std::vector<std::string> addresses, const RouterOptions& options);
  ~ShardRouter();

  int num_shards() const { return static_cast<int>(addresses_.size()); }
  // The shard-map version stamped on requests from now on.
  void set_shard_map_version(uint64_t version) { version_.store(version); }
  uint64_t shard_map_version() const { return version_.load(); }
  const std::vector<std::string>& addresses() const { return addresses_; }

  // Whether shard k passes its health checks (always true without health checking).
  bool serving(int k) const { return serving_[k].load(std::memory_order_relaxed); }

  // Called (on the health-check thread) with the index of a shard that passes its health
  // checks again after failing them; set before the shard can fail. The coordinator
  // re-creates the tables such a shard lacks.
  void SetReadmitCallback(std::function<void(int shard)> callback) {
    absl::MutexLock lock(&monitor_mu_);
    on_readmit_ = std::move(callback);
  }

  // Called with the index of a shard whose answer to a lookup or push carries a new
  // incarnation (it restarted), before the part it refused as NOT_FOUND is sent again
  // (once): a memory-only shard that came back too fast for the health checks to see it
  // down has lost its tables, and the callback re-creates them (the coordinator from its
  // registry, the smart client through the coordinator). Runs on the calling thread.
  void SetRestartCallback(std::function<void(int shard)> callback) {
    absl::MutexLock lock(&monitor_mu_);
    on_restart_ = std::move(callback);
  }

  // Alters `table`'s optimizer on every shard (idempotent: the same change again is OK).
  absl::Status AlterTable(const std::string& table, const v1::OptimizerConfig& changes);

  // Creates `config` on shard k alone (idempotent).
  absl::Status CreateTableOn(int k, const v1::TableConfig& config);
  // Drops `table` on shard k alone (a table it lacks counts as dropped).
  absl::Status DropTableOn(int k, const std::string& table);

  // One phase of a reshard on shard k (ReshardRequest), under the checkpoint deadline.
  absl::StatusOr<v1::ReshardResponse> ReshardOn(int k, const v1::ReshardRequest& request);

  const RouterOptions& options() const { return options_; }

  // Streams shard k's export of `request` into `sink` (one chunk at a time).
  absl::Status ExportFrom(int k, const v1::ExportRowsRequest& request,
                          const std::function<absl::Status(const v1::RowChunk&)>& sink);
  // Stores `rows` of table `config` on the shards that own them, in parallel, retrying
  // shards that fail UNAVAILABLE (an import is safe to repeat). `rows` must have passed
  // embedding::CheckRowBlock (its arrays are split by row as they are).
  absl::Status ImportRows(const v1::TableConfig& config, const embedding::RowBlock& rows);

  // The tables shard k holds (its own configs: max_rows is its part of the budget).
  absl::StatusOr<std::vector<v1::TableConfig>> ListTablesOn(int k);

  // Drops `table` on every shard, in parallel, retrying shards that fail UNAVAILABLE; a
  // shard that lacks it counts as done. The first other failure names its shard.
  absl::Status DropTable(const std::string& table);

  // Makes every shard channel stuck in failure dial again (see ReconnectingStub); calls
  // that fail with UNAVAILABLE do this for their shard themselves.
  void Reconnect() const;

  // Creates `config` on every shard (an idempotent call: the same config again is OK).
  // The first failure is returned.
  absl::Status CreateTable(const v1::TableConfig& config);

  // Looks up every part of `parts` (part i of table configs[i]) as
  // EmbeddingCollection::LookupBatch would. Offsets and weights must have been validated
  // and each part's `out` sized for its answer. With `forward` (one TableValues per part,
  // dim and rows set: a coordinator's answer), the shards' answers are moved into it as
  // they came (TableValues.shard_values, row_of_ids) for the caller's client to merge,
  // and no part's `out` is written.
  absl::Status LookupBatch(absl::Span<const v1::TableConfig> configs,
                           absl::Span<const embedding::TableBags> parts, bool read_only,
                           v1::BatchLookupResponse* forward = nullptr);

  // Sums repeated ids of each part of `push` (checked where it entered this process), checks
  // those sums finite and ids in a fixed vocabulary's range (the whole batch is refused
  // before any shard is called), then pushes each shard its rows of every part under
  // request id `id` (one of the router's own when empty). Returns the distinct
  // rows updated per part. A push spanning shards is one unit: each shard checks its part
  // first (BatchPushRequest.check_only), and a refusal there changes no row anywhere,
  // unless `after_lookup` says a lookup of the same ids by this caller did so in this step.
  // A failure after that (a shard down) may leave some shards applied: the error names
  // them and the request id, and calling again with the same id applies only the rest.
  // With an active `sync` every shard gets a push (empty where the worker has no rows of
  // it), and the call waits for the other workers'.
  absl::StatusOr<std::vector<int64_t>> PushBatch(const embedding::CheckedPush& push, int64_t step,
                                                 const embedding::RequestId& id,
                                                 const embedding::PushSync& sync = {},
                                                 bool after_lookup = false);

  // PushBatch of `push` (after_lookup, no sync group) and then LookupBatch of `parts`, in
  // one request per shard: each shard applies its part of the push, then answers its part
  // of the lookup (BatchLookupRequest.push), so the lookup reads the push applied. A push
  // spanning shards that is not `after_lookup` needs its check round first: it is sent
  // alone, then the lookup. Failures as PushBatch's (naming the shards that applied the
  // push); then LookupBatch's. Returns the distinct rows updated per push part.
  absl::StatusOr<std::vector<int64_t>> PushThenLookup(const embedding::CheckedPush& push,
                                                      int64_t step, const embedding::RequestId& id,
                                                      bool after_lookup,
                                                      absl::Span<const v1::TableConfig> configs,
                                                      absl::Span<const embedding::TableBags> parts,
                                                      bool read_only,
                                                      v1::BatchLookupResponse* forward = nullptr);

  // Registers `sync`'s group (its job and worker count) with the shards of `shards` (every
  // shard when empty) that this router has not registered it with, or with each of them
  // again when `again`. PushBatch calls it before a sync push, and again for a shard that
  // refuses one FAILED_PRECONDITION (it restarted, or joined in a reshard).
  absl::Status RegisterSyncGroup(const embedding::PushSync& sync, std::vector<bool> shards = {},
                                 bool again = false);

  // A fresh request id of this router's (random client id, next sequence).
  embedding::RequestId NextRequestId();

  // Every shard takes (or restores) the checkpoint `request` names, in parallel; each
  // shard's result in shard order. The first failure names its shard.
  absl::StatusOr<std::vector<v1::CheckpointInfo>> CheckpointShards(
      const v1::CheckpointRequest& request);
  absl::StatusOr<std::vector<v1::CheckpointInfo>> RestoreShards(const v1::RestoreRequest& request);

  // Shards seen to come back with a new incarnation (a restart: their CHECKPOINT tables
  // went back to their checkpoint, memory-only shards to initial rows), since this router
  // first heard from each.
  int64_t restarts() const { return restarts_.load(); }
  // Calls to a shard sent again after a transient failure (each retry of each shard).
  int64_t retries() const { return retries_.load(); }
  // A digest of every shard's incarnation, 0 until each has answered once; it changes when
  // any shard restarts. The coordinator sends it with its answers.
  uint64_t IncarnationDigest() const;

  // Every serving shard's stats of `table` (empty: every table); shards failing their
  // health checks are left out.
  absl::StatusOr<std::vector<v1::TableStats>> Stats(const std::string& table);

 private:
  // One table of a batch, as the router split it.
  struct PartPlan {
    std::vector<int64_t> unique;
    std::vector<int32_t> inverse;
    std::vector<int32_t> shard_of;       // per unique id (or per id when the shards pool)
    std::vector<int32_t> slot;           // per unique id: its place in its shard's part
    std::vector<int32_t> count;          // per shard: unique ids it holds
    std::vector<float> rows;             // (unique, dim) gathered from the answers
    std::vector<const char*> values_in;  // per shard: this part's rows in its answer
    bool shard_pools = false;
  };
  // Per-call buffers, kept between calls so that large batches do not allocate (and
  // page-fault) their request and response buffers afresh every time.
  struct Scratch {
    std::vector<PartPlan> parts;
    std::vector<int32_t> part_index;  // (shards, parts): the part's place in the request, or -1
    std::vector<int64_t*> ids_out;    // (shards, parts): the part's ids in shard k's request
    std::vector<float*> grads_out;    // (shards, parts): its gradients there (pushes)
    std::vector<v1::BatchLookupRequest> lookups;
    std::vector<v1::BatchLookupResponse> lookup_responses;
    std::vector<v1::BatchPushRequest> pushes;
    std::vector<v1::BatchPushResponse> push_responses;
  };
  // Deduplicates `ids` into plan->unique / inverse (or takes them as they are when
  // `distinct`: the ids of a lookup's IdPlan) and places each unique id on its shard:
  // shard_of, slot and count.
  void Place(const v1::TableConfig& config, absl::Span<const int64_t> ids, bool distinct,
             PartPlan* plan) const;
  // Hands the part's distinct ids and inverse to the caller's IdPlan, when it gave one.
  void FillIdPlan(const PartPlan& plan, const v1::TableConfig& config,
                  const embedding::TableBags& part) const;

  // A lookup's requests in s.lookups (*work: the shards that have a part), its answers
  // sent and merged into the parts' `out`.
  absl::Status PlanLookup(Scratch& s, absl::Span<const v1::TableConfig> configs,
                          absl::Span<const embedding::TableBags> parts, bool read_only,
                          std::vector<bool>* work);
  std::vector<grpc::Status> SendLookups(Scratch& s, const std::vector<bool>& work);
  absl::Status MergeLookup(Scratch& s, absl::Span<const v1::TableConfig> configs,
                           absl::Span<const embedding::TableBags> parts,
                           v1::BatchLookupResponse* forward);
  // A push's requests in s.pushes (*work: the shards that take part), checked; then sent
  // (with a check round where PushBatch says), the rows updated per part.
  absl::Status PlanPush(Scratch& s, const embedding::CheckedPush& push, int64_t step,
                        const embedding::RequestId& id, const embedding::PushSync& sync,
                        std::vector<bool>* work);
  absl::StatusOr<std::vector<int64_t>> SendPush(Scratch& s, const embedding::CheckedPush& push,
                                                const embedding::RequestId& id,
                                                const embedding::PushSync& sync, bool after_lookup,
                                                std::vector<bool>* work);
  // LookupBatch's stages. Part p of a batch goes into the shards' requests either as its
  // unique ids (each shard answers rows) or, for bags of many ids, as each shard's share
  // of every bag (each shard answers pooled partial sums); `work[k]`: shard k has a part.
  void AddUniqueIds(Scratch& s, size_t p, const v1::TableConfig& config, std::vector<bool>& work);
  // PushBatch's stages: part p's tables in the shards' requests (ids and gradient rows
  // sized, the pointers in s.ids_out and s.grads_out), then filled: ids in place, each id's
  // gradients summed into its row in the caller's order, the sums of repeated ids checked.
  void AddPushPart(Scratch& s, size_t p, const v1::TableConfig& config, std::vector<bool>& work);
  absl::Status FillPushPart(Scratch& s, size_t p, const v1::TableConfig& config,
                            const embedding::TableGradients& part) const;
  // A sync group's push: `send` (to the shards of *work) once the group is registered,
  // and again to the shards that refused it FAILED_PRECONDITION (they lost the group),
  // registered again. Every shard's status; the registration's failure.
  absl::StatusOr<std::vector<grpc::Status>> SendInSyncGroup(
      const embedding::PushSync& sync, std::vector<bool>* work,
      const std::function<std::vector<grpc::Status>()>& send);
  // OK when every shard of `work` answered OK; else the first failure, naming its shard.
  absl::Status FirstFailure(const std::vector<grpc::Status>& statuses,
                            const std::vector<bool>& work) const;
  // OK when every shard of `work` applied push `id`; else the first failure, naming the
  // shards that applied it (when any) and how to complete it.
  absl::Status PushOutcome(const std::vector<grpc::Status>& statuses, const std::vector<bool>& work,
                           const embedding::RequestId& id) const;
  // A push's ids before anything is sent: in a fixed vocabulary's range. InvalidArgument
  // names the table.
  static absl::Status CheckPushIds(const embedding::CheckedPush& push);
  // Rows updated per part, summed over the shards' answers in `s`.
  absl::StatusOr<std::vector<int64_t>> RowsUpdated(const Scratch& s,
                                                   absl::Span<const v1::TableConfig> configs) const;
  // The pool of options_ for a batch of `ids` ids in all, or the calling thread alone
  // (no pool, or a batch below kParallelIds).
  base::ThreadPool& Pool(size_t ids) const;
  // Below this many ids a batch's tables take less time than waking threads for them (a
  // batch of 256 samples of 26 features: 6,656): its tables stay on the calling thread.
  static constexpr size_t kParallelIds = 16384;
  void AddShardBags(Scratch& s, size_t p, const v1::TableConfig& config,
                    const embedding::TableBags& part, std::vector<bool>& work);
  // Shard k's answer for part p, checked to hold `rows` rows of `dim`.
  absl::StatusOr<const char*> LookupAnswer(const Scratch& s, int k, size_t p, size_t num_parts,
                                           size_t rows, const v1::TableConfig& config) const;
  // Part p's output from the answers: the shards' partial sums added (and divided for
  // MEAN), or the unique rows gathered, then copied or pooled into part.out.
  absl::Status MergeShardBags(const Scratch& s, size_t p, size_t num_parts,
                              const v1::TableConfig& config, const embedding::TableBags& part);
  absl::Status MergeUniqueRows(Scratch& s, size_t p, size_t num_parts,
                               const v1::TableConfig& config, const embedding::TableBags& part);
  // Part p's answers moved into `answer` as they came (LookupBatch's `forward`).
  absl::Status ForwardAnswers(Scratch& s, size_t p, size_t num_parts, const v1::TableConfig& config,
                              const embedding::TableBags& part, v1::TableValues* answer);

  std::unique_ptr<grpc::ClientContext> NewContext(std::chrono::milliseconds deadline) const;
  std::unique_ptr<grpc::ClientContext> NewContext() const { return NewContext(options_.deadline); }
  // Starts the call `prepare(k, context, queue)` for every shard with `has_work(k)`, all in
  // flight together, and returns each shard's status once all have answered, with its
  // answer in (*responses)[k]. The calling thread drives the completion queue itself, so
  // no other thread has to wake it.
  // Sets in *restarted (when given, num_shards() long) the incarnation of each shard whose
  // answer came from a new one, or from one whose tables were not made again yet (another
  // call may have heard of the restart first); 0 for the others.
  template <typename Response, typename Prepare>
  std::vector<grpc::Status> CallShards(const std::function<bool(int)>& has_work,
                                       const Prepare& prepare, std::vector<Response>* responses,
                                       std::chrono::milliseconds deadline,
                                       std::vector<uint64_t>* restarted = nullptr) const;
  template <typename Response, typename Prepare>
  std::vector<grpc::Status> CallShards(const std::function<bool(int)>& has_work,
                                       const Prepare& prepare,
                                       std::vector<Response>* responses) const {
    return CallShards(has_work, prepare, responses, options_.deadline);
  }

  // A stub's method that starts a unary call (PrepareAsyncCreateTable, ...).
  template <typename Request, typename Response>
  using StartCall = std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> (
      v1::EmbeddingShard::Stub::*)(grpc::ClientContext*, const Request&, grpc::CompletionQueue*);
  // Sends `request` to every shard through `start` (transient failures retried); the first
  // shard's failure, a failure with code `also_done` counting as done there.
  template <typename Request, typename Response>
  absl::Status SendToEveryShard(const Request& request, StartCall<Request, Response> start,
                                grpc::StatusCode also_done = grpc::StatusCode::OK) const;

  // CallShards for the shards with `work`, again for those that failed with a transient
  // code (up to max_retries, with backoff), the others' answers kept. A shard already
  // marked down by the health checks when the call starts fails at once, unretried (one
  // that goes down during the retries is retried on: it may be a restart). With
  // `reprovision`, a shard that answers NOT_FOUND from a new incarnation, or from one whose
  // tables were not made again yet, gets the restart callback and is called again once (only the
  // data path asks: the callback creates tables, and must not run under a caller that holds the
  // coordinator's create lock).
  template <typename Response, typename Prepare>
  std::vector<grpc::Status> CallShardsWithRetries(std::vector<bool> work, const Prepare& prepare,
                                                  std::vector<Response>* responses,
                                                  std::chrono::milliseconds deadline,
                                                  bool reprovision = false) const;

  std::vector<std::string> addresses_;
  RouterOptions options_;
  const uint64_t client_id_;  // of the request ids this router makes up
  std::atomic<uint64_t> next_sequence_{1};
  std::atomic<uint64_t> version_;
  std::vector<std::unique_ptr<ReconnectingStub<v1::EmbeddingShard>>> stubs_;
  std::unique_ptr<std::atomic<bool>[]> serving_;
  // Records shard k's incarnation from one of its answers (0: none sent); true when it
  // differs from the one heard before (the shard restarted).
  // `storage`: the answer's wire::kStorageMetadata ("": not said).
  bool NoteIncarnation(int k, uint64_t incarnation, absl::string_view storage = "") const;
  // Runs the restart callback for shard k, if one is set.
  void ShardRestarted(int k) const;
  std::unique_ptr<std::atomic<uint64_t>[]> incarnations_;  // per shard, 0 = not heard yet
  // Per shard: the incarnation that holds this router's tables (the first heard, or one
  // whose tables the restart callback made again); 0 = not heard yet.
  std::unique_ptr<std::atomic<uint64_t>[]> provisioned_;
  mutable std::atomic<int64_t> restarts_{0};
  mutable std::atomic<int64_t> retries_{0};
  // Health checking (options_.health_check_interval > 0).
  void MonitorHealth();
  mutable absl::Mutex monitor_mu_;
  bool stop_monitor_ ABSL_GUARDED_BY(monitor_mu_) = false;
  std::function<void(int)> on_readmit_ ABSL_GUARDED_BY(monitor_mu_);
  std::function<void(int)> on_restart_ ABSL_GUARDED_BY(monitor_mu_);
  std::thread monitor_;
  mutable ObjectPool<Scratch> scratch_;
  absl::Mutex groups_mu_;
  // Sync groups registered, by job: the worker count each shard has (0: none).
  std::map<std::string, std::vector<int>> registered_ ABSL_GUARDED_BY(groups_mu_);
};

}  // namespace tessera::client

#endif  // TESSERA_CLIENT_SHARD_ROUTER_H_
