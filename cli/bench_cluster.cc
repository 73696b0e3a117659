// `wsync bench cluster`: one update on an emulated cluster (each host its own
// network namespace, its link capped with tc tbf both ways) by wsync and by
// the rank-0 baseline frameworks use today, in one run, against the
// bytes-over-links limit. Needs root and iproute2 (demo/netns_cluster.h).
//
// Also `wsync bench rank0-peer` (hidden): one process of that baseline.
#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "demo/link_limit.h"
#include "demo/local_sync.h"
#include "demo/netns_cluster.h"
#include "demo/rank0_baseline.h"
#include "models/generate.h"
#include "routing/plan_summary.h"
#include "routing/rank_plan.h"

namespace wsync::cli {
namespace {

constexpr double kTargetLimitRatio = 1.10;  // issue 11: wsync within 10% of the link limit
constexpr double kTargetPredicted = 0.15;   // issue 11: predicted within 15% of measured

// The predictor's link model for the emulated hosts: one veth per host at
// the cap, TCP/IP headers over a 1500-byte MTU (1448 payload bytes of 1514
// on the wire), and inside a host TCP over loopback on cores the agents
// share (an assumption, not measured here; it matters only for full_tensor,
// whose all-gathers stay mostly inside a host).
LinkModel EmulatedLinks(double rate_gbit) {
  LinkModel m;
  m.nic_gbps = rate_gbit;
  m.nic_efficiency = 1448.0 / 1514.0;
  m.one_link_per_host = true;
  m.nvlink_gbps = 8.0;
  m.per_write_us = 5.0;
  m.allgather_call_us = 300.0;
  m.barrier_us = 1000.0;
  return m;
}

// Default link cap. The issue suggests 2 Gbit/s, but on the 2-core machine
// this was measured on, demo-moe-4x2-hosts with links uncapped takes
// 2.0-2.4 s per update (Gloo all-gathers and fp8 quantize share the two
// cores with the TCP stacks of six processes), more than the 1.44 s the
// links need at 2 Gbit/s: the CPU, not the link, would be measured. At
// 0.5 Gbit/s the links need 5.8 s and are the bottleneck, as on a real
// cluster. Use --rate-gbit on machines with more cores.
constexpr double kDefaultRateGbit = 0.5;

struct BenchClusterOptions {
  std::string cluster = "examples/demo-moe-4x2-hosts/cluster.json";
  double rate_gbit = kDefaultRateGbit;
  bool no_cap = false;
  int updates = 2;
  std::string provider = "tcp;ofi_rxm";
  std::string work_dir;
  std::string format = "text";
  bool verify = true;
  bool exchange = true;
  uint64_t watermark = 256ull << 20;
  // Delta versions: updates alternate whole and delta (--full-every 2) on
  // synthetic weights where about 1/drift of the elements change.
  bool delta = false;
  uint32_t drift = 30;
};

// Slowest trainer rank per pipeline stage, for the progress lines.
std::string Stages(const nlohmann::json& stats) {
  std::string out;
  for (const char* stage : {"unshard", "quantize_pack", "post", "wait_writes", "barrier"}) {
    double worst = 0;
    if (stats.is_object()) {
      for (const auto& [rank, st] : stats.items()) {
        if (st.contains("stages") && st["stages"].contains(stage)) worst = std::max(worst, st["stages"][stage].get<double>());
      }
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, " %s %.2f", stage, worst);
    out += buf;
  }
  return out;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int Fail(const std::string& what, const Status& s) {
  std::fprintf(stderr, "wsync bench cluster: %s: %s\n", what.c_str(), s.message().c_str());
  return 1;
}

int RunBenchCluster(const BenchClusterOptions& opt) {
  const bool text = opt.format == "text";
  auto progress = [&](const std::string& line) {
    std::fprintf(stderr, "[bench cluster] %s\n", line.c_str());
  };
  StatusOr<GeneratedSpecs> specs = GenerateFromClusterFile(opt.cluster);
  if (!specs.ok()) return Fail(opt.cluster, specs.status());

  // One namespace per host named in the specs: trainer hosts, then inference hosts.
  std::map<std::string, int> host_index;
  std::vector<std::string> host_names;
  int trainer_hosts = 0;
  auto add_host = [&](const std::string& h) {
    if (host_index.emplace(h, static_cast<int>(host_names.size())).second) host_names.push_back(h);
  };
  for (const TrainerRank& r : specs->trainer.ranks) add_host(r.host);
  trainer_hosts = static_cast<int>(host_names.size());
  for (const InferenceRank& r : specs->inference.ranks) add_host(r.host);
  const double rate = opt.no_cap ? 0 : opt.rate_gbit;
  progress("creating " + std::to_string(host_names.size()) + " host namespaces" +
           (rate > 0 ? ", links capped at " + std::to_string(rate) + " Gbit/s each way" : ", links uncapped"));
  StatusOr<std::unique_ptr<demo::EmulatedCluster>> cluster =
      demo::EmulatedCluster::Create({.hosts = static_cast<int>(host_names.size()), .rate_gbit = rate});
  if (!cluster.ok()) return Fail("cannot emulate the cluster", cluster.status());
  demo::EmulatedCluster& c = **cluster;
  auto place = [&](const std::string& host) {
    const int k = host_index.at(host);
    return demo::HostPlacement{c.host_netns(k), c.host_address(k)};
  };

  demo::LocalSyncOptions so;
  so.cluster = opt.cluster;
  so.provider = opt.provider;
  so.watermark = opt.watermark;
  so.exchange = opt.exchange;
  if (opt.delta) {
    so.full_every = 2;
    so.drift = opt.drift;
  }
  so.job = "bench" + std::to_string(getpid());
  so.work_dir = opt.work_dir.empty() ? "/tmp/wsync-" + so.job : opt.work_dir;
  so.controller = {c.switch_netns(), c.switch_address()};
  for (const TrainerRank& r : specs->trainer.ranks) so.trainers.push_back(place(r.host));
  for (const InferenceRank& r : specs->inference.ranks) so.inference.push_back(place(r.host));

  // --- wsync ---
  progress("starting wsync: controller, " + std::to_string(so.trainers.size()) + " trainer agents, " +
           std::to_string(so.inference.size()) + " inference agents (" + opt.provider + ")");
  std::vector<double> wsync_seconds, delta_seconds;
  double delta_wire = 0, delta_whole = 0;  // bytes the delta updates put on the wire, and their weights'
  double find_bytes = 0, find_seconds = 0;  // per rank and delta update: written bytes, and the find stage
  double pack_seconds = 0;                   // and the copy, quantize and pack stages
  double apply_bytes = 0, apply_seconds = 0;  // per inference rank and delta update: its writes' bytes, the apply
  uint64_t wire_bytes = 0;
  demo::LinkLimit limit, plan_bytes;
  PlanSummary predicted, predicted_delta;
  std::vector<uint64_t> inference_bytes;
  std::string verified = "not verified";
  uint64_t busiest_measured = 0;
  std::string busiest_measured_where;
  {
    StatusOr<std::unique_ptr<demo::LocalSync>> sync = demo::LocalSync::Start(so);
    if (!sync.ok()) return Fail("starting wsync", sync.status());
    demo::LocalSync& s = **sync;
    limit = demo::ComputeAnyPlanLimit(s.table(), s.specs().trainer, s.specs().inference, opt.rate_gbit);
    StatusOr<std::vector<TrainerRankPlan>> rank_plans =
        ExtractTrainerRankPlans(s.table(), s.specs().trainer, s.specs().inference, /*writes=*/false);
    if (!rank_plans.ok()) return Fail("rank plans", rank_plans.status());
    plan_bytes = opt.exchange ? demo::ComputeExchangeLinkBytes(s.table(), s.specs().trainer, s.specs().inference,
                                                               *rank_plans, opt.rate_gbit)
                              : demo::ComputeLinkLimit(s.table(), s.specs().trainer, s.specs().inference, opt.rate_gbit);
    if (rate > 0) predicted = Summarize(s.table(), EmulatedLinks(rate), &*rank_plans);
    inference_bytes = demo::InferenceWireBytes(s.table(), s.specs().inference.ranks.size());
    std::vector<uint64_t> tx0(host_names.size()), rx0(host_names.size());
    for (int v = 1; v <= opt.updates + 1; ++v) {
      if (v == 2) {
        for (size_t k = 0; k < host_names.size(); ++k) tx0[k] = c.HostTxBytes(k), rx0[k] = c.HostRxBytes(k);
      }
      StatusOr<demo::UpdateReport> r = s.Update(static_cast<uint64_t>(v));
      if (!r.ok()) return Fail("wsync update " + std::to_string(v), r.status());
      if (r->state != "complete") return Fail("wsync update " + std::to_string(v), Internal(r->failure));
      progress("wsync update " + std::to_string(v) + (v == 1 ? " (warm-up)" : "") + ": " +
               std::to_string(r->seconds) + " s; slowest rank's stages (s):" + Stages(r->trainer_stats));
      wire_bytes = r->wire_bytes;
      StatusOr<controller::VersionStatus> st = s.client().GetVersion(static_cast<uint64_t>(v));
      const bool as_delta = st.ok() && !st->delta_ranks.empty();
      if (as_delta && v > 1) {
        delta_seconds.push_back(r->seconds);
        for (const auto& [rank, t] : r->trainer_stats.items()) {
          if (!t.is_object()) continue;
          delta_wire += t.value("written_bytes", 0.0);
          delta_whole += t.value("write_bytes", 0.0);
          if (t.contains("stages")) {
            find_bytes += t.value("write_bytes", 0.0);
            find_seconds += t["stages"].value("delta", 0.0);
            pack_seconds += t["stages"].value("copy", 0.0) + t["stages"].value("quantize_pack", 0.0);
          }
        }
        if (st.ok()) {
          const nlohmann::json applied = st->raw.value("inference_stats", nlohmann::json::object());
          for (const auto& [rank, a] : applied.items()) {
            if (!a.is_object()) continue;
            apply_bytes += a.value("write_bytes", 0.0);
            apply_seconds += a.value("apply_seconds", 0.0);
          }
        }
      } else if (v > 1) {
        wsync_seconds.push_back(r->seconds);
      }
      if (v == opt.updates + 1 && opt.verify) {
        Status vs = s.Verify(r->version, &*r);
        if (!vs.ok()) return Fail("wsync update " + std::to_string(v) + " verification", vs);
        verified = "verified bit for bit (" + std::to_string(r->verified_tensors) + " tensors)";
      }
    }
    // The predictor's delta path over the same links, with the rates this
    // run measured: the fraction on the wire, and per rank its written bytes
    // per second of its find and of its copy, quantize and pack stages, and
    // an inference rank's bytes per second of its apply.
    if (opt.delta && rate > 0 && delta_whole > 0 && find_seconds > 0) {
      LinkModel links = EmulatedLinks(rate);
      links.delta_fraction = delta_wire / delta_whole;
      links.delta_find_gbps = find_bytes / find_seconds / 1e9;
      if (pack_seconds > 0) links.pack_gbps = find_bytes / pack_seconds / 1e9;
      if (apply_seconds > 0) links.delta_apply_gbps = apply_bytes / apply_seconds / 1e9;
      predicted_delta = Summarize(s.table(), links, &*rank_plans);
    }
    // What really crossed each host link (eth0 counters: payload plus TCP/IP
    // headers and Gloo/control traffic), per timed update.
    for (size_t k = 0; k < host_names.size(); ++k) {
      const uint64_t tx = (c.HostTxBytes(k) - tx0[k]) / opt.updates, rx = (c.HostRxBytes(k) - rx0[k]) / opt.updates;
      if (tx > busiest_measured) busiest_measured = tx, busiest_measured_where = host_names[k] + " egress";
      if (rx > busiest_measured) busiest_measured = rx, busiest_measured_where = host_names[k] + " ingress";
    }
  }
  const double wsync_s = Median(wsync_seconds);
  const double delta_s = Median(delta_seconds);

  // --- rank-0 baseline ---
  progress("running the rank-0 baseline (gather to trainer rank 0, then rank 0 -> every inference rank)");
  demo::Rank0BaselineOptions bo;
  bo.binary = demo::SelfExecutable();
  bo.provider = opt.provider;
  bo.work_dir = so.work_dir;
  bo.trainers = so.trainers;
  bo.inference = so.inference;
  bo.shard_bytes = demo::TrainerShardBytes(specs->trainer);
  bo.inference_bytes = inference_bytes;
  bo.rounds = opt.updates + 1;
  StatusOr<demo::Rank0BaselineResult> base = demo::RunRank0Baseline(bo);
  if (!base.ok()) return Fail("rank-0 baseline", base.status());
  const double rank0_s = base->seconds;

  uint64_t model_bytes = 0;
  for (uint64_t b : bo.shard_bytes) model_bytes += b;
  const double ratio = wsync_s > 0 ? rank0_s / wsync_s : 0;
  const double limit_ratio = limit.seconds > 0 ? wsync_s / limit.seconds : 0;
  if (!text) {
    nlohmann::json hosts = nlohmann::json::object();
    for (const auto& [name, b] : plan_bytes.hosts) {
      hosts[name] = {{"write_egress_bytes", b.write_egress}, {"write_ingress_bytes", b.write_ingress},
                     {"gather_egress_bytes", b.gather_egress}, {"gather_ingress_bytes", b.gather_ingress}};
    }
    nlohmann::json j = {
        {"cluster", opt.cluster}, {"provider", opt.provider}, {"rate_gbit", rate}, {"capped", rate > 0},
        {"bytes", wire_bytes}, {"model_bytes", model_bytes}, {"wsync_seconds", wsync_s},
        {"wsync_update_seconds", wsync_seconds}, {"wsync_gbps", wsync_s > 0 ? wire_bytes / wsync_s / 1e9 : 0},
        {"rank0_seconds", rank0_s}, {"rank0_round_seconds", base->round_seconds},
        {"rank0_gathered_bytes", base->gathered_bytes}, {"rank0_sent_bytes", base->sent_bytes},
        {"ratio", ratio}, {"trainer_hosts", trainer_hosts}, {"hosts", host_names.size()},
        {"link_limit_seconds", limit.seconds}, {"link_limit_bytes", limit.busiest_bytes},
        {"link_limit_busiest", limit.busiest}, {"wsync_over_limit", limit_ratio},
        {"target_over_limit", kTargetLimitRatio}, {"unshard", opt.exchange ? "exchange" : "full_tensor"},
        {"plan_link_seconds", plan_bytes.seconds}, {"plan_link_bytes", plan_bytes.busiest_bytes},
        {"plan_link_busiest", plan_bytes.busiest},
        {"predicted_seconds", predicted.predicted_seconds},
        {"predicted_reads_done_seconds", predicted.predicted_reads_done_seconds},
        {"predicted_over_measured", wsync_s > 0 ? predicted.predicted_seconds / wsync_s : 0.0}, {"measured_busiest_link_bytes", busiest_measured},
        {"measured_busiest_link", busiest_measured_where},
        {"measured_link_seconds", rate > 0 ? busiest_measured * 8.0 / (rate * 1e9) : 0.0}, {"verified", verified}, {"link_bytes", hosts}};
    if (opt.delta) {
      j["delta_seconds"] = delta_s;
      j["delta_update_seconds"] = delta_seconds;
      j["delta_wire_fraction"] = delta_whole > 0 ? delta_wire / delta_whole : 0.0;
      j["delta_over_whole"] = wsync_s > 0 ? delta_s / wsync_s : 0.0;
      j["delta_predicted_seconds"] = predicted_delta.delta_predicted_seconds;
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("wsync bench cluster: %s on %zu emulated hosts (%d trainer, %zu inference), %s, links %s\n",
              opt.cluster.c_str(), host_names.size(), trainer_hosts, host_names.size() - trainer_hosts,
              opt.provider.c_str(), rate > 0 ? (std::to_string(rate) + " Gbit/s each way (tc tbf)").c_str() : "uncapped");
  std::printf("  model        %.1f MB bf16 on the trainers; %.1f MB written into inference memory per update\n",
              model_bytes / 1e6, wire_bytes / 1e6);
  std::printf("  wsync        %.3f s  (%.3f GB/s; median of %zu %supdates after 1 warm-up; %s)\n", wsync_s,
              wsync_s > 0 ? wire_bytes / wsync_s / 1e9 : 0, wsync_seconds.size(), opt.delta ? "whole " : "",
              verified.c_str());
  if (opt.delta) {
    std::printf("  deltas       %.3f s  (median of %zu delta updates between the whole ones above, same links; %.1f%%\n"
                "               of the bytes on the wire; %.2f of the whole update's time)\n",
                delta_s, delta_seconds.size(), delta_whole > 0 ? 100 * delta_wire / delta_whole : 0.0,
                wsync_s > 0 ? delta_s / wsync_s : 0.0);
    if (predicted_delta.delta_predicted_seconds > 0) {
      const LinkModel& l = predicted_delta.link;
      std::printf("  predicted    %.3f s for a delta update by the same model with this run's fraction and rates per\n"
                  "               rank (find %.2f, pack %.2f, apply %.2f GB/s), %+.0f%% against measured\n",
                  predicted_delta.delta_predicted_seconds, l.delta_find_gbps, l.pack_gbps, l.delta_apply_gbps,
                  delta_s > 0 ? (predicted_delta.delta_predicted_seconds / delta_s - 1) * 100 : 0.0);
    }
  }
  std::printf("  rank-0       %.3f s  (gather %.1f MB into trainer rank 0, then it writes %.1f MB to the inference "
              "ranks; median of %d rounds after 1 warm-up; same transport and links; no fuse/quantize charged, "
              "which favours it)\n",
              rank0_s, base->gathered_bytes / 1e6, base->sent_bytes / 1e6, opt.updates);
  std::printf("  ratio        rank-0 / wsync = %.2fx   (trainer hosts: %d)\n", ratio, trainer_hosts);
  if (limit.seconds > 0) {
    std::printf("  link limit   %.3f s = %.1f MB over the busiest host link (%s) at %.2f Gbit/s, for any plan: each\n"
                "               inference host receives what its ranks hold, and all of it leaves the trainer hosts,\n"
                "               at best evenly%s\n",
                limit.seconds, limit.busiest_bytes / 1e6, limit.busiest.c_str(), opt.rate_gbit,
                rate > 0 ? "" : " (links uncapped in this run: the limit is what a cap would impose)");
    std::printf("  wsync/limit  %.2f  (target <= %.2f)\n", limit_ratio, kTargetLimitRatio);
    std::printf("  this plan    %.3f s = %.1f MB over its busiest host link (%s): the writes%s\n", plan_bytes.seconds,
                plan_bytes.busiest_bytes / 1e6, plan_bytes.busiest.c_str(),
                opt.exchange ? " and the exchange's pieces between hosts (--exchange)"
                             : " and full_tensor's gathers between hosts, received once per host");
  } else {
    std::printf("  link limit   none (links uncapped: this measures the CPU)\n");
  }
  if (rate > 0) {
    const double err = wsync_s > 0 ? predicted.predicted_seconds / wsync_s - 1 : 0;
    std::printf("  predicted    %.3f s by the plan summary's model of these links (wsync plan's, one %.2f Gbit/s link\n"
                "               per host at %.1f%% payload), %+.0f%% against measured (target within %.0f%%); trainer\n"
                "               stall predicted %.3f s\n",
                predicted.predicted_seconds, rate, predicted.link.nic_efficiency * 100, err * 100,
                kTargetPredicted * 100, predicted.predicted_reads_done_seconds);
  }
  std::printf("  measured     %.1f MB per update crossed the busiest link (%s, eth0 counters%s)", busiest_measured / 1e6,
              busiest_measured_where.c_str(), opt.delta ? "; whole and delta updates averaged" : "");
  if (rate > 0) {
    const double measured_s = busiest_measured * 8.0 / (rate * 1e9);
    std::printf(": %.3f s at the cap, wsync/that %.2f\n", measured_s, wsync_s / measured_s);
  } else {
    std::printf("\n");
  }
  std::printf("  this plan's bytes per host and direction (payload only; inside a host the bytes stay off the link):\n");
  for (const auto& [name, b] : plan_bytes.hosts) {
    std::printf("    %-10s egress %8.1f MB (writes %.1f + unshard %.1f)  ingress %8.1f MB (writes %.1f + unshard %.1f)\n",
                name.c_str(), b.egress() / 1e6, b.write_egress / 1e6, b.gather_egress / 1e6, b.ingress() / 1e6,
                b.write_ingress / 1e6, b.gather_ingress / 1e6);
  }
  return 0;
}

}  // namespace

void AddBenchCluster(CLI::App& bench) {
  auto opt = std::make_shared<BenchClusterOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "cluster", "wsync vs a rank-0 baseline on emulated hosts (netns + tc tbf), against the link limit (root)");
  cmd->add_option("--cluster", opt->cluster, "cluster spec; each named host becomes a namespace")->capture_default_str();
  cmd->add_option("--rate-gbit", opt->rate_gbit, "link cap per host and direction, Gbit/s (default low enough that 2 cores are not the bottleneck)")->capture_default_str();
  cmd->add_flag("--no-cap", opt->no_cap, "leave the links uncapped (shows the CPU bound)");
  cmd->add_option("--updates", opt->updates, "timed updates (after one warm-up), also baseline rounds")
      ->capture_default_str();
  cmd->add_option("--provider", opt->provider, "libfabric provider")->capture_default_str();
  cmd->add_option("--work-dir", opt->work_dir, "logs");
  cmd->add_option("--watermark", opt->watermark, "wsync's temporary memory bound per trainer rank, bytes")
      ->capture_default_str();
  cmd->add_option("--format", opt->format, "output format")->check(CLI::IsMember({"text", "json"}))->capture_default_str();
  cmd->add_flag("!--no-verify", opt->verify, "skip the bit-for-bit check of the last update");
  cmd->add_flag("--delta", opt->delta,
                "delta versions: updates alternate whole and delta (agents with --delta, --full-every 2), timed "
                "apart, on synthetic weights of which about 1/--drift change per update");
  cmd->add_option("--drift", opt->drift, "with --delta: about 1/P of the elements change per update")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--exchange,!--full-tensor", opt->exchange,
                "unshard by the planned exchange (the default: each trainer rank receives only the rows it writes) "
                "or all-gather whole tensors (--full-tensor)");
  cmd->callback([opt] {
    if (opt->updates < 1) {
      std::fprintf(stderr, "wsync bench cluster: --updates must be at least 1\n");
      std::exit(2);
    }
    std::exit(RunBenchCluster(*opt));
  });

  auto peer = std::make_shared<demo::Rank0PeerOptions>();
  CLI::App* p = bench.add_subcommand("rank0-peer", "one process of the rank-0 baseline (used by bench cluster)");
  p->group("");  // hidden
  p->add_option("--role", peer->role)->required();
  p->add_option("--rank", peer->rank)->required();
  p->add_option("--dir", peer->dir)->required();
  p->add_option("--provider", peer->provider);
  p->add_option("--node", peer->node);
  p->add_option("--shard-bytes", peer->shard_bytes)->delimiter(',')->required();
  p->add_option("--inference-bytes", peer->inference_bytes)->delimiter(',')->required();
  p->add_option("--chunk", peer->chunk);
  p->add_option("--rounds", peer->rounds);
  p->add_option("--timeout", peer->timeout_s);
  p->callback([peer] { std::exit(demo::RunRank0Peer(*peer)); });
}

}  // namespace wsync::cli
