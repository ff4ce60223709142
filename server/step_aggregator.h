#ifndef TESSERA_SERVER_STEP_AGGREGATOR_H_
#define TESSERA_SERVER_STEP_AGGREGATOR_H_

// Synchronous data-parallel pushes on a shard: the N workers of a job each push their
// gradients of step t; the shard applies step t once, when the last of them arrives, with
// the workers' gradients for each table concatenated in worker order (so a row's sum is
// worker 0's + worker 1's + ..., the same bits on every run), and answers every worker
// then. A worker that does not come within the timeout fails the others' pushes with an
// error naming it.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "embedding/collection.h"

namespace tessera::server {

// One worker's part of a step; its spans stay valid while Contribute runs.
struct Contribution {
  absl::Span<const embedding::TableGradients> tables;
  embedding::RequestId request_id;
};

class StepAggregator {
 public:
  // Workers a group may have (SyncGroup.workers): more is InvalidArgument.
  static constexpr int kMaxWorkers = 4096;

  // `where` is what errors call this server: "shard 1". At most `max_waiting` pushes wait
  // for other workers at once (each holds a server thread): one more that would wait is
  // ResourceExhausted, while one that completes its step is always taken.
  explicit StepAggregator(std::string where, int max_waiting = 1024)
      : where_(std::move(where)), max_waiting_(max_waiting) {}

  // Applies a step's merged tables (one part per table, in order of first appearance in
  // worker order) under request id `id` (the first worker's: the same for a retry of the
  // whole step), returning rows updated per part.
  using ApplyFn = std::function<absl::StatusOr<std::vector<int64_t>>(
      absl::Span<const embedding::TableGradients> merged, const embedding::RequestId& id)>;

  // Adds `part` as worker `member.worker`'s push of `step` in job `member.job` and waits
  // until the step is applied (by the last worker to arrive, through `apply`) or
  // member.timeout passes. Returns rows updated
  // for each of part.tables, or the step's failure (the same for every worker).
  // Aborted names the workers that did not push in time (not retried: they are gone);
  // InvalidArgument for a worker index out of range or a worker count that differs from the
  // others'; ResourceExhausted when it would wait and max_waiting pushes wait already.
  absl::StatusOr<std::vector<int64_t>> Contribute(const embedding::PushSync& member, int64_t step,
                                                  const Contribution& part, const ApplyFn& apply);

  // Steps waiting for workers.
  size_t pending() const;
  // Pushes waiting for their step's other workers.
  int waiting() const;

 private:
  struct Step {
    int workers = 0;
    std::vector<const Contribution*> parts;  // by worker; null until it arrives
    int arrived = 0;
    bool done = false;
    absl::Status status;
    std::vector<std::string> tables;  // merged part order
    std::vector<int64_t> rows;        // per merged part
  };
  using Key = std::pair<std::string, int64_t>;

  // `part` arrives at step `key` (made when new): *last when it completes the step, which
  // then leaves steps_. Refused when the group size differs, or when it would wait while
  // max_waiting_ pushes do.
  absl::StatusOr<std::shared_ptr<Step>> Join(const Key& key, const embedding::PushSync& member,
                                             const Contribution& part, bool* last)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits (up to member.timeout) for step `s` to fill, then for it to be applied; Aborted
  // naming the workers missing, with `part` taken out of the step.
  absl::Status AwaitStep(const Key& key, const std::shared_ptr<Step>& s,
                         const embedding::PushSync& member, const Contribution& part)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string where_;
  const int max_waiting_;
  mutable absl::Mutex mu_;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;  // contributions waiting for their step
  std::map<Key, std::shared_ptr<Step>> steps_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_STEP_AGGREGATOR_H_
