#include "routing/plan_summary.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "routing/chunking.h"

namespace wsync {
namespace {

uint64_t ShapeBytes(const Shape& shape, DType dtype) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n * static_cast<uint64_t>(DTypeSize(dtype));
}

Distribution Distribute(const std::vector<double>& values) {
  Distribution d;
  d.count = values.size();
  if (values.empty()) return d;
  d.min = *std::min_element(values.begin(), values.end());
  d.max = *std::max_element(values.begin(), values.end());
  double sum = 0;
  for (double v : values) sum += v;
  d.mean = sum / static_cast<double>(values.size());
  return d;
}

// Bytes per second a NIC moves at `gbps` Gbit/s.
double BytesPerSecond(double gbps) { return gbps * 1e9 / 8.0; }

std::string Bytes(double b) {
  char buf[64];
  if (b >= 1e12) std::snprintf(buf, sizeof buf, "%.2f TB", b / 1e12);
  else if (b >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else if (b >= 1e6) std::snprintf(buf, sizeof buf, "%.2f MB", b / 1e6);
  else if (b >= 1e3) std::snprintf(buf, sizeof buf, "%.2f KB", b / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

std::string Seconds(double s) {
  char buf[32];
  if (s >= 1.0) std::snprintf(buf, sizeof buf, "%.3f s", s);
  else std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  return buf;
}

std::string DistText(const Distribution& d, bool bytes) {
  auto f = [&](double v) { return bytes ? Bytes(v) : std::to_string(static_cast<uint64_t>(v)); };
  char imb[32];
  std::snprintf(imb, sizeof imb, "%.3f", d.imbalance());
  return "min " + f(d.min) + "  mean " + f(d.mean) + "  max " + f(d.max) +
         "  (max/mean " + imb + ", n=" + std::to_string(d.count) + ")";
}

nlohmann::json DistJson(const Distribution& d) {
  return {{"min", d.min}, {"mean", d.mean}, {"max", d.max}, {"count", d.count},
          {"imbalance", d.imbalance()}};
}

// Index of `rank` in the source's gather group.
int64_t GatherIndex(const RankSource& src, int32_t rank) {
  auto it = std::find(src.gather_ranks.begin(), src.gather_ranks.end(), rank);
  return it - src.gather_ranks.begin();
}

}  // namespace

namespace {

// Elements that more than one of `boxes` covers, counted once per extra box:
// a grid of every box edge per dim, each cell weighed by its coverage.
uint64_t RepeatedElements(const std::vector<Box>& boxes) {
  if (boxes.size() < 2) return 0;
  const int n = boxes[0].ndim;
  std::array<std::vector<int64_t>, kMaxDims> cuts;
  for (int d = 0; d < n; ++d) {
    for (const Box& b : boxes) {
      cuts[d].push_back(b.offset[d]);
      cuts[d].push_back(b.offset[d] + b.size[d]);
    }
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
  }
  uint64_t repeated = 0;
  std::array<size_t, kMaxDims> at{};
  while (true) {
    uint64_t volume = 1;
    for (int d = 0; d < n; ++d) volume *= static_cast<uint64_t>(cuts[d][at[d] + 1] - cuts[d][at[d]]);
    uint64_t cover = 0;
    for (const Box& b : boxes) {
      bool in = true;
      for (int d = 0; d < n && in; ++d)
        in = b.offset[d] <= cuts[d][at[d]] && cuts[d][at[d] + 1] <= b.offset[d] + b.size[d];
      cover += in;
    }
    if (cover > 1) repeated += volume * (cover - 1);
    int d = n - 1;  // odometer over the cells
    for (; d >= 0; --d) {
      if (++at[d] + 1 < cuts[d].size()) break;
      at[d] = 0;
    }
    if (d < 0) break;
  }
  return repeated;
}

// Calls its visitor with every trainer rank's plan, in turn.
using RankPlans = std::function<Status(const std::function<void(const TrainerRankPlan&)>&)>;

StatusOr<PlanSummary> SummarizeImpl(const RoutingTable& table, const LinkModel& link, const RankPlans* rank_plans) {
  PlanSummary s;
  s.link = link;
  s.trainer_ranks = static_cast<int32_t>(table.trainer_endpoints.size());
  s.inference_ranks = static_cast<int32_t>(table.inference_endpoints.size());
  s.source_tensors = static_cast<int32_t>(table.sources.size());
  s.dest_tensors = static_cast<int32_t>(table.destinations.size());

  for (const SourceTensor& src : table.sources) s.total_bytes += ShapeBytes(src.global_shape, src.dtype);
  for (const DestTensor& d : table.destinations) {
    s.dest_bytes += d.bytes + d.scale_bytes;
    if (d.has_scale) ++s.dest_scales;
  }

  const size_t num_groups = table.mesh_groups.size();
  const size_t nt = table.trainer_endpoints.size();
  // NIC ids: one per distinct (host, nic) on each side (per host when they
  // share one link).
  auto nic_ids = [&link](const std::vector<Endpoint>& eps, std::vector<int32_t>* of_rank) {
    std::map<std::pair<std::string, int32_t>, int32_t> ids;
    of_rank->resize(eps.size());
    for (size_t r = 0; r < eps.size(); ++r) {
      auto [it, inserted] = ids.emplace(std::make_pair(eps[r].host, link.one_link_per_host ? 0 : eps[r].nic),
                                        static_cast<int32_t>(ids.size()));
      (*of_rank)[r] = it->second;
    }
    return ids.size();
  };
  std::vector<int32_t> tnic_of, inic_of;
  const size_t num_tnics = nic_ids(table.trainer_endpoints, &tnic_of);
  const size_t num_inics = nic_ids(table.inference_endpoints, &inic_of);

  std::vector<double> sent(nt, 0), writes(nt, 0), tnic(num_tnics, 0), inic(num_inics, 0);
  // Per group: bytes per rank, writes per rank, bytes per trainer NIC.
  std::vector<std::vector<double>> g_sent(num_groups, std::vector<double>(nt, 0));
  std::vector<std::vector<double>> g_writes(num_groups, std::vector<double>(nt, 0));
  std::vector<std::vector<double>> g_tnic(num_groups, std::vector<double>(num_tnics, 0));
  for (const WriteOp& op : table.ops) {
    const double b = static_cast<double>(op.bytes);
    s.wire_bytes += op.bytes;
    s.writes += op.planes;
    ++s.ops;
    sent[op.src_rank] += b;
    writes[op.src_rank] += op.planes;
    tnic[tnic_of[op.src_rank]] += b;
    inic[inic_of[op.dst_rank]] += b;
    g_sent[op.mesh_group][op.src_rank] += b;
    g_writes[op.mesh_group][op.src_rank] += op.planes;
    g_tnic[op.mesh_group][tnic_of[op.src_rank]] += b;
  }
  s.sender_bytes = Distribute(sent);
  s.writes_per_sender = Distribute(writes);
  s.sender_nic_bytes = Distribute(tnic);
  s.receiver_nic_bytes = Distribute(inic);

  // full_tensor volume per rank and group. k ranks end up holding the same
  // box B; a rank receives (k-1)/k of B over NVLink, and its host must bring
  // in the part no local rank held, B * (1 - g/k) for g local holders,
  // spread over those g ranks' NICs.
  std::vector<std::vector<double>> g_gather(num_groups, std::vector<double>(nt, 0));  // NVLink bytes
  std::vector<std::vector<double>> g_gather_nic(num_groups, std::vector<double>(nt, 0));
  std::vector<std::vector<double>> g_calls(num_groups, std::vector<double>(nt, 0));
  std::vector<int32_t> g_sources(num_groups, 0);
  std::vector<uint64_t> g_stored(num_groups, 0);
  for (const SourceTensor& src : table.sources) {
    if (src.mesh_group < 0 || static_cast<size_t>(src.mesh_group) >= num_groups) continue;
    ++g_sources[src.mesh_group];
    g_stored[src.mesh_group] += ShapeBytes(src.global_shape, src.dtype);
    std::map<std::vector<int64_t>, int32_t> same_box;
    auto key = [](const Box& b) {
      std::vector<int64_t> k(b.offset.begin(), b.offset.begin() + b.ndim);
      k.insert(k.end(), b.size.begin(), b.size.begin() + b.ndim);
      return k;
    };
    std::map<std::pair<std::vector<int64_t>, std::string>, int32_t> same_box_host;
    for (const auto& h : src.holders) {
      ++same_box[key(h.box)];
      ++same_box_host[{key(h.box), table.trainer_endpoints[h.rank].host}];
    }
    for (const auto& h : src.holders) {
      const double k = same_box[key(h.box)];
      const double g = same_box_host[{key(h.box), table.trainer_endpoints[h.rank].host}];
      const double bytes = static_cast<double>(h.box.NumElements()) * DTypeSize(src.dtype);
      g_gather[src.mesh_group][h.rank] += bytes * (k - 1) / k;
      g_gather_nic[src.mesh_group][h.rank] += bytes * (1 - g / k) / g;
      g_calls[src.mesh_group][h.rank] += 1;
    }
  }

  for (const auto& per_rank : g_gather)
    for (double b : per_rank) s.full_tensor_bytes += static_cast<uint64_t>(b);
  s.exchange_bytes = s.full_tensor_bytes;

  // Bytes each trainer NIC sends to other hosts' trainers while unsharding;
  // they share the NIC with the writes.
  std::vector<std::vector<double>> g_unshard_send(num_groups, std::vector<double>(num_tnics, 0));
  if (rank_plans != nullptr) {
    s.from_rank_plans = true;
    s.exchange_bytes = 0;
    std::unordered_map<std::string, size_t> group_of;
    for (size_t g = 0; g < num_groups; ++g) group_of.emplace(table.mesh_groups[g].name, g);
    for (auto* v : {&g_gather, &g_gather_nic, &g_calls})
      for (auto& per_rank : *v) std::fill(per_rank.begin(), per_rank.end(), 0.0);
    // What each host receives from each peer of another host, per source
    // (a group's sources are in the same order on all its ranks).
    struct Into {
      uint64_t source;  // group << 32 | index in the group's sources
      int32_t peer, host;
      int64_t esize;
      Box box;
    };
    std::vector<Into> into_host;
    std::unordered_map<std::string, int32_t> host_ids;
    std::vector<int32_t> host_of(nt);
    for (size_t r = 0; r < nt; ++r)
      host_of[r] = host_ids.emplace(table.trainer_endpoints[r].host, static_cast<int32_t>(host_ids.size())).first->second;
    WSYNC_RETURN_IF_ERROR((*rank_plans)([&](const TrainerRankPlan& plan) {
      const int32_t me = plan.rank;
      if (me < 0 || static_cast<size_t>(me) >= nt) return;
      for (const RankMeshGroup& group : plan.groups) {
        auto it = group_of.find(group.name);
        if (it == group_of.end()) continue;
        const size_t g = it->second;
        for (size_t k = 0; k < group.sources.size(); ++k) {
          const RankSource& src = group.sources[k];
          if (src.gather_dim < 0) {
            ++s.unshard_none;
            continue;
          }
          const int64_t parts = static_cast<int64_t>(src.gather_ranks.size());
          const int64_t mine = GatherIndex(src, me);
          src.exchange() ? ++s.unshard_pieces : ++s.unshard_gathers;
          g_calls[g][me] += 1;
          for (int64_t i = 0; i < parts; ++i) {
            const int32_t peer = src.gather_ranks[i];
            if (peer == me || peer < 0 || static_cast<size_t>(peer) >= nt) continue;
            // An all-gather receives every peer's chunk and sends its own
            // to every peer; the exchange only the planned rows.
            const auto in = static_cast<double>(UnshardBytesFrom(src, i));
            const auto out = static_cast<double>(UnshardBytesTo(src, i, mine));
            s.exchange_bytes += static_cast<uint64_t>(in);
            if (host_of[peer] == host_of[me]) {
              g_gather[g][me] += in;
            } else {
              Box piece = src.held;
              const int gd = src.gather_dim;
              if (src.exchange()) {
                piece.offset[gd] = src.recv_rows[i].offset;
                piece.size[gd] = src.recv_rows[i].size;
              } else {
                const Range c = ChunkRange(src.held.size[gd], parts, i);
                piece.offset[gd] += c.offset;
                piece.size[gd] = c.size;
              }
              if (piece.NumElements() > 0)
                into_host.push_back({static_cast<uint64_t>(g) << 32 | k, peer, host_of[me], DTypeSize(src.dtype), piece});
              s.exchange_cross_host_bytes += static_cast<uint64_t>(in);
              g_gather_nic[g][me] += in;
              g_unshard_send[g][tnic_of[me]] += out;
            }
          }
        }
      }
    }));
    const auto key = [](const Into& a) { return std::tie(a.source, a.peer, a.host); };
    const auto same = [&](const Into& a, const Into& b) { return key(a) == key(b); };
    std::sort(into_host.begin(), into_host.end(), [&](const Into& a, const Into& b) { return key(a) < key(b); });
    std::vector<Box> boxes;
    for (size_t i = 0; i < into_host.size();) {
      size_t e = i + 1;
      while (e < into_host.size() && same(into_host[i], into_host[e])) ++e;
      if (e - i > 1) {
        boxes.clear();
        for (size_t j = i; j < e; ++j) boxes.push_back(into_host[j].box);
        s.exchange_repeat_cross_host_bytes += RepeatedElements(boxes) * static_cast<uint64_t>(into_host[i].esize);
      }
      i = e;
    }
  }

  // Unshard bytes from other hosts enter through the rank's NIC, which the
  // ranks sharing it share.
  std::vector<std::vector<double>> g_unshard_recv(num_groups, std::vector<double>(num_tnics, 0));
  for (size_t g = 0; g < num_groups; ++g)
    for (size_t r = 0; r < nt; ++r) g_unshard_recv[g][tnic_of[r]] += g_gather_nic[g][r];

  const double nic_bps = BytesPerSecond(link.nic_gbps) * link.nic_efficiency;
  const double nvlink_bps = BytesPerSecond(link.nvlink_gbps);
  std::vector<double> rank_path(nt, 0), rank_reads_done(nt, 0), rank_path_delta(nt, 0);
  const bool deltas = link.delta_fraction > 0;
  const double find_bps = deltas && link.delta_find_gbps > 0 ? link.delta_find_gbps * 1e9 : 0;
  const double apply_bps = deltas && link.delta_apply_gbps > 0 ? link.delta_apply_gbps * 1e9 : 0;
  const double pack_bps = deltas && link.pack_gbps > 0 ? link.pack_gbps * 1e9 : 0;
  for (size_t g = 0; g < num_groups; ++g) {
    double group_delta = 0;
    MeshGroupSummary m;
    m.name = table.mesh_groups[g].name;
    m.ranks = static_cast<int32_t>(table.mesh_groups[g].ranks.size());
    m.sources = g_sources[g];
    m.stored_bytes = g_stored[g];
    std::vector<double> rank_bytes;
    for (int32_t r : table.mesh_groups[g].ranks) {
      rank_bytes.push_back(g_sent[g][r]);
      m.wire_bytes += static_cast<uint64_t>(g_sent[g][r]);
      m.writes += static_cast<uint64_t>(g_writes[g][r]);
      const double ag = std::max(g_gather[g][r] / nvlink_bps, g_unshard_recv[g][tnic_of[r]] / nic_bps) +
                        g_calls[g][r] * link.allgather_call_us * 1e-6;
      m.unshard_bytes += static_cast<uint64_t>(g_gather[g][r] + g_gather_nic[g][r]);
      const double wr = (g_tnic[g][tnic_of[r]] + g_unshard_send[g][tnic_of[r]]) / nic_bps +
                        g_writes[g][r] * link.per_write_us * 1e-6;
      // Pipelined: the slower stage dominates; the faster one adds its first
      // tensor's share as pipeline fill.
      const double calls = std::max(1.0, g_calls[g][r]);
      const double t = std::max(ag, wr) + std::min(ag, wr) / calls;
      // Its last read is its last source's copy (and unshard); only that
      // source's writes, a share of the rank's, come after it.
      rank_reads_done[r] = rank_path[r] + t - wr / std::max(1.0, static_cast<double>(g_sources[g]));
      m.allgather_seconds = std::max(m.allgather_seconds, ag);
      m.write_seconds = std::max(m.write_seconds, wr);
      m.seconds = std::max(m.seconds, t);
      if (deltas) {
        // The writes leave while the thread goes on; the unshard, the pack
        // and the find take turns on it.
        const double wr_delta = (g_tnic[g][tnic_of[r]] * link.delta_fraction + g_unshard_send[g][tnic_of[r]]) / nic_bps +
                                g_writes[g][r] * link.per_write_us * 1e-6;
        const double work = (find_bps > 0 ? g_sent[g][r] / find_bps : 0) + (pack_bps > 0 ? g_sent[g][r] / pack_bps : 0);
        const double thread = ag + work;
        group_delta = std::max(group_delta, std::max(thread, wr_delta) + std::min(thread, wr_delta) / calls);
      }
    }
    for (int32_t r : table.mesh_groups[g].ranks) rank_path_delta[r] += group_delta + link.barrier_us * 1e-6;
    m.seconds += link.barrier_us * 1e-6;
    m.sender_bytes = Distribute(rank_bytes);
    // The barrier makes every rank of the group wait for the slowest one;
    // groups with disjoint ranks (different PP stages) run side by side.
    for (int32_t r : table.mesh_groups[g].ranks) rank_path[r] += m.seconds;
    s.mesh_groups.push_back(std::move(m));
  }
  s.sender_bound_seconds = rank_path.empty() ? 0 : *std::max_element(rank_path.begin(), rank_path.end());
  s.receive_bound_seconds = s.receiver_nic_bytes.max / nic_bps;
  s.wire_limit_seconds = std::max(s.sender_nic_bytes.max, s.receiver_nic_bytes.max) /
                         BytesPerSecond(link.nic_gbps);
  s.predicted_seconds = std::max(s.sender_bound_seconds, s.receive_bound_seconds);
  s.predicted_reads_done_seconds =
      rank_reads_done.empty() ? 0 : *std::max_element(rank_reads_done.begin(), rank_reads_done.end());
  if (deltas) {
    s.delta_sender_bound_seconds =
        rank_path_delta.empty() ? 0 : *std::max_element(rank_path_delta.begin(), rank_path_delta.end());
    s.delta_receive_bound_seconds = s.receiver_nic_bytes.max * link.delta_fraction / nic_bps +
                                    (apply_bps > 0 ? s.receiver_nic_bytes.max / apply_bps : 0);
    s.delta_predicted_seconds = std::max(s.delta_sender_bound_seconds, s.delta_receive_bound_seconds);
  }
  return s;
}

}  // namespace

PlanSummary Summarize(const RoutingTable& table, const LinkModel& link,
                      const std::vector<TrainerRankPlan>* rank_plans) {
  if (rank_plans == nullptr) return *SummarizeImpl(table, link, nullptr);
  const RankPlans each = [rank_plans](const std::function<void(const TrainerRankPlan&)>& visit) {
    for (const TrainerRankPlan& plan : *rank_plans) visit(plan);
    return Status::Ok();
  };
  return *SummarizeImpl(table, link, &each);
}

StatusOr<PlanSummary> SummarizeFromRankPlans(const RoutingTable& table, const TrainerSpec& trainer,
                                             const InferenceSpec& inference, const LinkModel& link, bool writes) {
  // Each rank's ops, indexed once; none without writes (unshard only).
  const std::vector<std::vector<uint32_t>> ops_of =
      writes ? OpsByTrainer(table, trainer.ranks.size()) : std::vector<std::vector<uint32_t>>(trainer.ranks.size());
  // Ranks are extracted a batch at a time, one per core (each only reads
  // the table and the specs), and visited in rank order: what the summary
  // adds up does not depend on the cores, and a batch of plans without
  // writes is small.
  const size_t lanes = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 16);
  const RankPlans each = [&](const std::function<void(const TrainerRankPlan&)>& visit) -> Status {
    const size_t n = trainer.ranks.size();
    std::vector<std::optional<StatusOr<TrainerRankPlan>>> batch(lanes);
    auto extract = [&](size_t r, size_t slot) {
      batch[slot] = ExtractTrainerRankPlan(table, trainer, inference, static_cast<int32_t>(r), &ops_of[r],
                                           /*list_writes=*/false);
    };
    for (size_t first = 0; first < n; first += lanes) {
      const size_t count = std::min(lanes, n - first);
      std::vector<std::thread> helpers;
      for (size_t i = 1; i < count; ++i) helpers.emplace_back(extract, first + i, i);
      extract(first, 0);
      for (std::thread& t : helpers) t.join();
      for (size_t i = 0; i < count; ++i) {
        if (!batch[i]->ok()) return batch[i]->status();  // the lowest rank's error, as before
        visit(**batch[i]);
      }
    }
    return Status::Ok();
  };
  return SummarizeImpl(table, link, &each);
}

std::string FormatSummaryText(const PlanSummary& s) {
  std::ostringstream o;
  o << "plan: " << s.trainer_ranks << " trainer ranks -> " << s.inference_ranks << " inference ranks\n";
  o << "  tensors      " << s.source_tensors << " trainer tensors -> " << s.dest_tensors
    << " engine tensors (+" << s.dest_scales << " fp8 scale tensors)\n";
  o << "  bytes        stored on trainers " << Bytes(s.total_bytes) << ", held by inference "
    << Bytes(s.dest_bytes) << ", on the wire " << Bytes(s.wire_bytes) << "\n";
  o << "  writes       " << s.writes << " in " << s.ops << " ops (per sender: " << DistText(s.writes_per_sender, false)
    << ")\n";
  o << "  sender rank  " << DistText(s.sender_bytes, true) << "\n";
  o << "  sender NIC   " << DistText(s.sender_nic_bytes, true) << "\n";
  o << "  receiver NIC " << DistText(s.receiver_nic_bytes, true) << "\n";
  {
    char line[512];
    const double saved = s.full_tensor_bytes > 0 ? 1.0 - double(s.exchange_bytes) / double(s.full_tensor_bytes) : 0;
    if (s.from_rank_plans) {
      std::snprintf(line, sizeof line,
                    "  unshard      ranks receive %s from their peers (%s between hosts, %s of it into a host a "
                    "second time) where full_tensor would "
                    "move %s (%.1f%% less); (rank, tensor) pairs: %llu exchange pieces, %llu all-gather, "
                    "%llu from the shard as is\n",
                    Bytes(s.exchange_bytes).c_str(), Bytes(s.exchange_cross_host_bytes).c_str(),
                    Bytes(s.exchange_repeat_cross_host_bytes).c_str(), Bytes(s.full_tensor_bytes).c_str(), saved * 100,
                    static_cast<unsigned long long>(s.unshard_pieces),
                    static_cast<unsigned long long>(s.unshard_gathers),
                    static_cast<unsigned long long>(s.unshard_none));
    } else {
      std::snprintf(line, sizeof line, "  unshard      full_tensor: ranks receive %s from their peers\n",
                    Bytes(s.full_tensor_bytes).c_str());
    }
    o << line;
  }
  o << "  mesh groups (in order):\n";
  for (const MeshGroupSummary& m : s.mesh_groups) {
    char line[512];
    std::snprintf(line, sizeof line,
                  "    %-16s %4d ranks %6d tensors  stored %-10s wire %-10s writes %-8llu "
                  "max/mean %.3f  unshard %s  write %s  => %s\n",
                  m.name.c_str(), m.ranks, m.sources, Bytes(m.stored_bytes).c_str(),
                  Bytes(m.wire_bytes).c_str(), static_cast<unsigned long long>(m.writes),
                  m.sender_bytes.imbalance(), Seconds(m.allgather_seconds).c_str(),
                  Seconds(m.write_seconds).c_str(), Seconds(m.seconds).c_str());
    o << line;
  }
  const LinkModel& l = s.link;
  o << "  predicted update time " << Seconds(s.predicted_seconds) << " = max(sender path "
    << Seconds(s.sender_bound_seconds) << ", busiest receiver NIC " << Seconds(s.receive_bound_seconds)
    << "); bytes-over-busiest-NIC limit " << Seconds(s.wire_limit_seconds) << "\n";
  o << "  trainer stall (until every rank has read its last shard) " << Seconds(s.predicted_reads_done_seconds)
    << "\n";
  if (l.delta_fraction > 0) {
    char line[512], pack[32] = "no cost";
    if (l.pack_gbps > 0) std::snprintf(pack, sizeof pack, "%.1f GB/s", l.pack_gbps);
    std::snprintf(line, sizeof line,
                  "  delta version %s = max(sender path %s, busiest receiver NIC and apply %s): %.1f%% of the bytes "
                  "on the wire, changes found at %.1f GB/s per trainer rank, applied at %.1f GB/s per inference rank, "
                  "packed at %s (docs/DELTAS.md)\n",
                  Seconds(s.delta_predicted_seconds).c_str(), Seconds(s.delta_sender_bound_seconds).c_str(),
                  Seconds(s.delta_receive_bound_seconds).c_str(), l.delta_fraction * 100, l.delta_find_gbps,
                  l.delta_apply_gbps, pack);
    o << line;
  }
  o << "  link model: " << (l.one_link_per_host ? "one link per host, " : "") << "NIC " << l.nic_gbps << " Gbit/s at " << l.nic_efficiency * 100
    << "% efficiency per direction; " << l.per_write_us << " us to post a write; unshard ("
    << (s.from_rank_plans ? "the rank plans' exchange and all-gathers, peer by peer" : "full_tensor")
    << ") over NVLink " << l.nvlink_gbps << " Gbit/s inside a host and the NICs across hosts, + " << l.allgather_call_us
    << " us per collective; "
    << l.barrier_us << " us per MeshGroup barrier; unshard and writes pipelined inside a "
    << "MeshGroup, MeshGroups of one rank in sequence, disjoint MeshGroups in parallel\n";
  return o.str();
}

std::string FormatSummaryJson(const PlanSummary& s) {
  nlohmann::json j;
  j["trainer_ranks"] = s.trainer_ranks;
  j["inference_ranks"] = s.inference_ranks;
  j["source_tensors"] = s.source_tensors;
  j["dest_tensors"] = s.dest_tensors;
  j["dest_scales"] = s.dest_scales;
  j["total_bytes"] = s.total_bytes;
  j["dest_bytes"] = s.dest_bytes;
  j["wire_bytes"] = s.wire_bytes;
  j["writes"] = s.writes;
  j["ops"] = s.ops;
  j["max_sender_bytes"] = s.sender_bytes.max;
  j["mean_sender_bytes"] = s.sender_bytes.mean;
  j["sender_bytes"] = DistJson(s.sender_bytes);
  j["sender_nic_bytes"] = DistJson(s.sender_nic_bytes);
  j["receiver_nic_bytes"] = DistJson(s.receiver_nic_bytes);
  j["writes_per_sender"] = DistJson(s.writes_per_sender);
  nlohmann::json groups = nlohmann::json::array();
  for (const MeshGroupSummary& m : s.mesh_groups) {
    groups.push_back({{"name", m.name}, {"ranks", m.ranks}, {"tensors", m.sources},
                      {"stored_bytes", m.stored_bytes}, {"wire_bytes", m.wire_bytes},
                      {"writes", m.writes}, {"sender_bytes", DistJson(m.sender_bytes)},
                      {"unshard_bytes", m.unshard_bytes},
                      {"allgather_seconds", m.allgather_seconds},
                      {"write_seconds", m.write_seconds}, {"seconds", m.seconds}});
  }
  j["mesh_groups"] = groups;
  j["unshard_from_rank_plans"] = s.from_rank_plans;
  j["exchange_bytes"] = s.exchange_bytes;
  j["exchange_cross_host_bytes"] = s.exchange_cross_host_bytes;
  j["exchange_repeat_cross_host_bytes"] = s.exchange_repeat_cross_host_bytes;
  j["full_tensor_bytes"] = s.full_tensor_bytes;
  j["unshard_pairs"] = {{"exchange", s.unshard_pieces}, {"all_gather", s.unshard_gathers}, {"none", s.unshard_none}};
  j["predicted_seconds"] = s.predicted_seconds;
  j["predicted_reads_done_seconds"] = s.predicted_reads_done_seconds;
  j["sender_bound_seconds"] = s.sender_bound_seconds;
  j["receive_bound_seconds"] = s.receive_bound_seconds;
  j["wire_limit_seconds"] = s.wire_limit_seconds;
  if (s.link.delta_fraction > 0) {
    j["delta"] = {{"fraction", s.link.delta_fraction}, {"find_gbps", s.link.delta_find_gbps},
                  {"pack_gbps", s.link.pack_gbps},
                  {"apply_gbps", s.link.delta_apply_gbps}, {"predicted_seconds", s.delta_predicted_seconds},
                  {"sender_bound_seconds", s.delta_sender_bound_seconds},
                  {"receive_bound_seconds", s.delta_receive_bound_seconds}};
  }
  j["link_model"] = {{"nic_gbps", s.link.nic_gbps}, {"nic_efficiency", s.link.nic_efficiency},
                     {"per_write_us", s.link.per_write_us},
                     {"nvlink_gbps", s.link.nvlink_gbps},
                     {"allgather_call_us", s.link.allgather_call_us},
                     {"barrier_us", s.link.barrier_us},
                     {"one_link_per_host", s.link.one_link_per_host}};
  return j.dump(2);
}

}  // namespace wsync
