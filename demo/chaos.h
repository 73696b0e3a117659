// The chaos run (issue 10): updates in a row on the local deployment while a
// random trainer agent, inference agent or the controller is killed
// (SIGKILL) at a random moment of an update and restarted. After every
// fault it checks what a user relies on:
//   - a version the controller calls complete holds the reference's bytes
//     on every inference rank (else: silently_wrong);
//   - a version that did not complete is reported failed (or, after the
//     controller itself was killed, unknown to it), and no engine's version
//     word claims it unless its bytes are right (else: silently_wrong);
//   - no version stays unfinished past its deadline (else: hangs);
//   - the next update after each fault completes and verifies (recovered).
// Used by `wsync chaos` (scripts/chaos.sh).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "demo/local_sync.h"

namespace wsync::demo {

struct ChaosOptions {
  LocalSyncOptions sync;
  int faults = 200;
  uint64_t seed = 1;
  // Faults stop after this long (0: no bound); what ran is reported.
  double max_seconds = 0;
  std::function<void(const std::string&)> log;
};

struct ChaosResult {
  uint64_t attempted = 0;        // versions published
  uint64_t completed = 0;        // complete at the controller and verified
  uint64_t failed_reported = 0;  // failed (or unknown to a restarted controller), and no engine claims it wrongly
  uint64_t silently_wrong = 0;   // called complete (controller or an engine) with wrong bytes
  uint64_t hangs = 0;            // unfinished past the deadline, or a process that never came back
  uint64_t faults = 0;           // processes killed
  uint64_t not_recovered = 0;    // faults after which the next update did not complete and verify
  nlohmann::json by_kind = nlohmann::json::object();  // kind -> faults
  double seconds = 0;

  nlohmann::json ToJson() const;
};

StatusOr<ChaosResult> RunChaos(const ChaosOptions& options);

}  // namespace wsync::demo
