#ifndef TESSERA_SERVER_RESHARD_PARTICIPANT_H_
#define TESSERA_SERVER_RESHARD_PARTICIPANT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "embedding/collection.h"
#include "embedding/shard_tables.h"
#include "tessera/v1/embedding_service.pb.h"

namespace tessera::server {

class PushApplier;

// A shard's side of a live reshard (the coordinator drives it: COPY rounds, FREEZE, COMMIT
// or ABORT, SETTLE) and the gate every data request passes: while the shard is frozen,
// pushes and requests of the new map wait; during a commit every request waits; a shard
// no longer in the map refuses all. It holds the shard's place in the map (index, shard
// count, version), which a commit changes. Thread-safe. Knows nothing of gRPC: the shard
// service converts requests and deadlines.
class ReshardParticipant {
 public:
  struct Options {
    int32_t shard_index = 0;
    int32_t num_shards = 1;
    uint64_t shard_map_version = 1;
    // Called at a COMMIT with the new place (index -1: none) and version, before they are
    // served; an error stops the commit.
    std::function<absl::Status(int index, int num_shards, uint64_t version)> on_placement;
  };
  // What a data request is, for the gate.
  enum class Traffic { kRead, kPush, kImport };

  // `tables` and `pushes` must outlive it (`pushes` is only used from Handle on: it may be
  // constructed after this).
  ReshardParticipant(embedding::ShardTables* tables, PushApplier* pushes, const Options& options);
  ~ReshardParticipant();  // waits for the last commit's drop of the rows that left
  ReshardParticipant(const ReshardParticipant&) = delete;
  ReshardParticipant& operator=(const ReshardParticipant&) = delete;

  int32_t index() const { return index_.load(); }
  int32_t num_shards() const { return num_shards_.load(); }
  uint64_t version() const { return version_.load(); }
  // Serve another shard-map version from now on (the map was rebalanced).
  void SetVersion(uint64_t version) { version_.store(version); }

  // Admits a data request of map `version` (0: any), waiting while the gate holds it, until
  // shortly before `deadline` (then UNAVAILABLE, which callers retry). A shard that left
  // the map refuses (FAILED_PRECONDITION). The request counts as in flight until Leave.
  absl::Status Enter(Traffic traffic, uint64_t version, absl::Time deadline);
  void Leave(Traffic traffic);
  // A request admitted by Enter, until it is destroyed.
  class Admitted {
   public:
    Admitted(ReshardParticipant* gate, Traffic traffic) : gate_(gate), traffic_(traffic) {}
    ~Admitted() { gate_->Leave(traffic_); }
    Admitted(const Admitted&) = delete;
    Admitted& operator=(const Admitted&) = delete;

   private:
    ReshardParticipant* gate_;
    Traffic traffic_;
  };

  // True when an import of map `version` brings a reshard's rows for the map this shard is
  // moving to (not a caller's rows).
  bool MovingRowsOf(uint64_t version);
  // An import stamped with `*version`: when it is the map this shard moves to, *version
  // becomes 0 and *index and *num_shards this shard's place in that map (its rows are
  // checked against it); a shard leaving the map takes none (FAILED_PRECONDITION).
  absl::Status PlaceOfImport(uint64_t* version, int32_t* index, int32_t* num_shards);

  // During a reshard's copy: notes the ids of `ids` that leave this shard as changed
  // (after their rows changed), for the next round to copy again. Cheap when no reshard
  // is copying (noting() is false).
  void NoteChanged(const v1::TableConfig& config, absl::Span<const int64_t> ids);
  bool noting() const { return noting_.load(); }
  // An export of a reshard's moving rows of `table` (ExportRows with MovingRows): the
  // commit knows the table was copied.
  void NoteCopied(const std::string& table);
  // The ids of `table` changed in the last finished copy round, which a changed-only
  // export sends again.
  std::vector<int64_t> ChangedInLastRound(const std::string& table);

  // One phase of a reshard: COPY, FREEZE, COMMIT, ABORT or SETTLE. The answer carries
  // the place served after it.
  absl::Status Handle(const v1::ReshardRequest& request, v1::ReshardResponse* response);

 private:
  absl::Status Copy(const v1::ReshardRequest& request, v1::ReshardResponse* response);
  absl::Status Freeze(const v1::ReshardRequest& request, v1::ReshardResponse* response);
  absl::Status Commit(const v1::ReshardRequest& request);
  absl::Status Abort(const v1::ReshardRequest& request);
  // The gate's part of a commit: waits for every request to leave, checks, switches the
  // place. `request`'s place must be the frozen one.
  absl::Status CommitFrozen(const v1::ReshardRequest& request);
  // Ends a copy round: the ids changed in it become those ChangedInLastRound gives;
  // returns how many.
  int64_t EndRound();
  // FailedPrecondition, naming it, for a table holding rows that this reshard's rounds did
  // not copy (the coordinator does not know it): its rows would be lost at the commit.
  absl::Status CheckCopied();
  // After a commit, while the new map is served: the rows that left are dropped (and the
  // rows held written, with a data directory) on a thread of its own. The next phase
  // waits for it (FinishRepartition: its result, retried once when it failed).
  void StartRepartition(int32_t index, int32_t num_shards,
                        std::map<std::string, int64_t> row_budgets);
  absl::Status FinishRepartition();
  // Each table of `row_budgets` (whole budgets) gets its part of `num_shards` (0: none).
  absl::Status SplitRowBudgets(const std::map<std::string, int64_t>& row_budgets,
                               int32_t num_shards);
  // "shard N is moving to version V, not W" when another reshard is pending.
  absl::Status CheckPending(uint64_t version) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(gate_mu_);
  void ClearPending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(gate_mu_);

  embedding::ShardTables* const tables_;
  PushApplier* const pushes_;
  const std::function<absl::Status(int, int, uint64_t)> on_placement_;
  std::atomic<uint64_t> version_;
  std::atomic<int32_t> index_;
  std::atomic<int32_t> num_shards_;

  absl::Mutex gate_mu_;
  absl::CondVar gate_cv_;
  int64_t reads_in_flight_ ABSL_GUARDED_BY(gate_mu_) = 0;  // lookups and imports
  int64_t pushes_in_flight_ ABSL_GUARDED_BY(gate_mu_) = 0;
  bool frozen_ ABSL_GUARDED_BY(gate_mu_) = false;           // FREEZE until COMMIT or ABORT
  bool committing_ ABSL_GUARDED_BY(gate_mu_) = false;       // every request waits
  bool left_ ABSL_GUARDED_BY(gate_mu_) = false;             // not in the map any more
  uint64_t pending_version_ ABSL_GUARDED_BY(gate_mu_) = 0;  // COPY or FREEZE until COMMIT/ABORT
  int32_t pending_index_ ABSL_GUARDED_BY(gate_mu_) = 0;
  int32_t pending_shards_ ABSL_GUARDED_BY(gate_mu_) = 1;
  bool tracking_ ABSL_GUARDED_BY(gate_mu_) = false;  // since COPY
  std::atomic<bool> noting_{false};                  // tracking_, for NoteChanged

  absl::Mutex changed_mu_;
  std::map<std::string, absl::flat_hash_set<int64_t>> changed_ ABSL_GUARDED_BY(changed_mu_);
  std::map<std::string, std::vector<int64_t>> to_send_ ABSL_GUARDED_BY(changed_mu_);
  // The tables whose rows a reshard's rounds exported since its first COPY.
  std::set<std::string> copied_ ABSL_GUARDED_BY(changed_mu_);

  absl::Mutex repartition_mu_;  // one reshard phase at a time, after the last drop
  std::thread repartition_ ABSL_GUARDED_BY(repartition_mu_);
  absl::Status repartitioned_;  // written by that thread, read once it is joined
  int32_t repartition_index_ ABSL_GUARDED_BY(repartition_mu_) = 0;
  int32_t repartition_shards_ ABSL_GUARDED_BY(repartition_mu_) = 1;
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_RESHARD_PARTICIPANT_H_
