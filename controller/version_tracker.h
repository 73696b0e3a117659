// Per-version bookkeeping of weight updates: who started a version, which
// ranks reported done, whether it completed or failed and why.
//
// Owned by Controller and used only under its mutex (not thread-safe on its
// own). The rule it enforces is the one users depend on: a version is
// complete only when every inference rank reported its writes landed; any
// failure report or a passed deadline makes it failed, and a failed version
// never becomes complete.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "routing/metadata.h"

namespace wsync::controller {

enum class VersionState { kStarted, kComplete, kFailed };
const char* VersionStateName(VersionState s);

struct RankFailure {
  std::string role;  // "trainer", "inference" or "controller" (deadline)
  int32_t rank = -1;
  std::string error;
};

struct VersionRecord {
  uint64_t version = 0;
  VersionState state = VersionState::kStarted;
  std::chrono::steady_clock::time_point start;
  std::chrono::steady_clock::time_point deadline;
  double started_unix = 0;
  double finished_unix = 0;
  double seconds = 0;  // start to finish
  std::set<int32_t> trainer_done;
  std::set<int32_t> inference_done;
  std::vector<RankFailure> failures;
  // What each trainer rank reported with trainer_done (stage times, bytes,
  // peak temporary memory), passed through as sent.
  std::map<int32_t, nlohmann::json> trainer_stats;
  // What each inference rank reported with inference_done (the deltas it
  // applied and how long that took), passed through as sent.
  std::map<int32_t, nlohmann::json> inference_stats;
  // The checksums trainers sent with trainer_done (`stats.checksums`), kept
  // apart from trainer_stats and merged per inference rank: {"<region>":
  // [[offset, bytes, "<hash>"], ...]}. `checksum_trainers`: who sent any.
  std::map<int32_t, nlohmann::json> checksums;
  std::set<int32_t> checksum_trainers;
  // Shadow mode's two phases: inference ranks that reported done with
  // `commit` hold the version in their shadow. Once every rank is done the
  // version has `landed`: each such rank then copies it out into its
  // engine's weights and leaves `committing` (inference_committed); the
  // version is complete when the last one has. A committing rank that is
  // lost or registers again fails it.
  std::set<int32_t> committing;
  bool landed = false;
  // Engine-paced ranks (routing's Pacing): trainers write v only once it is
  // admitted, i.e. every paced rank's gate lets v in (VersionTracker::Gate).
  // Without paced ranks a version is admitted when it starts.
  bool admitted = false;
  // Delta versions (docs/DELTAS.md), fixed when the version starts: trainers
  // may send inference rank r in `delta_ranks` only what changed since
  // `delta_base`, the latest complete version, which r holds intact. Empty:
  // every write goes whole.
  uint64_t delta_base = 0;
  std::vector<int32_t> delta_ranks;

  bool finished() const { return state != VersionState::kStarted; }
  nlohmann::json ToJson(std::chrono::steady_clock::time_point now) const;
};

// What an engine-paced rank's gate answers (VersionTracker::Gate).
struct GateState {
  int32_t rank = -1;
  Pacing pacing = Pacing::kPush;
  uint64_t upto = 0;      // versions up to this may be admitted (kGateOpen: any)
  uint64_t admitted = 0;  // the highest version ever admitted (0: none)
  bool admitted_running = false;  // ... and it has not finished yet
  uint64_t newest = 0;    // the newest version started and not finished (0: none)
  nlohmann::json ToJson() const;
};

// How an engine moves its gate (POST /v1/gate).
enum class GateMove {
  kOpen,    // admit any version (a shadow rank between two update() calls)
  kNewest,  // admit up to the newest running version (update() with no version)
  kUpto,    // admit up to a given version (update(v))
  kClose,   // admit nothing more (a shadow rank copying its shadow out)
};
inline constexpr uint64_t kGateOpen = ~0ull;

class VersionTracker {
 public:
  using Clock = std::chrono::steady_clock;

  VersionTracker(int32_t trainers, int32_t inference, double timeout_s);

  // Starts `v` (idempotent while it runs). FailedPrecondition if it already
  // finished or is not above the latest complete version.
  StatusOr<const VersionRecord*> Start(uint64_t v, Clock::time_point now);
  // Reports. NotFound for a version that was never started (a report never
  // starts one). Reports on a finished version are recorded only.
  // InvalidArgument (nothing recorded) for malformed `stats.checksums`.
  StatusOr<const VersionRecord*> TrainerDone(uint64_t v, int32_t rank, bool ok,
                                             const std::string& error, Clock::time_point now,
                                             const nlohmann::json& stats = nullptr);
  // `commit`: the rank is in shadow mode (VersionRecord::committing).
  StatusOr<const VersionRecord*> InferenceDone(uint64_t v, int32_t rank, bool ok,
                                               const std::string& error, Clock::time_point now, bool commit = false,
                                               const nlohmann::json& stats = nullptr);
  // A shadow rank copied landed version v into its engine's weights;
  // FailedPrecondition unless v has landed and is still running.
  StatusOr<const VersionRecord*> Committed(uint64_t v, int32_t rank, Clock::time_point now);
  StatusOr<const VersionRecord*> Fail(uint64_t v, const std::string& role, int32_t rank,
                                      const std::string& error, Clock::time_point now);

  // Engine-paced ranks. A rank's gate starts closed (live) or open
  // (shadow); setting the pacing again (a new registration) resets it. A
  // version is admitted, for good, once every paced rank's gate is at or
  // above it, oldest first; admission never goes back, so a gate cannot
  // close under writes already let in (the answer says which version they
  // are). Returns what moved: the versions admitted by this call.
  void SetPacing(int32_t rank, Pacing pacing);
  StatusOr<GateState> Gate(int32_t rank, GateMove move, uint64_t version);
  std::vector<uint64_t> AdmitReady();
  Pacing PacingOf(int32_t rank) const {
    auto it = gates_.find(rank);
    return it == gates_.end() ? Pacing::kPush : it->second.first;
  }

  // Delta versions. `ranks`: the inference ranks that registered delta
  // inboxes (set with each plan). A new version goes as a delta to every
  // such rank that holds the latest complete version intact (it completed
  // there, and nothing since failed or registered it again), except every
  // `full_every`-th version, which goes whole (1: no deltas at all).
  void ConfigureDeltas(uint32_t full_every, std::set<int32_t> ranks);
  // Inference rank `rank` registered (again): whatever it holds is unknown.
  void ForgetHeld(int32_t rank) { held_.erase(rank); }

  // Fails every running version whose deadline passed; returns them.
  std::vector<const VersionRecord*> ExpireOverdue(Clock::time_point now);

  const VersionRecord* Find(uint64_t v) const;
  const std::map<uint64_t, VersionRecord>& records() const { return records_; }

  // Restores what a restarted controller knows from its state dir.
  void RestoreLatestComplete(uint64_t v, double seconds, double finished_unix);
  // ... and a shadow version that had landed: running again (a new
  // deadline), every inference rank done, `committing` still to copy it out.
  void RestoreLanded(uint64_t v, const std::vector<int32_t>& committing, Clock::time_point now);
  // The running version that landed and waits for commits, if any.
  const VersionRecord* Landed() const;

  bool has_complete() const { return has_complete_; }
  uint64_t latest_complete() const { return latest_complete_; }
  double last_update_seconds() const { return last_update_seconds_; }
  uint64_t started_total() const { return started_total_; }
  uint64_t complete_total() const { return complete_total_; }
  uint64_t failed_total() const { return failed_total_; }
  int in_progress() const;

 private:
  StatusOr<VersionRecord*> GetOrStart(uint64_t v, Clock::time_point now, bool explicit_start);
  void Finish(VersionRecord* r, VersionState state, Clock::time_point now);
  // Completes r once every inference rank is done and none is committing.
  void MaybeComplete(VersionRecord* r, Clock::time_point now);
  void Prune();

  GateState GateOf(int32_t rank) const;
  // The paced ranks whose gates keep v out (for the deadline's message).
  std::vector<int32_t> ClosedGates(uint64_t v) const;

  int32_t trainers_;
  int32_t inference_;
  std::map<int32_t, std::pair<Pacing, uint64_t>> gates_;  // paced rank -> (pacing, upto)
  uint64_t admitted_ = 0;
  Clock::duration timeout_;
  std::map<uint64_t, VersionRecord> records_;
  bool has_complete_ = false;
  uint64_t latest_complete_ = 0;
  double last_update_seconds_ = 0;
  uint64_t started_total_ = 0;
  uint64_t complete_total_ = 0;
  uint64_t failed_total_ = 0;
  uint32_t full_every_ = 1;
  std::set<int32_t> delta_capable_;
  std::map<int32_t, uint64_t> held_;  // inference rank -> the complete version it holds intact
  uint32_t deltas_in_row_ = 0;        // versions sent as deltas since the last full one
};

}  // namespace wsync::controller
