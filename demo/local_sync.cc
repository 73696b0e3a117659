#include "demo/local_sync.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "demo/reference.h"
#include "demo/synthetic.h"
#include "inference_agent/engine_view.h"
#include "routing/planner.h"
#include "routing/spec_io.h"

namespace wsync::demo {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kStartTimeout = std::chrono::seconds(180);

Box LocalBox(const TrainerParam& p) {
  Box b;
  b.ndim = static_cast<int8_t>(p.global_shape.size());
  for (size_t d = 0; d < p.global_shape.size(); ++d) {
    b.offset[d] = p.local_offset[d];
    b.size[d] = p.local_shape[d];
  }
  return b;
}

// Runs fn(i) for i in [0, n) on up to `threads` threads; first error wins.
Status ParallelFor(size_t n, size_t threads, const std::function<Status(size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::vector<Status> errors(threads);
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (size_t i = next++; i < n; i = next++) {
        Status s = fn(i);
        if (!s.ok()) {
          errors[t] = s;
          return;
        }
      }
    });
  }
  for (std::thread& th : pool) th.join();
  for (const Status& s : errors) {
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

}  // namespace

size_t DemoWorkers() {
  const unsigned cores = std::thread::hardware_concurrency();
  return std::clamp<size_t>(cores == 0 ? 2 : cores, 1, 8);
}

LocalSync::~LocalSync() {
  // Trainer agents first (they write), then inference agents, then the controller.
  trainer_agents_.clear();
  inference_agents_.clear();
  controller_.Stop();
}

std::vector<std::string> LocalSync::Wrap(const HostPlacement& host, std::vector<std::string> argv) const {
  if (host.netns.empty()) return argv;
  std::vector<std::string> wrapped = {"ip", "netns", "exec", host.netns};
  wrapped.insert(wrapped.end(), argv.begin(), argv.end());
  return wrapped;
}

std::string LocalSync::InferenceLog(int32_t rank) const {
  return options_.work_dir + "/inference-agent-" + std::to_string(rank) + ".log";
}

std::string LocalSync::TrainerLog(int32_t rank) const {
  return options_.work_dir + "/trainer-agent-" + std::to_string(rank) + ".log";
}

std::string LocalSync::InferenceShmName(int32_t rank) const {
  return "/wsync-" + options_.job + "-infer-" + std::to_string(rank);
}

StatusOr<std::unique_ptr<LocalSync>> LocalSync::Start(const LocalSyncOptions& in) {
  LocalSyncOptions o = in;
  if (o.binary.empty()) o.binary = SelfExecutable();
  if (o.job.empty()) o.job = "demo" + std::to_string(getpid());
  if (o.work_dir.empty()) o.work_dir = "/tmp/wsync-" + o.job;
  std::error_code ec;
  fs::remove_all(o.work_dir + "/state", ec);
  fs::create_directories(o.work_dir, ec);
  if (ec) return Internal("cannot create work dir '" + o.work_dir + "': " + ec.message());
  o.cluster = fs::absolute(o.cluster).string();

  // The demo's job secret: every process it starts signs its control
  // requests with it (controller/auth.h), as a real deployment should.
  const std::string secret = o.work_dir + "/job.secret";
  fs::remove(secret, ec);
  WSYNC_RETURN_IF_ERROR(controller::WriteNewSecret(secret));

  auto say = [&](const std::string& what) {
    if (o.progress) o.progress(what);
  };
  std::unique_ptr<LocalSync> sync(new LocalSync(o));
  sync->secret_path_ = secret;
  WSYNC_ASSIGN_OR_RETURN(sync->specs_, GenerateFromClusterFile(o.cluster));
  const GeneratedSpecs& specs = sync->specs_;
  PlanOptions plan_options;  // as the controller will plan it
  plan_options.exchange = o.exchange;
  WSYNC_ASSIGN_OR_RETURN(sync->table_, Plan(specs.trainer, specs.inference, specs.mapping, plan_options));
  sync->options_.trainers.resize(specs.trainer.ranks.size());
  sync->options_.inference.resize(specs.inference.ranks.size());

  // The controller gets the mapping with every "{name}" already resolved.
  sync->mapping_path_ = o.work_dir + "/mapping.json";
  WSYNC_RETURN_IF_ERROR(WriteJsonFile(ToJson(specs.mapping), sync->mapping_path_));

  // The trainers' side: one shard export per rank, created before its agent.
  for (const TrainerRank& rank : specs.trainer.ranks) {
    WSYNC_ASSIGN_OR_RETURN(std::string name, trainer_agent::ShardRegionName(o.job, rank.rank));
    WSYNC_ASSIGN_OR_RETURN(auto exp, trainer_agent::ShardExport::Create(name, rank));
    sync->exports_.push_back(std::move(exp));
  }

  say("starting the controller (" + o.work_dir + "/controller.log)");
  WSYNC_RETURN_IF_ERROR(sync->StartController());
  say("controller listening on " + sync->controller_address_ + "; starting " +
      std::to_string(specs.inference.ranks.size() - o.absent_inference.size()) + " inference agents and " +
      std::to_string(specs.trainer.ranks.size()) + " trainer agents (logs beside it)");
  sync->inference_agents_.resize(specs.inference.ranks.size());
  sync->trainer_agents_.resize(specs.trainer.ranks.size());
  auto absent = [&](size_t r) {
    return std::find(o.absent_inference.begin(), o.absent_inference.end(), static_cast<int32_t>(r)) !=
           o.absent_inference.end();
  };
  for (size_t r = 0; r < specs.inference.ranks.size(); ++r) {
    if (!absent(r)) WSYNC_RETURN_IF_ERROR(sync->StartInferenceAgent(static_cast<int32_t>(r), false));
  }
  for (size_t r = 0; r < specs.trainer.ranks.size(); ++r) {
    WSYNC_RETURN_IF_ERROR(sync->StartTrainerAgent(static_cast<int32_t>(r)));
  }
  if (!o.wait_ready) return sync;
  say("waiting for every agent to register its memory and the controller to plan (seconds)");
  // Agents print "ready" once registered; the plan exists once all are.
  for (size_t r = 0; r < sync->inference_agents_.size(); ++r) {
    if (!absent(r)) WSYNC_RETURN_IF_ERROR(sync->inference_agents_[r].WaitForLine("ready", kStartTimeout));
  }
  for (ChildProcess& p : sync->trainer_agents_) WSYNC_RETURN_IF_ERROR(p.WaitForLine("ready", kStartTimeout));
  return sync;
}

Status LocalSync::StartController() {
  const HostPlacement& host = options_.controller;
  std::vector<std::string> argv = {
      options_.binary, "controller", "--listen", host.address + ":" + std::to_string(controller_port_),
      "--state-dir", options_.work_dir + "/state",
      "--trainers", std::to_string(specs_.trainer.ranks.size()),
      "--inference", std::to_string(specs_.inference.ranks.size()),
      "--mapping", mapping_path_,
      "--version-timeout", std::to_string(options_.version_timeout_s),
      "--world-timeout", std::to_string(options_.world_timeout_s),
      "--heartbeat-timeout", std::to_string(options_.heartbeat_timeout_s),
      "--secret-file", secret_path_};
  argv.push_back(options_.exchange ? "--exchange" : "--full-tensor");
  if (options_.full_every > 0) {
    argv.push_back("--full-every");
    argv.push_back(std::to_string(options_.full_every));
  }
  WSYNC_ASSIGN_OR_RETURN(controller_, ChildProcess::Spawn("controller", Wrap(host, argv),
                                                          options_.work_dir + "/controller.log"));
  WSYNC_ASSIGN_OR_RETURN(controller_address_, controller_.ReadLine(std::chrono::seconds(30)));
  controller_port_ = std::stoi(controller_address_.substr(controller_address_.rfind(':') + 1));
  WSYNC_ASSIGN_OR_RETURN(auto client, controller::ControllerClient::Connect(controller_address_, secret_path_));
  client_ = std::make_unique<controller::ControllerClient>(std::move(client));
  return Status::Ok();
}

void LocalSync::StopController() { controller_.Stop(); }

Status LocalSync::StartInferenceAgent(int32_t rank, bool attach) {
  const HostPlacement& host = options_.inference[rank];
  std::vector<std::string> argv = {
      options_.binary, "inference-agent", "--controller", controller_address_, "--secret-file", secret_path_,
      "--rank", std::to_string(rank), "--cluster", options_.cluster,
      "--provider", options_.provider, "--nics", std::to_string(options_.nics),
      "--job", options_.job, "--version-timeout", std::to_string(options_.version_timeout_s)};
  if (!options_.inference[rank].netns.empty()) argv.insert(argv.end(), {"--node", host.address});
  if (attach) argv.push_back("--attach");
  if (options_.full_every > 0) argv.push_back("--delta");
  argv.insert(argv.end(), options_.extra_inference_args.begin(), options_.extra_inference_args.end());
  WSYNC_ASSIGN_OR_RETURN(inference_agents_[rank],
                         ChildProcess::Spawn("inference-agent " + std::to_string(rank), Wrap(host, argv),
                                             InferenceLog(rank)));
  return Status::Ok();
}

Status LocalSync::StartTrainerAgent(int32_t rank) {
  const HostPlacement& host = options_.trainers[rank];
  std::vector<std::string> argv = {
      options_.binary, "trainer-agent", "--controller", controller_address_, "--secret-file", secret_path_,
      "--rank", std::to_string(rank),
      "--cluster", options_.trainer_cluster.count(rank) ? options_.trainer_cluster.at(rank) : options_.cluster,
      "--job", options_.job, "--provider", options_.provider, "--nics", std::to_string(options_.nics),
      "--watermark", std::to_string(options_.watermark), "--gloo-host", host.address,
      "--gloo-timeout", std::to_string(options_.gloo_timeout_s)};
  if (!host.netns.empty()) argv.insert(argv.end(), {"--node", host.address});
  if (options_.full_every > 0) argv.push_back("--delta");
  argv.insert(argv.end(), options_.extra_trainer_args.begin(), options_.extra_trainer_args.end());
  WSYNC_ASSIGN_OR_RETURN(trainer_agents_[rank],
                         ChildProcess::Spawn("trainer-agent " + std::to_string(rank), Wrap(host, argv),
                                             TrainerLog(rank)));
  return Status::Ok();
}

void LocalSync::KillTrainerAgent(int32_t rank, int signal) {
  trainer_agents_[rank].Kill(signal);
  (void)trainer_agents_[rank].Wait(std::chrono::seconds(10));
}

void LocalSync::KillInferenceAgent(int32_t rank, int signal) {
  inference_agents_[rank].Kill(signal);
  (void)inference_agents_[rank].Wait(std::chrono::seconds(10));
}

Status LocalSync::FillShards(uint64_t version, uint64_t* bytes) {
  // The trainer may only touch its weights once the agent has read the last
  // version it published.
  for (auto& exp : exports_) {
    const uint64_t last = exp->published_version();
    if (last > exp->reads_done_version()) {
      Status s = exp->WaitReadsDone(last, std::chrono::seconds(static_cast<int64_t>(options_.version_timeout_s)));
      if (!s.ok()) return s.WithContext("trainer rank " + std::to_string(exp->layout().rank));
    }
  }
  struct Job {
    size_t rank;
    const TrainerParam* param;
  };
  std::vector<Job> jobs;
  for (size_t r = 0; r < specs_.trainer.ranks.size(); ++r) {
    for (const TrainerParam& p : specs_.trainer.ranks[r].params) jobs.push_back({r, &p});
  }
  if (bytes != nullptr) {
    *bytes = 0;
    for (const Job& job : jobs) *bytes += static_cast<uint64_t>(LocalBox(*job.param).NumElements()) * 2;
  }
  return ParallelFor(jobs.size(), DemoWorkers(), [&](size_t i) -> Status {
    const Job& job = jobs[i];
    WSYNC_ASSIGN_OR_RETURN(trainer_agent::ShardTensor t, exports_[job.rank]->Tensor(job.param->name));
    FillSyntheticBox(job.param->name, job.param->global_shape, LocalBox(*job.param), version,
                     static_cast<uint16_t*>(t.data), options_.drift);
    return Status::Ok();
  });
}

Status LocalSync::Publish(uint64_t version) {
  for (auto& exp : exports_) WSYNC_RETURN_IF_ERROR(exp->Publish(version));
  return Status::Ok();
}

StatusOr<controller::VersionStatus> LocalSync::WaitVersion(uint64_t version, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  while (true) {
    StatusOr<controller::VersionStatus> v = client_->WaitVersion(version, deadline);
    if (v.ok() && v->finished()) return v;
    if (Clock::now() >= deadline) {
      if (!v.ok()) return v.status();
      return DeadlineExceeded("version " + std::to_string(version) + " still '" + v->state + "' after " +
                              std::to_string(timeout_s) + " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // not started yet (404) or a long poll ended
  }
}

StatusOr<UpdateReport> LocalSync::Update(uint64_t version) {
  UpdateReport report;
  const auto fill_start = Clock::now();
  WSYNC_RETURN_IF_ERROR(FillShards(version, &report.fill_bytes));
  const auto t0 = Clock::now();
  report.fill_seconds = std::chrono::duration<double>(t0 - fill_start).count();
  WSYNC_RETURN_IF_ERROR(Publish(version));
  WSYNC_ASSIGN_OR_RETURN(controller::VersionStatus v, WaitVersion(version, options_.version_timeout_s + 30));
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  // Trainer reports (with their stage times) may trail the last inference
  // report that completed the version by a moment, more on a loaded
  // machine (2 s was seen too short under ctest -j2).
  for (int i = 0; i < 200 && v.complete() && v.trainer_done.size() < exports_.size(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    StatusOr<controller::VersionStatus> again = client_->GetVersion(version);
    if (again.ok()) v = *again;
  }
  report.version = version;
  report.seconds = seconds;
  for (const WriteOp& op : table_.ops) report.wire_bytes += op.bytes;
  report.gbps = report.seconds > 0 ? report.wire_bytes / report.seconds / 1e9 : 0;
  report.state = v.state;
  if (!v.failures.empty()) {
    const auto& f = v.failures.front();
    report.failure = f.role + " rank " + std::to_string(f.rank) + ": " + f.error;
  }
  if (v.raw.contains("trainer_stats")) report.trainer_stats = v.raw["trainer_stats"];
  return report;
}

Status LocalSync::Verify(uint64_t version, UpdateReport* report, int32_t only_rank) const {
  const auto start = Clock::now();
  const Reference reference(specs_.trainer, specs_.mapping, options_.drift);
  // Every rank's store, its version word checked before any byte.
  std::vector<inference::EngineView> views;
  std::vector<const InferenceRank*> ranks;
  for (const InferenceRank& rank : specs_.inference.ranks) {
    if (only_rank >= 0 && rank.rank != only_rank) continue;
    WSYNC_ASSIGN_OR_RETURN(inference::EngineView view, inference::EngineView::Open(InferenceShmName(rank.rank)));
    if (view.complete_version() != version) {
      return FailedPrecondition("inference rank " + std::to_string(rank.rank) + " reports complete version " +
                                std::to_string(view.complete_version()) + ", expected " + std::to_string(version));
    }
    views.push_back(std::move(view));
    ranks.push_back(&rank);
  }
  // One group per engine tensor (name and expert range): the reference fuses
  // and quantizes it once and cuts every rank's part from that copy.
  struct Holder {
    size_t rank;  // into views / ranks
    const InferenceTensor* tensor;
  };
  std::vector<std::vector<Holder>> groups;
  std::map<std::string, size_t> group_of;
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (const InferenceTensor& t : ranks[r]->tensors) {
      std::string key = t.name;
      if (t.experts) key += "#" + std::to_string(t.experts->start) + ":" + std::to_string(t.experts->end);
      auto [it, added] = group_of.emplace(key, groups.size());
      if (added) groups.emplace_back();
      groups[it->second].push_back({r, &t});
    }
  }
  std::atomic<uint64_t> tensors{0}, bytes{0};
  auto compare = [&](size_t r, const std::string& name, const std::vector<uint8_t>& want) -> Status {
    const int32_t rank = ranks[r]->rank;
    const inference::EngineTensor* got = views[r].Find(name);
    if (got == nullptr) return NotFound("inference rank " + std::to_string(rank) + ": no tensor '" + name + "'");
    if (got->bytes != want.size()) {
      return FailedPrecondition("inference rank " + std::to_string(rank) + ": tensor '" + name + "' holds " +
                                std::to_string(got->bytes) + " bytes, reference " + std::to_string(want.size()));
    }
    if (std::memcmp(got->data, want.data(), want.size()) != 0) {
      size_t i = 0;
      while (got->data[i] == want[i]) ++i;
      char bytes_seen[48];
      std::snprintf(bytes_seen, sizeof bytes_seen, " (got 0x%02x, want 0x%02x)", got->data[i], want[i]);
      return FailedPrecondition("version " + std::to_string(version) + ": inference rank " + std::to_string(rank) +
                                ": tensor '" + name + "' differs from the reference at byte " + std::to_string(i) +
                                bytes_seen);
    }
    ++tensors;
    bytes += want.size();
    return Status::Ok();
  };
  Status s = ParallelFor(groups.size(), DemoWorkers(), [&](size_t g) -> Status {
    std::vector<const InferenceTensor*> same;
    for (const Holder& h : groups[g]) same.push_back(h.tensor);
    WSYNC_ASSIGN_OR_RETURN(std::vector<ExpectedTensor> want, reference.ExpectedOnRanks(same, version));
    for (size_t i = 0; i < groups[g].size(); ++i) {
      const Holder& h = groups[g][i];
      WSYNC_RETURN_IF_ERROR(compare(h.rank, h.tensor->name, want[i].weight));
      if (h.tensor->scale) WSYNC_RETURN_IF_ERROR(compare(h.rank, h.tensor->scale->name, want[i].scale));
    }
    return Status::Ok();
  });
  if (report != nullptr) {
    report->verified_tensors = tensors;
    report->verified_bytes = bytes;
    report->verify_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return s;
}

}  // namespace wsync::demo
