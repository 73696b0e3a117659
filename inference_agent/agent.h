// InferenceAgent: the passive side of a weight update for one inference
// rank. It registers the rank's weight store with the transport engine,
// publishes the transport descriptors in its InferenceRank (so the plan
// carries them to trainers), and for every version the trainers start
// expects that version's immediates (imm = version as uint32). Only when
// every planned write of a version has landed does it store the version in
// the store's complete_version word (release); a version whose arrivals do
// not all come by its deadline is marked failed and never complete.
//
// No receive calls and no copies on the data path: the engine's IMMCOUNTER
// counts arrivals on its worker; the agent only reacts to the one callback
// per version. Driven by RunInferenceAgent (agent_runner.h) against the
// controller, or by tests directly.
//
// Threads: every method may be called from any thread. Outcomes are
// produced on the engine's callback thread and queued; callers take them
// with TakeOutcomes/WaitVersion (reporting over HTTP must not block the
// engine's callback thread).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/status.h"
#include "inference_agent/weight_memory.h"
#include "inference_agent/weight_store.h"
#include "routing/metadata.h"
#include "routing/rank_plan.h"
#include "transport/engine.h"

namespace wsync::inference {

using Clock = std::chrono::steady_clock;

struct VersionOutcome {
  uint64_t version = 0;
  Status status;          // OK: every write landed, complete_version moved
  uint32_t expected = 0;  // arrivals expected
  double seconds = 0;     // from BeginVersion to the outcome
  // OK with InferenceAgentOptions::hold: every write landed, but the
  // version is not complete here until Commit (after Verify).
  bool held = false;
};

struct InferenceAgentOptions {
  // One line per event (registration, version complete/failed); may be null.
  std::function<void(const std::string&)> log;
  // Hold each version whose writes all landed instead of marking it
  // complete: its outcome says `held`, and complete_version moves only on
  // Commit (RunInferenceAgent verifies the checksums first).
  bool hold = false;
  // Shadow mode (implies hold): the writes land in this memory, of the same
  // regions as the engine's; Commit copies a version out into the engine's
  // weights, so a version that fails leaves them at the last complete one.
  std::shared_ptr<ShadowMemory> shadow;
  // Delta versions (delta/inbox.h): beside each region of the landing
  // memory (the shadow's, in shadow mode), an inbox is registered and
  // published as region "<id>#delta"; implies hold. A held version's deltas
  // are applied (ApplyDeltas) before it is checked and committed. A host
  // region's inbox is host memory, applied by the CPU codec; a device
  // region's is memory on its device from the WeightMemory
  // (AllocateInbox), applied there by it (ApplyDelta); an owner without
  // those leaves its device regions without an inbox, taking full writes.
  bool deltas = false;
};

// What ApplyDeltas did for one version.
struct DeltaApplied {
  bool inboxes = false;      // the rank takes deltas at all
  uint64_t writes = 0;       // writes that came as deltas
  uint64_t delta_bytes = 0;  // their slots' bytes (headers included)
  uint64_t bytes = 0;        // the weight bytes they stand for
  uint64_t write_bytes = 0;  // the weight bytes of every write of the version
  double seconds = 0;
  // Bytes that came over the wire: deltas, and whole writes in place.
  uint64_t wire_bytes() const { return write_bytes - bytes + delta_bytes; }
};

class InferenceAgent {
 public:
  // Registers every region of `memory` with `engine` and fills the
  // descriptors of `rank` (hex text, descriptor_text.h). `rank`'s regions
  // must be `memory`'s, in the same order, of the same sizes.
  static StatusOr<std::unique_ptr<InferenceAgent>> Create(std::unique_ptr<transport::Engine> engine,
                                                          std::unique_ptr<WeightMemory> memory, InferenceRank rank,
                                                          InferenceAgentOptions options = {});
  // The sidecar's form: the weights in a shared-memory WeightStore.
  static StatusOr<std::unique_ptr<InferenceAgent>> Create(std::unique_ptr<transport::Engine> engine,
                                                          WeightStore store, InferenceRank rank,
                                                          InferenceAgentOptions options = {});
  // Deregisters, then stops the engine: a version still pending ends as
  // ABORTED (marked failed, never complete).
  ~InferenceAgent();

  // The rank's layout with its transport descriptors: what to register.
  const InferenceRank& rank() const { return rank_; }
  transport::Engine& engine() { return *engine_; }
  WeightMemory& memory() { return *memory_; }

  // Arrivals one version produces: sum of ArrivalsPerWrite over every write
  // this rank receives. Fails if the plan is for another rank.
  Status SetPlan(const InferenceRankPlan& plan);
  bool has_plan() const;
  uint32_t arrivals_per_version() const;

  // Starts waiting for version `v` until `deadline`. Arrivals that came
  // before the call count. Idempotent while v is pending or after it ended
  // (returns OK, does nothing). FailedPrecondition before SetPlan. If the
  // engine refuses the Expect (e.g. v and an older pending version share
  // the low 32 bits), v ends at once as a failed outcome.
  Status BeginVersion(uint64_t v, Clock::time_point deadline);
  bool begun(uint64_t v) const;

  // The controller failed `v` while this rank still waits for it (another
  // rank failed, or its deadline passed): v must never become complete here,
  // even if every write of it still lands. Marks it failed at once; the
  // pending expect, when it ends, changes nothing but the outcome's message.
  // Returns false (does nothing) unless v is pending and not yet abandoned.
  bool AbandonVersion(uint64_t v, const std::string& why);

  // The integrity check: hashes this rank's memory over every write of the
  // plan and compares with `expected` (what the trainers hashed of the bytes
  // they sent, common/checksum.h). DataLoss naming the first tensor whose
  // bytes differ (in plan order), FailedPrecondition for a planned write
  // with no checksum or a checksum of no planned write. Only meaningful
  // while no other version's writes land (before its Commit, or while the
  // trainers are between versions).
  // In shadow mode `landed` checks the shadow (what the writes left), else
  // the engine's weights (what a committed version copied out).
  Status Verify(uint64_t v, const std::vector<WriteChecksum>& expected, bool landed = true) const;
  // Applies every delta of held version v (slots stamped with v) onto the
  // landing memory, in this thread. FailedPrecondition naming the tensor for
  // a delta computed against a version other than the one this rank's
  // landing memory holds (a controller or trainer bug: the version must
  // fail, never be silently wrong); DataLoss for a malformed one. Once it
  // succeeded the landing memory holds v at every planned write.
  StatusOr<DeltaApplied> ApplyDeltas(uint64_t v);
  // The version the landing memory holds at every planned write, or
  // kNoVersion: what a delta must have been computed against.
  uint64_t landed_base() const;
  // A held version becomes complete here: in shadow mode every planned
  // write's bytes are copied out into the engine's weights first.
  Status Commit(uint64_t v);
  // A held version that will not be complete here (`why`).
  void Reject(uint64_t v, const Status& why);
  // v failed before this rank began it (some of its writes may have
  // landed): the engine hears of it (WeightMemory::MarkFailed; in shadow
  // mode MarkNotApplied).
  void MarkFailedHere(uint64_t v);
  bool shadowed() const { return options_.shadow != nullptr; }

  // Outcomes in the order they happened, waiting up to `wait` for the first.
  std::vector<VersionOutcome> TakeOutcomes(std::chrono::milliseconds wait);
  // Waits up to `wait` for `v`'s outcome (does not take it from the queue).
  // DeadlineExceeded if it has none yet.
  StatusOr<VersionOutcome> WaitVersion(uint64_t v, std::chrono::milliseconds wait);

 private:
  InferenceAgent(std::unique_ptr<transport::Engine> engine, std::unique_ptr<WeightMemory> memory, InferenceRank rank,
                 InferenceAgentOptions options);
  void OnVersionDone(uint64_t v, Clock::time_point begun, const Status& status);
  void Log(const std::string& line) const;
  // InferenceAgentOptions::deltas: an inbox beside each region of `landing`.
  Status RegisterInboxes(const std::vector<WeightMemory::Region>& landing);

  // Declaration order is teardown order reversed: regions go first, then the
  // engine (whose callback thread may still run OnVersionDone and so needs
  // everything declared above it).
  const InferenceAgentOptions options_;
  InferenceRank rank_;
  std::unique_ptr<WeightMemory> memory_;
  struct Inbox;
  std::map<std::string, std::unique_ptr<Inbox>> inboxes_;  // by weight region id; fixed after Create
  std::string no_inbox_;  // why a device region has no inbox, if one has none
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool planned_ = false;                         // guarded by mu_
  std::vector<IncomingWrite> writes_;            // the plan's; guarded by mu_
  uint32_t arrivals_ = 0;                        // guarded by mu_
  std::map<uint64_t, uint32_t> begun_;           // v -> expected; guarded by mu_
  std::map<uint64_t, VersionOutcome> finished_;  // guarded by mu_ (recent only)
  std::map<uint64_t, std::string> abandoned_;    // pending versions; guarded by mu_
  std::deque<VersionOutcome> outcomes_;          // guarded by mu_; not yet taken
  uint64_t landed_base_;                         // guarded by mu_; kNoVersion until a version lands
  std::unique_ptr<transport::Engine> engine_;
  std::vector<std::unique_ptr<transport::MemoryRegion>> regions_;
};

}  // namespace wsync::inference
