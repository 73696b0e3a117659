// Controller liveness: heartbeats, lost ranks, and failing the versions a
// lost rank can no longer finish (a killed agent must not leave a version
// hanging until its deadline).
#include <cstdio>

#include "controller/controller.h"

namespace wsync::controller {

using nlohmann::json;

namespace {

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string Who(Role role, int32_t rank) { return std::string(RoleName(role)) + " rank " + std::to_string(rank); }

}  // namespace

std::string Controller::LostReason() const {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "lost: no heartbeat for %g s (agent killed or unreachable?)",
                options_.heartbeat_timeout_s);
  return buf;
}

StatusOr<json> Controller::Heartbeat(Role role, int32_t rank) {
  std::lock_guard<std::mutex> lock(mu_);
  const Clock::time_point now = Clock::now();
  TickLocked(now);
  const int32_t n = role == Role::kTrainer ? options_.trainers : options_.inference;
  if (rank < 0 || rank >= n)
    return InvalidArgument(Who(role, rank) + " is outside 0.." + std::to_string(n - 1));
  // Only a heartbeat starts tracking; other calls merely refresh it.
  last_seen_.try_emplace({role, rank}, now);
  SeenLocked(role, rank, now);
  return json{{"role", RoleName(role)}, {"rank", rank}, {"phase", PhaseLocked()},
              {"heartbeat_timeout_s", options_.heartbeat_timeout_s}};
}

void Controller::SeenLocked(Role role, int32_t rank, Clock::time_point now) {
  auto it = last_seen_.find({role, rank});
  if (it == last_seen_.end()) return;
  it->second = now;
  if (lost_.erase({role, rank})) Log(Who(role, rank) + " is back");
}

void Controller::CheckLivenessLocked(Clock::time_point now) {
  if (options_.heartbeat_timeout_s <= 0) return;
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options_.heartbeat_timeout_s));
  for (const auto& [who, seen] : last_seen_) {
    if (now - seen <= timeout || lost_.count(who)) continue;
    lost_[who] = UnixNow();
    const int failed = FailVersionsOfLostLocked(who.first, who.second, LostReason(), now, seen);
    Log(Who(who.first, who.second) + " " + LostReason() +
        (failed ? "; failed " + std::to_string(failed) + " running version(s)" : std::string()));
  }
}

int Controller::FailVersionsOfLostLocked(Role role, int32_t rank, const std::string& why, Clock::time_point now,
                                         Clock::time_point last_seen) {
  // Running versions the rank has not finished fail now. Versions that
  // already failed since the rank went quiet (its peers saw the broken link
  // first, e.g. "lost a peer" from Gloo) get this rank named as the cause.
  const double quiet_since_unix = UnixNow() - std::chrono::duration<double>(now - last_seen).count();
  std::vector<uint64_t> doomed;
  for (const auto& [v, r] : versions_.records()) {
    if (r.state == VersionState::kComplete) continue;
    if (r.finished() && r.finished_unix < quiet_since_unix) continue;
    // A shadow rank still to copy the version out has not finished it.
    const bool done = role == Role::kTrainer ? r.trainer_done.count(rank) > 0
                                             : r.inference_done.count(rank) > 0 && r.committing.count(rank) == 0;
    if (!done) doomed.push_back(v);
  }
  for (uint64_t v : doomed) {
    StatusOr<const VersionRecord*> r = versions_.Fail(v, RoleName(role), rank, why, now);
    if (r.ok()) LogVersionLocked(**r);
  }
  if (!doomed.empty()) cv_.notify_all();
  return static_cast<int>(doomed.size());
}

}  // namespace wsync::controller
