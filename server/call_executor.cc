#include "server/call_executor.h"

#include <deque>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"

namespace tessera::server {

struct CallExecutor::State {
  explicit State(absl::Duration idle) : idle_exit(idle) {}
  bool HasTaskOrStop() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop || !tasks.empty(); }
  bool NoThreads() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return threads == 0; }

  const absl::Duration idle_exit;
  mutable absl::Mutex mu;
  std::deque<std::function<void()>> tasks ABSL_GUARDED_BY(mu);
  int threads ABSL_GUARDED_BY(mu) = 0;
  int idle ABSL_GUARDED_BY(mu) = 0;
  bool stop ABSL_GUARDED_BY(mu) = false;
};

CallExecutor::CallExecutor(absl::Duration idle_exit) : state_(std::make_shared<State>(idle_exit)) {}

CallExecutor::~CallExecutor() {
  absl::MutexLock lock(&state_->mu);
  state_->stop = true;
  // Each thread runs the tasks left before it leaves: nothing is dropped.
  state_->mu.Await(absl::Condition(state_.get(), &State::NoThreads));
}

void CallExecutor::Schedule(std::function<void()> task) {
  absl::MutexLock lock(&state_->mu);
  state_->tasks.push_back(std::move(task));
  // Idle threads take the tasks queued, oldest first; one more thread when they are too few.
  if (state_->idle >= static_cast<int>(state_->tasks.size())) return;
  ++state_->threads;
  std::thread([s = state_] { Loop(s.get()); }).detach();
}

void CallExecutor::Loop(State* s) {
  s->mu.Lock();
  while (true) {
    ++s->idle;
    const bool woke =
        s->mu.AwaitWithTimeout(absl::Condition(s, &State::HasTaskOrStop), s->idle_exit);
    --s->idle;
    if (s->tasks.empty()) {
      if (s->stop || !woke) break;
      continue;
    }
    std::function<void()> task = std::move(s->tasks.front());
    s->tasks.pop_front();
    s->mu.Unlock();
    task();
    task = nullptr;  // what it holds goes before the thread counts as idle
    s->mu.Lock();
  }
  --s->threads;
  s->mu.Unlock();
}

int CallExecutor::busy() const {
  absl::MutexLock lock(&state_->mu);
  return state_->threads - state_->idle;
}

int CallExecutor::threads() const {
  absl::MutexLock lock(&state_->mu);
  return state_->threads;
}

}  // namespace tessera::server
