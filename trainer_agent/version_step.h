// One version of one trainer rank, as both trainer routes run it: start it
// at the controller, run the executor, report trainer_done (ok with the
// report's stage times, or the failure's one line).
//
// Called by the sidecar's loop (agent_runner.cc) and by the in-process
// Python binding (python/src/trainer_binding.cc), so the two routes cannot
// drift apart in what they tell the controller.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "controller/client.h"
#include "pipeline/executor.h"
#include "pipeline/shard_source.h"

namespace wsync::trainer_agent {

enum class VersionDecision { kRun, kSkip };

// Starts `v` at the controller. kSkip (with `why`) when the version already
// failed there (e.g. this rank restarted mid-version: the peers have given it
// up, so running it would only wait for a collective timeout). An already
// complete version still runs: a rank with no writes can be late, and its
// peers may wait in its barriers. An unreachable controller is logged and the
// version runs anyway.
// On kSkip the executor's collective groups are dropped: every peer that ran
// `v` failed a collective with this rank (it never joined one) and rebuilds
// its groups under the next version's generation, so this rank must too.
// Keeping them, it would run the next version on the old, broken groups
// while its peers wait for it in the new ones' rendezvous, failing that
// version as well (seen under TSan: a rank slow to start version 2 found it
// already failed, then failed version 3 for everyone).
VersionDecision StartVersion(controller::ControllerClient& client, PlanExecutor& executor, int32_t rank,
                             uint64_t v, const std::function<void(const std::string&)>& log, Status* why);

// The executor's report as the controller keeps it (`stats` of trainer_done).
nlohmann::json VersionStats(const VersionReport& report);

// Runs `v` on `executor` over `shards` and reports the outcome to the
// controller (a failed report is logged, not returned: the version's own
// result is what the caller acts on).
StatusOr<VersionReport> RunAndReport(PlanExecutor& executor, controller::ControllerClient& client, int32_t rank,
                                     uint64_t v, ShardSource& shards,
                                     const std::function<void(const std::string&)>& log);

}  // namespace wsync::trainer_agent
