#include "base/thread_pool.h"

#include <sched.h>

#include <algorithm>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"

namespace tessera::base {

int AvailableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

absl::Status ResolveThreads(int requested, int* threads) {
  if (requested < 0 || requested > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("thread count must be in [0, 1024] (0 = every CPU), got ", requested));
  }
  *threads = requested == 0 ? AvailableCpus() : requested;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ThreadPool>> NewThreadPool(int requested) {
  int threads = 0;
  if (absl::Status s = ResolveThreads(requested, &threads); !s.ok()) return s;
  return std::make_shared<ThreadPool>(threads);
}

// One ParallelFor call, on its caller's stack. Every field is read and written under the
// pool's mutex: the caller returns once `done == n`, and no thread touches the job after
// counting its last iteration.
struct ThreadPool::Job {
  absl::FunctionRef<void(int)> fn;
  int n;
  int next = 0;  // the next iteration to claim
  int done = 0;  // iterations returned
};

ThreadPool& ThreadPool::CallingThread() {
  static ThreadPool* calling_thread = new ThreadPool(1);
  return *calling_thread;
}

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

bool ThreadPool::ClaimLocked(Job** job, int* index) {
  if (jobs_.empty()) return false;
  Job* j = jobs_.front();
  *job = j;
  *index = j->next++;
  if (j->next == j->n) jobs_.erase(jobs_.begin());  // fully claimed
  return true;
}

void ThreadPool::RunClaimed(Job* job, int index) {
  mu_.Unlock();
  job->fn(index);
  mu_.Lock();
  ++job->done;
}

void ThreadPool::WorkerLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(this, &ThreadPool::HasWork));
    if (jobs_.empty()) return;  // stopping, and nothing left to run
    Job* job = nullptr;
    int index = 0;
    if (ClaimLocked(&job, &index)) RunClaimed(job, index);
  }
}

void ThreadPool::ParallelFor(int n, absl::FunctionRef<void(int)> fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  Job job{fn, n};
  absl::MutexLock lock(&mu_);
  jobs_.push_back(&job);
  // The caller runs its own job's iterations (never another's: it would wait on that).
  while (job.next < job.n) {
    const int index = job.next++;
    if (job.next == job.n) jobs_.erase(std::find(jobs_.begin(), jobs_.end(), &job));
    RunClaimed(&job, index);
  }
  struct AllDone {
    const Job* job;
    bool operator()() const { return job->done == job->n; }
  } all_done{&job};
  mu_.Await(absl::Condition(&all_done));
}

absl::Status ThreadPool::ParallelForStatus(int n, absl::FunctionRef<absl::Status(int)> fn) {
  absl::InlinedVector<absl::Status, 32> results(std::max(n, 0));
  ParallelFor(n, [&](int i) { results[i] = fn(i); });
  for (absl::Status& s : results) {
    if (!s.ok()) return std::move(s);
  }
  return absl::OkStatus();
}

}  // namespace tessera::base
