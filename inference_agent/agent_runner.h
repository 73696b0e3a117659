// Drives an InferenceAgent against the controller (docs/CONTROL_PLANE.md):
// registers the rank's layout with its transport descriptors, waits for the
// plan, then until stopped: notices every version the trainers started
// (GET /v1/status), makes the agent expect it, and reports each outcome
// (POST /v1/versions/<v>/inference_done, ok or the failure's one line).
//
// Called by `wsync inference-agent` (agent_command.h) and tests. Runs on
// the caller's thread; the controller is only ever called from it, never
// from the transport's callback thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>

#include "common/status.h"
#include "controller/client.h"
#include "inference_agent/agent.h"
#include "inference_agent/pacer.h"

namespace wsync::inference {

struct AgentRunnerOptions {
  // Upper bound on how long one version may take on this rank; the
  // controller's own deadline for the version applies when it is sooner.
  std::chrono::milliseconds version_timeout{300000};
  // How long to wait for the rest of the world to register (0: until stopped).
  std::chrono::milliseconds plan_timeout{0};
  // Started versions are learned by a long poll of the controller's status
  // (answered as soon as a version starts or finishes). This is the pause
  // after a failed poll, the poll interval against a controller without the
  // long poll, and how long the reporter waits between looks at `stop`.
  std::chrono::milliseconds poll_interval{100};
  // A version whose writes all landed on a holding agent
  // (InferenceAgentOptions::hold) is checked against the trainers'
  // checksums (GET /v1/versions/<v>/checksums, once every trainer reported)
  // before it is marked complete and reported done; a mismatch fails it,
  // naming the tensor. Without this a held version is committed unchecked.
  bool verify_checksums = false;
  std::function<void(const std::string&)> log;
  // Called once registration succeeded (the CLI prints "ready").
  std::function<void()> on_registered;
  // Engine-paced (the rank registered with pacing live or shadow): live, a
  // version is armed only once the controller let it in, and one that
  // failed before that touched nothing here; shadow, a landed version is
  // reported done and handed to the pacer, which the engine's update()
  // copies out (instead of copying it out once it landed everywhere).
  Pacer* pacer = nullptr;
};

// Returns OK when `stop` became true, or the first error that ends the
// agent (registration refused, plan not for this layout, no plan in time).
// A controller that is briefly unreachable after the plan is only logged.
Status RunInferenceAgent(InferenceAgent& agent, controller::ControllerClient& client,
                         const AgentRunnerOptions& options, const std::atomic<bool>& stop);

}  // namespace wsync::inference
