// `wsync plan`: load specs, validate, plan, print a summary; optionally write
// the full routing table and a traffic heatmap. Writes nothing on error.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli/commands.h"
#include "cli/plan_inputs.h"
#include "routing/plan_io.h"
#include "routing/plan_summary.h"
#include "routing/rank_plan.h"
#include "routing/planner.h"
#include "routing/spec_io.h"

namespace wsync::cli {
namespace {

struct PlanCommandOptions {
  PlanSource source;
  std::string format = "text";
  std::string out;
  std::string heatmap;
  std::string write_specs;
  bool quiet = false;
  bool exchange = true;  // the planned exchange instead of full_tensor (PlanOptions::exchange)
  uint64_t min_shard_piece_bytes = PlanOptions{}.min_shard_piece_bytes;
  LinkModel link;
};

// Writes `text` to `path` through a temporary file and a rename, so a reader
// never sees a half-written file.
Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return Internal("cannot open '" + tmp + "' for writing");
    f << text;
    if (!f.flush()) return Internal("cannot write '" + tmp + "'");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Internal("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
  return Status::Ok();
}

int RunPlan(const PlanCommandOptions& opt) {
  const Progress progress(opt.quiet);
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "wsync plan: error: %s\n", s.message().c_str());
    return 1;
  };
  StatusOr<PlanInputs> inputs = LoadPlanInputs(opt.source, progress);
  if (!inputs.ok()) return fail(inputs.status());

  inputs->options.exchange = opt.exchange;
  inputs->options.min_shard_piece_bytes = opt.min_shard_piece_bytes;
  StatusOr<RoutingTable> table = Plan(inputs->trainer, inputs->inference, inputs->mapping, inputs->options);
  if (!table.ok()) return fail(table.status());
  progress.Step("planned " + std::to_string(WriteCount(table->ops)) + " writes (" + std::to_string(table->ops.size()) +
                " ops)");

  // The unshard term from the rank plans the executor would run; a plan the
  // pipeline refuses is still summarized (as full_tensor), and said so.
  StatusOr<PlanSummary> from_rank_plans =
      SummarizeFromRankPlans(*table, inputs->trainer, inputs->inference, opt.link, /*writes=*/true);
  if (from_rank_plans.ok()) {
    progress.Step("modeled the unshard from " + std::to_string(inputs->trainer.ranks.size()) + " trainer rank plans");
  } else {
    std::fprintf(stderr, "wsync plan: warning: the pipeline would refuse this plan: %s\n",
                 from_rank_plans.status().message().c_str());
  }
  const PlanSummary summary =
      from_rank_plans.ok() ? std::move(from_rank_plans).value() : Summarize(*table, opt.link, nullptr);
  // Render everything before writing anything: nothing is half-written.
  std::string plan_text, svg_text;
  if (!opt.out.empty()) plan_text = PlanToText(*table) + "\n";
  if (!opt.heatmap.empty()) svg_text = RenderTrafficHeatmapSvg(*table);
  if (!opt.write_specs.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(opt.write_specs, ec);
    if (ec) return fail(Internal("cannot create '" + opt.write_specs + "': " + ec.message()));
    const std::pair<std::string, nlohmann::json> specs[] = {{"trainer.json", ToJson(inputs->trainer)},
                                                            {"inference.json", ToJson(inputs->inference)},
                                                            {"mapping.json", ToJson(inputs->mapping)}};
    for (const auto& [name, doc] : specs) {
      if (Status s = WriteFileAtomically(opt.write_specs + "/" + name, doc.dump(1) + "\n"); !s.ok()) return fail(s);
    }
    progress.Step("wrote trainer.json, inference.json, mapping.json to " + opt.write_specs);
  }
  if (!opt.out.empty()) {
    if (Status s = WriteFileAtomically(opt.out, plan_text); !s.ok()) return fail(s);
    progress.Step("wrote routing table to " + opt.out);
  }
  if (!opt.heatmap.empty()) {
    if (Status s = WriteFileAtomically(opt.heatmap, svg_text); !s.ok()) return fail(s);
    progress.Step("wrote heatmap to " + opt.heatmap);
  }
  if (opt.format == "json") {
    std::cout << FormatSummaryJson(summary) << "\n";
  } else {
    std::cout << "source: " << inputs->description << "\n" << FormatSummaryText(summary);
  }
  return 0;
}

}  // namespace

void AddLinkModelOptions(CLI::App& cmd, LinkModel* link) {
  cmd.add_option("--nic-gbps", link->nic_gbps, "NIC line rate per direction, Gbit/s")->capture_default_str();
  cmd.add_option("--nic-efficiency", link->nic_efficiency, "fraction of line rate large writes reach")
      ->capture_default_str();
  cmd.add_option("--per-write-us", link->per_write_us, "sender cost to post one write, us")->capture_default_str();
  cmd.add_option("--nvlink-gbps", link->nvlink_gbps, "NVLink bandwidth per GPU and direction, Gbit/s")
      ->capture_default_str();
  cmd.add_option("--allgather-call-us", link->allgather_call_us, "fixed cost per full_tensor call, us")
      ->capture_default_str();
  cmd.add_option("--barrier-us", link->barrier_us, "cost of one MeshGroup barrier, us")->capture_default_str();
  cmd.add_option("--delta-fraction", link->delta_fraction,
                 "also predict a delta version that puts this fraction of the written bytes on the wire "
                 "(docs/DELTAS.md measures 0.03 for an fp8 engine at lr 1e-6, 0.13 at 1e-5; 0: whole only)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd.add_option("--delta-find-gbps", link->delta_find_gbps,
                 "with --delta-fraction: GB/s of written bytes one trainer rank finds changes in")
      ->capture_default_str();
  cmd.add_option("--delta-apply-gbps", link->delta_apply_gbps,
                 "with --delta-fraction: GB/s of weights one inference rank applies deltas to at commit")
      ->capture_default_str();
  cmd.add_option("--pack-gbps", link->pack_gbps,
                 "with --delta-fraction: GB/s of written bytes one trainer rank copies, quantizes and packs "
                 "(0: free, as on a GPU)")
      ->capture_default_str();
}

void AddPlanSourceOptions(CLI::App& cmd, PlanSource* src) {
  cmd.add_option("dir", src->dir, "example folder (cluster.json, or trainer/inference/mapping.json)");
  cmd.add_option("--trainer", src->trainer, "wsync.trainer/v1 spec file");
  cmd.add_option("--inference", src->inference, "wsync.inference/v1 spec file");
  cmd.add_option("--mapping", src->mapping, "wsync.mapping/v1 rules file");
  cmd.add_option("--cluster", src->cluster, "wsync.cluster/v1 file (model config + layouts)");
}

void AddPlanCommand(CLI::App& app) {
  auto opt = std::make_shared<PlanCommandOptions>();
  CLI::App* cmd = app.add_subcommand("plan", "dry-run a routing plan: validate specs, plan, summarize");
  AddPlanSourceOptions(*cmd, &opt->source);
  cmd->add_option("--format", opt->format, "summary format")->check(CLI::IsMember({"text", "json"}));
  cmd->add_flag("--exchange,!--full-tensor", opt->exchange,
                "plan the exchange (the default: each rank receives only the rows it writes) or full_tensor "
                "(--full-tensor: every rank all-gathers whole tensors)");
  cmd->add_option("--min-shard-piece", opt->min_shard_piece_bytes,
                  "with --exchange: cut a piece at trainer shard edges only where each part keeps this many bytes")
      ->capture_default_str();
  cmd->add_option("--out", opt->out, "write the full routing table (wsync.plan/v1 JSON) here");
  cmd->add_option("--heatmap", opt->heatmap, "write the sender x receiver traffic matrix as SVG here");
  cmd->add_option("--write-specs", opt->write_specs,
                  "write the (generated) trainer.json, inference.json and mapping.json into this folder");
  cmd->add_flag("-q,--quiet", opt->quiet, "no progress lines on stderr");
  AddLinkModelOptions(*cmd, &opt->link);
  cmd->callback([opt] { std::exit(RunPlan(*opt)); });
}

}  // namespace wsync::cli
