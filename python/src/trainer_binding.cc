#include "python/src/trainer_binding.h"

#include <cstdio>
#include <iostream>
#include <utility>

#include "python/src/torch_device.h"
#include "transport/libfabric/libfabric_engine.h"
#include "trainer_agent/version_step.h"

namespace wsync::python {
namespace {

using Clock = std::chrono::steady_clock;

void LogLine(int32_t rank, const std::string& line) {
  std::fprintf(stderr, "wsync trainer rank %d: %s\n", rank, line.c_str());
}

// The executor's ShardSource over the pointers of one push: the trainer's
// own local tensors, read in place.
class PointerShards : public ShardSource {
 public:
  PointerShards(std::vector<ShardPointer> shards, std::shared_ptr<PushState> state) : state_(std::move(state)) {
    for (ShardPointer& s : shards) by_name_.emplace(s.name, s);
  }
  const uint8_t* Shard(const std::string& name, uint64_t* bytes) const override {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) {
      *bytes = 0;
      return nullptr;
    }
    *bytes = it->second.bytes;
    return it->second.data;
  }
  void ReadsDone(uint64_t) override { state_->MarkReadsDone(); }

 private:
  std::unordered_map<std::string, ShardPointer> by_name_;
  std::shared_ptr<PushState> state_;
};

}  // namespace

// -------------------------------------------------------------- PushState --

bool PushState::WaitReadsDone(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return reads_done_; });
}

StatusOr<VersionReport> PushState::Wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return result_.has_value(); })) {
    return DeadlineExceeded("version " + std::to_string(version_) + " still running after " +
                            std::to_string(timeout.count()) + " ms");
  }
  return *result_;
}

bool PushState::done() {
  std::lock_guard<std::mutex> lock(mu_);
  return result_.has_value();
}

void PushState::MarkReadsDone() {
  std::lock_guard<std::mutex> lock(mu_);
  reads_done_ = true;
  cv_.notify_all();
}

void PushState::Finish(StatusOr<VersionReport> result) {
  std::lock_guard<std::mutex> lock(mu_);
  reads_done_ = true;  // a version that ended reads nothing more
  result_ = std::move(result);
  cv_.notify_all();
}

// --------------------------------------------------------- TrainerSession --

StatusOr<std::unique_ptr<TrainerSession>> TrainerSession::Create(TrainerConfig config,
                                                                 std::unique_ptr<GroupFactory> groups) {
  if (!config.registration.contains("rank") || !config.registration["rank"].is_number_integer()) {
    return InvalidArgument("trainer registration has no integer 'rank'");
  }
  const int32_t rank = config.registration["rank"].get<int32_t>();
  const std::string me = "trainer rank " + std::to_string(rank);
  controller::ClientOptions client_options;
  client_options.tls_ca_file = config.tls_ca_file;
  client_options.retry_for_s = std::chrono::duration<double>(config.timeout).count();
  WSYNC_ASSIGN_OR_RETURN(controller::ControllerClient client,
                         controller::ControllerClient::Connect(config.controller, config.secret_file,
                                                                              client_options));
  std::unique_ptr<TrainerSession> s(new TrainerSession(std::move(config), std::move(client), rank));
  s->groups_ = std::move(groups);

  transport::fabric::LibfabricOptions fabric;
  fabric.provider = s->config_.provider;
  fabric.num_nics = s->config_.nics;
  fabric.node = s->config_.node;
  StatusOr<transport::fabric::GpuMemory> want = transport::fabric::GpuMemoryForStaging(s->config_.staging);
  if (!want.ok()) return want.status().WithContext(me);
  bool stage = false;
  if (s->config_.cuda_device >= 0) {
    WSYNC_ASSIGN_OR_RETURN(s->device_, MakeTorchCudaDevice(s->config_.cuda_device, s->config_.host_shards));
    fabric.gpu = s->config_.cuda_device;
    StatusOr<transport::fabric::GpuEngine> gpu =
        transport::fabric::CreateLibfabricEngineForGpu(fabric, *want);
    if (!gpu.ok()) return gpu.status().WithContext(me + ": the pipeline runs on " + s->device_->name());
    stage = !gpu->cuda_memory;
    fabric.enable_hmem = gpu->cuda_memory;
    s->engine_ = std::move(gpu->engine);
    if (stage) {
      LogLine(rank, "writes leave " + s->device_->name() + " through pinned host memory (host staging: " +
                        gpu->why_not + "); the slower path: one more copy of every written byte");
    }
  } else {
    StatusOr<std::unique_ptr<transport::Engine>> engine = transport::fabric::CreateLibfabricEngine(fabric);
    if (!engine.ok()) return engine.status().WithContext(me + ": starting the transport");
    s->engine_ = std::move(engine).value();
  }
  s->fabric_options_ = fabric;  // what a restarted engine is made with

  StatusOr<nlohmann::json> reg = s->client_.RegisterTrainerJson(s->config_.registration);
  if (!reg.ok()) return reg.status().WithContext(me + ": registering with controller " + s->client_.address());
  LogLine(rank, "registered with controller " + s->client_.address() + " (" +
                    std::to_string(reg->value("registered", 0)) + " of " + std::to_string(reg->value("world", 0)) +
                    " agents, trainer and inference); " + s->engine_->Describe());
  s->heartbeat_ = std::make_unique<controller::HeartbeatSender>(s->client_, controller::Role::kTrainer, rank);

  StatusOr<controller::TrainerPlanSlice> slice =
      s->client_.FetchTrainerPlan(rank, Clock::now() + s->config_.timeout);
  if (!slice.ok()) return slice.status().WithContext(me + ": waiting for the plan");
  if (slice->plan.rank != rank) {
    return Internal(me + ": the controller answered with the plan of rank " + std::to_string(slice->plan.rank));
  }
  s->plan_id_ = slice->plan_id;
  s->epoch_ = slice->epoch;
  ExecutorOptions& options = s->executor_options_;
  options.watermark_bytes = s->config_.watermark_bytes;
  options.checksums = s->config_.checksums;
  options.deltas = s->config_.deltas;
  options.rendezvous_prefix = s->config_.job + "/" + slice->plan_id;
  options.write_timeout = s->config_.timeout;
  options.device = s->device_.get();
  options.stage_through_host = stage;
  WSYNC_ASSIGN_OR_RETURN(s->executor_, PlanExecutor::Create(std::move(slice->plan), s->engine_.get(),
                                                            s->groups_.get(), options));
  LogLine(rank, "plan " + s->plan_id_ + ": " + std::to_string(s->executor_->plan().writes) + " writes, " +
                    std::to_string(s->executor_->plan().write_bytes) + " bytes per version; temporary memory " +
                    std::to_string(s->executor_->arena_bytes()) + " bytes" +
                    (s->device_ ? " on " + s->device_->name() : std::string()) +
                    (stage ? ", mirrored in pinned host memory" : "") + " (watermark " +
                    std::to_string(options.watermark_bytes) + ")");
  return s;
}

TrainerSession::~TrainerSession() { Close(); }

void TrainerSession::JoinPrevious() {
  if (pipeline_.joinable()) pipeline_.join();
}

StatusOr<std::shared_ptr<PushState>> TrainerSession::Push(uint64_t v, std::vector<ShardPointer> shards) {
  const std::string me = "trainer rank " + std::to_string(rank_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return FailedPrecondition(me + ": push(" + std::to_string(v) + ") after close()");
  }
  std::shared_ptr<PushState> last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = last_;
  }
  if (last != nullptr) {
    if (!last->WaitReadsDone(std::chrono::milliseconds(0))) {
      return FailedPrecondition(me + ": push(" + std::to_string(v) + ") while version " +
                                std::to_string(last->version()) +
                                " is still reading the weights; call its handle's wait_reads_done() first");
    }
    if (v <= last->version()) {
      return InvalidArgument(me + ": push(" + std::to_string(v) + ") after version " +
                             std::to_string(last->version()) + "; versions must grow");
    }
  }
  JoinPrevious();  // its writes may still be landing; the executor runs one version at a time
  auto state = std::make_shared<PushState>(v);
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_ = state;
  }
  pipeline_ = std::thread([this, v, state, shards = std::move(shards)]() mutable {
    auto log = [this](const std::string& line) { LogLine(rank_, line); };
    Status why, replan_error;
    const auto decision = trainer_agent::StartVersionAtCurrentEpoch(
        client_, rank_, v, epoch_, log, [this] { return Replan(); }, &why, &replan_error);
    if (decision != trainer_agent::VersionDecision::kRun) {
      // The peers that ran `v` rebuild their groups under the next version.
      if (executor_ != nullptr) executor_->ResetGroups();
      state->Finish(why);
      return;
    }
    if (executor_ == nullptr) {  // the last rebuild failed (its error was logged)
      state->Finish(FailedPrecondition("trainer rank " + std::to_string(rank_) + ": version " + std::to_string(v) +
                                       ": no executor since a failed rebuild; see the log"));
      return;
    }
    PointerShards source(std::move(shards), state);
    StatusOr<VersionReport> result = trainer_agent::RunAndReport(*executor_, client_, rank_, v, source, log);
    if (!result.ok() && executor_->writes_timed_out()) {
      Status replaced = Replan(/*new_engine=*/true);
      if (!replaced.ok()) LogLine(rank_, "could not replace the transport engine: " + replaced.message());
    }
    state->Finish(std::move(result));
  });
  return state;
}

Status TrainerSession::Replan(bool new_engine) {
  const std::string me = "trainer rank " + std::to_string(rank_);
  StatusOr<controller::TrainerPlanSlice> slice = client_.FetchTrainerPlan(rank_, Clock::now() + config_.timeout);
  if (!slice.ok()) return slice.status().WithContext(me + ": fetching the plan of the new epoch");
  const trainer_agent::EngineFactory make = [this] { return transport::fabric::CreateLibfabricEngine(fabric_options_); };
  std::lock_guard<std::mutex> lock(plan_mu_);  // Describe() must not read them half replaced
  return trainer_agent::RebuildExecutor(std::move(slice).value(), groups_.get(), executor_options_,
                                        new_engine ? &make : nullptr, me,
                                        [this](const std::string& line) { LogLine(rank_, line); }, engine_, executor_,
                                        epoch_);
}

StatusOr<VersionReport> TrainerSession::ReplayWrites() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return FailedPrecondition("trainer rank " + std::to_string(rank_) + ": replay_writes() after close()");
  }
  JoinPrevious();
  if (executor_ == nullptr) return FailedPrecondition("trainer rank " + std::to_string(rank_) + ": no plan to replay");
  return executor_->ReplayWrites();
}

void TrainerSession::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  JoinPrevious();
  std::lock_guard<std::mutex> lock(plan_mu_);
  executor_.reset();
  heartbeat_.reset();
  engine_.reset();
  groups_.reset();
}

nlohmann::json TrainerSession::Describe() const {
  std::lock_guard<std::mutex> lock(plan_mu_);  // Replan() may be swapping executor_ and engine_
  nlohmann::json j = {{"rank", rank_}, {"plan_id", plan_id_}};
  if (executor_ != nullptr) {
    const TrainerRankPlan& p = executor_->plan();
    size_t sources = 0;
    nlohmann::json groups = nlohmann::json::array();
    for (const RankMeshGroup& g : p.groups) {
      sources += g.sources.size();
      groups.push_back({{"name", g.name}, {"ranks", g.ranks}, {"sources", g.sources.size()}});
    }
    j["mesh_groups"] = groups;
    j["sources"] = sources;
    j["writes"] = p.writes;
    j["write_bytes"] = p.write_bytes;
    j["arena_bytes"] = executor_->arena_bytes();
    j["transport"] = engine_->Describe();
    j["host_staging"] = executor_options_.stage_through_host;
  }
  return j;
}

}  // namespace wsync::python
