// Drives one trainer rank's PlanExecutor against the controller
// (docs/CONTROL_PLANE.md) and the trainer's shard export:
//   register the rank's shard metadata -> fetch its TrainerRankPlan ->
//   open the trainer's shared memory -> until stopped: wait for the trainer
//   to publish a new version, start it at the controller, run the executor,
//   report trainer_done (ok, or the failure's one line).
// A failed version is also marked failed in the shard export, which releases
// the trainer (it may modify its weights; the version will never complete).
//
// With TrainerAgentOptions::cuda_ipc the shards are the trainer's CUDA
// memory (cuda_shards.h): the pipeline runs on that GPU (a torch-free CUDA
// DeviceOps, pipeline/cuda_device.h), the engine is made for it once the
// shards are open, and the all-gathers go through host memory
// (pipeline/staged_group.h).
//
// Called by `wsync trainer-agent` (agent_command.h) and tests. Runs on the
// caller's thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "controller/client.h"
#include "pipeline/collectives.h"
#include "pipeline/executor.h"
#include "routing/metadata.h"
#include "trainer_agent/version_step.h"
#include "transport/engine.h"

namespace wsync::trainer_agent {

struct TrainerAgentOptions {
  // Watermark and timeouts. rendezvous_prefix is extended with the plan id,
  // so a new plan (or a restarted controller) never meets stale addresses.
  ExecutorOptions executor;
  // The Gloo groups' address and timeout; they meet through the
  // controller's KV store.
  GlooGroupOptions gloo;
  // How long to wait for the rest of the world to register (0: until stopped).
  std::chrono::milliseconds plan_timeout{0};
  // How long to wait for the trainer to create its shard export (0: until
  // stopped): the sidecar may start first.
  std::chrono::milliseconds shm_timeout{0};
  std::function<void(const std::string&)> log;
  // Called once registration succeeded (the CLI prints "ready").
  std::function<void()> on_registered;
  // Called after every version this rank finished (ok or not), with its
  // report when ok (tests, metrics).
  std::function<void(uint64_t version, const StatusOr<VersionReport>& result)> on_version;
  // Makes a new engine like the first. After a version whose writes timed
  // out the agent replaces its engine with one (a provider can be left
  // unable to complete any write after a peer died with writes outstanding);
  // without it the agent keeps the engine it has.
  EngineFactory make_engine;

  // The GPU route: the wsync.cuda_ipc/v1 file of the trainer's shards (""
  // for shards in shared memory), and how to make the engine for the GPU
  // they are on, given its ordinal here. `engine` is then made by the agent
  // (pass an empty one); make_engine is derived from this.
  std::string cuda_ipc;
  struct DeviceEngine {
    std::unique_ptr<transport::Engine> engine;
    bool stage_through_host = false;  // the engine cannot register CUDA memory
    std::string why_staged;
  };
  std::function<StatusOr<DeviceEngine>(int ordinal)> make_device_engine;
};

// Returns OK when `stop` became true, or the first error that ends the
// agent (registration refused, no plan in time, a plan this rank cannot run,
// a shard export that does not match the rank's metadata).
Status RunTrainerAgent(const TrainerRank& rank, const std::vector<MeshGroupSpec>& mesh_groups,
                       const std::string& shm_name, std::unique_ptr<transport::Engine>& engine,
                       controller::ControllerClient& client, const TrainerAgentOptions& options,
                       const std::atomic<bool>& stop);

}  // namespace wsync::trainer_agent
