// Subcommand registration for the `wsync` binary. Each subcommand lives in
// its own cli/<name>_command.cc and adds itself to the app (or to `bench`).
#pragma once

#include <CLI/CLI.hpp>

#include "cli/plan_inputs.h"
#include "routing/plan_summary.h"

namespace wsync::cli {

void AddPlanCommand(CLI::App& app);
void AddDemoCommand(CLI::App& app);               // cli/demo_command.cc
void AddChaosCommand(CLI::App& app);              // cli/chaos_command.cc
void AddControllerCommand(CLI::App& app);          // cli/controller_command.cc
void AddSecretCommand(CLI::App& app);              // cli/secret_command.cc
void AddTrainerAgentCommand(CLI::App& app);        // cli/trainer_agent_command.cc
void AddInferenceAgentCommand(CLI::App& app);      // cli/inference_agent_command.cc
void AddDoctorCommand(CLI::App& app);              // cli/doctor_command.cc
// Options shared by `plan` and `bench plan` (cli/plan_command.cc).
void AddPlanSourceOptions(CLI::App& cmd, PlanSource* src);
void AddLinkModelOptions(CLI::App& cmd, LinkModel* link);

// `wsync bench <what>`: benchmarks that print ours vs the limit in one run.
void AddBenchCommand(CLI::App& app);
void AddBenchPlan(CLI::App& bench);       // cli/bench_plan.cc
void AddBenchTransport(CLI::App& bench);  // cli/bench_transport.cc
void AddBenchCluster(CLI::App& bench);    // cli/bench_cluster.cc
void AddBenchController(CLI::App& bench); // cli/bench_controller.cc
void AddBenchSigning(CLI::App& bench);    // cli/bench_signing.cc

}  // namespace wsync::cli
