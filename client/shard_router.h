#ifndef TESSERA_CLIENT_SHARD_ROUTER_H_
#define TESSERA_CLIENT_SHARD_ROUTER_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "client/object_pool.h"
#include "client/reconnecting_stub.h"
#include "client/security.h"
#include "tessera/v1/embedding_service.grpc.pb.h"

namespace tessera::client {

struct RouterOptions {
  std::chrono::milliseconds deadline{10000};  // per shard call
  int max_message_bytes = 256 << 20;          // gRPC send/receive limit per channel
  uint64_t shard_map_version = 1;             // stamped on every shard request
  std::chrono::milliseconds checkpoint_deadline{30 * 60 * 1000};  // per shard checkpoint/restore
  // Interval of gRPC health checks of every shard; 0 = none. A shard failing two checks in
  // a row is down: calls needing it fail at once with UNAVAILABLE naming it, until a
  // check passes again and it is re-admitted.
  std::chrono::milliseconds health_check_interval{0};
  ClientSecurity security;  // TLS and token for every shard call (default: plaintext, none)
};

// The grpc::Status of a shard call as an absl::Status naming the shard.
absl::Status FromShardStatus(const grpc::Status& status, int shard, const std::string& address);

// Talks to every shard of a shard map: deduplicates a batch, splits it by ShardOf(),
// calls the shards in parallel and merges their answers in the caller's order. Pooled
// lookups send each shard its ids of every bag and add up the partial sums, so only
// pooled vectors travel. Used by the coordinator and by the smart client.
// Thread-safe.
class ShardRouter {
 public:
  ShardRouter(std::vector<std::string> addresses, const RouterOptions& options);
  ~ShardRouter();

  int num_shards() const { return static_cast<int>(addresses_.size()); }
  // The shard-map version stamped on requests from now on.
  void set_shard_map_version(uint64_t version) { version_.store(version); }
  const std::vector<std::string>& addresses() const { return addresses_; }

  // Whether shard k passes its health checks (always true without health checking).
  bool serving(int k) const { return serving_[k].load(std::memory_order_relaxed); }

  // Makes every shard channel stuck in failure dial again (see ReconnectingStub); calls
  // that fail with UNAVAILABLE do this for their shard themselves.
  void Reconnect() const;

  // Creates `config` on every shard. The first failure is returned.
  absl::Status CreateTable(const v1::TableConfig& config);

  // out: (ids, dim).
  absl::Status Lookup(const v1::TableConfig& config, absl::Span<const int64_t> ids,
                      absl::Span<float> out, bool read_only);

  // out: (bags, dim). Offsets and weights must have been validated.
  absl::Status PooledLookup(const v1::TableConfig& config, absl::Span<const int64_t> ids,
                            absl::Span<const int32_t> offsets, absl::Span<const float> weights,
                            v1::Pooling pooling, absl::Span<float> out, bool read_only);

  // Sums repeated ids, checks every value is finite, then pushes each shard its rows.
  // Returns the distinct rows updated.
  absl::StatusOr<int64_t> PushGradients(const v1::TableConfig& config,
                                        absl::Span<const int64_t> ids,
                                        absl::Span<const float> gradients, int64_t step);

  // Every shard takes (or restores) checkpoint `step`, in parallel; each shard's result
  // in shard order. The first failure names its shard.
  absl::StatusOr<std::vector<v1::CheckpointInfo>> CheckpointShards(int64_t step);
  absl::StatusOr<std::vector<v1::CheckpointInfo>> RestoreShards(int64_t step);

  // Every shard's stats for `table` (empty = all).
  // Every serving shard's stats of `table` (empty: every table); shards failing their
  // health checks are left out.
  absl::StatusOr<std::vector<v1::TableStats>> Stats(const std::string& table);

 private:
  // Per-call buffers, kept between calls so that large batches do not allocate (and
  // page-fault) their request and response buffers afresh every time.
  struct Scratch {
    std::vector<int64_t> unique;
    std::vector<int32_t> inverse;
    std::vector<std::vector<int32_t>> groups;  // per shard: positions in `unique`
    std::vector<const float*> rows;            // per unique id: its row in a response
    std::vector<float*> slots;                 // per unique id: its row in a request
    std::vector<v1::LookupRequest> lookups;
    std::vector<v1::LookupResponse> lookup_responses;
    std::vector<v1::PushGradientsRequest> pushes;
    std::vector<v1::PushGradientsResponse> push_responses;
  };
  // Deduplicates `ids` into s->unique / s->inverse and groups the unique ids by shard.
  void Split(const v1::TableConfig& config, absl::Span<const int64_t> ids, Scratch* s) const;

  std::unique_ptr<grpc::ClientContext> NewContext(std::chrono::milliseconds deadline) const;
  std::unique_ptr<grpc::ClientContext> NewContext() const { return NewContext(options_.deadline); }
  // Starts the call `prepare(k, context, queue)` for every shard with `has_work(k)`, all in
  // flight together, and returns each shard's status once all have answered, with its
  // answer in (*responses)[k]. The calling thread drives the completion queue itself, so
  // no other thread has to wake it.
  template <typename Response, typename Prepare>
  std::vector<grpc::Status> CallShards(const std::function<bool(int)>& has_work,
                                       const Prepare& prepare, std::vector<Response>* responses,
                                       std::chrono::milliseconds deadline) const;
  template <typename Response, typename Prepare>
  std::vector<grpc::Status> CallShards(const std::function<bool(int)>& has_work,
                                       const Prepare& prepare,
                                       std::vector<Response>* responses) const {
    return CallShards(has_work, prepare, responses, options_.deadline);
  }

  std::vector<std::string> addresses_;
  RouterOptions options_;
  std::atomic<uint64_t> version_;
  std::vector<std::unique_ptr<ReconnectingStub<v1::EmbeddingShard>>> stubs_;
  std::unique_ptr<std::atomic<bool>[]> serving_;
  // Health checking (options_.health_check_interval > 0).
  void MonitorHealth();
  absl::Mutex monitor_mu_;
  bool stop_monitor_ ABSL_GUARDED_BY(monitor_mu_) = false;
  std::thread monitor_;
  mutable ObjectPool<Scratch> scratch_;
};

}  // namespace tessera::client

#endif  // TESSERA_CLIENT_SHARD_ROUTER_H_
