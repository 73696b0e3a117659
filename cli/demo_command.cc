// `wsync demo`: README command one. Starts a whole deployment on this
// machine from real processes (controller, 4 trainer agents, 2 inference
// agents over libfabric on loopback), runs several updates with changing
// weights, and checks every inference byte after each against a reference
// computed without the pipeline.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "demo/local_sync.h"

namespace wsync::cli {
namespace {

struct DemoOptions {
  demo::LocalSyncOptions sync;
  int updates = 3;
  bool verify = true;
};

void PrintStages(const nlohmann::json& stats, uint64_t watermark) {
  if (!stats.is_object() || stats.empty()) return;
  // Slowest rank per stage: the update waits for it.
  const char* stages[] = {"copy", "unshard", "quantize_pack", "post", "watermark_wait", "wait_writes", "barrier",
                          "rendezvous"};
  std::printf("    stages (slowest trainer rank, s):");
  for (const char* stage : stages) {
    double worst = 0;
    for (const auto& [rank, s] : stats.items()) {
      if (s.contains("stages") && s["stages"].contains(stage)) worst = std::max(worst, s["stages"][stage].get<double>());
    }
    std::printf(" %s %.3f", stage, worst);
  }
  uint64_t peak = 0;
  for (const auto& [rank, s] : stats.items()) peak = std::max<uint64_t>(peak, s.value("peak_temp_bytes", 0));
  std::printf("\n    peak temporary memory %.1f MiB of a %.1f MiB watermark (max over trainer ranks)\n",
              peak / 1048576.0, watermark / 1048576.0);
  uint64_t wire = 0, whole = 0, deltas = 0, writes = 0, copies = 0;
  double find = 0;
  for (const auto& [rank, s] : stats.items()) {
    wire += s.value("written_bytes", uint64_t{0});
    whole += s.value("write_bytes", uint64_t{0});
    deltas += s.value("delta_writes", uint64_t{0});
    writes += s.value("writes", uint64_t{0});
    copies += s.value("delta_copy_bytes", uint64_t{0});
    if (s.contains("stages")) find = std::max(find, s["stages"].value("delta", 0.0));
  }
  if (copies > 0) {
    std::printf("    deltas: %llu of %llu writes; %.2f MiB on the wire for %.2f MiB of weights (%.1f%%); finding "
                "changes %.3f s (slowest rank); copies of what receivers hold %.1f MiB\n",
                static_cast<unsigned long long>(deltas), static_cast<unsigned long long>(writes), wire / 1048576.0,
                whole / 1048576.0, whole > 0 ? 100.0 * wire / whole : 0.0, find, copies / 1048576.0);
  }
}

int RunDemo(DemoOptions opt) {
  using Clock = std::chrono::steady_clock;
  // Line-buffered even into a pipe or a CI log: each phase shows when it happens.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const auto start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  std::printf("wsync demo: %s over libfabric %s, %d updates\n", opt.sync.cluster.c_str(), opt.sync.provider.c_str(),
              opt.updates);
  opt.sync.progress = [&](const std::string& what) { std::printf("[%5.1f s] %s\n", elapsed(), what.c_str()); };
  StatusOr<std::unique_ptr<demo::LocalSync>> sync = demo::LocalSync::Start(opt.sync);
  if (!sync.ok()) {
    std::fprintf(stderr, "wsync demo: error: %s\n", sync.status().message().c_str());
    return 1;
  }
  demo::LocalSync& s = **sync;
  std::printf("[%5.1f s] ready: %zu trainer ranks -> %zu inference ranks, %zu writes per update; logs in %s\n",
              elapsed(), s.specs().trainer.ranks.size(), s.specs().inference.ranks.size(),
              static_cast<size_t>(WriteCount(s.table().ops)),
              s.options().work_dir.c_str());
  std::printf("each update: new synthetic trainer weights (the demo's work), the update itself (wsync), %s\n",
              opt.verify ? "then every inference byte checked against an independent reference (the demo's work)"
                         : "no verification (--no-verify)");
  int failures = 0;
  double fill_total = 0, update_total = 0, verify_total = 0;
  for (int i = 1; i <= opt.updates; ++i) {
    StatusOr<demo::UpdateReport> r = s.Update(static_cast<uint64_t>(i));
    if (!r.ok()) {
      std::fprintf(stderr, "wsync demo: update %d: error: %s\n", i, r.status().message().c_str());
      return 1;
    }
    fill_total += r->fill_seconds;
    update_total += r->seconds;
    std::printf("update %llu: synthetic weights %.3f GB generated in %.2f s (%zu threads)\n",
                static_cast<unsigned long long>(r->version), r->fill_bytes / 1e9, r->fill_seconds,
                demo::DemoWorkers());
    std::printf("update %llu: %s, %.3f GB in %.3f s = %.3f GB/s\n", static_cast<unsigned long long>(r->version),
                r->state.c_str(), r->wire_bytes / 1e9, r->seconds, r->gbps);
    if (r->state != "complete") {
      std::printf("    failed: %s\n", r->failure.c_str());
      ++failures;
      continue;
    }
    PrintStages(r->trainer_stats, opt.sync.watermark);
    if (opt.verify) {
      Status v = s.Verify(r->version, &*r);
      verify_total += r->verify_seconds;
      if (!v.ok()) {
        std::printf("    verification FAILED after %.2f s: %s\n", r->verify_seconds, v.message().c_str());
        ++failures;
      } else {
        std::printf("    verified %llu tensors (%.3f GB) bit for bit against the independent reference in %.2f s\n",
                    static_cast<unsigned long long>(r->verified_tensors), r->verified_bytes / 1e9, r->verify_seconds);
      }
    }
  }
  std::printf("wsync demo: %d of %d updates complete%s in %.1f s; per update on average: weights %.2f s, "
              "update %.2f s, verification %.2f s\n",
              opt.updates - failures, opt.updates, opt.verify ? " and verified" : "", elapsed(),
              fill_total / std::max(opt.updates, 1), update_total / std::max(opt.updates, 1),
              verify_total / std::max(opt.updates, 1));
  return failures == 0 ? 0 : 1;
}

}  // namespace

void AddDemoCommand(CLI::App& app) {
  auto opt = std::make_shared<DemoOptions>();
  CLI::App* cmd = app.add_subcommand("demo", "local weight sync on loopback: real processes, real libfabric, verified");
  cmd->add_option("--cluster", opt->sync.cluster, "cluster spec of the model and layouts")->capture_default_str();
  cmd->add_option("--updates", opt->updates, "updates to run")->capture_default_str();
  cmd->add_option("--provider", opt->sync.provider, "libfabric provider: shm or tcp;ofi_rxm")->capture_default_str();
  cmd->add_option("--nics", opt->sync.nics, "endpoints per rank")->capture_default_str();
  cmd->add_option("--watermark", opt->sync.watermark, "temporary memory bound per trainer rank, bytes")
      ->capture_default_str();
  cmd->add_option("--job", opt->sync.job, "job name (shared-memory names)");
  cmd->add_option("--work-dir", opt->sync.work_dir, "logs and controller state");
  cmd->add_flag("!--no-verify", opt->verify, "skip the bit-for-bit check");
  cmd->add_option("--delta", opt->sync.full_every,
                  "delta versions: agents with --delta, the controller with --full-every K (every K-th update whole; "
                  "0: no deltas)")
      ->capture_default_str();
  cmd->add_option("--drift", opt->sync.drift,
                  "synthetic weights: about 1/P of the elements change per update (1: all, as by default)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--exchange,!--full-tensor", opt->sync.exchange,
                "unshard by the planned exchange (the default: each trainer rank receives only the rows it writes) "
                "or all-gather whole tensors (--full-tensor)");
  cmd->callback([opt] { std::exit(RunDemo(*opt)); });
}

}  // namespace wsync::cli
