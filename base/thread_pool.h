#ifndef TESSERA_BASE_THREAD_POOL_H_
#define TESSERA_BASE_THREAD_POOL_H_

#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tessera::base {

// The CPUs this process may run on, as sched_getaffinity reports them (so `taskset -c 0`
// gives 1); at least 1.
int AvailableCpus();

// Resolves a thread-count setting: `requested` when >= 1, AvailableCpus() for 0.
// InvalidArgument for a negative count or one over 1024.
absl::Status ResolveThreads(int requested, int* threads);

class ThreadPool;
// A pool of ResolveThreads(requested) threads, or its error.
absl::StatusOr<std::shared_ptr<ThreadPool>> NewThreadPool(int requested);

// A fixed set of threads that run the iterations of ParallelFor. The calling thread runs
// iterations too, so a pool of 1 thread has no workers and runs every call inline. Calls
// may come from several threads at once, and an iteration may call ParallelFor again (its
// thread then runs the inner iterations too, so nothing waits on a busy pool forever).
//
// Iterations must write disjoint outputs; which thread runs an iteration is unspecified,
// so a result that must not depend on the thread count is computed per iteration and
// combined in index order by the caller.
class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // A pool of one thread, the caller: for work too small to be worth waking a thread.
  static ThreadPool& CallingThread();
  // This pool when `work` items are at least `min_work`, else CallingThread().
  ThreadPool& For(size_t work, size_t min_work) {
    return work >= min_work ? *this : CallingThread();
  }

  // Runs fn(i) for every i in [0, n) and returns when all have returned.
  void ParallelFor(int n, absl::FunctionRef<void(int)> fn);

  // ParallelFor over fallible iterations: every iteration runs, and the result is the
  // failure of the lowest index (OK when none failed), whatever the thread count.
  absl::Status ParallelForStatus(int n, absl::FunctionRef<absl::Status(int)> fn);

 private:
  struct Job;
  // Claims the next iteration of the oldest job with one left; false when there is none.
  bool ClaimLocked(Job** job, int* index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs iteration `index` of `job` (unlocked), then counts it done.
  void RunClaimed(Job* job, int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WorkerLoop();
  // Called by mu_.Await, which holds mu_; the analysis cannot see through the Condition.
  bool HasWork() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_ || !jobs_.empty(); }

  absl::Mutex mu_;
  std::vector<Job*> jobs_ ABSL_GUARDED_BY(mu_);  // jobs with iterations left, oldest first
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace tessera::base

#endif  // TESSERA_BASE_THREAD_POOL_H_
