#include "trainer_agent/agent_runner.h"

#include <algorithm>
#include <thread>

#include "pipeline/cuda_device.h"
#include "pipeline/http_store.h"
#include "pipeline/staged_group.h"
#include "trainer_agent/cuda_shards.h"
#include "trainer_agent/shard_export.h"
#include "trainer_agent/version_step.h"

namespace wsync::trainer_agent {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr milliseconds kSlice(200);  // how often waits look at `stop`

void Log(const TrainerAgentOptions& o, const std::string& line) {
  if (o.log) o.log(line);
}

// Deadline of a wait bounded by `timeout` (0: none).
Clock::time_point DeadlineAfter(milliseconds timeout) {
  return timeout.count() > 0 ? Clock::now() + timeout : Clock::time_point::max();
}

StatusOr<controller::TrainerPlanSlice> FetchPlan(controller::ControllerClient& client, int32_t rank,
                                                 const TrainerAgentOptions& o, const std::atomic<bool>& stop) {
  const Clock::time_point deadline = DeadlineAfter(o.plan_timeout);
  while (true) {
    const Clock::time_point slice = std::min(deadline, Clock::now() + milliseconds(2000));
    StatusOr<controller::TrainerPlanSlice> plan = client.FetchTrainerPlan(rank, slice);
    if (plan.ok() || plan.status().code() != StatusCode::kDeadlineExceeded || Clock::now() >= deadline) return plan;
    if (stop.load(std::memory_order_acquire)) return Aborted("stopped while waiting for the plan");
  }
}

StatusOr<std::unique_ptr<ShardView>> OpenShards(const std::string& name, const TrainerRank& rank,
                                                const TrainerAgentOptions& o, const std::atomic<bool>& stop) {
  const Clock::time_point deadline = DeadlineAfter(o.shm_timeout);
  const ShardPlacement placement = o.cuda_ipc.empty() ? ShardPlacement::kInRegion : ShardPlacement::kCudaIpc;
  bool told = false;
  while (true) {
    StatusOr<std::unique_ptr<ShardView>> view = ShardView::Open(name, rank, placement);
    // A layout or placement mismatch will not fix itself; a missing or
    // half-made region will.
    if (view.ok() || view.status().message().find("layout hash") != std::string::npos ||
        view.status().message().find("exported by trainer rank") != std::string::npos ||
        view.status().message().find("--cuda-ipc") != std::string::npos) {
      return view;
    }
    if (Clock::now() >= deadline) {
      return view.status().WithContext("waiting for the trainer to export its shards as '" + name + "'");
    }
    if (stop.load(std::memory_order_acquire)) return Aborted("stopped while waiting for the shard export");
    if (!told) {
      Log(o, "waiting for the trainer to export its shards as '" + name + "' (" + view.status().message() + ")");
      told = true;
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
}

// The GPU route's pieces, in the order they must go: the shards opened (the
// GPU is theirs), the pipeline's device on it, the engine for it.
struct GpuRoute {
  std::unique_ptr<CudaIpcShards> shards;  // null: shards in shared memory
  std::unique_ptr<DeviceOps> device;
};

StatusOr<GpuRoute> OpenGpuRoute(ShardView& view, const TrainerAgentOptions& o,
                                TrainerAgentOptions::DeviceEngine* engine) {
  GpuRoute route;
  if (o.cuda_ipc.empty()) return route;
  if (!o.make_device_engine) return InvalidArgument("--cuda-ipc without a way to make the GPU's engine");
  WSYNC_ASSIGN_OR_RETURN(route.shards, CudaIpcShards::Open(o.cuda_ipc, view.layout(), &view));
  WSYNC_ASSIGN_OR_RETURN(route.device, MakeCudaDevice(route.shards->device()));
  StatusOr<TrainerAgentOptions::DeviceEngine> made = o.make_device_engine(route.shards->device());
  if (!made.ok()) return made.status().WithContext("the pipeline runs on " + route.device->name());
  *engine = std::move(made).value();
  Log(o, "opened " + route.shards->Describe() + " from " + o.cuda_ipc + "; the pipeline runs on " +
             route.device->name() + "; all-gathers go through host memory (Gloo), the slower path");
  if (engine->stage_through_host) {
    Log(o, "writes leave " + route.device->name() + " through pinned host memory (host staging: " +
               engine->why_staged + "); the slower path: one more copy of every written byte");
  }
  return route;
}

}  // namespace

Status RunTrainerAgent(const TrainerRank& rank, const std::vector<MeshGroupSpec>& mesh_groups,
                       const std::string& shm_name, std::unique_ptr<transport::Engine>& engine,
                       controller::ControllerClient& client, const TrainerAgentOptions& options,
                       const std::atomic<bool>& stop) {
  const std::string me = "trainer rank " + std::to_string(rank.rank);
  StatusOr<nlohmann::json> reg = client.RegisterTrainer(rank, mesh_groups);
  if (!reg.ok()) return reg.status().WithContext(me + ": registering with controller " + client.address());
  Log(options, "registered " + me + " with controller " + client.address() + " (" +
                   std::to_string(reg->value("registered", 0)) + " of " + std::to_string(reg->value("world", 0)) +
                   " registered, phase " + reg->value("phase", std::string("?")) + ")");
  if (options.on_registered) options.on_registered();
  // Once heartbeats start, the controller fails this rank's versions, naming
  // it, within its heartbeat timeout if the process dies.
  controller::HeartbeatSender heartbeat(client, controller::Role::kTrainer, rank.rank);

  StatusOr<controller::TrainerPlanSlice> slice = FetchPlan(client, rank.rank, options, stop);
  if (!slice.ok()) {
    if (slice.status().code() == StatusCode::kAborted) return Status::Ok();
    return slice.status().WithContext(me + ": fetching the plan");
  }
  if (slice->plan.rank != rank.rank) {
    return Internal(me + ": the controller answered with the plan of rank " + std::to_string(slice->plan.rank));
  }
  size_t sources = 0;
  for (const RankMeshGroup& g : slice->plan.groups) sources += g.sources.size();
  Log(options, "plan " + slice->plan_id + ": " + std::to_string(slice->plan.groups.size()) + " mesh groups, " +
                   std::to_string(sources) + " sources, " + std::to_string(slice->plan.writes) + " writes, " +
                   std::to_string(slice->plan.write_bytes) + " bytes per version");

  StatusOr<std::unique_ptr<ShardView>> view = OpenShards(shm_name, rank, options, stop);
  if (!view.ok()) {
    if (view.status().code() == StatusCode::kAborted) return Status::Ok();
    return view.status().WithContext(me);
  }

  ExecutorOptions exec_options = options.executor;
  TrainerAgentOptions::DeviceEngine gpu_engine;
  StatusOr<GpuRoute> gpu = OpenGpuRoute(**view, options, &gpu_engine);
  if (!gpu.ok()) return gpu.status().WithContext(me);
  ShardSource* shards = view->get();
  EngineFactory make_engine = options.make_engine;
  std::unique_ptr<RendezvousStore> store = MakeHttpRendezvousStore(client);
  std::unique_ptr<GroupFactory> groups = MakeGlooGroupFactory(store.get(), options.gloo);
  if (gpu->shards != nullptr) {
    shards = gpu->shards.get();
    engine = std::move(gpu_engine.engine);
    exec_options.device = gpu->device.get();
    exec_options.stage_through_host = gpu_engine.stage_through_host;
    groups = MakeHostStagedGroupFactory(std::move(groups), gpu->device.get());
    const int ordinal = gpu->shards->device();
    make_engine = [make = options.make_device_engine, ordinal]() -> StatusOr<std::unique_ptr<transport::Engine>> {
      WSYNC_ASSIGN_OR_RETURN(TrainerAgentOptions::DeviceEngine e, make(ordinal));
      return std::move(e.engine);
    };
  }
  exec_options.rendezvous_prefix += "/" + slice->plan_id;
  uint64_t epoch = slice->epoch;
  StatusOr<std::unique_ptr<PlanExecutor>> created =
      PlanExecutor::Create(std::move(slice->plan), engine.get(), groups.get(), exec_options);
  if (!created.ok()) return created.status();
  std::unique_ptr<PlanExecutor> executor = std::move(created).value();
  // After an inference rank registered again with new memory: the slice of
  // the new epoch, and an executor that imports its descriptors; with
  // `new_engine`, on a new engine too (after writes that timed out).
  const std::function<void(const std::string&)> log = [&](const std::string& line) { Log(options, line); };
  auto replan = [&](bool new_engine = false) -> Status {
    StatusOr<controller::TrainerPlanSlice> fresh = FetchPlan(client, rank.rank, options, stop);
    if (!fresh.ok()) return fresh.status().WithContext(me + ": fetching the plan of the new epoch");
    return RebuildExecutor(std::move(fresh).value(), groups.get(), exec_options,
                           new_engine ? &make_engine : nullptr, me, log, engine, executor, epoch);
  };
  Log(options, "ready: temporary memory " + std::to_string(executor->arena_bytes()) + " bytes (watermark " +
                   std::to_string(exec_options.watermark_bytes) + ", largest source needs " +
                   std::to_string(executor->max_source_need()) + ")");

  // Versions a previous agent of this rank already read are not run again.
  uint64_t last = (*view)->reads_done_version();
  while (!stop.load(std::memory_order_acquire)) {
    StatusOr<uint64_t> published = (*view)->WaitPublished(last, kSlice);
    if (!published.ok()) continue;  // nothing new yet; look at `stop` again
    const uint64_t v = *published;
    last = v;
    Status why, replan_error;
    const VersionDecision decision = StartVersionAtCurrentEpoch(
        client, rank.rank, v, epoch, options.log, [&] { return replan(); }, &why, &replan_error);
    if (!replan_error.ok()) return replan_error;
    if (decision != VersionDecision::kRun) {
      // Every peer that ran `v` failed a collective with this rank and
      // rebuilds its groups under the next version: this rank must too.
      executor->ResetGroups();
      (*view)->MarkFailed(v);
      if (options.on_version) options.on_version(v, why);
      continue;
    }
    StatusOr<VersionReport> result = RunAndReport(*executor, client, rank.rank, v, *shards, options.log);
    // A failed version is marked failed in the export, which releases the
    // trainer (it may change its weights; the version will never complete).
    if (!result.ok()) (*view)->MarkFailed(v);
    if (options.on_version) options.on_version(v, result);
    if (!result.ok() && executor->writes_timed_out() && make_engine) {
      Status replaced = replan(/*new_engine=*/true);
      if (!replaced.ok()) return replaced;
    }
  }
  return Status::Ok();
}

}  // namespace wsync::trainer_agent
