// `wsync secret PATH`: makes a job secret (64 random hex digits, mode 0600)
// for --secret-file / $WSYNC_SECRET_FILE (controller/auth.h).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "controller/auth.h"

namespace wsync::cli {

void AddSecretCommand(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "secret",
      "Write a new job secret to PATH (mode 0600; an existing file is never overwritten). Give the same file to "
      "the controller and every agent (--secret-file or $WSYNC_SECRET_FILE): they then sign every control "
      "request with it, and the controller refuses any request that is not signed with it.");
  cmd->add_option("path", *path, "file to create")->required();
  cmd->callback([path] {
    Status s = controller::WriteNewSecret(*path);
    if (!s.ok()) {
      std::fprintf(stderr, "wsync secret: error: %s\n", s.message().c_str());
      std::exit(1);
    }
    std::fprintf(stderr, "wsync secret: wrote %s (mode 0600)\n", path->c_str());
    std::exit(0);
  });
}

}  // namespace wsync::cli
