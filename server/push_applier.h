#ifndef TESSERA_SERVER_PUSH_APPLIER_H_
#define TESSERA_SERVER_PUSH_APPLIER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "embedding/collection.h"
#include "embedding/shard_tables.h"
#include "google/protobuf/repeated_field.h"
#include "server/change_log.h"
#include "server/lookup_request.h"
#include "server/push_journal.h"
#include "server/step_aggregator.h"
#include "server/sync_groups.h"
#include "tessera/v1/embedding_service.pb.h"

namespace tessera::server {

class ReshardParticipant;

// A shard's exactly-once push path, below the wire: applies decoded pushes once per
// request id (PushJournal), across reshards (the pushes applied under earlier maps,
// MovedPushes) and restarts (the collection's durable record), and merges the pushes of
// a data-parallel step's workers (StepAggregator, for the groups jobs registered). Tells
// the reshard in progress which rows changed. Thread-safe. Knows nothing of gRPC.
class PushApplier {
 public:
  struct Options {
    std::string where = "shard 0";  // what errors call this shard
    size_t push_window = 1 << 16;   // request ids of recent pushes remembered
    // Sync-group pushes waiting at once, and the longest one waits.
    int max_sync_waiting = 1024;
    std::chrono::milliseconds max_sync_wait{60000};
    size_t change_log_bytes = size_t{128} << 20;  // the bound of the rows-changed log
  };
  // `tables` and `reshard` must outlive it. `configs` gives a table's config and counters
  // (for pushes merged from a step's workers). Loads the pushes of earlier maps the
  // collection keeps.
  PushApplier(embedding::ShardTables* tables, ReshardParticipant* reshard, ConfigLookup configs,
              const Options& options);
  PushApplier(const PushApplier&) = delete;
  PushApplier& operator=(const PushApplier&) = delete;

  // Applies the decoded parts `batch.pushes` of a push, exactly once per request id `id`
  // (empty: every time). Returns rows updated per part. A reused id of another shape is
  // InvalidArgument.
  absl::StatusOr<std::vector<int64_t>> Apply(const DecodedBatch& batch, int64_t step,
                                             const embedding::RequestId& id);
  // A check round: checks the parts as Apply would apply them, changing nothing.
  absl::Status Check(const DecodedBatch& batch, int64_t step);

  // A data-parallel worker's push (`member` of a registered group): its parts wait in the
  // step until every worker pushed, then the merged step is applied once and `done` hears
  // the rows updated per part (or why not), once, now or later. `part` must stay valid
  // until then (its spans too); Cancel(part) ends its wait early. Deduplicated by `id`.
  void StartSync(embedding::PushSync member, int64_t step, const embedding::RequestId& id,
                 Contribution* part, StepAggregator::Done done);
  void Cancel(const Contribution* part) { steps_.Cancel(part); }
  absl::Status RegisterGroup(const std::string& job, int workers) {
    return groups_.Register(job, workers);
  }
  int sync_pushes_waiting() const { return steps_.waiting(); }

  // For a reshard's FREEZE: the pushes this shard applied under its place (`index` of
  // `num_shards`) in map `version`, from its journal and its durable record.
  std::vector<v1::AppliedPush> OwnPushes(uint64_t version, int32_t index, int32_t num_shards);
  // Those applied under earlier maps, kept from earlier reshards.
  std::vector<v1::AppliedPush> Moved() const { return moved_.All(); }
  // At a COMMIT: every shard's pushes of the old map, kept (on disk too) before the new
  // map is served: a retry skips the rows that took them.
  absl::Status AddMoved(const google::protobuf::RepeatedPtrField<v1::AppliedPush>& applied);
  // The journal speaks of a place in the old map: after a commit, what it said is moved.
  void ClearJournal() { journal_.Clear(); }
  // After a restore of every model: no push is remembered as applied.
  absl::Status ForgetAll();

  // The ids each push applied here changed, for serving replicas (appended once a push's
  // part is applied, never for a repeat answered from the journal).
  ChangeLog& changes() { return changes_; }

 private:
  static constexpr char kMovedPushesKey[] = "moved_pushes";
  absl::Status KeepMoved();
  // The applying half of Apply, inside the journal's run: parts from done->size() on.
  absl::Status ApplyParts(const DecodedBatch& batch, int64_t step, const embedding::RequestId& id,
                          uint64_t version, std::vector<int64_t>* done);
  // Apply's batch in one PushBatch, for a collection that AppliesBatchWhole: *done gets
  // every part's rows updated once it applied, and stays empty when it was refused.
  absl::Status ApplyWhole(const DecodedBatch& batch, int64_t step, const embedding::PushTag& first,
                          std::vector<int64_t>* done);
  // `batch` without the ids whose rows already carry request `id` (applied under an
  // earlier map), into *kept (its copies hold them); (*skipped)[i]: distinct ids part i
  // left out. False (nothing filled) when no earlier map applied `id`.
  bool WithoutMovedPushes(const DecodedBatch& batch, const embedding::RequestId& id,
                          DecodedBatch* kept, std::vector<int64_t>* skipped) const;
  // The config of part `i` of `batch`, from the batch or looked up.
  absl::StatusOr<v1::TableConfig> ConfigOf(const DecodedBatch& batch, size_t i) const;
  // A step's pushes of every worker, merged, applied as one push.
  absl::StatusOr<std::vector<int64_t>> ApplyMerged(
      absl::Span<const embedding::TableGradients> merged, int64_t step,
      const embedding::RequestId& first);

  embedding::ShardTables* const tables_;
  ReshardParticipant* const reshard_;
  const ConfigLookup configs_;
  const Options options_;
  PushJournal journal_;
  MovedPushes moved_;     // applied under earlier maps (reshards)
  SyncGroups groups_;     // registered by data-parallel jobs
  StepAggregator steps_;  // synchronous pushes of data-parallel workers
  ChangeLog changes_;     // rows changed, for serving replicas
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PUSH_APPLIER_H_
