// Small process-level helpers shared by the long-running wsync commands
// (trainer agent, inference agent): timestamped log lines on stderr, and a
// stop flag raised by SIGTERM/SIGINT without interrupting any system call.
#pragma once

#include <atomic>
#include <csignal>
#include <string>
#include <thread>

namespace wsync {

// "HH:MM:SS.mmm <component>: <line>" on stderr (UTC).
void LogLine(const std::string& component, const std::string& line);

// SIGTERM/SIGINT are blocked in every thread created after this object (the
// engine's and Gloo's threads inherit the mask) and taken by one thread with
// sigwait, so no libfabric or socket call is interrupted and stopping is a
// plain flag. Create it first in main-like code, before any other thread;
// the signals stay blocked after it is destroyed (see the destructor).
class StopOnSignal {
 public:
  explicit StopOnSignal(std::string component);
  ~StopOnSignal();
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

  std::atomic<bool> stop{false};

 private:
  std::string component_;
  sigset_t set_{};
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace wsync
