#include "demo/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

namespace wsync::demo {

std::string SelfExecutable() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "wsync";
  buf[n] = '\0';
  return buf;
}

ChildProcess::~ChildProcess() { Stop(); }

ChildProcess::ChildProcess(ChildProcess&& o) noexcept { *this = std::move(o); }

ChildProcess& ChildProcess::operator=(ChildProcess&& o) noexcept {
  if (this != &o) {
    Stop();
    name_ = std::move(o.name_);
    log_ = std::move(o.log_);
    pid_ = std::exchange(o.pid_, -1);
    stdout_fd_ = std::exchange(o.stdout_fd_, -1);
    buffer_ = std::move(o.buffer_);
    exited_ = o.exited_;
    exit_status_ = o.exit_status_;
  }
  return *this;
}

StatusOr<ChildProcess> ChildProcess::Spawn(const std::string& name, const std::vector<std::string>& argv,
                                           const std::string& stderr_log) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return Internal("pipe2 failed: " + std::string(std::strerror(errno)));
  const int log_fd = open(stderr_log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    close(out[0]);
    close(out[1]);
    return Internal("cannot open log '" + stderr_log + "': " + std::strerror(errno));
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(out[0]);
    close(out[1]);
    close(log_fd);
    return Internal("fork failed: " + std::string(std::strerror(errno)));
  }
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    setpgid(0, 0);  // its own group: a stop reaches its helpers (ip netns exec) too
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // never outlive the harness, even if it is killed
    execvp(args[0], args.data());
    std::fprintf(stderr, "exec %s failed: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(out[1]);
  close(log_fd);
  ChildProcess p;
  p.name_ = name;
  p.log_ = stderr_log;
  p.pid_ = pid;
  p.stdout_fd_ = out[0];
  return p;
}

StatusOr<std::string> ChildProcess::ReadLine(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return DeadlineExceeded(name_ + " printed no line within " + std::to_string(timeout.count()) +
                              " ms; its log ends: " + LogTail());
    }
    pollfd pfd{stdout_fd_, POLLIN, 0};
    const int r = poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), 200)));
    if (r < 0 && errno != EINTR) return Internal("poll failed: " + std::string(std::strerror(errno)));
    if (r > 0) {
      char buf[4096];
      const ssize_t n = read(stdout_fd_, buf, sizeof buf);
      if (n > 0) {
        buffer_.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n == 0) {
        (void)Wait(std::chrono::milliseconds(2000));
        return Unavailable(name_ + " exited (status " + std::to_string(exit_status_) + "); its log ends: " +
                           LogTail());
      }
    }
  }
}

Status ChildProcess::WaitForLine(const std::string& line, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    WSYNC_ASSIGN_OR_RETURN(std::string got, ReadLine(std::max(left, std::chrono::milliseconds(1))));
    if (got == line) return Status::Ok();
  }
}

bool ChildProcess::running() {
  if (pid_ < 0 || exited_) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exited_ = true;
    exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    return false;
  }
  return true;
}

void ChildProcess::Kill(int signal) {
  if (pid_ > 0 && !exited_) {
    kill(-pid_, signal);  // the whole group
    kill(pid_, signal);
  }
}

StatusOr<int> ChildProcess::Wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (running()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return DeadlineExceeded(name_ + " did not exit within " + std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return exit_status_;
}

void ChildProcess::Stop() {
  if (pid_ > 0) {
    if (running()) {
      Kill(SIGTERM);
      if (!Wait(std::chrono::milliseconds(5000)).ok()) {
        Kill(SIGKILL);
        (void)Wait(std::chrono::milliseconds(5000));
      }
    }
    pid_ = -1;
  }
  if (stdout_fd_ >= 0) close(stdout_fd_);
  stdout_fd_ = -1;
}

std::string ChildProcess::LogTail(size_t bytes) const {
  std::ifstream f(log_);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  if (s.size() > bytes) s = "..." + s.substr(s.size() - bytes);
  for (char& c : s) {
    if (c == '\n') c = '|';
  }
  return s.empty() ? "(empty)" : s;
}

}  // namespace wsync::demo
