#include "controller/version_tracker.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "common/checksum.h"

namespace wsync::controller {

namespace {

// Finished versions kept for /v1/status; running ones are never dropped.
constexpr size_t kKeepFinished = 64;

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string Ranks(const std::vector<int32_t>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

// stats.checksums of a trainer_done (trainer_agent::ChecksumsJson): inference
// ranks -> regions -> [offset, bytes, 16 hex digits] entries.
Status CheckChecksums(const nlohmann::json& c, int32_t inference) {
  const std::string where = "trainer_done: 'stats.checksums'";
  if (!c.is_object()) return InvalidArgument(where + " must be an object of inference ranks");
  for (const auto& [dst, regions] : c.items()) {
    char* end = nullptr;
    const long rank = std::strtol(dst.c_str(), &end, 10);
    if (dst.empty() || *end != '\0' || rank < 0 || rank >= inference)
      return InvalidArgument(where + ": '" + dst + "' is not an inference rank (0.." + std::to_string(inference - 1) + ")");
    if (!regions.is_object()) return InvalidArgument(where + ": rank " + dst + ": must be an object of regions");
    for (const auto& [region, list] : regions.items()) {
      if (!list.is_array()) return InvalidArgument(where + ": rank " + dst + " region '" + region + "': not a list");
      for (const nlohmann::json& e : list) {
        if (!e.is_array() || e.size() != 3 || !e[0].is_number_unsigned() || !e[1].is_number_unsigned() ||
            !e[2].is_string() || !ParseChecksumText(e[2].get<std::string>()))
          return InvalidArgument(where + ": rank " + dst + " region '" + region +
                                 "': entries are [offset, bytes, \"<16 hex digits>\"]");
      }
    }
  }
  return Status::Ok();
}

}  // namespace

const char* VersionStateName(VersionState s) {
  switch (s) {
    case VersionState::kStarted: return "started";
    case VersionState::kComplete: return "complete";
    case VersionState::kFailed: return "failed";
  }
  return "unknown";
}

nlohmann::json VersionRecord::ToJson(std::chrono::steady_clock::time_point now) const {
  nlohmann::json failures_json = nlohmann::json::array();
  for (const RankFailure& f : failures)
    failures_json.push_back({{"role", f.role}, {"rank", f.rank}, {"error", f.error}});
  nlohmann::json j = {{"version", version},
                      {"state", VersionStateName(state)},
                      {"started_unix", started_unix},
                      {"trainer_done", trainer_done},
                      {"inference_done", inference_done},
                      {"failures", std::move(failures_json)}};
  if (!checksum_trainers.empty()) j["checksums_from"] = checksum_trainers;
  if (!committing.empty()) j["committing"] = committing;
  j["admitted"] = admitted;
  if (landed) j["landed"] = true;
  if (!delta_ranks.empty()) j["delta"] = {{"base", delta_base}, {"ranks", delta_ranks}};
  if (!trainer_stats.empty()) {
    nlohmann::json stats = nlohmann::json::object();
    for (const auto& [rank, s] : trainer_stats) stats[std::to_string(rank)] = s;
    j["trainer_stats"] = std::move(stats);
  }
  if (!inference_stats.empty()) {
    nlohmann::json stats = nlohmann::json::object();
    for (const auto& [rank, s] : inference_stats) stats[std::to_string(rank)] = s;
    j["inference_stats"] = std::move(stats);
  }
  if (finished()) {
    j["finished_unix"] = finished_unix;
    j["seconds"] = seconds;
  } else {
    j["deadline_in_s"] = std::chrono::duration<double>(deadline - now).count();
  }
  return j;
}

VersionTracker::VersionTracker(int32_t trainers, int32_t inference, double timeout_s)
    : trainers_(trainers),
      inference_(inference),
      timeout_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s))) {}

StatusOr<VersionRecord*> VersionTracker::GetOrStart(uint64_t v, Clock::time_point now,
                                                    bool explicit_start) {
  auto it = records_.find(v);
  if (it != records_.end()) {
    if (explicit_start && it->second.finished()) {
      // A rank that starts late must learn why, not only that: its peers
      // may have failed on a dead rank it never talked to.
      std::string cause;
      if (!it->second.failures.empty()) {
        const RankFailure& f = it->second.failures.front();
        cause = " (" + (f.rank >= 0 ? f.role + " rank " + std::to_string(f.rank) : f.role) + ": " + f.error + ")";
      }
      return FailedPrecondition("version " + std::to_string(v) + " already " +
                                VersionStateName(it->second.state) + cause + "; start a new version number");
    }
    return &it->second;
  }
  if (!explicit_start) {
    // Only a started version can be reported on: a report of a number
    // nobody started (a typo, a stray or hostile client) must not start it,
    // nor, once done, stand as the latest complete version that refuses
    // every real one after it.
    const bool long_gone = !records_.empty() && v < records_.begin()->first;
    return NotFound("version " + std::to_string(v) +
                    (long_gone ? " finished long ago (its record is gone)"
                               : " was never started (a trainer rank starts a version before anyone reports on it)"));
  }
  if (has_complete_ && v <= latest_complete_)
    return FailedPrecondition("version " + std::to_string(v) + " is not above the latest complete version " +
                              std::to_string(latest_complete_) + "; use a higher version number");
  VersionRecord& r = records_[v];
  r.version = v;
  r.start = now;
  r.deadline = now + timeout_;
  r.started_unix = UnixNow();
  if (has_complete_ && deltas_in_row_ + 1 < full_every_) {
    for (const auto& [rank, held] : held_)
      if (held == latest_complete_ && delta_capable_.count(rank) != 0) r.delta_ranks.push_back(rank);
  }
  if (r.delta_ranks.empty()) {
    deltas_in_row_ = 0;
  } else {
    r.delta_base = latest_complete_;
    ++deltas_in_row_;
  }
  ++started_total_;
  Prune();
  AdmitReady();
  return &records_[v];
}

nlohmann::json GateState::ToJson() const {
  nlohmann::json j = {{"rank", rank}, {"pacing", PacingName(pacing)}, {"open", upto == kGateOpen},
                      {"admitted", admitted}, {"admitted_running", admitted_running}, {"newest", newest}};
  if (upto != kGateOpen) j["upto"] = upto;
  return j;
}

void VersionTracker::SetPacing(int32_t rank, Pacing pacing) {
  if (pacing == Pacing::kPush) {
    gates_.erase(rank);
    AdmitReady();  // a rank that no longer paces holds nothing back
    return;
  }
  gates_[rank] = {pacing, pacing == Pacing::kShadow ? kGateOpen : 0};
}

GateState VersionTracker::GateOf(int32_t rank) const {
  GateState g;
  g.rank = rank;
  auto it = gates_.find(rank);
  if (it != gates_.end()) std::tie(g.pacing, g.upto) = it->second;
  g.admitted = admitted_;
  for (const auto& [v, r] : records_) {
    if (r.finished()) continue;
    g.newest = std::max(g.newest, v);
    if (v == admitted_ && r.admitted) g.admitted_running = true;
  }
  return g;
}

StatusOr<GateState> VersionTracker::Gate(int32_t rank, GateMove move, uint64_t version) {
  auto it = gates_.find(rank);
  if (it == gates_.end())
    return FailedPrecondition("inference rank " + std::to_string(rank) +
                              " is not engine-paced (it registered with pacing 'push'): trainers write into it "
                              "whenever they push, and it has no gate to move");
  uint64_t& upto = it->second.second;
  switch (move) {
    case GateMove::kOpen: upto = kGateOpen; break;
    case GateMove::kUpto: upto = version; break;
    case GateMove::kNewest: upto = GateOf(rank).newest; break;
    // Nothing newer than what is admitted already (which cannot be undone).
    case GateMove::kClose: upto = admitted_; break;
  }
  AdmitReady();
  return GateOf(rank);
}

std::vector<uint64_t> VersionTracker::AdmitReady() {
  std::vector<uint64_t> now_admitted;
  for (auto& [v, r] : records_) {  // oldest first
    if (r.finished() || r.admitted) continue;
    if (!ClosedGates(v).empty()) break;  // a newer one waits behind it
    r.admitted = true;
    admitted_ = std::max(admitted_, v);
    now_admitted.push_back(v);
  }
  return now_admitted;
}

std::vector<int32_t> VersionTracker::ClosedGates(uint64_t v) const {
  std::vector<int32_t> closed;
  for (const auto& [rank, gate] : gates_)
    if (gate.second < v) closed.push_back(rank);
  return closed;
}

StatusOr<const VersionRecord*> VersionTracker::Start(uint64_t v, Clock::time_point now) {
  WSYNC_ASSIGN_OR_RETURN(VersionRecord * r, GetOrStart(v, now, /*explicit_start=*/true));
  return static_cast<const VersionRecord*>(r);
}

StatusOr<const VersionRecord*> VersionTracker::TrainerDone(uint64_t v, int32_t rank, bool ok,
                                                           const std::string& error,
                                                           Clock::time_point now,
                                                           const nlohmann::json& stats) {
  nlohmann::json kept = stats;
  nlohmann::json checksums;
  if (kept.is_object() && kept.contains("checksums")) {
    checksums = std::move(kept["checksums"]);
    kept.erase("checksums");
    WSYNC_RETURN_IF_ERROR(CheckChecksums(checksums, inference_));
  }
  WSYNC_ASSIGN_OR_RETURN(VersionRecord * r, GetOrStart(v, now, false));
  if (!ok) return Fail(v, "trainer", rank, error.empty() ? "reported not ok" : error, now);
  r->trainer_done.insert(rank);
  if (kept.is_object()) r->trainer_stats[rank] = std::move(kept);
  if (checksums.is_object()) {
    r->checksum_trainers.insert(rank);
    for (auto& [dst, regions] : checksums.items()) {
      nlohmann::json& into = r->checksums[std::stoi(dst)];
      for (auto& [region, list] : regions.items()) {
        for (auto& entry : list) into[region].push_back(std::move(entry));
      }
    }
  }
  return static_cast<const VersionRecord*>(r);
}

StatusOr<const VersionRecord*> VersionTracker::Committed(uint64_t v, int32_t rank, Clock::time_point now) {
  auto it = records_.find(v);
  if (it == records_.end()) return NotFound("version " + std::to_string(v) + " is not known (or too old to be kept)");
  VersionRecord* r = &it->second;
  if (r->state != VersionState::kStarted || !r->landed || r->committing.count(rank) == 0)
    return FailedPrecondition("version " + std::to_string(v) + " is " + VersionStateName(r->state) +
                              (r->landed ? "" : ", not landed everywhere,") + " and inference rank " +
                              std::to_string(rank) + " has nothing of it to commit");
  r->committing.erase(rank);
  MaybeComplete(r, now);
  return static_cast<const VersionRecord*>(r);
}

void VersionTracker::MaybeComplete(VersionRecord* r, Clock::time_point now) {
  if (r->state != VersionState::kStarted || static_cast<int32_t>(r->inference_done.size()) != inference_) return;
  r->landed = true;
  if (!r->committing.empty()) return;  // shadow ranks copy it out first
  // Deadlines are enforced here too, not only by the ticker: a report that
  // arrives after the deadline must not complete the version.
  if (now > r->deadline) {
    ExpireOverdue(now);
  } else {
    Finish(r, VersionState::kComplete, now);
  }
}

StatusOr<const VersionRecord*> VersionTracker::InferenceDone(uint64_t v, int32_t rank, bool ok,
                                                             const std::string& error,
                                                             Clock::time_point now, bool commit,
                                                             const nlohmann::json& stats) {
  WSYNC_ASSIGN_OR_RETURN(VersionRecord * r, GetOrStart(v, now, false));
  if (!ok) return Fail(v, "inference", rank, error.empty() ? "reported not ok" : error, now);
  r->inference_done.insert(rank);
  if (stats.is_object()) r->inference_stats[rank] = stats;
  if (commit && r->state == VersionState::kStarted) r->committing.insert(rank);
  MaybeComplete(r, now);
  return static_cast<const VersionRecord*>(r);
}

StatusOr<const VersionRecord*> VersionTracker::Fail(uint64_t v, const std::string& role, int32_t rank,
                                                    const std::string& error, Clock::time_point now) {
  WSYNC_ASSIGN_OR_RETURN(VersionRecord * r, GetOrStart(v, now, false));
  r->failures.push_back({role, rank, error});
  if (r->state == VersionState::kStarted) Finish(r, VersionState::kFailed, now);
  return static_cast<const VersionRecord*>(r);
}

std::vector<const VersionRecord*> VersionTracker::ExpireOverdue(Clock::time_point now) {
  std::vector<const VersionRecord*> expired;
  for (auto& [v, r] : records_) {
    if (r.state != VersionState::kStarted || now <= r.deadline) continue;
    std::vector<int32_t> waiting;
    for (int32_t i = 0; i < inference_; ++i)
      if (!r.inference_done.count(i)) waiting.push_back(i);
    std::vector<int32_t> trainers_waiting;
    for (int32_t i = 0; i < trainers_; ++i)
      if (!r.trainer_done.count(i)) trainers_waiting.push_back(i);
    char limit[32];
    std::snprintf(limit, sizeof(limit), "%g", std::chrono::duration<double>(timeout_).count());
    if (!r.admitted) {
      // Nothing was written: the trainers waited for engines to let it in.
      r.failures.push_back({"controller", -1,
                            "deadline of " + std::string(limit) + " s passed before any write: engine-paced inference "
                            "ranks " + Ranks(ClosedGates(v)) + " did not call update() for it (their weights are "
                            "untouched)"});
      Finish(&r, VersionState::kFailed, now);
      expired.push_back(&r);
      continue;
    }
    r.failures.push_back(
        {"controller", -1,
         "deadline of " + std::string(limit) + " s passed; inference ranks not done " +
             Ranks(waiting) + ", trainer ranks not done " + Ranks(trainers_waiting) +
             (r.committing.empty() ? std::string()
                                   : ", inference ranks not committed (shadow) " +
                                         Ranks(std::vector<int32_t>(r.committing.begin(), r.committing.end())))});
    Finish(&r, VersionState::kFailed, now);
    expired.push_back(&r);
  }
  return expired;
}

void VersionTracker::Finish(VersionRecord* r, VersionState state, Clock::time_point now) {
  r->state = state;
  r->finished_unix = UnixNow();
  r->seconds = std::chrono::duration<double>(now - r->start).count();
  if (state == VersionState::kComplete) {
    ++complete_total_;
    last_update_seconds_ = r->seconds;
    if (!has_complete_ || r->version > latest_complete_) latest_complete_ = r->version;
    has_complete_ = true;
    for (int32_t rank = 0; rank < inference_; ++rank) held_[rank] = r->version;  // every one took it whole
  } else {
    ++failed_total_;
    // Some of its writes may have landed anywhere: nobody holds a version
    // intact that a delta could build on until one completes again.
    held_.clear();
  }
  AdmitReady();  // one that waited behind r may go now
}

void VersionTracker::ConfigureDeltas(uint32_t full_every, std::set<int32_t> ranks) {
  full_every_ = std::max<uint32_t>(full_every, 1);
  delta_capable_ = std::move(ranks);
}

void VersionTracker::Prune() {
  size_t finished = 0;
  for (const auto& [v, r] : records_) finished += r.finished();
  for (auto it = records_.begin(); it != records_.end() && finished > kKeepFinished;) {
    if (it->second.finished()) {
      it = records_.erase(it);
      --finished;
    } else {
      ++it;
    }
  }
}

void VersionTracker::RestoreLanded(uint64_t v, const std::vector<int32_t>& committing, Clock::time_point now) {
  if (has_complete_ && v <= latest_complete_) return;
  VersionRecord& r = records_[v];
  r.version = v;
  r.state = VersionState::kStarted;
  r.start = now;
  r.deadline = now + timeout_;
  r.started_unix = UnixNow();
  for (int32_t i = 0; i < inference_; ++i) r.inference_done.insert(i);
  for (int32_t i : committing)
    if (i >= 0 && i < inference_) r.committing.insert(i);
  r.landed = true;
  r.admitted = true;  // every write of it landed
  admitted_ = std::max(admitted_, v);
  ++started_total_;
}

const VersionRecord* VersionTracker::Landed() const {
  for (auto it = records_.rbegin(); it != records_.rend(); ++it)
    if (it->second.state == VersionState::kStarted && it->second.landed) return &it->second;
  return nullptr;
}

void VersionTracker::RestoreLatestComplete(uint64_t v, double seconds, double finished_unix) {
  has_complete_ = true;
  latest_complete_ = v;
  last_update_seconds_ = seconds;
  VersionRecord& r = records_[v];
  r.version = v;
  r.state = VersionState::kComplete;
  r.seconds = seconds;
  r.finished_unix = finished_unix;
  r.started_unix = finished_unix - seconds;
}

const VersionRecord* VersionTracker::Find(uint64_t v) const {
  auto it = records_.find(v);
  return it == records_.end() ? nullptr : &it->second;
}

int VersionTracker::in_progress() const {
  return static_cast<int>(std::count_if(records_.begin(), records_.end(),
                                        [](const auto& kv) { return !kv.second.finished(); }));
}

}  // namespace wsync::controller
