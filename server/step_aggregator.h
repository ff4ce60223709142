#ifndef TESSERA_SERVER_STEP_AGGREGATOR_H_
#define TESSERA_SERVER_STEP_AGGREGATOR_H_

// Synchronous data-parallel pushes on a shard: the N workers of a job each push their
// gradients of step t; the shard applies step t once, when the last of them arrives, with
// the workers' gradients for each table concatenated in worker order (so a row's sum is
// worker 0's + worker 1's + ..., the same bits on every run), and answers every worker
// then. A worker that does not come within the timeout fails the others' pushes with an
// error naming it. Waiting takes no thread (Start answers through a callback).

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "embedding/collection.h"

namespace tessera::server {

// One worker's part of a step; its spans stay valid until its answer (Done) is called.
struct Contribution {
  absl::Span<const embedding::TableGradients> tables;
  embedding::RequestId request_id;
};

class StepAggregator {
 public:
  // Workers a group may have (SyncGroup.workers): more is InvalidArgument.
  static constexpr int kMaxWorkers = 4096;

  // `where` is what errors call this server: "shard 1". At most `max_waiting` pushes wait
  // for other workers at once: one more that would wait is ResourceExhausted, while one
  // that completes its step is always taken. A waiting push holds no thread: its part and
  // its answer wait in the step, and a timer thread of the aggregator ends the waits that
  // time out.
  explicit StepAggregator(std::string where, int max_waiting = 1024);
  // Answers the pushes still waiting (Unavailable), then stops the timer.
  ~StepAggregator();
  StepAggregator(const StepAggregator&) = delete;
  StepAggregator& operator=(const StepAggregator&) = delete;

  // Applies a step's merged tables (one part per table, in order of first appearance in
  // worker order) under request id `id` (the first worker's: the same for a retry of the
  // whole step), returning rows updated per part.
  using ApplyFn = std::function<absl::StatusOr<std::vector<int64_t>>(
      absl::Span<const embedding::TableGradients> merged, const embedding::RequestId& id)>;
  // A push's answer: rows updated for each of its part's tables, or the step's failure
  // (the same for every worker). Called exactly once, on no lock of the aggregator.
  using Done = std::function<void(absl::StatusOr<std::vector<int64_t>>)>;

  // Adds `part` as worker `member.worker`'s push of `step` in job `member.job`, and
  // returns at once. `done` is called when the step is applied (by the last worker to
  // arrive, through its `apply`, on its thread: this one when `part` completes the step),
  // when member.timeout passes first (on the timer thread), or at once when refused.
  // Aborted names the workers that did not push in time (not retried: they are gone), or
  // says that a later push of the same worker and step took this one's place;
  // InvalidArgument for a worker index out of range or a worker count that differs from
  // the others'; ResourceExhausted when it would wait and max_waiting pushes wait already.
  void Start(const embedding::PushSync& member, int64_t step, const Contribution* part,
             ApplyFn apply, Done done);
  // Takes `part`, waiting, out of its step (its call was cancelled); its done gets
  // Cancelled. False when it does not wait (not yet, or no longer: then done is called as
  // usual).
  bool Cancel(const Contribution* part);

  // Start, waiting on this thread for the answer.
  absl::StatusOr<std::vector<int64_t>> Contribute(const embedding::PushSync& member, int64_t step,
                                                  const Contribution& part, const ApplyFn& apply);

  // Steps waiting for workers.
  size_t pending() const;
  // Pushes waiting for their step's other workers.
  int waiting() const;

 private:
  using Key = std::pair<std::string, int64_t>;
  struct Waiter {
    const Contribution* part = nullptr;  // null until the worker arrives
    Done done;
    std::chrono::milliseconds timeout{0};
    absl::Time deadline;
  };
  struct Step {
    int workers = 0;
    std::vector<Waiter> parts;  // by worker
    int arrived = 0;
  };
  // An answer to give once the lock is released.
  using Answer = std::pair<Done, absl::StatusOr<std::vector<int64_t>>>;

  // `part` arrives at step `key` (made when new). Returns the step when it completes it
  // (the step left steps_ and no waiter of it is parked any more), null when it parks;
  // refused when the group size differs, or when it would wait while max_waiting_ pushes
  // do. A worker's earlier push that it replaces goes to *answers.
  absl::StatusOr<std::shared_ptr<Step>> Join(const Key& key, const embedding::PushSync& member,
                                             const Contribution* part, Done* done,
                                             std::vector<Answer>* answers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Merges and applies a complete step, then answers each of its workers.
  static void ApplyStep(const std::shared_ptr<Step>& s, const ApplyFn& apply);
  // Takes waiting `part` out of its step: its done and why, into *answers.
  void Unpark(const Contribution* part, bool timed_out, std::vector<Answer>* answers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(const Waiter& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the waits that time out.
  void TimerLoop();

  const std::string where_;
  const int max_waiting_;
  mutable absl::Mutex mu_;
  absl::CondVar timer_cv_;  // an earlier deadline, or stop_
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::map<Key, std::shared_ptr<Step>> steps_ ABSL_GUARDED_BY(mu_);
  std::map<const Contribution*, Key> parked_ ABSL_GUARDED_BY(mu_);  // waiting parts
  std::multimap<absl::Time, const Contribution*> deadlines_ ABSL_GUARDED_BY(mu_);
  std::thread timer_;
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_STEP_AGGREGATOR_H_
