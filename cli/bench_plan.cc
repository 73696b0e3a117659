// `wsync bench plan`: time and peak memory of loading, validating and
// planning a case (default: the reference Kimi-K2 256 -> 128) and of the
// summary's model (what `wsync plan` runs), against the planner's targets
// (2 s, 2 GiB on a 2-core machine), and the predicted update time against
// the reference's measured 1.2-1.3 s.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "routing/planner.h"
#include "routing/rank_plan.h"

namespace wsync::cli {
namespace {

constexpr double kTargetSeconds = 2.0;
constexpr double kTargetBytes = 2.0 * 1024 * 1024 * 1024;
constexpr double kReferenceUpdateLow = 1.2, kReferenceUpdateHigh = 1.3;  // arXiv 2510.27656

struct BenchPlanOptions {
  PlanSource source;
  int repeat = 3;
  std::string format = "text";
  LinkModel link;
};

double PeakRssBytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) * 1024.0;  // Linux reports KiB
}

int RunBenchPlan(const BenchPlanOptions& opt) {
  PlanSource source = opt.source;
  if (source.dir.empty() && source.cluster.empty() && source.trainer.empty()) {
    source.dir = "examples/kimi-k2-256x128";
  }
  const double rss_before = PeakRssBytes();
  std::vector<double> seconds;
  PlanSummary summary;
  size_t ops = 0, writes = 0;  // strided ops once; their planes
  std::string description;
  std::vector<std::vector<std::pair<std::string, double>>> stages;  // per run
  for (int i = 0; i < std::max(1, opt.repeat); ++i) {
    const Progress timer(/*quiet=*/true);
    stages.emplace_back();
    StatusOr<PlanInputs> inputs = LoadPlanInputs(source, timer);
    if (!inputs.ok()) {
      std::fprintf(stderr, "wsync bench plan: error: %s\n", inputs.status().message().c_str());
      return 1;
    }
    stages.back().emplace_back("load", timer.Elapsed());
    inputs->options.stage_seconds = &stages.back();
    StatusOr<RoutingTable> table = Plan(inputs->trainer, inputs->inference, inputs->mapping, inputs->options);
    if (!table.ok()) {
      std::fprintf(stderr, "wsync bench plan: error: %s\n", table.status().message().c_str());
      return 1;
    }
    // The summary's model, as `wsync plan` runs it: every rank plan the
    // executor would run, with its writes.
    const double planned = timer.Elapsed();
    StatusOr<PlanSummary> modeled =
        SummarizeFromRankPlans(*table, inputs->trainer, inputs->inference, opt.link, /*writes=*/true);
    if (!modeled.ok()) {
      std::fprintf(stderr, "wsync bench plan: error: %s\n", modeled.status().message().c_str());
      return 1;
    }
    seconds.push_back(timer.Elapsed());
    stages.back().emplace_back("summary", seconds.back() - planned);
    if (i == 0) {
      summary = *std::move(modeled);
      ops = table->ops.size();
      writes = WriteCount(table->ops);
      description = inputs->description;
    }
  }
  const double peak = PeakRssBytes();
  // The stages of the median run.
  std::vector<size_t> by_time(seconds.size());
  for (size_t i = 0; i < by_time.size(); ++i) by_time[i] = i;
  std::sort(by_time.begin(), by_time.end(), [&](size_t a, size_t b) { return seconds[a] < seconds[b]; });
  const std::vector<std::pair<std::string, double>>& median_stages = stages[by_time[by_time.size() / 2]];
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];

  if (opt.format == "json") {
    nlohmann::json j = {{"case", description},
                        {"plan_seconds_median", median},
                        {"plan_seconds_min", seconds.front()},
                        {"repeat", seconds.size()},
                        {"target_seconds", kTargetSeconds},
                        {"peak_rss_bytes", peak},
                        {"stage_seconds", median_stages},
                        {"rss_before_bytes", rss_before},
                        {"target_bytes", kTargetBytes},
                        {"writes", writes},
                        {"ops", ops},
                        {"predicted_update_seconds", summary.predicted_seconds},
                        {"exchange_bytes", summary.exchange_bytes},
                        {"full_tensor_bytes", summary.full_tensor_bytes},
                        {"reference_update_seconds", {kReferenceUpdateLow, kReferenceUpdateHigh}}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("bench plan: %s (load + validate + plan + the summary's model, %zu runs)\n", description.c_str(),
              seconds.size());
  std::printf("  time        median %.3f s, min %.3f s   target %.1f s   ratio %.2f\n", median,
              seconds.front(), kTargetSeconds, median / kTargetSeconds);
  std::printf("  stages      ");
  for (const auto& [name, s] : median_stages) std::printf("%s %.3f  ", name.c_str(), s);
  std::printf("(s, the median run)\n");
  std::printf("  peak memory %.0f MiB (process peak RSS; %.0f MiB before loading)   target %.0f MiB   ratio %.2f\n",
              peak / (1 << 20), rss_before / (1 << 20), kTargetBytes / (1 << 20), peak / kTargetBytes);
  std::printf("  plan        %zu writes in %zu ops, %.2f TB on the wire, busiest sender NIC %.2f GB\n", writes, ops,
              summary.wire_bytes / 1e12, summary.sender_nic_bytes.max / 1e9);
  std::printf("  predicted update %.3f s   reference measured %.1f-%.1f s   ratio %.2f-%.2f\n",
              summary.predicted_seconds, kReferenceUpdateLow, kReferenceUpdateHigh,
              summary.predicted_seconds / kReferenceUpdateHigh, summary.predicted_seconds / kReferenceUpdateLow);
  std::printf("    (sender path %.3f s, busiest receiver NIC %.3f s, bytes-over-busiest-NIC limit %.3f s; "
              "link model: `wsync plan --help`)\n",
              summary.sender_bound_seconds, summary.receive_bound_seconds, summary.wire_limit_seconds);
  return 0;
}

}  // namespace

void AddBenchPlan(CLI::App& bench) {
  auto opt = std::make_shared<BenchPlanOptions>();
  CLI::App* cmd = bench.add_subcommand("plan", "time and peak memory of planning a case (default Kimi-K2 256->128)");
  AddPlanSourceOptions(*cmd, &opt->source);
  cmd->add_option("--repeat", opt->repeat, "runs to take the median of")->capture_default_str();
  cmd->add_option("--format", opt->format, "output format")->check(CLI::IsMember({"text", "json"}));
  AddLinkModelOptions(*cmd, &opt->link);
  cmd->callback([opt] { std::exit(RunBenchPlan(*opt)); });
}

}  // namespace wsync::cli
