// A child process of the demo / integration harness: started with argv,
// stdout read line by line (agents print "ready", the controller its
// address), stderr appended to a log file, stopped on destruction.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/status.h"

namespace wsync::demo {

class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess();  // SIGTERM, then SIGKILL after a grace period
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // `name` labels the process in errors ("trainer-agent 2").
  static StatusOr<ChildProcess> Spawn(const std::string& name, const std::vector<std::string>& argv,
                                      const std::string& stderr_log);

  // Next stdout line (without '\n'); DeadlineExceeded after `timeout`,
  // Unavailable if the process exited (the message quotes its log's tail).
  StatusOr<std::string> ReadLine(std::chrono::milliseconds timeout);
  // Reads lines until one equals `line`.
  Status WaitForLine(const std::string& line, std::chrono::milliseconds timeout);

  bool running();
  void Kill(int signal);
  // Waits for exit; returns the exit status (or -signal).
  StatusOr<int> Wait(std::chrono::milliseconds timeout);
  void Stop();  // SIGTERM, wait up to 5 s, SIGKILL

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  std::string LogTail(size_t bytes = 600) const;

 private:
  std::string name_;
  std::string log_;
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string buffer_;
  bool exited_ = false;
  int exit_status_ = 0;
};

// This executable's path (/proc/self/exe), to start `wsync <subcommand>`.
std::string SelfExecutable();

}  // namespace wsync::demo
