// The control plane's state machine: registrations -> assembled world ->
// static plan -> per-version progress, plus the Gloo rendezvous store.
//
// Transport-free: http_server.h maps HTTP requests onto these calls (see
// docs/CONTROL_PLANE.md), tests call them directly too. Thread-safe: every
// public method takes the one mutex `mu_`; waits (plan, KV key, version
// end) block on `cv_` under it. Planning does not hold it: the request of
// the rank that completes the world snapshots the registrations, assembles,
// plans and persists without the mutex (phase "planning"), and installs the
// plan under it, so status, heartbeats, KV and registrations are answered
// meanwhile. Slices are extracted without it too; health checks never take it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "controller/registration.h"
#include "controller/role.h"
#include "controller/state_store.h"
#include "controller/thread_annotations.h"
#include "controller/version_tracker.h"
#include "routing/metadata.h"
#include "routing/plan_summary.h"
#include "routing/planner.h"
#include "routing/routing_table.h"

namespace wsync::controller {

struct ControllerOptions {
  int32_t trainers = 1;
  int32_t inference = 1;
  MappingSpec mapping;           // default: identity ({*} -> {*})
  std::string state_dir;         // "" keeps nothing across restarts
  double world_timeout_s = 300;  // after this without a full world: failed_to_assemble
  double version_timeout_s = 300;
  // A rank that has sent a heartbeat and then stays silent this long is
  // declared lost: every running version it has not finished fails, naming
  // it. Ranks that never send heartbeats are not tracked. 0: off.
  double heartbeat_timeout_s = 10;
  // Plan the exchange instead of full_tensor (PlanOptions::exchange): each
  // trainer rank receives from its FSDP peers only the rows it writes.
  // false: full_tensor.
  bool exchange = true;
  uint64_t min_shard_piece_bytes = PlanOptions{}.min_shard_piece_bytes;
  // Delta versions (docs/DELTAS.md), for inference ranks that registered
  // inboxes: every full_every-th version goes whole, the others as deltas
  // against the latest complete version where its receivers hold it intact.
  // 1: every version whole.
  uint32_t full_every = 10;
  // One line per event (registration, plan, version finished, timeout).
  std::function<void(const std::string&)> log;
  // Tests: called on the planning thread, without the mutex, before each
  // planning pass over a full world. Blocking in it holds the controller in
  // phase "planning" (what a large world's planning looks like to others).
  std::function<void()> planning_hook;
};

// The identity mapping: every engine tensor has the trainer tensor's name.
MappingSpec IdentityMapping();

class Controller {
 public:
  using Clock = std::chrono::steady_clock;

  // Loads the state dir (if it holds a plan, the controller starts planned).
  static StatusOr<std::unique_ptr<Controller>> Create(ControllerOptions options);
  ~Controller();

  // Registrations: `body` as in docs/CONTROL_PLANE.md. InvalidArgument for
  // metadata that does not fit (one line naming rank and tensor; also kept
  // in Status()), FailedPrecondition for a change after the plan exists.
  StatusOr<nlohmann::json> RegisterTrainer(nlohmann::json body);
  StatusOr<nlohmann::json> RegisterInference(nlohmann::json body);

  // A rank's plan slice, waiting up to `wait` for the world. While the world
  // is incomplete: FailedPrecondition naming the missing ranks.
  StatusOr<nlohmann::json> PlanSlice(Role role, int32_t rank, Clock::duration wait);
  // The same slice as the text served (built once per rank, then shared).
  StatusOr<std::shared_ptr<const std::string>> PlanSliceText(Role role, int32_t rank, Clock::duration wait);
  // {"phase", "missing": {"trainer": [...], "inference": [...]}}
  nlohmann::json WorldSummary();

  // Liveness (POST /v1/heartbeat): marks the rank alive; a lost rank that
  // beats again is alive again (its agent restarted).
  StatusOr<nlohmann::json> Heartbeat(Role role, int32_t rank);

  // Gloo rendezvous store. KvGet waits up to `wait` for the key; NotFound
  // after that.
  void KvSet(const std::string& key, std::string value);
  StatusOr<std::string> KvGet(const std::string& key, Clock::duration wait);
  StatusOr<int64_t> KvAdd(const std::string& key, int64_t delta);

  // Versions; each returns the version object of docs/CONTROL_PLANE.md.
  // `epoch` is the registration epoch of the trainer's plan slice (0: not
  // checked, for callers that predate epochs); an older one than the
  // controller's is refused with a FailedPrecondition whose message starts
  // with kStaleEpochPrefix: the trainer must fetch its slice again. While a
  // version older than v runs, v's first start is refused with Unavailable
  // (kOlderRunningPrefix): one version in flight.
  StatusOr<nlohmann::json> StartVersion(uint64_t v, int32_t rank, uint64_t epoch = 0);
  // `stats`: a trainer's executor report, or what an inference rank did at
  // commit (the deltas it applied), shown in the version object.
  // `commit` (inference only): the rank is in shadow mode. Once every rank
  // is done, v has `landed` and each such rank copies it into its engine's
  // weights (ReportCommitted); v is complete when the last one has, and
  // fails if one of them is lost or registers again first.
  StatusOr<nlohmann::json> ReportDone(uint64_t v, Role role, int32_t rank, bool ok,
                                      const std::string& error, const nlohmann::json& stats = nullptr,
                                      bool commit = false);
  StatusOr<nlohmann::json> ReportCommitted(uint64_t v, int32_t rank);
  StatusOr<nlohmann::json> ReportFailure(uint64_t v, Role role, int32_t rank,
                                         const std::string& error);
  // Waits up to `wait` for the version to finish, or also to land (shadow
  // ranks wait for that to copy it out) or to be admitted (trainers wait for
  // that before they write, docs/CONTROL_PLANE.md "Engine-paced ranks").
  // NotFound if never seen.
  enum class Until { kFinished, kLanded, kAdmitted };
  StatusOr<nlohmann::json> GetVersion(uint64_t v, Clock::duration wait, Until until = Until::kFinished);
  // An engine-paced inference rank moves its gate (VersionTracker::Gate);
  // FailedPrecondition for a rank that registered without pacing.
  StatusOr<nlohmann::json> Gate(int32_t rank, GateMove move, uint64_t version);
  // The checksums of every write inference rank `rank` receives in `v`, as
  // the trainers sent them, once every trainer rank reported done (waits up
  // to `wait` for that): {"version", "rank", "state", "checksums": {"<region>":
  // [[offset, bytes, "<hash>"], ...]}}. FailedPrecondition when v failed or
  // a trainer sent none (it runs without checksums); DeadlineExceeded naming
  // the trainer ranks still out.
  StatusOr<nlohmann::json> VersionChecksums(uint64_t v, int32_t rank, Clock::duration wait);

  // With `since` (a `versions_fingerprint` of an earlier answer), waits up
  // to `wait` for a version to start or finish first: the inference agents'
  // long poll, which learns of a started version at once instead of at the
  // next poll.
  nlohmann::json StatusJson(const std::string& since = "", Clock::duration wait = Clock::duration::zero());
  std::string MetricsText();  // Prometheus text format 0.0.4

  // Enforces deadlines (world timeout, version deadlines) and logs them.
  // Every call does this too; the server also calls it periodically so
  // the log and the metrics do not wait for a request.
  void Tick();
  // Wakes every waiter with Aborted; later waits return at once.
  void Shutdown();

 private:
  explicit Controller(ControllerOptions options);

  Status LoadStateLocked() WSYNC_REQUIRES(mu_);
  bool WorldFullLocked() const WSYNC_REQUIRES(mu_);
  // Once every rank is registered (and no pass is in flight): assembles,
  // plans and persists a snapshot of the registrations with `lock` released,
  // again while registrations changed meanwhile, then installs the plan.
  // Returns with `lock` held; the error is the assembly/planning one.
  Status MaybePlanLocked(std::unique_lock<std::mutex>& lock) WSYNC_REQUIRES(mu_);
  // Registrations that arrive while the plan is being written wait for it
  // (they are then checked against the plan, like any later registration).
  void WaitCommitLocked(std::unique_lock<std::mutex>& lock) WSYNC_REQUIRES(mu_);
  // A registration after the plan exists: same metadata or FailedPrecondition.
  StatusOr<nlohmann::json> ReRegisterLocked(Role role, int32_t rank, const nlohmann::json& rank_json,
                                            const nlohmann::json* mesh_groups) WSYNC_REQUIRES(mu_);
  void TickLocked(Clock::time_point now) WSYNC_REQUIRES(mu_);
  void RecordErrorLocked(Role role, int32_t rank, const std::string& error) WSYNC_REQUIRES(mu_);
  // When an assembly error names a rank other than (role, rank), drops that
  // rank's registration instead, remembers why for its agent, returns true.
  bool DropCulpritLocked(Role role, int32_t rank, const std::string& error) WSYNC_REQUIRES(mu_);
  void SaveVersionsLocked() WSYNC_REQUIRES(mu_);
  void LogVersionLocked(const VersionRecord& r) WSYNC_REQUIRES(mu_);
  void VersionFinishedLocked(bool was_finished, const VersionRecord& r) WSYNC_REQUIRES(mu_);
  nlohmann::json RegisterReplyLocked(Role role, int32_t rank) WSYNC_REQUIRES(mu_);
  std::vector<int32_t> MissingLocked(Role role) const WSYNC_REQUIRES(mu_);
  std::string MissingTextLocked() const WSYNC_REQUIRES(mu_);
  std::string PhaseLocked() const WSYNC_REQUIRES(mu_);
  Status CheckReportLocked(Role role, int32_t rank) const WSYNC_REQUIRES(mu_);
  void Log(const std::string& line) const;
  // Liveness (controller/liveness.cc).
  void SeenLocked(Role role, int32_t rank, Clock::time_point now) WSYNC_REQUIRES(mu_);
  void CheckLivenessLocked(Clock::time_point now) WSYNC_REQUIRES(mu_);
  // Fails the running versions `rank` has not finished, and names it on
  // versions that failed after it went quiet (at `last_seen`); returns how many.
  int FailVersionsOfLostLocked(Role role, int32_t rank, const std::string& why, Clock::time_point now,
                               Clock::time_point last_seen = Clock::time_point::max()) WSYNC_REQUIRES(mu_);
  std::string LostReason() const;

  // Set at construction, read-only afterwards.
  const ControllerOptions options_;
  const Clock::time_point started_;

  mutable std::mutex mu_;
  // Changes whenever a version starts or finishes (GET /v1/status's
  // `versions_fingerprint`).
  std::string VersionsFingerprintLocked() const;
  std::condition_variable cv_;  // signalled on plan, KV set, version finished, shutdown

  bool shutdown_ WSYNC_GUARDED_BY(mu_) = false;
  // Guarded by mu_, except that the planning pass writes world.json and
  // plan.json without it while committing_ (nothing else writes the store
  // before the plan exists).
  StateStore store_;

  // Registrations (before the plan) and assembly.
  // Released once the plan is installed (the plan's specs are what counts
  // from then on).
  TrainerRegistry trainers_ WSYNC_GUARDED_BY(mu_);
  RankJsons inference_ranks_ WSYNC_GUARDED_BY(mu_);
  // Bumped by every change to the registrations: a planning pass whose
  // snapshot is older plans again.
  uint64_t registrations_gen_ WSYNC_GUARDED_BY(mu_) = 0;
  bool planning_ WSYNC_GUARDED_BY(mu_) = false;    // a pass is in flight (phase "planning")
  bool committing_ WSYNC_GUARDED_BY(mu_) = false;  // ... and writing the state dir
  // The last pass: assemble + plan + persist, and its parts.
  double plan_seconds_ WSYNC_GUARDED_BY(mu_) = 0;
  double assemble_seconds_ WSYNC_GUARDED_BY(mu_) = 0;
  double persist_seconds_ WSYNC_GUARDED_BY(mu_) = 0;
  // Registrations dropped at assembly because the error named them; their
  // agents get the error from /v1/plan until they register again.
  std::map<std::pair<Role, int32_t>, std::string> rejected_ WSYNC_GUARDED_BY(mu_);
  bool world_timed_out_ WSYNC_GUARDED_BY(mu_) = false;
  std::string assembly_error_ WSYNC_GUARDED_BY(mu_);
  struct ErrorRecord {
    double unix;
    Role role;
    int32_t rank;
    std::string error;
  };
  std::vector<ErrorRecord> errors_ WSYNC_GUARDED_BY(mu_);  // newest last, capped
  uint64_t registration_errors_ WSYNC_GUARDED_BY(mu_) = 0;

  // The plan and what it was made from. Immutable once built and shared, so
  // per-rank slices are extracted without holding mu_ (tens of ms each at
  // Kimi-K2 scale, and every agent asks at once).
  struct PlanState {
    TrainerSpec trainer;
    InferenceSpec inference;
    // Normalized wsync.trainer/v1 and wsync.inference/v1 text (ToJsonText),
    // persisted and compared with re-registrations; text, not trees: tens
    // of MB at Kimi-K2 scale.
    std::string trainer_text;
    std::string inference_text;
    RoutingTable table;
    PlanSummary summary;
    std::string plan_id;
    // Indices into table.ops by sender and by receiver rank, so each slice
    // is extracted in time of its own share (384 slices at Kimi-K2 scale
    // would otherwise each scan ~1M writes).
    std::vector<std::vector<uint32_t>> ops_by_trainer, ops_by_inference;
  };
  // One rank's plan slice as served, from an immutable plan (no lock).
  static StatusOr<std::shared_ptr<const std::string>> BuildSlice(const PlanState& plan, uint64_t epoch, Role role,
                                                                 int32_t rank);
  // Plans and digests; `plan_text` receives the wsync.plan/v1 document.
  StatusOr<std::shared_ptr<const PlanState>> BuildPlan(TrainerSpec trainer, InferenceSpec inference,
                                                       std::string trainer_text, std::string inference_text,
                                                       std::string* plan_text) const;
  void InstallPlanLocked(std::shared_ptr<const PlanState> plan) WSYNC_REQUIRES(mu_);

  // A rank registering again after the plan (its agent restarted): an
  // inference rank with the same layout in new memory (`inference`: its new
  // spec and normalized json, swapped into the plan) or a trainer rank with
  // the same metadata. Bumps and persists the epoch and fails the versions
  // still running that the rank had not finished (its old process is gone).
  StatusOr<nlohmann::json> NewEpochLocked(Role role, int32_t rank,
                                          std::optional<std::pair<InferenceSpec, std::string>> inference)
      WSYNC_REQUIRES(mu_);

  // Set once (by the last registration or from the state dir).
  bool planned_ WSYNC_GUARDED_BY(mu_) = false;
  uint64_t epoch_ WSYNC_GUARDED_BY(mu_) = 1;
  std::shared_ptr<const PlanState> plan_ WSYNC_GUARDED_BY(mu_);
  // Slices are built on first request and kept: every agent asks once, and
  // after a restart again.
  std::map<int32_t, std::shared_ptr<const std::string>> trainer_slices_ WSYNC_GUARDED_BY(mu_);
  std::map<int32_t, std::shared_ptr<const std::string>> inference_slices_ WSYNC_GUARDED_BY(mu_);
  // Slices being built (without the lock), at most one per rank and a few
  // at once: a build's JSON tree is several times its text, and 384 at
  // once held 23 GB for Kimi-K2's exchange plan (12 M writes) until the
  // OOM killer ended the controller.
  std::set<std::pair<Role, int32_t>> building_ WSYNC_GUARDED_BY(mu_);
  // The build slots, handed on in turn: a request that finds them all taken
  // queues here and sleeps on its own condition variable, and a finishing
  // build wakes only the oldest. (All waiting on cv_, each of 384 builds
  // woke every other waiting request: ~100k context switches, a good part
  // of the time to serve Kimi-K2's slices on 2 cores.)
  struct SliceSlotWaiter {
    std::condition_variable cv;
    bool granted = false;  // guarded by mu_
  };
  size_t slice_slots_taken_ WSYNC_GUARDED_BY(mu_) = 0;
  std::deque<SliceSlotWaiter*> slice_slot_queue_ WSYNC_GUARDED_BY(mu_);
  // Takes a build slot, waiting in turn until `until`; false if none came
  // by then or the controller is shutting down.
  bool TakeSliceSlotLocked(std::unique_lock<std::mutex>& lock, Clock::time_point until) WSYNC_REQUIRES(mu_);
  // Hands the slot to the oldest queued request, else frees it.
  void ReleaseSliceSlotLocked() WSYNC_REQUIRES(mu_);

  VersionTracker versions_ WSYNC_GUARDED_BY(mu_);
  // When each rank that sends heartbeats was last heard from, and the ranks
  // declared lost (-> unix time).
  std::map<std::pair<Role, int32_t>, Clock::time_point> last_seen_ WSYNC_GUARDED_BY(mu_);
  std::map<std::pair<Role, int32_t>, double> lost_ WSYNC_GUARDED_BY(mu_);
  std::map<std::string, std::string> kv_ WSYNC_GUARDED_BY(mu_);
};

}  // namespace wsync::controller
