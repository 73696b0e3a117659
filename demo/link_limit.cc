#include "demo/link_limit.h"

#include <algorithm>
#include <set>

namespace wsync::demo {

LinkLimit ComputeLinkLimit(const RoutingTable& table, const TrainerSpec& trainer, const InferenceSpec& inference,
                           double rate_gbit) {
  LinkLimit limit;
  for (const TrainerRank& r : trainer.ranks) limit.hosts[r.host];
  for (const InferenceRank& r : inference.ranks) limit.hosts[r.host];
  for (const WriteOp& op : table.ops) {
    limit.hosts[trainer.ranks[op.src_rank].host].write_egress += op.bytes;
    limit.hosts[inference.ranks[op.dst_rank].host].write_ingress += op.bytes;
  }

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
  for (auto& [host, b] : limit.hosts) {
    if (b.egress() > limit.busiest_bytes) {
      limit.busiest_bytes = b.egress();
      limit.busiest = host + " egress";
    }
    if (b.ingress() > limit.busiest_bytes) {
      limit.busiest_bytes = b.ingress();
      limit.busiest = host + " ingress";
    }
  }
  limit.seconds = rate_gbit > 0 ? limit.busiest_bytes * 8.0 / (rate_gbit * 1e9) : 0;
  return limit;
}

}  // namespace wsync::demo
