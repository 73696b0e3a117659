#include "trainer_agent/agent_command.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <thread>

#include "controller/client.h"
#include "models/generate.h"
#include "routing/spec_io.h"
#include "trainer_agent/agent_runner.h"
#include "trainer_agent/shard_export.h"
#include "transport/libfabric/libfabric_engine.h"

namespace wsync::trainer_agent {
namespace {

void LogLine(const std::string& line) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &tm);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::fprintf(stderr, "%s.%03lld trainer-agent: %s\n", stamp, static_cast<long long>(ms), line.c_str());
}

// SIGTERM/SIGINT are blocked in every thread (the engine's and Gloo's
// threads inherit the mask) and taken by one thread with sigwait, so no
// libfabric or socket call is interrupted and stopping is a plain flag.
class StopOnSignal {
 public:
  StopOnSignal() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set_, &old_);
    thread_ = std::thread([this] {
      int sig = 0;
      if (sigwait(&set_, &sig) != 0 || done_.load()) return;
      LogLine(std::string("got ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT") + ", stopping");
      stop.store(true, std::memory_order_release);
    });
  }
  ~StopOnSignal() {
    if (!stop.load()) {
      done_.store(true);
      pthread_kill(thread_.native_handle(), SIGTERM);  // wakes sigwait; ignored via done_
    }
    thread_.join();
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

  std::atomic<bool> stop{false};

 private:
  sigset_t set_{}, old_{};
  std::atomic<bool> done_{false};
  std::thread thread_;
};

std::chrono::milliseconds Ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

}  // namespace

StatusOr<TrainerRankSpec> LoadTrainerRank(const TrainerAgentFlags& flags) {
  if (flags.layout.empty() == flags.cluster.empty()) {
    return InvalidArgument("give exactly one of --layout (wsync.trainer/v1 file) and --cluster (cluster spec)");
  }
  TrainerSpec spec;
  std::string source;
  if (!flags.layout.empty()) {
    WSYNC_ASSIGN_OR_RETURN(spec, ParseTrainerSpecFromFile(flags.layout));
    source = flags.layout;
  } else {
    WSYNC_ASSIGN_OR_RETURN(GeneratedSpecs gen, GenerateFromClusterFile(flags.cluster));
    spec = std::move(gen.trainer);
    source = flags.cluster;
  }
  for (TrainerRank& r : spec.ranks) {
    if (r.rank == flags.rank) return TrainerRankSpec{std::move(r), std::move(spec.mesh_groups)};
  }
  return NotFound(source + ": no trainer rank " + std::to_string(flags.rank) + " (it has " +
                  std::to_string(spec.ranks.size()) + " ranks)");
}

int RunTrainerAgentCommand(const TrainerAgentFlags& flags) {
  auto fail = [](const Status& s) {
    LogLine("error: " + s.message());
    return 1;
  };
  StatusOr<TrainerRankSpec> spec = LoadTrainerRank(flags);
  if (!spec.ok()) return fail(spec.status());
  StatusOr<controller::ControllerClient> client = controller::ControllerClient::FromAddress(flags.controller);
  if (!client.ok()) return fail(client.status());
  std::string shm_name = flags.shm_name;
  if (shm_name.empty()) {
    StatusOr<std::string> name = ShardRegionName(flags.job, flags.rank);
    if (!name.ok()) return fail(name.status());
    shm_name = *name;
  }

  StopOnSignal signals;  // before any thread is started
  transport::fabric::LibfabricOptions fabric;
  fabric.provider = flags.provider;
  fabric.num_nics = flags.nics;
  fabric.node = flags.node;
  fabric.gpu = spec->rank.gpu;
  StatusOr<std::unique_ptr<transport::Engine>> engine = transport::fabric::CreateLibfabricEngine(fabric);
  if (!engine.ok()) return fail(engine.status());

  TrainerAgentOptions options;
  options.executor.watermark_bytes = flags.watermark;
  options.executor.rendezvous_prefix = "trainer";
  options.executor.gloo.hostname = flags.gloo_host;
  options.executor.gloo.iface = flags.gloo_iface;
  options.executor.gloo.timeout = Ms(flags.gloo_timeout_s);
  options.plan_timeout = Ms(flags.plan_timeout_s);
  options.shm_timeout = Ms(flags.shm_timeout_s);
  options.log = LogLine;
  options.on_registered = [] { std::cout << "ready" << std::endl; };
  Status s = RunTrainerAgent(spec->rank, spec->mesh_groups, shm_name, **engine, *client, options, signals.stop);
  if (!s.ok()) return fail(s);
  LogLine("stopped");
  return 0;
}

}  // namespace wsync::trainer_agent
