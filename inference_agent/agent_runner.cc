#include "inference_agent/agent_runner.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <thread>
#include <vector>

namespace wsync::inference {
namespace {

using std::chrono::milliseconds;

class Runner {
 public:
  Runner(InferenceAgent& agent, controller::ControllerClient& client, const AgentRunnerOptions& options,
         const std::atomic<bool>& stop)
      : agent_(agent), client_(client), options_(options), stop_(stop),
        where_("inference rank " + std::to_string(agent.rank().rank)) {}

  Status Run() {
    StatusOr<nlohmann::json> reply = client_.RegisterInference(agent_.rank());
    if (!reply.ok()) return reply.status().WithContext(where_ + ": registering with " + client_.address());
    Log("registered with " + client_.address() + " (" + std::to_string(reply->value("registered", 0)) + " of " +
        std::to_string(reply->value("world", 0)) + " ranks registered, phase " + reply->value("phase", "") + ")");
    if (options_.on_registered) options_.on_registered();
    controller::HeartbeatSender heartbeat(client_, controller::Role::kInference, agent_.rank().rank);
    WSYNC_RETURN_IF_ERROR(FetchPlan());
    // Outcomes are reported from a thread of their own, so a version's done
    // never waits behind the long poll for the next one.
    std::thread reporter([this] {
      while (!stopped()) {
        for (const VersionOutcome& out : agent_.TakeOutcomes(options_.poll_interval)) Report(out);
      }
    });
    while (!stopped()) PollVersions();
    reporter.join();
    // Outcomes that came while stopping (e.g. ABORTED ones come later, from
    // the engine's teardown, and are not reported: the agent is going away).
    for (const VersionOutcome& out : agent_.TakeOutcomes(milliseconds(0))) Report(out);
    return Status::Ok();
  }

 private:
  bool stopped() const { return stop_.load(std::memory_order_acquire); }

  Status FetchPlan() {
    const Clock::time_point give_up = options_.plan_timeout.count() > 0 ? Clock::now() + options_.plan_timeout
                                                                        : Clock::time_point::max();
    Clock::time_point next_note = Clock::now() + std::chrono::seconds(10);
    while (!stopped()) {
      // Short polls, so a stop request is noticed within a second.
      const Clock::time_point deadline = std::min(give_up, Clock::now() + std::chrono::seconds(1));
      StatusOr<controller::InferencePlanSlice> slice = client_.FetchInferencePlan(agent_.rank().rank, deadline);
      if (slice.ok()) {
        if (slice->expected_writes != WriteCount(slice->plan)) {
          return Internal(where_ + ": plan " + slice->plan_id + " says " + std::to_string(slice->expected_writes) +
                          " writes but lists " + std::to_string(WriteCount(slice->plan)));
        }
        Log("plan " + slice->plan_id + ": " + std::to_string(slice->expected_writes) + " writes, " +
            std::to_string(slice->expected_bytes) + " bytes per version");
        return agent_.SetPlan(slice->plan);
      }
      if (slice.status().code() != StatusCode::kDeadlineExceeded) {
        return slice.status().WithContext(where_ + ": fetching the plan");
      }
      if (Clock::now() >= give_up) return slice.status().WithContext(where_ + ": no plan in time");
      if (Clock::now() >= next_note) {
        Log("waiting for the plan: " + slice.status().message());
        next_note = Clock::now() + std::chrono::seconds(10);
      }
    }
    return Status::Ok();
  }

  // One long poll of the controller's status: it answers as soon as a
  // version starts or finishes (or after a second, so a stop is noticed),
  // so a started version is armed within a round trip, not a poll interval.
  void PollVersions() {
    StatusOr<nlohmann::json> status = client_.GetStatus(fingerprint_, std::chrono::milliseconds(1000));
    if (!status.ok()) {
      // The controller may be restarting; versions it started meanwhile
      // are picked up on the next successful poll.
      if (!controller_down_) Log("controller unreachable, retrying: " + status.status().message());
      controller_down_ = true;
      fingerprint_.clear();
      std::this_thread::sleep_for(options_.poll_interval);
      return;
    }
    if (controller_down_) Log("controller reachable again");
    controller_down_ = false;
    const std::string fingerprint = status->value("versions_fingerprint", std::string());
    // A controller without the long poll answers at once: poll at the interval.
    if (fingerprint.empty()) std::this_thread::sleep_for(options_.poll_interval);
    fingerprint_ = fingerprint;
    const uint64_t complete = agent_.memory().complete_version();
    for (const nlohmann::json& vj : status->value("versions", nlohmann::json::array())) {
      StatusOr<controller::VersionStatus> v = controller::ParseVersionStatus(vj);
      if (!v.ok() || ignored_.count(v->version) != 0) continue;
      if (agent_.begun(v->version)) {
        if (v->failed()) agent_.AbandonVersion(v->version, FailureSummary(*v));
        continue;
      }
      if (complete != kNoVersion && v->version <= complete) continue;  // landed here before a restart
      if (live_paced() && !v->admitted) {
        if (!v->failed()) continue;  // armed once the engine lets it in
        Log("version " + std::to_string(v->version) + " failed before the engine let it in (" + FailureSummary(*v) +
            "); its weights are untouched");
        Ignore(v->version);
        continue;
      }
      if (v->finished()) {
        // Failed before this rank heard of it: nothing to wait for, but some
        // of its writes may have landed, so the engine must hear of it.
        if (v->failed()) agent_.MarkFailedHere(v->version);
        Log("version " + std::to_string(v->version) + " is already " + v->state + " at the controller (" +
            FailureSummary(*v) + "); not expecting it");
        Ignore(v->version);
        continue;
      }
      milliseconds budget = options_.version_timeout;
      if (vj.contains("deadline_in_s") && vj["deadline_in_s"].is_number()) {
        const auto left = milliseconds(static_cast<int64_t>(std::max(0.0, vj["deadline_in_s"].get<double>()) * 1000));
        budget = std::min(budget, left);
      }
      Status s = agent_.BeginVersion(v->version, Clock::now() + budget);
      if (!s.ok()) Log("version " + std::to_string(v->version) + ": " + s.ToString());
    }
  }

  bool live_paced() const { return options_.pacer != nullptr && options_.pacer->pacing() == Pacing::kLive; }
  bool shadow_paced() const { return options_.pacer != nullptr && options_.pacer->pacing() == Pacing::kShadow; }

  void Ignore(uint64_t v) {
    ignored_.insert(v);
    if (ignored_.size() > 1024) ignored_.erase(ignored_.begin());
  }

  // A held version's checksums (with verify_checksums): OK, or why not.
  Status Check(const VersionOutcome& out) {
    if (!options_.verify_checksums) return Status::Ok();
    const auto t0 = Clock::now();
    StatusOr<std::vector<WriteChecksum>> want =
        client_.FetchChecksums(out.version, agent_.rank().rank, Clock::now() + options_.version_timeout);
    if (!want.ok()) {
      return want.status().WithContext(where_ + ": version " + std::to_string(out.version) +
                                       ": fetching the trainers' checksums");
    }
    WSYNC_RETURN_IF_ERROR(agent_.Verify(out.version, *want));
    Log("version " + std::to_string(out.version) + ": " + std::to_string(want->size()) + " checksums verified in " +
        std::to_string(std::chrono::duration<double>(Clock::now() - t0).count()) + " s");
    return Status::Ok();
  }

  // A held version's deltas, applied where its writes landed; what was done
  // goes into `stats` for the version's record.
  Status ApplyDeltas(uint64_t v, nlohmann::json* stats) {
    StatusOr<DeltaApplied> applied = agent_.ApplyDeltas(v);
    if (!applied.ok()) return applied.status();
    if (applied->inboxes) {
      *stats = {{"delta_writes", applied->writes},
                {"delta_bytes", applied->delta_bytes},
                {"delta_covered_bytes", applied->bytes},
                {"write_bytes", applied->write_bytes},
                {"wire_bytes", applied->wire_bytes()},
                {"apply_seconds", applied->seconds}};
    }
    if (applied->writes > 0) {
      char line[256];
      std::snprintf(line, sizeof line, "version %llu: %llu deltas applied in %.3f s (%.1f KiB for %.1f KiB of weights)",
                    static_cast<unsigned long long>(v), static_cast<unsigned long long>(applied->writes),
                    applied->seconds, applied->delta_bytes / 1024.0, applied->bytes / 1024.0);
      Log(line);
    }
    return Status::Ok();
  }

  // The client itself retries a refused connection (controller restarting).
  void Report(const VersionOutcome& out) {
    if (!out.held) {
      Send(out.version, out.status, false);
      return;
    }
    nlohmann::json stats;
    Status s = ApplyDeltas(out.version, &stats);
    if (s.ok()) s = Check(out);
    if (s.ok() && !agent_.shadowed()) s = agent_.Commit(out.version);
    if (!s.ok()) {
      agent_.Reject(out.version, s);
      Send(out.version, s, false);
      return;
    }
    if (!agent_.shadowed()) {
      Send(out.version, s, false, stats);
      return;
    }
    if (shadow_paced()) {
      // Complete at the controller once in every shadow; the engine's
      // update() copies it out when it is ready for it.
      if (Send(out.version, Status::Ok(), false, stats)) options_.pacer->OnLanded(out.version);
      return;
    }
    Send(out.version, Status::Ok(), /*commit=*/true, stats);
    CommitOnceLanded(out);
  }

  // Shadow mode: done here, but the engine's weights change only once the
  // version has landed on every rank; it is complete once every shadow rank
  // has copied it out.
  void CommitOnceLanded(const VersionOutcome& out) {
    // Until it lands or fails, through a controller restart (which restores
    // a landed version from its state dir), within the version's time on
    // this rank; short waits, so a stop is noticed. Meanwhile this thread
    // reports nothing else, but no later version can start.
    const Clock::time_point give_up = Clock::now() + options_.version_timeout;
    StatusOr<controller::VersionStatus> end = Aborted(where_ + ": stopped before version " +
                                                      std::to_string(out.version) + " landed everywhere");
    while (!stopped()) {
      if (Clock::now() >= give_up) {
        end = DeadlineExceeded(where_ + ": version " + std::to_string(out.version) + " did not land everywhere in " +
                               std::to_string(options_.version_timeout.count()) + " ms");
        break;
      }
      end = client_.WaitVersionLanded(out.version, std::min(give_up, Clock::now() + std::chrono::seconds(1)));
      const StatusCode code = end.ok() ? StatusCode::kOk : end.status().code();
      if (code != StatusCode::kDeadlineExceeded && code != StatusCode::kUnavailable) break;
    }
    if (!end.ok() || !end->landed || end->failed()) {
      agent_.Reject(out.version, end.ok() ? Aborted("failed at the controller: " + FailureSummary(*end) +
                                                    "; the engine's weights stay at the last complete version")
                                          : end.status());
      return;
    }
    const Status s = agent_.Commit(out.version);
    if (!s.ok()) {
      agent_.Reject(out.version, s);
      StatusOr<controller::VersionStatus> failed =
          client_.ReportFailure(out.version, controller::Role::kInference, agent_.rank().rank, s.message());
      if (!failed.ok()) Log("reporting version " + std::to_string(out.version) + " failed: " + failed.status().message());
      return;
    }
    StatusOr<controller::VersionStatus> reply = client_.ReportCommitted(out.version, agent_.rank().rank);
    if (!reply.ok()) Log("reporting the commit of version " + std::to_string(out.version) + " failed: " +
                         reply.status().message());
  }

  // True when the controller took the report.
  bool Send(uint64_t v, const Status& result, bool commit, const nlohmann::json& stats = nullptr) {
    StatusOr<controller::VersionStatus> reply =
        client_.ReportInferenceDone(v, agent_.rank().rank, result, commit, stats);
    if (!reply.ok()) {
      Log("reporting version " + std::to_string(v) + " failed: " + reply.status().message());
      return false;
    }
    Log("reported version " + std::to_string(v) + " " + (result.ok() ? "done" : "failed") + "; controller says " +
        reply->state);
    return true;
  }

  static std::string FailureSummary(const controller::VersionStatus& v) {
    if (v.failures.empty()) return "failed at the controller";
    const controller::VersionFailure& f = v.failures.front();
    return f.role + " rank " + std::to_string(f.rank) + ": " + f.error;
  }

  void Log(const std::string& line) const {
    if (options_.log) options_.log(where_ + ": " + line);
  }

  InferenceAgent& agent_;
  controller::ControllerClient& client_;
  const AgentRunnerOptions& options_;
  const std::atomic<bool>& stop_;
  const std::string where_;
  bool controller_down_ = false;
  std::string fingerprint_;  // of the last status seen ("": none yet)
  std::set<uint64_t> ignored_;
};

}  // namespace

Status RunInferenceAgent(InferenceAgent& agent, controller::ControllerClient& client,
                         const AgentRunnerOptions& options, const std::atomic<bool>& stop) {
  Status s = Runner(agent, client, options, stop).Run();
  if (options.pacer != nullptr) options.pacer->Stop(s);  // an engine inside update() hears of it, and why
  return s;
}

}  // namespace wsync::inference
