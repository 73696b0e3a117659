#include "inference_agent/pacer.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "inference_agent/weight_store_format.h"

namespace wsync::inference {
namespace {

using std::chrono::milliseconds;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

uint64_t Field(const nlohmann::json& j, const char* key) {
  const nlohmann::json v = j.value(key, nlohmann::json());
  return v.is_number_unsigned() ? v.get<uint64_t>() : 0;
}

}  // namespace

Pacer::Pacer(InferenceAgent& agent, controller::ControllerClient& client, Pacing pacing)
    : agent_(agent), client_(client), pacing_(pacing) {}

uint64_t Pacer::complete() const {
  const uint64_t v = agent_.memory().complete_version();
  return v == kNoVersion ? 0 : v;
}

void Pacer::OnLanded(uint64_t v) {
  std::lock_guard<std::mutex> lock(mu_);
  landed_ = std::max(landed_, v);
  cv_.notify_all();
}

void Pacer::Stop(const Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
  why_stopped_ = why;
  cv_.notify_all();
}

std::string Pacer::WhyUnplanned() {
  StatusOr<nlohmann::json> st = client_.GetStatus();
  if (!st.ok()) return "; the controller did not say why: " + st.status().message();
  const nlohmann::json& j = *st;
  std::string why = "; controller: phase " + j.value("phase", std::string("?"));
  if (j.contains("missing") && j["missing"].is_object())
    why += ", missing trainer ranks " + j["missing"].value("trainer", nlohmann::json::array()).dump() +
           ", inference ranks " + j["missing"].value("inference", nlohmann::json::array()).dump();
  const std::string error = j.value("assembly_error", std::string());
  if (!error.empty()) why += "; last assembly error: " + error;
  return why;
}

Status Pacer::StoppedLocked(const std::string& what) const {
  // A registration the controller dropped, a lost controller: the engine
  // hears the runner's own error, not only that it ended.
  if (why_stopped_.ok()) return Aborted(what + ": the agent stopped");
  return Aborted(what + ": the agent stopped: " + why_stopped_.message());
}

StatusOr<UpdateReport> Pacer::Update(std::optional<uint64_t> version, Clock::time_point deadline) {
  if (version && *version == 0) return InvalidArgument(me() + ": update(version=0): versions start at 1");
  // Before the plan no version can exist: nothing newer to take, or wait
  // for the world to be planned when a version is asked for.
  while (!agent_.has_plan()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return StoppedLocked(me() + ": update()");
    }
    if (!version) {
      UpdateReport nothing;
      nothing.version = nothing.previous = complete();
      return nothing;
    }
    if (Clock::now() >= deadline)
      return DeadlineExceeded(me() + ": update(" + std::to_string(*version) + "): the world has not been planned" +
                              WhyUnplanned());
    std::this_thread::sleep_for(milliseconds(20));
  }
  return pacing_ == Pacing::kShadow ? UpdateShadow(version, deadline) : UpdateLive(version, deadline);
}

std::string Pacer::FailureOf(const controller::VersionStatus& v) const {
  std::string why;
  for (const controller::VersionFailure& f : v.failures)
    why += (why.empty() ? "" : "; ") + (f.rank >= 0 ? f.role + " rank " + std::to_string(f.rank) : f.role) + ": " +
           f.error;
  return why.empty() ? "failed at the controller" : why;
}

Status Pacer::WaitLive(uint64_t v, Clock::time_point deadline, bool* timed_out) {
  *timed_out = false;
  const std::string what = me() + ": version " + std::to_string(v);
  Clock::time_point next_look = Clock::now();
  Clock::time_point next_gate = Clock::now() + std::chrono::seconds(1);
  while (true) {
    if (complete() >= v) return Status::Ok();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return StoppedLocked(what);
    }
    StatusOr<VersionOutcome> out = agent_.WaitVersion(v, milliseconds(20));
    if (out.ok() && !out->status.ok()) return Aborted(out->status.message());
    if (complete() >= v) return Status::Ok();
    if (Clock::now() < next_look) continue;
    next_look = Clock::now() + milliseconds(200);
    // The controller's word: a version failed elsewhere, or never let in
    // before its deadline, has no outcome here.
    StatusOr<controller::VersionStatus> state = client_.GetVersion(v);
    if (state.ok() && state->failed()) {
      return Aborted(what + " failed: " + FailureOf(*state) + "; " +
                     (state->admitted ? "the weights are a mix of versions until the next complete one"
                                      : "no write of it was let in: the weights are untouched, still version " +
                                            std::to_string(complete())));
    }
    // A restarted controller's gates start closed: move ours again.
    if (state.ok() && !state->admitted && Clock::now() >= next_gate) {
      next_gate = Clock::now() + std::chrono::seconds(1);
      StatusOr<nlohmann::json> g = client_.Gate(agent_.rank().rank, "upto", v);
      (void)g;  // a refusal shows as the version's own failure
    }
    if (Clock::now() >= deadline) {
      *timed_out = true;
      return DeadlineExceeded(what + " not complete by the deadline");
    }
  }
}

StatusOr<controller::VersionStatus> Pacer::WaitFinished(uint64_t v) {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return StoppedLocked(me() + ": version " + std::to_string(v));
    }
    StatusOr<controller::VersionStatus> end = client_.WaitVersion(v, Clock::now() + std::chrono::seconds(1));
    if (end.ok() || end.status().code() != StatusCode::kDeadlineExceeded) return end;
  }
}

StatusOr<UpdateReport> Pacer::UpdateLive(std::optional<uint64_t> version, Clock::time_point deadline) {
  const Clock::time_point t0 = Clock::now();
  UpdateReport report;
  report.previous = complete();
  StatusOr<nlohmann::json> gate = client_.Gate(agent_.rank().rank, version ? "upto" : "newest", version.value_or(0));
  if (!gate.ok()) return gate.status().WithContext(me() + ": update(): letting a version in");
  const uint64_t target = version ? *version : Field(*gate, "newest");
  if (target == 0 || target <= report.previous) {  // nothing newer pushed
    report.version = complete();
    report.seconds = Since(t0);
    return report;
  }
  bool timed_out = false;
  Status s = WaitLive(target, deadline, &timed_out);
  if (timed_out) {
    // Let nothing more in; a version already let in has writes in flight
    // and is waited for (the controller ends it by its deadline).
    gate = client_.Gate(agent_.rank().rank, "close");
    if (!gate.ok()) return gate.status().WithContext(me() + ": update(): closing the gate after the timeout");
    if (Field(*gate, "admitted") < target) {
      return DeadlineExceeded(me() + ": update(): no version " + std::to_string(target) +
                              " by the deadline (trainers have not pushed it); the weights stay at version " +
                              std::to_string(complete()));
    }
    s = WaitLive(target, Clock::time_point::max(), &timed_out);
  }
  if (!s.ok()) return s;
  report.version = complete();
  report.seconds = Since(t0);
  report.wait_seconds = report.seconds;
  return report;
}

StatusOr<UpdateReport> Pacer::UpdateShadow(std::optional<uint64_t> version, Clock::time_point deadline) {
  const Clock::time_point t0 = Clock::now();
  UpdateReport report;
  report.previous = complete();
  const int32_t rank = agent_.rank().rank;
  if (version) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] { return stopped_ || landed_ >= *version; }))
      return DeadlineExceeded(me() + ": update(" + std::to_string(*version) + "): it has not landed by the deadline; " +
                              "the weights stay at version " + std::to_string(complete()));
    if (stopped_) return StoppedLocked(me() + ": update()");
  }
  // No version may start writing into the shadow while it is copied out.
  StatusOr<nlohmann::json> gate = client_.Gate(rank, "close");
  if (!gate.ok()) return gate.status().WithContext(me() + ": update(): closing the gate to copy the shadow out");
  struct Reopen {
    Pacer* p;
    ~Reopen() {
      StatusOr<nlohmann::json> g = p->client_.Gate(p->agent_.rank().rank, "open");
      if (!g.ok()) std::fprintf(stderr, "wsync %s: update(): could not open the gate again: %s\n", p->me().c_str(),
                                g.status().message().c_str());
    }
  } reopen{this};

  uint64_t candidate;
  {
    std::lock_guard<std::mutex> lock(mu_);
    candidate = landed_;
  }
  const uint64_t admitted = Field(*gate, "admitted");
  const Clock::time_point t_wait = Clock::now();
  if (admitted > candidate && gate->value("admitted_running", false) && !version) {
    // A newer version is writing into the shadow: what it held is gone, and
    // the engine need not wait for the new one; a later update() takes it.
    report.version = complete();
    report.seconds = Since(t0);
    return report;
  }
  if (admitted > candidate) {
    // A newer version was let in: its writes went, or go, into the shadow.
    // Wait for its end (the controller ends it by its deadline).
    StatusOr<controller::VersionStatus> end = WaitFinished(admitted);
    if (!end.ok()) return end.status().WithContext(me() + ": update(): waiting for version " + std::to_string(admitted));
    std::unique_lock<std::mutex> lock(mu_);
    if (end->complete()) {
      // Complete needs this rank's report, sent just before OnLanded.
      cv_.wait_for(lock, std::chrono::seconds(10), [&] { return stopped_ || landed_ >= admitted; });
    }
    if (landed_ >= admitted) {
      candidate = landed_;
    } else {
      candidate = 0;  // the shadow holds part of a failed version
      landed_ = 0;
    }
  }
  report.wait_seconds = Since(t_wait);
  if (version && candidate != *version && candidate > report.previous) {
    // Ranks of one engine ask for one version; one they cannot all hold
    // must not be taken by some of them.
    return Aborted(me() + ": update(" + std::to_string(*version) + "): the shadow holds version " +
                   std::to_string(candidate) + " now (a newer one replaced it); the weights stay at version " +
                   std::to_string(complete()) + "; ask for " + std::to_string(candidate));
  }
  if (candidate > report.previous) {
    // Landed here; complete only once it landed on every rank.
    StatusOr<controller::VersionStatus> end = WaitFinished(candidate);
    if (!end.ok()) return end.status().WithContext(me() + ": update(): version " + std::to_string(candidate));
    if (end->complete()) {
      const Clock::time_point t_copy = Clock::now();
      WSYNC_RETURN_IF_ERROR(agent_.Commit(candidate));
      report.copy_seconds = Since(t_copy);
    } else if (version) {
      return Aborted(me() + ": version " + std::to_string(candidate) + " failed: " + FailureOf(*end) +
                     "; the weights stay at version " + std::to_string(complete()) + " (shadow)");
    }
  }
  if (version && complete() < *version)
    return Aborted(me() + ": update(" + std::to_string(*version) + "): the shadow no longer holds a complete version " +
                   "(a newer one failed while it was written); the weights stay at version " +
                   std::to_string(complete()));
  report.version = complete();
  report.seconds = Since(t0);
  return report;
}

}  // namespace wsync::inference
