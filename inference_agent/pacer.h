// Pacer: engine-paced updates for one inference rank (routing's Pacing
// kLive / kShadow; docs/PYTHON.md, "Engine-paced updates"). The engine calls
// Update() between batches; outside it, its weights never change.
//
//   live:   trainers write into the engine's weights, but only versions the
//           rank's gate at the controller lets in; Update() opens the gate up
//           to one version, waits until every write of it landed here (or it
//           failed), and leaves the gate there, so nothing newer gets in
//           until the next Update(). A push waits at the controller meanwhile.
//   shadow: the gate stays open and writes land in the shadow whenever
//           trainers push; the runner tells the Pacer (OnLanded) once a
//           version is all there. Update() closes the gate (no version starts
//           writing into the shadow while it is copied out), copies the
//           newest version complete at the controller out into the engine's
//           weights, and opens the gate again. While a newer version is
//           still writing into the shadow, Update() with no version returns
//           at once (the engine keeps what it has; a later call takes the
//           new one), and Update(v) waits for it.
//
// Threads: Update() on the engine's thread (one call at a time), OnLanded on
// the runner's reporter thread. The controller is called from Update() only.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "common/status.h"
#include "controller/client.h"
#include "inference_agent/agent.h"
#include "routing/metadata.h"

namespace wsync::inference {

struct UpdateReport {
  uint64_t version = 0;      // what the weights hold now
  uint64_t previous = 0;     // what they held before the call
  double seconds = 0;        // the whole call: the engine's pause
  double wait_seconds = 0;   // live: until the version was let in and landed; shadow: for one still writing
  double copy_seconds = 0;   // shadow: copying it out of the shadow
};

class Pacer {
 public:
  // `pacing` is kLive or kShadow; `agent` must be in shadow mode for kShadow.
  Pacer(InferenceAgent& agent, controller::ControllerClient& client, Pacing pacing);
  Pacing pacing() const { return pacing_; }

  // Brings the weights to `version` (none: the newest version trainers have
  // pushed (live) or that has landed everywhere (shadow)) and returns what
  // they hold, or the version's failure (Aborted, with the controller's
  // cause and what the weights hold), or DeadlineExceeded when no such
  // version came by `deadline`. A live version already let in when the
  // deadline passes is waited for to its end: its writes are in flight.
  StatusOr<UpdateReport> Update(std::optional<uint64_t> version, Clock::time_point deadline);

  // Shadow: every write of `v` landed here, was checked and reported done.
  void OnLanded(uint64_t v);
  // The runner stopped, with `why` (OK: it was asked to): Update() returns
  // at once, saying why.
  void Stop(const Status& why);

 private:
  StatusOr<UpdateReport> UpdateLive(std::optional<uint64_t> version, Clock::time_point deadline);
  StatusOr<UpdateReport> UpdateShadow(std::optional<uint64_t> version, Clock::time_point deadline);
  // Until v has an outcome here or failed at the controller: OK once every
  // write of it landed and it is complete here.
  Status WaitLive(uint64_t v, Clock::time_point deadline, bool* timed_out);
  // Until the controller finished v (the controller ends it by its deadline)
  // or the runner stopped.
  StatusOr<controller::VersionStatus> WaitFinished(uint64_t v);
  // The controller's failure of v, as one line.
  std::string FailureOf(const controller::VersionStatus& v) const;
  uint64_t complete() const;  // the weights' version (0: none)
  std::string me() const { return "inference rank " + std::to_string(agent_.rank().rank); }
  // Why the world has no plan yet, as the controller says it: "; ...".
  std::string WhyUnplanned();
  // Update()'s answer once the runner stopped: `what` and why it stopped.
  Status StoppedLocked(const std::string& what) const;

  InferenceAgent& agent_;
  controller::ControllerClient& client_;
  const Pacing pacing_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t landed_ = 0;   // shadow: the newest version all in the shadow; guarded by mu_
  bool stopped_ = false;  // guarded by mu_
  Status why_stopped_;     // guarded by mu_
};

}  // namespace wsync::inference
