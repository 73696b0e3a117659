// A small two-MeshGroup setup for executor tests: 4 trainer ranks (dense
// weights sharded over 4, experts over fsdp 2 x ep 2), 2 inference ranks
// (tensor parallel 2 on rows or on columns, fp8 block-quantized qk and
// experts), real libfabric
// engines on both sides and the routing library's planner in between. The
// experts' FSDP shards (192 of 384 rows) cut an fp8 block, so a planned
// exchange moves rows of every expert of a stack.
//
// The expected destination bytes come from ExpectedRegion(), which builds
// each inference tensor from the full weights by hand (slice, concatenate,
// quantize with the pipeline/fp8.h reference) and never looks at the plan.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "routing/metadata.h"
#include "routing/rank_plan.h"
#include "routing/routing_table.h"
#include "transport/engine.h"

namespace wsync::testing {

inline constexpr int kTrainers = 4;
inline constexpr int kInference = 2;
inline constexpr uint8_t kFill = 0xEE;  // receiver memory before each version

// The full (global) bf16 weights of one version, by trainer name.
using FullWeights = std::map<std::string, std::vector<uint16_t>>;

struct InferenceTarget {
  std::unique_ptr<transport::Engine> engine;
  std::vector<uint8_t> memory;
  std::unique_ptr<transport::MemoryRegion> region;
};

struct UpdateFixture {
  TrainerSpec trainer;
  InferenceSpec inference;
  MappingSpec mapping;
  RoutingTable table;
  std::vector<TrainerRankPlan> plans;        // index = trainer rank
  std::vector<InferenceTarget> targets;      // index = inference rank
  std::vector<uint32_t> expected_arrivals;   // per inference rank, per version
  uint64_t region_bytes = 0;
};

// The trainer spec alone (no engines): what an agent process needs.
TrainerSpec MakeTestTrainerSpec();

// Shapes of the trainer tensors (global).
const std::map<std::string, Shape>& TrainerShapes();

// Specs, receivers (registered, descriptors filled in), plan and per-rank
// plans. `provider`: "shm" or "tcp;ofi_rxm".
// `exchange`: plan the exchange (PlanOptions::exchange). Tests whose agents
// take their plan from a controller must match its planning (full_tensor).
// `min_shard_piece_bytes` (PlanOptions): 0 cuts even small tensors at shard
// edges; the planner's default leaves them whole, so their writers receive
// the rest (narrowed to the columns they write) and a tensor every
// inference rank holds is written by one trainer rank.
StatusOr<std::unique_ptr<UpdateFixture>> MakeUpdateFixture(const std::string& provider, bool exchange = false,
                                                            uint64_t min_shard_piece_bytes = 0);

// Deterministic, version-dependent full weights (finite, varied magnitudes
// per 128-block so fp8 scales differ).
FullWeights MakeFullWeights(uint64_t version);

// Rank `rank`'s local shard of `name`, cut from the full tensor by its
// TrainerParam local_offset/local_shape.
std::vector<uint8_t> LocalShard(const TrainerParam& p, const FullWeights& full);

// The bytes inference rank `rank`'s region must hold after the update.
std::vector<uint8_t> ExpectedRegion(int rank, const FullWeights& full, uint64_t region_bytes);

}  // namespace wsync::testing
