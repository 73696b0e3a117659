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
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "controller/client.h"
#include "pipeline/executor.h"
#include "pipeline/group.h"
#include "pipeline/shard_source.h"
#include "transport/engine.h"

namespace wsync::trainer_agent {

enum class VersionDecision { kRun, kSkip, kReplan };

// Starts `v` at the controller. kSkip (with `why`) when the version already
// failed there (e.g. this rank restarted mid-version: the peers have given it
// up, so running it would only wait for a collective timeout). An already
// complete version still runs: a rank with no writes can be late, and its
// peers may wait in its barriers. An unreachable controller is logged and the
// version runs anyway. On kSkip the caller drops the executor's collective
// groups (PlanExecutor::ResetGroups): every peer that ran `v` failed a
// collective with this rank and rebuilds its groups under the next
// version's generation; keeping its old ones, this rank would run the next
// version on broken groups while its peers wait for it in the new ones
// (seen under TSan: a rank slow to start version 2 found it already failed,
// then failed version 3 for everyone). kReplan when the controller serves a newer
// registration epoch than `epoch` (an inference rank registered again with
// new memory): fetch the plan slice again, rebuild the executor (it
// imports the new descriptors) and start again.
VersionDecision StartVersion(controller::ControllerClient& client, int32_t rank, uint64_t v, uint64_t epoch,
                             const std::function<void(const std::string&)>& log, Status* why);

// StartVersion at the current registration epoch: while the controller
// serves a newer one, `replan` (fetch the slice again, rebuild the executor,
// update `epoch`) and start again, three times at most. A failed `replan`
// ends it with kReplan and its error in `replan_error` (and `why`); kReplan
// with `replan_error` OK means the epoch moved on every try.
VersionDecision StartVersionAtCurrentEpoch(controller::ControllerClient& client, int32_t rank, uint64_t v,
                                           const uint64_t& epoch, const std::function<void(const std::string&)>& log,
                                           const std::function<Status()>& replan, Status* why, Status* replan_error);

// Makes a transport engine like the one the agent started with.
using EngineFactory = std::function<StatusOr<std::unique_ptr<transport::Engine>>()>;

// A new executor for `slice` (the plan of a new registration epoch, whose
// descriptors it imports): drops `executor` first (waiting for its writes
// still in flight) and, with `make_engine`, replaces `engine` with a new one
// (after writes that timed out: a provider can be left unable to complete
// any write; its stuck operations go with the old engine). Sets `epoch` and
// logs what it did. `me` names the rank in errors.
Status RebuildExecutor(controller::TrainerPlanSlice slice, GroupFactory* groups, const ExecutorOptions& options,
                       const EngineFactory* make_engine, const std::string& me,
                       const std::function<void(const std::string&)>& log, std::unique_ptr<transport::Engine>& engine,
                       std::unique_ptr<PlanExecutor>& executor, uint64_t& epoch);

// The executor's report as the controller keeps it (`stats` of trainer_done).
nlohmann::json VersionStats(const VersionReport& report);
// Its checksums as trainer_done sends them (`stats.checksums`, which the
// controller keeps apart): {"<inference rank>": {"<region>": [[offset,
// bytes, "<16 hex>"], ...]}} (docs/CONTROL_PLANE.md).
nlohmann::json ChecksumsJson(const std::vector<WriteChecksum>& checksums);

// Runs `v` on `executor` over `shards` and reports the outcome to the
// controller (a failed report is logged, not returned: the version's own
// result is what the caller acts on).
StatusOr<VersionReport> RunAndReport(PlanExecutor& executor, controller::ControllerClient& client, int32_t rank,
                                     uint64_t v, ShardSource& shards,
                                     const std::function<void(const std::string&)>& log);

}  // namespace wsync::trainer_agent
