// Subcommand registration for the `wsync` binary. Each subcommand lives in
// its own cli/<name>_command.cc and adds itself to the app (or to `bench`).
#pragma once

#include <CLI/CLI.hpp>

namespace wsync::cli {

void AddPlanCommand(CLI::App& app);

// `wsync bench <what>`: benchmarks that print ours vs the limit in one run.
void AddBenchCommand(CLI::App& app);
void AddBenchPlan(CLI::App& bench);       // cli/bench_plan.cc

}  // namespace wsync::cli
