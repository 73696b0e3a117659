// A role of the test binary run as a separate process (it re-executes
// itself: main.cc dispatches on argv[1]), talked to through its stdin and
// stdout one line at a time. Killed and reaped when the test ends.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace wsync::inference::testing {

class ChildProcess {
 public:
  explicit ChildProcess(std::vector<std::string> args) {
    args.insert(args.begin(), "/proc/self/exe");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {  // only async-signal-safe calls until exec
      dup2(in[0], 0);
      dup2(out[1], 1);
      close(in[1]);
      close(out[0]);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_child_ = in[1];
    from_child_ = out[0];
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  // Asks politely first: end of stdin (roles reading commands exit on it),
  // then SIGTERM, then SIGKILL. A killed libfabric process leaves its shm
  // provider files behind, and a later process that gets the same pid then
  // fails to open its endpoint (fi_enable: EBUSY).
  ~ChildProcess() {
    if (to_child_ >= 0) close(to_child_);
    if (pid_ > 0 && Wait(std::chrono::seconds(5)) == -1) {
      kill(pid_, SIGTERM);
      if (Wait(std::chrono::seconds(5)) == -1) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
      }
    }
    if (from_child_ >= 0) close(from_child_);
  }

  bool Send(const std::string& line) {
    const std::string s = line + "\n";
    return write(to_child_, s.data(), s.size()) == static_cast<ssize_t>(s.size());
  }

  // The next line the child printed, or "timeout" / "eof".
  std::string ReadLine(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const size_t nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return "timeout";
      pollfd p{from_child_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char chunk[4096];
      const ssize_t n = read(from_child_, chunk, sizeof(chunk));
      if (n <= 0) return "eof";
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }

  void Signal(int sig) {
    if (pid_ > 0) kill(pid_, sig);
  }

  // Exit status, or -1 if still running after `timeout`.
  int Wait(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (pid_ > 0) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (std::chrono::steady_clock::now() > deadline) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  std::string buffer_;
};

}  // namespace wsync::inference::testing
