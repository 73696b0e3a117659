#include "common/process_control.h"

#include <pthread.h>

#include <chrono>
#include <cstdio>
#include <ctime>

namespace wsync {

void LogLine(const std::string& component, const std::string& line) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &tm);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::fprintf(stderr, "%s.%03lld %s: %s\n", stamp, static_cast<long long>(ms), component.c_str(), line.c_str());
}

StopOnSignal::StopOnSignal(std::string component) : component_(std::move(component)) {
  sigemptyset(&set_);
  sigaddset(&set_, SIGTERM);
  sigaddset(&set_, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  thread_ = std::thread([this] {
    int sig = 0;
    if (sigwait(&set_, &sig) != 0 || done_.load()) return;
    LogLine(component_, std::string("got ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT") + ", stopping");
    stop.store(true, std::memory_order_release);
  });
}

StopOnSignal::~StopOnSignal() {
  if (!stop.load()) {
    done_.store(true);
    pthread_kill(thread_.native_handle(), SIGTERM);  // wakes sigwait; ignored via done_
  }
  thread_.join();
  // The stop signals stay blocked: this object lives in a process's main
  // and is destroyed on the way out of it. A stop is often asked for more
  // than once (demo/process.cc signals the child's group and then the
  // child; a dying parent sends PR_SET_PDEATHSIG; supervisors repeat). The
  // sigwait thread took the first; the rest are already answered. Unblocked,
  // any of them, pending or arriving a moment later, is delivered to the
  // handlers libraries installed: libfabric's shm provider chains to
  // libinfinipath's (loaded with libfabric), which ends the process with
  // exit() from inside the handler, so exit-time destructors run in a signal
  // (TSan reported it, twice: draining the pending ones was not enough) and
  // the agent's own status is lost. Blocked, they are discarded at exit.
}

}  // namespace wsync
