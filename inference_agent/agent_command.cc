#include "inference_agent/agent_command.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <optional>
#include <thread>

#include "controller/client.h"
#include "inference_agent/agent.h"
#include "inference_agent/agent_runner.h"
#include "inference_agent/cuda_ipc.h"
#include "inference_agent/pacer.h"
#include "models/generate.h"
#include "common/process_control.h"
#include "routing/json_reader.h"
#include "routing/spec_io.h"
#include "transport/libfabric/libfabric_engine.h"

namespace wsync::inference {
namespace {

void LogLine(const std::string& line) { wsync::LogLine("inference-agent", line); }

}  // namespace

StatusOr<InferenceRank> LoadInferenceRank(const InferenceAgentFlags& flags) {
  if (flags.layout.empty() == flags.cluster.empty()) {
    return InvalidArgument("give exactly one of --layout (wsync.inference/v1 file) and --cluster (cluster spec)");
  }
  InferenceSpec spec;
  std::string source;
  if (!flags.layout.empty()) {
    // An engine may write a layout of its own rank only (wsync.export_cuda_ipc does).
    WSYNC_ASSIGN_OR_RETURN(nlohmann::json doc, ReadJsonFile(flags.layout));
    const nlohmann::json ranks = doc.is_object() ? doc.value("ranks", nlohmann::json()) : nlohmann::json();
    if (ranks.is_array() && ranks.size() == 1 && ranks[0].is_object() &&
        ranks[0].value("rank", nlohmann::json()) == flags.rank)
      return ParseOneInferenceRank(ranks[0], flags.layout);
    WSYNC_ASSIGN_OR_RETURN(spec, ParseInferenceSpec(doc, flags.layout));
    source = flags.layout;
  } else {
    WSYNC_ASSIGN_OR_RETURN(GeneratedSpecs gen, GenerateFromClusterFile(flags.cluster));
    spec = std::move(gen.inference);
    source = flags.cluster;
  }
  for (InferenceRank& r : spec.ranks) {
    if (r.rank == flags.rank) return std::move(r);
  }
  return NotFound(source + ": no inference rank " + std::to_string(flags.rank) + " (it has " +
                  std::to_string(spec.ranks.size()) + " ranks)");
}

int RunInferenceAgentCommand(const InferenceAgentFlags& flags) {
  auto fail = [](const Status& s) {
    LogLine("error: " + s.message());
    return 1;
  };
  // First, before any thread and before the layout loads (see the trainer
  // agent's command: libraries' load-time handlers must not see a stop).
  StopOnSignal signals("inference-agent");
  StatusOr<InferenceRank> rank = LoadInferenceRank(flags);
  if (!rank.ok()) return fail(rank.status());
  controller::ClientOptions client_options;
  client_options.tls_ca_file = flags.tls_ca_file;
  StatusOr<controller::ControllerClient> client =
      controller::ControllerClient::Connect(flags.controller, flags.secret_file, client_options);
  if (!client.ok()) return fail(client.status());

  std::optional<cuda_ipc::Export> ipc;
  StatusOr<transport::fabric::GpuMemory> want = transport::fabric::GpuMemoryForStaging(flags.staging);
  if (!want.ok()) return fail(want.status().WithContext("--staging"));
  if (!flags.cuda_ipc.empty()) {
    StatusOr<cuda_ipc::Export> read = ReadCudaIpcExport(flags.cuda_ipc, *rank);
    if (!read.ok()) return fail(read.status());
    ipc = std::move(read).value();
  }
  const std::string shm_name = flags.shm_name.empty() ? WeightStoreName(flags.job, flags.rank) : flags.shm_name;
  StatusOr<WeightStore> store =
      flags.attach ? WeightStore::Attach(shm_name, *rank) : WeightStore::Create(shm_name, *rank);
  if (!store.ok()) return fail(store.status());
  if (flags.keep_shm) store->KeepName();
  // The engine's update() requests (--paced); the mapping outlives the store's moves.
  std::optional<WeightStore::UpdateChannel> channel;
  if (flags.paced) channel = store->update_channel();
  LogLine(std::string(flags.attach ? "attached to" : "created") + " weight store '" + shm_name + "' (complete_version " +
          (store->complete_version() == kNoVersion ? std::string("none") : std::to_string(store->complete_version())) +
          ")");

  std::unique_ptr<WeightMemory> memory;
  transport::fabric::LibfabricOptions options;
  options.provider = flags.provider;
  options.num_nics = flags.nics;
  options.node = flags.node;
  if (ipc.has_value()) {
    // Opened before the engine starts: the engine's worker takes on the
    // CUDA context current where it was created.
    StatusOr<std::unique_ptr<WeightMemory>> opened = OpenCudaIpcWeights(*ipc, std::move(store).value());
    if (!opened.ok()) return fail(opened.status());
    memory = std::move(opened).value();
    options.gpu = memory->regions().empty() ? 0 : memory->regions().front().device;  // this process's ordinal
    LogLine("opened " + memory->name() + " from " + flags.cuda_ipc);
  } else {
    memory = MakeShmWeightMemory(std::move(store).value());
  }
  std::unique_ptr<transport::Engine> engine;
  bool staged = false;
  if (ipc.has_value()) {
    StatusOr<transport::fabric::GpuEngine> made = transport::fabric::CreateLibfabricEngineForGpu(options, *want);
    if (!made.ok()) return fail(made.status().WithContext("--cuda-ipc: the weights are GPU memory"));
    engine = std::move(made->engine);
    staged = !made->cuda_memory;
    if (staged) {
      LogLine("writes land in pinned host memory and are copied into the GPU tensors once a version landed on "
              "every rank (host staging: " + made->why_not +
              "); the slower path: as much pinned host memory as the tensors, and one more copy of every byte");
    }
  } else {
    StatusOr<std::unique_ptr<transport::Engine>> made = transport::fabric::CreateLibfabricEngine(options);
    if (!made.ok()) return fail(made.status());
    engine = std::move(made).value();
  }

  InferenceAgentOptions agent_options;
  agent_options.log = LogLine;
  agent_options.hold = flags.verify_checksums;
  agent_options.deltas = flags.deltas;
  if (flags.shadow || staged) {
    StatusOr<std::unique_ptr<ShadowMemory>> shadow =
        ipc.has_value() ? MakeCudaShadow(*memory, staged) : MakeHostShadow(*memory);
    if (!shadow.ok()) return fail(shadow.status());
    agent_options.shadow = std::move(shadow).value();
    if (flags.shadow) {  // staging said its own line above
      uint64_t bytes = 0;
      for (const WeightMemory::Region& r : memory->regions()) bytes += r.size;
      LogLine("shadow mode: " + std::to_string(bytes) + " bytes of private " +
              (ipc.has_value() && !staged ? "GPU" : "host") + " memory take the writes; '" + memory->name() +
              "' changes only when a version is complete everywhere");
    }
  }
  if (flags.paced) {
    rank->pacing = flags.shadow || staged ? Pacing::kShadow : Pacing::kLive;
    LogLine(std::string("engine-paced (") + PacingName(rank->pacing) +
            "): the weights change only when the engine asks (StoreVersions.update)" +
            (rank->pacing == Pacing::kLive ? "; trainers' pushes wait for it" : "; pushes land in the shadow meanwhile"));
  }
  StatusOr<std::unique_ptr<InferenceAgent>> agent =
      InferenceAgent::Create(std::move(engine), std::move(memory), std::move(rank).value(), agent_options);
  if (!agent.ok()) return fail(agent.status());
  std::optional<Pacer> pacer;
  if (flags.paced) pacer.emplace(**agent, *client, (*agent)->rank().pacing);

  AgentRunnerOptions run;
  run.version_timeout = std::chrono::milliseconds(static_cast<int64_t>(flags.version_timeout_s * 1000));
  run.plan_timeout = std::chrono::milliseconds(static_cast<int64_t>(flags.plan_timeout_s * 1000));
  run.poll_interval = std::chrono::milliseconds(std::max(1, flags.poll_ms));
  run.verify_checksums = flags.verify_checksums;
  run.log = LogLine;
  run.on_registered = [] { std::cout << "ready" << std::endl; };
  run.pacer = pacer ? &*pacer : nullptr;
  // The engine's asks, answered one at a time on a thread of their own
  // (an update() may wait for trainers; the runner must go on meanwhile).
  std::atomic<bool> ended{false};
  std::thread asks;
  if (pacer) {
    asks = std::thread([&] {
      while (!ended.load(std::memory_order_acquire) && !signals.stop.load(std::memory_order_acquire)) {
        std::optional<WeightStore::UpdateChannel::Request> ask = channel->Pending();
        if (!ask) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          continue;
        }
        const auto deadline = ask->timeout_ms == 0 ? std::chrono::steady_clock::time_point::max()
                                                   : std::chrono::steady_clock::now() +
                                                         std::chrono::milliseconds(std::min<uint64_t>(
                                                             ask->timeout_ms, uint64_t{1} << 40));
        StatusOr<UpdateReport> r = pacer->Update(
            ask->version == 0 ? std::nullopt : std::optional<uint64_t>(ask->version), deadline);
        if (r.ok()) {
          LogLine("update(): version " + std::to_string(r->version) + " (was " + std::to_string(r->previous) +
                  ") in " + std::to_string(r->seconds) + " s");
          channel->Answer(ask->seq, r->version, kUpdateOk, "");
        } else {
          LogLine("update(): " + r.status().message());
          const uint64_t now = (*agent)->memory().complete_version();
          channel->Answer(ask->seq, now == kNoVersion ? 0 : now,
                          r.status().code() == StatusCode::kDeadlineExceeded ? kUpdateTimedOut : kUpdateFailed,
                          r.status().message());
        }
      }
    });
  }
  Status s = RunInferenceAgent(**agent, *client, run, signals.stop);
  ended.store(true, std::memory_order_release);
  if (asks.joinable()) asks.join();
  if (!s.ok()) return fail(s);
  LogLine("stopped");
  return 0;
}

}  // namespace wsync::inference
