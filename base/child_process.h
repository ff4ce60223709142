#ifndef TESSERA_BASE_CHILD_PROCESS_H_
#define TESSERA_BASE_CHILD_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace tessera::base {

// A child process of a test or a benchmark (tessera-bench starts its local servers so): killed
// (SIGKILL) and reaped on destruction. Not thread-safe.
class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() { Kill(); }

  // The parent's side of DieWithParent, before fork: its pid, or 0 when the caller is not
  // the main thread. The kernel sends the death signal when the thread that forked exits,
  // so a child forked by a short-lived thread (a restart from a helper thread) must not
  // ask for it.
  static pid_t ParentToDieWith();
  // In a forked child, before exec: the kernel kills it (SIGKILL) when the parent dies,
  // however it dies (an abort, a sanitizer report, ctest's timeout), so no server outlives
  // its test and holds ctest's pipe open. `parent`: ParentToDieWith().
  static void DieWithParent(pid_t parent);

  pid_t pid() const { return pid_; }
  // Sends `sig` to it (while it runs).
  void Signal(int sig);
  void Kill();
  // Sends SIGTERM, waits up to `grace` for the process to end, then kills it.
  void Terminate(std::chrono::milliseconds grace);
  // Waits for the process to end; its exit code (-1 when a signal ended it).
  int WaitForExit();

 protected:
  // Forks and execs argv (argv[0]: the program's path), dying with this process
  // (DieWithParent). In the child, `out` becomes its stdout and `err` its stderr (-1: this
  // process's); open them close-on-exec, so the child keeps only those copies.
  void Start(std::vector<std::string> argv, int out, int err);

  pid_t pid_ = -1;
};

// A program in the background (`argv[0]`: its path) with its stdout and stderr in file
// `log`, made afresh.
class LoggedProcess : public ChildProcess {
 public:
  LoggedProcess(std::vector<std::string> argv, std::string log);
  // What it printed so far.
  std::string Output() const;

 private:
  const std::string log_;
};

// A child server process (tessera-shard, tessera-coordinator) started with --port=0
// unless `args` names a port; its first stdout line ends in the port it listens on.
class ServerProcess : public ChildProcess {
 public:
  // `quiet`: its stderr goes to /dev/null (a benchmark's servers), else to the parent's.
  ServerProcess(const std::string& binary, std::vector<std::string> args, bool quiet = false);
  // 127.0.0.1:PORT, or empty when the process did not start.
  const std::string& address() const { return address_; }

 private:
  std::string address_;
};

}  // namespace tessera::base

#endif  // TESSERA_BASE_CHILD_PROCESS_H_
