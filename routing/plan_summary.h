// Plan summary and update-time prediction for a RoutingTable.
//
// Called by `wsync plan` (text and JSON output), `wsync bench plan`, and
// later by the controller's /v1/status. Pure arithmetic over the table: no
// I/O. The link model is deliberately simple and printed with every
// prediction so a reader can check each assumption.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "routing/rank_plan.h"
#include "routing/routing_table.h"

namespace wsync {

// Assumptions behind a predicted update time. Defaults describe the
// reference cluster (one 400 Gbit/s NIC per GPU, NVLink inside a node).
struct LinkModel {
  double nic_gbps = 400.0;          // per NIC, each direction (Gbit/s)
  double nic_efficiency = 0.9;      // fraction of line rate a large write reaches
  double per_write_us = 1.0;        // sender CPU cost to post one write
  // Unshard: bytes from peers on the same host move over NVLink; bytes from
  // other hosts cross the NICs. Modeled from the rank plans (the planned
  // exchange's pieces, peer by peer) when Summarize has them, else as
  // full_tensor: bytes from other hosts enter each host once over its NICs
  // (hierarchical all-gather) and are shared over NVLink from there.
  double nvlink_gbps = 3600.0;      // per GPU, each direction (H100/H200: 450 GB/s)
  double allgather_call_us = 150.0; // fixed cost of one unshard collective (launch + sync)
  double barrier_us = 200.0;        // one Gloo barrier between MeshGroups
  // Every NIC of a host shares one link (an emulated host's one veth, or a
  // host whose NICs sit behind one uplink): bytes are counted per host.
  bool one_link_per_host = false;
  // Delta versions (docs/DELTAS.md), predicted beside whole ones when
  // delta_fraction > 0: the fraction of written bytes a delta version puts
  // on the wire, and the rates, in GB/s of written bytes, at which a trainer
  // rank finds what changed (encode: reading its copy and the new bytes) and
  // an inference rank applies it at commit.
  double delta_fraction = 0;
  double delta_find_gbps = 0;
  double delta_apply_gbps = 0;
  // GB/s of written bytes one trainer rank copies, quantizes and packs
  // (0: free, as on a GPU, where it takes milliseconds). A whole version
  // hides this work behind its writes; a delta version, with a fraction of
  // the bytes to send, waits for it, on the same thread as the unshard and
  // the find.
  double pack_gbps = 0;
};

struct Distribution {
  double min = 0, mean = 0, max = 0;
  uint64_t count = 0;           // how many entities (ranks, NICs)
  double imbalance() const { return mean > 0 ? max / mean : 0; }  // max / mean
};

struct MeshGroupSummary {
  std::string name;
  int32_t ranks = 0;
  int32_t sources = 0;          // trainer tensors in the group
  uint64_t stored_bytes = 0;    // trainer bytes of those tensors
  uint64_t wire_bytes = 0;
  uint64_t writes = 0;
  Distribution sender_bytes;    // over the group's ranks
  uint64_t unshard_bytes = 0;   // received from peers to unshard, all ranks
  double allgather_seconds = 0; // predicted unshard time, slowest rank
  double write_seconds = 0;     // predicted: busiest sender NIC, write posting
  double seconds = 0;           // predicted, pipelined: max of the two + fill
};

struct PlanSummary {
  int32_t trainer_ranks = 0;
  int32_t inference_ranks = 0;
  int32_t source_tensors = 0;
  int32_t dest_tensors = 0;       // destination tensors (scales counted separately)
  int32_t dest_scales = 0;
  uint64_t total_bytes = 0;       // model as stored on the trainers
  uint64_t dest_bytes = 0;        // bytes all inference ranks hold (weights + scales)
  uint64_t wire_bytes = 0;        // bytes written over the network per update
  uint64_t writes = 0;            // one-sided writes: a strided op's planes each
  uint64_t ops = 0;               // the plan's entries: a strided op once
  Distribution sender_bytes;      // per trainer rank
  Distribution sender_nic_bytes;  // per trainer (host, nic)
  Distribution receiver_nic_bytes;  // per inference (host, nic)
  Distribution writes_per_sender;
  std::vector<MeshGroupSummary> mesh_groups;

  // Unshard traffic, summed over trainer ranks: what they receive from their
  // FSDP peers under the plan the executor runs (exchange_bytes; from the
  // rank plans), against what full_tensor would move (every rank of a gather
  // group receiving the whole box but its own shard). Without rank plans
  // the prediction assumes full_tensor and exchange_bytes equals it.
  bool from_rank_plans = false;
  uint64_t exchange_bytes = 0;
  uint64_t exchange_cross_host_bytes = 0;  // of which between hosts
  // Of those, bytes a host receives from one peer more than once (several
  // of its ranks receiving the same elements: full_tensor's all-gather, or
  // replicas each receiving what they share); the rest cross once.
  uint64_t exchange_repeat_cross_host_bytes = 0;
  uint64_t full_tensor_bytes = 0;
  // (rank, source) pairs by how the executor unshards them.
  uint64_t unshard_pieces = 0;      // planned exchange: only the rows it writes
  uint64_t unshard_gathers = 0;     // all-gather (full_tensor)
  uint64_t unshard_none = 0;        // written from the shard as it is

  LinkModel link;
  double predicted_seconds = 0;
  double sender_bound_seconds = 0;    // slowest rank through its MeshGroups
  double receive_bound_seconds = 0;  // busiest inference NIC at line rate
  // The trainer's stall: until every rank has read its last local shard
  // (the last source's unshard done; its writes may still be in flight),
  // when training may go on.
  double predicted_reads_done_seconds = 0;
  double wire_limit_seconds = 0;      // busiest NIC (either side), bytes only
  // With LinkModel::delta_fraction: the same for a delta version. A
  // rank's unshard, pack and find run one after the other, its smaller
  // writes beside them; the receiver's NIC takes the fraction, then the
  // apply runs over every byte the deltas stand for.
  double delta_predicted_seconds = 0;
  double delta_sender_bound_seconds = 0;
  double delta_receive_bound_seconds = 0;
};

// `rank_plans`, when given (every trainer rank's, ExtractTrainerRankPlans),
// make the unshard term exactly the executor's: its exchange pieces or
// all-gathers, peer by peer.
PlanSummary Summarize(const RoutingTable& table, const LinkModel& link,
                      const std::vector<TrainerRankPlan>* rank_plans = nullptr);
// The same with every trainer rank's plan extracted and dropped in turn,
// never all at once (Kimi-K2's 256 plans held 0.6 GB without their writes,
// and allocating them was half of a planning pass). Fails like
// ExtractTrainerRankPlans; `writes`: with each rank's writes, so a plan the
// pipeline would refuse (fp8 blocks split by the unshard) fails here too.
StatusOr<PlanSummary> SummarizeFromRankPlans(const RoutingTable& table, const TrainerSpec& trainer,
                                             const InferenceSpec& inference, const LinkModel& link,
                                             bool writes = false);

// Human-readable report (several lines) and the JSON form (--format json).
std::string FormatSummaryText(const PlanSummary& s);
std::string FormatSummaryJson(const PlanSummary& s);

// SVG heatmap of bytes from every trainer rank (rows) to every inference
// rank (columns).
std::string RenderTrafficHeatmapSvg(const RoutingTable& table);

}  // namespace wsync
