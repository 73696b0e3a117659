#include "trainer_agent/version_step.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace wsync::trainer_agent {
namespace {

void Log(const std::function<void(const std::string&)>& log, const std::string& line) {
  if (log) log(line);
}

}  // namespace

VersionDecision StartVersion(controller::ControllerClient& client, int32_t rank, uint64_t v, uint64_t epoch,
                             const std::function<void(const std::string&)>& log, Status* why) {
  StatusOr<controller::VersionStatus> started = client.StartVersion(v, rank, epoch);
  // The previous version is still landing elsewhere: ask again until it has
  // finished (it does by its deadline), backing off to 200 ms.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::hours(1);
  bool told = false;
  for (auto pause = std::chrono::milliseconds(5);
       !started.ok() && started.status().code() == StatusCode::kUnavailable &&
       started.status().message().find(controller::kOlderRunningPrefix) != std::string::npos &&
       std::chrono::steady_clock::now() < give_up;
       pause = std::min(pause * 2, std::chrono::milliseconds(200))) {
    if (!told) Log(log, "version " + std::to_string(v) + ": waiting: " + started.status().message());
    told = true;
    std::this_thread::sleep_for(pause);
    started = client.StartVersion(v, rank, epoch);
  }
  if (started.ok()) return VersionDecision::kRun;
  if (started.status().code() == StatusCode::kFailedPrecondition &&
      started.status().message().find(controller::kStaleEpochPrefix) != std::string::npos) {
    Log(log, "version " + std::to_string(v) + ": " + started.status().message());
    if (why != nullptr) *why = started.status();
    return VersionDecision::kReplan;
  }
  if (started.status().code() == StatusCode::kFailedPrecondition) {
    StatusOr<controller::VersionStatus> state = client.GetVersion(v);
    if (state.ok() && state->complete()) return VersionDecision::kRun;
    Log(log, "version " + std::to_string(v) + " skipped: " + started.status().message());
    if (why != nullptr) *why = started.status();
    return VersionDecision::kSkip;
  }
  Log(log, "warning: could not start version " + std::to_string(v) + " at the controller: " +
               started.status().message() + "; running it anyway");
  return VersionDecision::kRun;
}

VersionDecision StartVersionAtCurrentEpoch(controller::ControllerClient& client, int32_t rank, uint64_t v,
                                           const uint64_t& epoch, const std::function<void(const std::string&)>& log,
                                           const std::function<Status()>& replan, Status* why, Status* replan_error) {
  *replan_error = Status::Ok();
  VersionDecision decision = StartVersion(client, rank, v, epoch, log, why);
  for (int tries = 0; decision == VersionDecision::kReplan && tries < 3; ++tries) {
    *replan_error = replan();
    if (!replan_error->ok()) {
      if (why != nullptr) *why = *replan_error;
      return VersionDecision::kReplan;
    }
    decision = StartVersion(client, rank, v, epoch, log, why);
  }
  return decision;
}

Status RebuildExecutor(controller::TrainerPlanSlice slice, GroupFactory* groups, const ExecutorOptions& options,
                       const EngineFactory* make_engine, const std::string& me,
                       const std::function<void(const std::string&)>& log, std::unique_ptr<transport::Engine>& engine,
                       std::unique_ptr<PlanExecutor>& executor, uint64_t& epoch) {
  // What the old executor's writes last sent is still what their receivers
  // hold: the new one keeps it (the controller decides whom that serves).
  HeldCopies held = executor != nullptr ? executor->TakeHeldCopies() : HeldCopies{};
  executor.reset();  // waits for its writes still in flight
  if (make_engine != nullptr) {
    engine.reset();
    StatusOr<std::unique_ptr<transport::Engine>> made = (*make_engine)();
    if (!made.ok()) return made.status().WithContext(me + ": replacing the transport engine");
    engine = std::move(made).value();
    log("replaced the transport engine after writes that timed out: " + engine->Describe());
  }
  StatusOr<std::unique_ptr<PlanExecutor>> made =
      PlanExecutor::Create(std::move(slice.plan), engine.get(), groups, options);
  if (!made.ok()) return made.status().WithContext(me + ": epoch " + std::to_string(slice.epoch));
  executor = std::move(made).value();
  executor->AdoptHeldCopies(std::move(held));
  epoch = slice.epoch;
  log("re-imported the plan of epoch " + std::to_string(epoch));
  return Status::Ok();
}

nlohmann::json VersionStats(const VersionReport& r) {
  const StageSeconds& s = r.seconds;
  return {{"stages",
           {{"copy", s.copy},
            {"unshard", s.unshard},
            {"quantize_pack", s.quantize_pack},
            {"post", s.post},
            {"watermark_wait", s.watermark_wait},
            {"wait_writes", s.wait_writes},
            {"barrier", s.barrier},
            {"rendezvous", s.rendezvous},
            {"checksum", s.checksum},
            {"delta", s.delta},
            {"engine_wait", s.engine_wait},
            {"total", s.total}}},
          {"reads_done_after", r.reads_done_after},
          {"copied_bytes", r.copied_bytes},
          {"gathered_bytes", r.gathered_bytes},
          {"exchanged_bytes", r.exchanged_bytes},
          {"written_bytes", r.written_bytes},
          {"staged_bytes", r.staged_bytes},
          {"write_bytes", r.write_bytes},
          {"delta_writes", r.delta_writes},
          {"delta_covered_bytes", r.delta_covered_bytes},
          {"delta_copy_bytes", r.delta_copy_bytes},
          {"writes", r.writes},
          {"sources", r.sources},
          {"watermark_waits", r.watermark_waits},
          {"peak_temp_bytes", r.peak_temp_bytes},
          {"watermark_bytes", r.watermark_bytes}};
}

nlohmann::json ChecksumsJson(const std::vector<WriteChecksum>& checksums) {
  nlohmann::json by_rank = nlohmann::json::object();
  for (const WriteChecksum& c : checksums) {
    by_rank[std::to_string(c.dst_rank)][c.region].push_back({c.offset, c.bytes, ChecksumText(c.hash)});
  }
  return by_rank;
}

// Waits until v is admitted; `seen` gets the version as the controller
// last answered (its delta decision among the rest).
StatusOr<double> WaitAdmitted(controller::ControllerClient& client, int32_t rank, uint64_t v,
                              const std::function<void(const std::string&)>& log, controller::VersionStatus* seen) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string me = "trainer rank " + std::to_string(rank) + ": version " + std::to_string(v);
  bool told = false;
  while (true) {
    // The controller ends a version by its deadline, so this ends too;
    // short polls keep a restarting controller from stalling it for long.
    StatusOr<controller::VersionStatus> s =
        client.WaitVersionAdmitted(v, std::chrono::steady_clock::now() + std::chrono::seconds(10));
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s.ok()) *seen = *s;
    if (s.ok() && s->admitted) {
      if (told) Log(log, me + ": engine-paced inference ranks let it in after " + std::to_string(waited) + " s");
      return waited;
    }
    if (s.ok() && s->failed()) {
      const controller::VersionFailure* f = s->failures.empty() ? nullptr : &s->failures.front();
      return Aborted(me + ": failed before it was written" +
                     (f ? ": " + (f->rank >= 0 ? f->role + " rank " + std::to_string(f->rank) : f->role) + ": " + f->error
                        : std::string()));
    }
    if (s.ok() && s->complete()) return waited;  // a late rank: its peers wrote it
    // NotFound: the controller lost the version (restarted while it ran):
    // nothing may be written without its admission, so it ends here.
    if (!s.ok() && s.status().code() != StatusCode::kDeadlineExceeded && s.status().code() != StatusCode::kUnavailable)
      return s.status().WithContext(me + ": waiting for engine-paced inference ranks to let it in");
    if (!told) Log(log, me + ": waiting for engine-paced inference ranks to call update()");
    told = true;
  }
}

StatusOr<VersionReport> RunAndReport(PlanExecutor& executor, controller::ControllerClient& client, int32_t rank,
                                     uint64_t v, ShardSource& shards,
                                     const std::function<void(const std::string&)>& log) {
  // Engine-paced inference ranks: nothing is written before they let v in.
  // The shards wait where they are (the trainer's own tensors in process,
  // the export region for the sidecar), so reads are not done before then.
  controller::VersionStatus seen;
  StatusOr<double> waited = WaitAdmitted(client, rank, v, log, &seen);
  // The controller's delta decision: it knows which receivers hold which
  // version intact; the executor knows what its copies hold.
  DeltaTarget delta{seen.delta_base, seen.delta_ranks};
  StatusOr<VersionReport> result = waited.ok() ? executor.Run(v, shards, delta.ranks.empty() ? nullptr : &delta)
                                               : StatusOr<VersionReport>(waited.status());
  if (result.ok()) result->seconds.engine_wait = *waited;
  if (result.ok()) {
    Log(log, result->Summary());
  } else {
    Log(log, "version " + std::to_string(v) + " failed: " + result.status().message());
  }
  nlohmann::json stats = nullptr;
  if (result.ok()) {
    stats = VersionStats(*result);
    if (!result->checksums.empty()) stats["checksums"] = ChecksumsJson(result->checksums);
  }
  StatusOr<controller::VersionStatus> reported =
      client.ReportTrainerDone(v, rank, result.ok() ? Status::Ok() : result.status(), stats);
  if (!reported.ok()) {
    Log(log, "warning: could not report version " + std::to_string(v) + " to the controller: " +
                 reported.status().message());
  }
  return result;
}

}  // namespace wsync::trainer_agent
