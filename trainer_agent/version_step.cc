#include "trainer_agent/version_step.h"

namespace wsync::trainer_agent {
namespace {

void Log(const std::function<void(const std::string&)>& log, const std::string& line) {
  if (log) log(line);
}

}  // namespace

VersionDecision StartVersion(controller::ControllerClient& client, PlanExecutor& executor, int32_t rank,
                             uint64_t v, const std::function<void(const std::string&)>& log, Status* why) {
  StatusOr<controller::VersionStatus> started = client.StartVersion(v, rank);
  if (started.ok()) return VersionDecision::kRun;
  if (started.status().code() == StatusCode::kFailedPrecondition) {
    StatusOr<controller::VersionStatus> state = client.GetVersion(v);
    if (state.ok() && state->complete()) return VersionDecision::kRun;
    Log(log, "version " + std::to_string(v) + " skipped: " + started.status().message());
    if (why != nullptr) *why = started.status();
    executor.ResetGroups();  // the peers that ran v rebuild theirs (version_step.h)
    return VersionDecision::kSkip;
  }
  Log(log, "warning: could not start version " + std::to_string(v) + " at the controller: " +
               started.status().message() + "; running it anyway");
  return VersionDecision::kRun;
}

nlohmann::json VersionStats(const VersionReport& r) {
  const StageSeconds& s = r.seconds;
  return {{"stages",
           {{"copy", s.copy},
            {"all_gather", s.all_gather},
            {"quantize_pack", s.quantize_pack},
            {"post", s.post},
            {"watermark_wait", s.watermark_wait},
            {"wait_writes", s.wait_writes},
            {"barrier", s.barrier},
            {"rendezvous", s.rendezvous},
            {"total", s.total}}},
          {"reads_done_after", r.reads_done_after},
          {"copied_bytes", r.copied_bytes},
          {"gathered_bytes", r.gathered_bytes},
          {"written_bytes", r.written_bytes},
          {"writes", r.writes},
          {"sources", r.sources},
          {"watermark_waits", r.watermark_waits},
          {"peak_temp_bytes", r.peak_temp_bytes},
          {"watermark_bytes", r.watermark_bytes}};
}

StatusOr<VersionReport> RunAndReport(PlanExecutor& executor, controller::ControllerClient& client, int32_t rank,
                                     uint64_t v, ShardSource& shards,
                                     const std::function<void(const std::string&)>& log) {
  StatusOr<VersionReport> result = executor.Run(v, shards);
  if (result.ok()) {
    Log(log, result->Summary());
  } else {
    Log(log, "version " + std::to_string(v) + " failed: " + result.status().message());
  }
  StatusOr<controller::VersionStatus> reported = client.ReportTrainerDone(
      v, rank, result.ok() ? Status::Ok() : result.status(), result.ok() ? VersionStats(*result) : nullptr);
  if (!reported.ok()) {
    Log(log, "warning: could not report version " + std::to_string(v) + " to the controller: " +
                 reported.status().message());
  }
  return result;
}

}  // namespace wsync::trainer_agent
