#ifndef TESSERA_SERVER_CALL_EXECUTOR_H_
#define TESSERA_SERVER_CALL_EXECUTOR_H_

#include <functional>
#include <memory>

#include "absl/time/time.h"

namespace tessera::server {

// Threads for the work of callback-API calls, so that gRPC's own callback threads never
// block on it. A task starts at once: on an idle thread, or on a new one when none is
// idle (as the synchronous server's threads grow with its calls); a thread idle for
// `idle_exit` leaves. A call that waits for something without working (a sync-group push
// waiting for its other workers) gives its thread back instead of holding it.
// Thread-safe.
class CallExecutor {
 public:
  explicit CallExecutor(absl::Duration idle_exit = absl::Seconds(30));
  // Runs the tasks scheduled, then waits for every thread to leave.
  ~CallExecutor();
  CallExecutor(const CallExecutor&) = delete;
  CallExecutor& operator=(const CallExecutor&) = delete;

  void Schedule(std::function<void()> task);

  // Threads running a task now, and threads that exist (running or idle).
  int busy() const;
  int threads() const;

 private:
  struct State;  // shared with the threads: it outlives the last one's exit
  static void Loop(State* s);
  std::shared_ptr<State> state_;
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_CALL_EXECUTOR_H_
