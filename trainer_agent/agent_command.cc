#include "trainer_agent/agent_command.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <thread>

#include "controller/client.h"
#include "models/generate.h"
#include "common/process_control.h"
#include "routing/spec_io.h"
#include "trainer_agent/agent_runner.h"
#include "trainer_agent/shard_export.h"
#include "transport/libfabric/libfabric_engine.h"

namespace wsync::trainer_agent {
namespace {

void LogLine(const std::string& line) { wsync::LogLine("trainer-agent", line); }

std::chrono::milliseconds Ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

}  // namespace

std::chrono::milliseconds WriteTimeoutWithin(std::chrono::milliseconds engine_default,
                                             std::chrono::milliseconds gloo_timeout) {
  return std::max(std::chrono::milliseconds(1), std::min(engine_default, gloo_timeout / 2));
}

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
  // First, before any thread and before the specs load: a stop that comes
  // earlier meets the handlers libraries install when they are loaded
  // (libinfinipath, pulled in by libfabric, exits from inside its handler).
  StopOnSignal signals("trainer-agent");
  StatusOr<TrainerRankSpec> spec = LoadTrainerRank(flags);
  if (!spec.ok()) return fail(spec.status());
  controller::ClientOptions client_options;
  client_options.tls_ca_file = flags.tls_ca_file;
  StatusOr<controller::ControllerClient> client =
      controller::ControllerClient::Connect(flags.controller, flags.secret_file, client_options);
  if (!client.ok()) return fail(client.status());
  std::string shm_name = flags.shm_name;
  if (shm_name.empty()) {
    StatusOr<std::string> name = ShardRegionName(flags.job, flags.rank);
    if (!name.ok()) return fail(name.status());
    shm_name = *name;
  }

  transport::fabric::LibfabricOptions fabric;
  fabric.provider = flags.provider;
  fabric.num_nics = flags.nics;
  fabric.node = flags.node;
  fabric.gpu = spec->rank.gpu;
  fabric.op_timeout = WriteTimeoutWithin(fabric.op_timeout, Ms(flags.gloo_timeout_s));
  TrainerAgentOptions options;
  options.executor.watermark_bytes = flags.watermark;
  options.executor.checksums = flags.checksums;
  options.executor.deltas = flags.deltas;
  options.executor.rendezvous_prefix = "trainer";
  options.gloo.hostname = flags.gloo_host;
  options.gloo.iface = flags.gloo_iface;
  options.gloo.timeout = Ms(flags.gloo_timeout_s);
  options.plan_timeout = Ms(flags.plan_timeout_s);
  options.shm_timeout = Ms(flags.shm_timeout_s);
  options.log = LogLine;
  options.on_registered = [] { std::cout << "ready" << std::endl; };
  options.make_engine = [fabric] { return transport::fabric::CreateLibfabricEngine(fabric); };
  std::unique_ptr<transport::Engine> host_engine;
  if (flags.cuda_ipc.empty()) {
    StatusOr<std::unique_ptr<transport::Engine>> engine = transport::fabric::CreateLibfabricEngine(fabric);
    if (!engine.ok()) return fail(engine.status());
    host_engine = std::move(engine).value();
  } else {
    // The engine is made once the shards are open: it is for their GPU.
    StatusOr<transport::fabric::GpuMemory> want = transport::fabric::GpuMemoryForStaging(flags.staging);
    if (!want.ok()) return fail(want.status());
    options.cuda_ipc = flags.cuda_ipc;
    options.make_device_engine = [fabric, want = *want](int ordinal)
        -> StatusOr<TrainerAgentOptions::DeviceEngine> {
      transport::fabric::LibfabricOptions on_gpu = fabric;
      on_gpu.gpu = ordinal;
      WSYNC_ASSIGN_OR_RETURN(transport::fabric::GpuEngine gpu,
                             transport::fabric::CreateLibfabricEngineForGpu(on_gpu, want));
      return TrainerAgentOptions::DeviceEngine{std::move(gpu.engine), !gpu.cuda_memory, gpu.why_not};
    };
  }
  Status s = RunTrainerAgent(spec->rank, spec->mesh_groups, shm_name, host_engine, *client, options, signals.stop);
  if (!s.ok()) return fail(s);
  LogLine("stopped");
  return 0;
}

}  // namespace wsync::trainer_agent
