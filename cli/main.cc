// wsync: the command-line entry point. Each subcommand lives in its own
// file (cli/<name>_command.cc) and registers itself in cli/commands.h.
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "transport/libfabric/foreign_signals.h"

int main(int argc, char** argv) {
  // Before anything else: Debian's libfabric took SIGINT and SIGTERM at load
  // (transport/libfabric/foreign_signals.h); a stopped agent must just stop.
  wsync::transport::fabric::ReleaseSignalsFromInfinipath();
  CLI::App app{"wsync: RDMA weight synchronization for RL post-training"};
  app.require_subcommand(1);
  wsync::cli::AddDemoCommand(app);
  wsync::cli::AddChaosCommand(app);
  wsync::cli::AddPlanCommand(app);
  wsync::cli::AddControllerCommand(app);
  wsync::cli::AddSecretCommand(app);
  wsync::cli::AddTrainerAgentCommand(app);
  wsync::cli::AddInferenceAgentCommand(app);
  wsync::cli::AddDoctorCommand(app);
  wsync::cli::AddBenchCommand(app);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
