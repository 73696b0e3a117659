// `wsync chaos`: the chaos run of demo/chaos.h on the local deployment
// (scripts/chaos.sh). One line per fault; the last line is a JSON object
// with attempted, completed, failed_reported, silently_wrong, hangs (and
// faults, not_recovered, by_kind, seconds). Exit status 0 only when
// silently_wrong, hangs and not_recovered are all 0 (--allow-unrecovered:
// silently_wrong and hangs).
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "demo/chaos.h"

namespace wsync::cli {
namespace {

int RunChaosCommand(demo::ChaosOptions o, bool allow_unrecovered) {
  std::printf("wsync chaos: %d faults (seed %llu) on %s: each kills a random trainer agent, inference agent or the "
              "controller during an update, restarts it, and checks what landed\n",
              o.faults, static_cast<unsigned long long>(o.seed), o.sync.cluster.c_str());
  std::fflush(stdout);
  o.log = [](const std::string& line) {
    std::printf("  %s\n", line.c_str());
    std::fflush(stdout);
  };
  StatusOr<demo::ChaosResult> r = demo::RunChaos(o);
  if (!r.ok()) {
    std::fprintf(stderr, "wsync chaos: error: %s\n", r.status().message().c_str());
    return 1;
  }
  std::printf("%s\n", r->ToJson().dump().c_str());
  return r->silently_wrong == 0 && r->hangs == 0 && (allow_unrecovered || r->not_recovered == 0) ? 0 : 1;
}

}  // namespace

void AddChaosCommand(CLI::App& app) {
  auto o = std::make_shared<demo::ChaosOptions>();
  o->sync.cluster = "examples/small-moe-fp8-4x2/cluster.json";
  o->sync.version_timeout_s = 60;
  o->sync.gloo_timeout_s = 20;  // a dead peer shows at once ("lost a peer"); this bounds a silent one
  o->sync.heartbeat_timeout_s = 3;
  auto allow_unrecovered = std::make_shared<bool>(false);
  auto shadow = std::make_shared<bool>(false);
  auto checksums = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("chaos", "kill and restart agents and the controller during updates; check "
                                              "that nothing is silently wrong and nothing hangs");
  cmd->add_option("--faults", o->faults, "processes to kill, one per update")->capture_default_str();
  cmd->add_option("--seed", o->seed, "random seed (which process, when)")->capture_default_str();
  cmd->add_option("--max-seconds", o->max_seconds, "stop starting faults after this long (0: no bound)")
      ->capture_default_str();
  cmd->add_option("--cluster", o->sync.cluster, "cluster spec of the model and layouts")->capture_default_str();
  cmd->add_option("--provider", o->sync.provider, "libfabric provider: shm or tcp;ofi_rxm")->capture_default_str();
  cmd->add_option("--version-timeout", o->sync.version_timeout_s, "controller: seconds before a version fails")
      ->capture_default_str();
  cmd->add_option("--gloo-timeout", o->sync.gloo_timeout_s, "trainer agents: seconds a collective may wait")
      ->capture_default_str();
  cmd->add_option("--job", o->sync.job, "job name (shared-memory names)");
  cmd->add_option("--work-dir", o->sync.work_dir, "logs and controller state");
  cmd->add_flag("--allow-unrecovered", *allow_unrecovered,
                "exit 0 even if an update after a fault did not complete (still never if silently wrong or hung)");
  cmd->add_flag("--shadow", *shadow, "inference agents in shadow mode (--shadow)");
  cmd->add_flag("--checksums", *checksums,
                "trainers send checksums, inference agents check them before a version is complete");
  cmd->callback([o, allow_unrecovered, shadow, checksums] {
    if (*shadow) o->sync.extra_inference_args.push_back("--shadow");
    if (*checksums) {
      o->sync.extra_trainer_args.push_back("--checksums");
      o->sync.extra_inference_args.push_back("--verify-checksums");
    }
    std::exit(RunChaosCommand(*o, *allow_unrecovered));
  });
}

}  // namespace wsync::cli
