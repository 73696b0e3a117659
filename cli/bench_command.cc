// `wsync bench`: the parent of every benchmark subcommand. Each benchmark
// prints our figure beside its limit (the reference tool, the link, the copy
// bandwidth) and the ratio, all measured in one run.
#include "cli/commands.h"

namespace wsync::cli {

void AddBenchCommand(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "benchmarks: our figure beside its limit, in one run");
  bench->require_subcommand(1);
  AddBenchPlan(*bench);
  AddBenchTransport(*bench);
  AddBenchCluster(*bench);
  AddBenchController(*bench);
  AddBenchSigning(*bench);
}

}  // namespace wsync::cli
