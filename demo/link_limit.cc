#include "demo/link_limit.h"

#include <algorithm>
#include <set>

namespace wsync::demo {
namespace {

void FindBusiest(LinkLimit* limit, double rate_gbit) {
  for (auto& [host, b] : limit->hosts) {
    if (b.egress() > limit->busiest_bytes) {
      limit->busiest_bytes = b.egress();
      limit->busiest = host + " egress";
    }
    if (b.ingress() > limit->busiest_bytes) {
      limit->busiest_bytes = b.ingress();
      limit->busiest = host + " ingress";
    }
  }
  limit->seconds = rate_gbit > 0 ? limit->busiest_bytes * 8.0 / (rate_gbit * 1e9) : 0;
}

void AddWrites(const RoutingTable& table, const TrainerSpec& trainer, const InferenceSpec& inference,
               LinkLimit* limit) {
  for (const TrainerRank& r : trainer.ranks) limit->hosts[r.host];
  for (const InferenceRank& r : inference.ranks) limit->hosts[r.host];
  for (const WriteOp& op : table.ops) {
    limit->hosts[trainer.ranks[op.src_rank].host].write_egress += op.bytes;
    limit->hosts[inference.ranks[op.dst_rank].host].write_ingress += op.bytes;
  }
}

}  // namespace

LinkLimit ComputeAnyPlanLimit(const RoutingTable& table, const TrainerSpec& trainer, const InferenceSpec& inference,
                              double rate_gbit) {
  LinkLimit limit;
  std::set<std::string> trainer_hosts;
  for (const TrainerRank& r : trainer.ranks) trainer_hosts.insert(r.host);
  for (const InferenceRank& r : inference.ranks) limit.hosts[r.host];
  uint64_t total = 0;
  for (const DestTensor& d : table.destinations) {
    limit.hosts[inference.ranks[d.rank].host].write_ingress += d.bytes + d.scale_bytes;
    total += d.bytes + d.scale_bytes;
  }
  const uint64_t share = trainer_hosts.empty() ? 0 : (total + trainer_hosts.size() - 1) / trainer_hosts.size();
  for (const std::string& h : trainer_hosts) limit.hosts[h].write_egress = share;
  FindBusiest(&limit, rate_gbit);
  return limit;
}

LinkLimit ComputeExchangeLinkBytes(const RoutingTable& table, const TrainerSpec& trainer,
                                   const InferenceSpec& inference, const std::vector<TrainerRankPlan>& rank_plans,
                                   double rate_gbit) {
  LinkLimit limit;
  AddWrites(table, trainer, inference, &limit);
  const auto host = [&](int32_t r) -> const std::string& { return trainer.ranks[r].host; };
  for (const TrainerRankPlan& plan : rank_plans) {
    for (const RankMeshGroup& group : plan.groups) {
      for (const RankSource& src : group.sources) {
        if (src.gather_dim < 0) continue;
        for (size_t i = 0; i < src.gather_ranks.size(); ++i) {
          const int32_t peer = src.gather_ranks[i];
          if (peer == plan.rank || host(peer) == host(plan.rank)) continue;
          const uint64_t bytes = UnshardBytesFrom(src, static_cast<int64_t>(i));
          limit.hosts[host(plan.rank)].gather_ingress += bytes;
          limit.hosts[host(peer)].gather_egress += bytes;
        }
      }
    }
  }
  FindBusiest(&limit, rate_gbit);
  return limit;
}

LinkLimit ComputeLinkLimit(const RoutingTable& table, const TrainerSpec& trainer, const InferenceSpec& inference,
                           double rate_gbit) {
  LinkLimit limit;
  AddWrites(table, trainer, inference, &limit);

  // Local (pre-unshard) shard bytes per (tensor, rank).
  std::map<std::string, std::map<int32_t, uint64_t>> local;
  for (const TrainerRank& r : trainer.ranks) {
    for (const TrainerParam& p : r.params) {
      uint64_t elems = 1;
      for (int64_t d : p.local_shape) elems *= static_cast<uint64_t>(d);
      local[p.name][r.rank] = elems * DTypeSize(p.dtype);
    }
  }
  for (const SourceTensor& s : table.sources) {
    // Group the holders by the box they hold after unshard.
    std::vector<bool> done(s.holders.size(), false);
    for (size_t i = 0; i < s.holders.size(); ++i) {
      if (done[i]) continue;
      const Box& box = s.holders[i].box;
      const uint64_t box_bytes = static_cast<uint64_t>(box.NumElements()) * DTypeSize(s.dtype);
      std::map<std::string, uint64_t> held_before;  // host -> bytes its ranks hold before unshard
      for (size_t j = i; j < s.holders.size(); ++j) {
        if (done[j] || !(s.holders[j].box == box)) continue;
        done[j] = true;
        const int32_t rank = s.holders[j].rank;
        held_before[trainer.ranks[rank].host] += local[s.name][rank];
      }
      if (held_before.size() < 2) continue;  // the whole group on one host: no link traffic
      for (auto& [host, held] : held_before) {
        const uint64_t have = std::min(held, box_bytes);
        uint64_t others_need = 0;
        for (auto& [other, other_held] : held_before) {
          if (other != host) others_need = std::max(others_need, box_bytes - std::min(other_held, box_bytes));
        }
        limit.hosts[host].gather_ingress += box_bytes - have;
        limit.hosts[host].gather_egress += std::min(have, others_need);
      }
    }
  }
  FindBusiest(&limit, rate_gbit);
  return limit;
}

}  // namespace wsync::demo
