#include "base/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tessera::base {

pid_t ChildProcess::ParentToDieWith() {
  return static_cast<pid_t>(syscall(SYS_gettid)) == getpid() ? getpid() : 0;
}

void ChildProcess::DieWithParent(pid_t parent) {
  if (parent == 0) return;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(125);  // the parent died before prctl took effect
}

void ChildProcess::Start(std::vector<std::string> args, int out, int err) {
  // Everything is built before fork: the child of a threaded process may only exec.
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ParentToDieWith();
  pid_ = fork();
  if (pid_ == 0) {
    DieWithParent(parent);
    if (out >= 0) dup2(out, STDOUT_FILENO);
    if (err >= 0) dup2(err, STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
}

void ChildProcess::Signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

void ChildProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

void ChildProcess::Terminate(std::chrono::milliseconds grace) {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Kill();
}

int ChildProcess::WaitForExit() {
  int status = 0;
  if (pid_ <= 0 || waitpid(pid_, &status, 0) != pid_) return -1;
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

ServerProcess::ServerProcess(const std::string& binary, std::vector<std::string> args, bool quiet) {
  bool has_port = false;
  for (const auto& a : args) has_port |= a.rfind("--port=", 0) == 0;
  if (!has_port) args.insert(args.begin(), "--port=0");
  args.insert(args.begin(), binary);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return;
  const int null = quiet ? open("/dev/null", O_WRONLY | O_CLOEXEC) : -1;
  Start(std::move(args), fds[1], null);
  if (null >= 0) close(null);
  close(fds[1]);
  FILE* out = fdopen(fds[0], "r");
  char line[256] = {0};
  if (out != nullptr && fgets(line, sizeof(line), out) != nullptr) {
    const std::string s(line);
    const size_t colon = s.rfind(':');
    int port = 0;
    if (colon != std::string::npos && absl::SimpleAtoi(s.substr(colon + 1), &port)) {
      address_ = absl::StrCat("127.0.0.1:", port);
    }
  }
  if (out != nullptr) fclose(out);
}

LoggedProcess::LoggedProcess(std::vector<std::string> argv, std::string log)
    : log_(std::move(log)) {
  const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  Start(std::move(argv), fd, fd);
  close(fd);
}

std::string LoggedProcess::Output() const {
  std::ifstream in(log_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace tessera::base
