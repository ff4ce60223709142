#ifndef TESSERA_SERVING_REPLICA_H_
#define TESSERA_SERVING_REPLICA_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/embedding_client.h"
#include "client/reconnecting_stub.h"
#include "embedding/serving_table.h"
#include "serving/dense_model.h"
#include "tessera/v1/embedding_service.grpc.pb.h"

namespace tessera::serving {

struct ReplicaOptions {
  std::string model;                // the tables "<model>.*" (required)
  std::vector<std::string> tables;  // only these of the model; empty: every table of it
  embedding::ServingFormat format = embedding::ServingFormat::kFp32;
  client::ClientOptions client;  // reaching the coordinator, and the shards (security)
  int64_t max_read_bytes = int64_t{16} << 20;  // rows per change read, in bytes
  int max_reads_per_poll = 64;                 // a shard's reads in one Poll at most
  // Where the replica keeps its rows, cursors and dense network (Save); a replica started
  // on it reads on from the saved cursors. Empty: nothing is kept.
  std::string state_dir;
  // Serve this checkpoint of the model, frozen (-1: its newest complete one): its rows, read
  // from the checkpoint's files by the shards, and the dense network it holds (taken by
  // tessera-train); no change is followed. Unset: follow training.
  std::optional<int64_t> checkpoint;
};

// What a replica did since it started.
struct ReplicaCounters {
  int64_t snapshots = 0;     // a shard's rows read whole (at start, and starting again)
  int64_t reads = 0;         // change reads answered
  int64_t rows_applied = 0;  // rows written into the tables (snapshots and changes)
  int64_t bytes_read = 0;    // of the rows' answers
};

// A serving replica of one model's tables: starts from a snapshot of every shard's rows
// (each shard's change-log head, then its rows), then follows each shard's change log
// (server/change_log.h) from there: every row a push changed is read after the push, none
// missed. A shard whose log no longer holds the replica's cursor (it restarted, its rows were
// restored, the replica fell behind the log's bound) is read whole again, and its rows the
// snapshot no longer holds go back to their initial weights. Follows reshards through the
// coordinator's shard map. Lookups (table()) run beside Poll. Thread-safe.
class Replica {
 public:
  // Connects to the coordinator at `coordinator`, lists the model's tables and reads every
  // shard's rows. InvalidArgument for a bad model name; the first failure of a shard.
  static absl::StatusOr<std::unique_ptr<Replica>> Start(const std::string& coordinator,
                                                        const ReplicaOptions& options);
  ~Replica();

  // One round: the coordinator's shard map (at most once a second, and after a shard
  // failed; kept as it was when the coordinator is away), then every shard's changes since
  // the replica's cursor, until caught up with the head it saw or max_reads_per_poll, then
  // the dense network. The first failure, after trying every shard.
  absl::Status Poll();

  // Writes the replica's rows, its cursor in each shard's log and its dense network to
  // options.state_dir, whole or not at all (a new file renamed over the last); no Poll
  // runs meanwhile, lookups do. FailedPrecondition without a state_dir.
  absl::Status Save();

  // The table `name`, or null when the replica holds no such table (yet).
  std::shared_ptr<const embedding::ServingTable> table(const std::string& name) const;
  std::vector<std::string> tables() const;

  // The training steps every shard's changes have been read through, counted as
  // tessera-train counts steps done: the pushes of steps 0 .. serving_step() - 1 are all in
  // the rows (later ones may be too). 0 before any. A checkpoint's replica: its step.
  int64_t serving_step() const;
  // The training steps the shards have applied, counted the same way (the newest step any
  // shard's log holds, plus one): head_step() - serving_step() is the lag in steps.
  int64_t head_step() const;
  // Seconds since the start of the last Poll that found every shard read to its head: every
  // change made before then is in the rows (since the replica's start before any).
  double seconds_since_caught_up() const;
  const std::string& model() const { return options_.model; }
  // The step of the checkpoint served frozen (options.checkpoint), or nullopt.
  std::optional<int64_t> frozen_step() const {
    return frozen_step_ < 0 ? std::nullopt : std::optional<int64_t>(frozen_step_);
  }
  // Shards whose log the replica has read to its head, of those it follows.
  int shards_caught_up() const;
  int shards() const;
  ReplicaCounters counters() const;
  // What made the replica read a shard whole, or take new dense weights, the newest last
  // (the last 64).
  std::vector<std::string> events() const;

  // The dense network the trainer published last that the replica has (null before any).
  std::shared_ptr<const DenseModel> dense() const;
  int64_t dense_step() const;

  // Scores `samples` samples: `dense` (samples, num_dense) and one FeatureBags per sparse
  // feature of the model, through the published dense network and the replica's rows.
  // FailedPrecondition before a dense network is published or when a feature's table is
  // not one the replica serves; InvalidArgument for wrong shapes or non-finite features.
  struct Prediction {
    std::vector<float> logits;
    std::vector<float> scores;  // sigmoid(logit), as the trainer's evaluation computes it
    int64_t dense_step = -1;
    int64_t serving_step = -1;
  };
  absl::StatusOr<Prediction> Predict(int samples, absl::Span<const float> dense,
                                     absl::Span<const FeatureBags> features) const;

 private:
  struct Shard;
  Replica(const ReplicaOptions& options, std::unique_ptr<client::EmbeddingClient> client);
  bool Wanted(const std::string& table) const;
  // Follows the coordinator's shard map: new shards are read whole, gone ones dropped.
  absl::Status FollowMap();
  // A shard's changes until caught up; a snapshot when its log no longer has them.
  absl::Status FollowShard(Shard* shard);
  // The state options.state_dir holds, when it holds one of this model and format: its
  // tables, shards with their cursors and dense network taken (under poll_mu_). Says in
  // events what it found; a state it cannot read is left for a fresh start.
  void LoadState();
  // LoadState's reading of the file at `path`: DataLoss for a damaged one,
  // FailedPrecondition for one of another model or format.
  absl::Status ReadState(const std::string& path);
  // Reads checkpoint `step` of the model (-1: the newest) from the shards of the map now
  // (FollowMap first), and its dense network; sets frozen_step_.
  absl::Status LoadCheckpoint(int64_t step);
  // Reads table `name` of the checkpoint in `dirs` from every shard, making the table from
  // the config the checkpoint holds.
  absl::Status LoadCheckpointTable(const std::string& name, const std::vector<std::string>& dirs);
  // Reads `shard` whole: its log's head, then its rows, those it no longer holds reset.
  absl::Status Snapshot(Shard* shard, const std::string& why);
  // The replica's table `name`, made from the coordinator's config when new; null for a
  // table the replica does not serve.
  absl::StatusOr<std::shared_ptr<embedding::ServingTable>> TableFor(const std::string& name);
  absl::Status ApplyRows(const std::string& table, const v1::RowChunk& rows);
  // The newest step any shard said it applied (-1: none); under mu_.
  int64_t NewestHeadStep() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Takes the dense network the trainer published when it is newer than the one held.
  absl::Status FollowDense();
  void Note(const std::string& event);

  const ReplicaOptions options_;
  const std::unique_ptr<client::EmbeddingClient> client_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<embedding::ServingTable>> tables_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
  ReplicaCounters counters_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const DenseModel> dense_ ABSL_GUARDED_BY(mu_);
  // One Poll at a time. The shards followed, by address: changed with poll_mu_ and mu_
  // held, read by Poll under poll_mu_ and by the status calls under mu_.
  absl::Mutex poll_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::map<std::string, std::unique_ptr<Shard>> shards_;
  int64_t frozen_step_ = -1;  // set by Start, before the replica is shared
  uint64_t map_version_ = 0;  // under poll_mu_, as the two below
  std::chrono::steady_clock::time_point map_read_at_;
  bool map_stale_ = false;  // a shard failed: read the map at the next Poll
  std::chrono::steady_clock::time_point caught_up_at_ ABSL_GUARDED_BY(mu_) =
      std::chrono::steady_clock::now();
};

}  // namespace tessera::serving

#endif  // TESSERA_SERVING_REPLICA_H_
