// A child process of a transport test (transport_peer, possibly inside a
// network namespace), killed and reaped when the test ends, pass or fail.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace wsync::transport::testing {

class PeerProcess {
 public:
  // argv[0] is the program; exec'd with execvp.
  explicit PeerProcess(std::vector<std::string> argv) {
    // Built before fork: the child of a threaded parent may only make
    // async-signal-safe calls (no malloc) until exec.
    std::vector<char*> raw;
    for (std::string& a : argv) raw.push_back(a.data());
    raw.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      execvp(raw[0], raw.data());
      _exit(127);
    }
  }
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;
  ~PeerProcess() { Kill(); }

  // Asks the process to exit (SIGTERM: it closes its endpoints, which
  // removes its shm region), then SIGKILLs it after `grace`.
  void Kill(std::chrono::milliseconds grace = std::chrono::milliseconds(3000)) {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    if (Wait(grace) == -1) KillHard();
  }

  // Death without cleanup, as a crashed peer. Its shm regions (named
  // wsync-<pid>-*) are removed so dead-peer tests leave nothing in /dev/shm.
  void KillHard() {
    if (pid_ <= 0) return;
    const pid_t pid = pid_;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
    const std::string prefix = "wsync-" + std::to_string(pid) + "-";
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
      if (entry.path().filename().string().rfind(prefix, 0) == 0) std::filesystem::remove(entry.path(), ec);
    }
  }

  // Exit status, or -1 if still running after `timeout`.
  int Wait(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (pid_ > 0) {
      int status = 0;
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
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
};

}  // namespace wsync::transport::testing
