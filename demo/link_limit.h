// The bytes-over-links limit of one update on a cluster whose hosts each
// have one link (each direction capped at the same rate), as `wsync bench
// cluster` emulates: the update cannot finish before the busiest host link
// has carried its bytes.
//
// Per host and direction it counts (a lower bound, from the routing table):
//   - the weight writes its ranks issue (egress) or receive (ingress);
//   - full_tensor traffic between hosts: for every source tensor and every
//     group of ranks that hold the same box after unshard, a host must
//     receive the part of the box that no rank on it holds before unshard,
//     and must send the part only it holds to the other hosts once (as a
//     hierarchical all-gather would; inside a host the bytes do not touch
//     the link).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "routing/metadata.h"
#include "routing/rank_plan.h"
#include "routing/routing_table.h"

namespace wsync::demo {

struct HostBytes {
  uint64_t write_egress = 0, write_ingress = 0;
  uint64_t gather_egress = 0, gather_ingress = 0;
  uint64_t egress() const { return write_egress + gather_egress; }
  uint64_t ingress() const { return write_ingress + gather_ingress; }
};

struct LinkLimit {
  std::map<std::string, HostBytes> hosts;  // by host name ("trainer-0", "infer-1")
  std::string busiest;                     // "trainer-0 egress"
  uint64_t busiest_bytes = 0;
  double seconds = 0;                      // busiest_bytes / rate
};

LinkLimit ComputeLinkLimit(const RoutingTable& table, const TrainerSpec& trainer, const InferenceSpec& inference,
                           double rate_gbit);

// The limit for any plan, from the layouts alone: every inference host must
// receive what its ranks hold (weights and scales: `table.destinations`, the
// engines' layout, not the plan's writes), and all of it must leave the
// trainer hosts, at best evenly (each its share, as writes or exchange).
// Per host: write_ingress for an inference host, write_egress (the share)
// for a trainer host.
LinkLimit ComputeAnyPlanLimit(const RoutingTable& table, const TrainerSpec& trainer, const InferenceSpec& inference,
                              double rate_gbit);

// The planned exchange's bytes between hosts, from the trainer rank plans
// (what the executor moves): per host, gather_ingress / gather_egress, with
// the writes as in ComputeLinkLimit. For a plan whose sources all-gather it
// counts each peer's chunk (a direct all-gather).
LinkLimit ComputeExchangeLinkBytes(const RoutingTable& table, const TrainerSpec& trainer,
                                   const InferenceSpec& inference, const std::vector<TrainerRankPlan>& rank_plans,
                                   double rate_gbit);

}  // namespace wsync::demo
