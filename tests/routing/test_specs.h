// Test helpers for routing_test: spec builders and an independent plan
// checker. Nothing here calls the code under test (chunking, mapping,
// planner): sharding is torch.chunk written out again, and the checker works
// on raw bytes, so a bug in the planner cannot hide in its own check.
#pragma once

#include "routing/rank_plan.h"

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "routing/metadata.h"
#include "routing/routing_table.h"

namespace wsync::testing {

// torch.chunk(n, k): (offset, size) of every piece, trailing ones empty.
std::vector<std::pair<int64_t, int64_t>> TorchChunks(int64_t n, int64_t k);

struct MeshDef {
  std::string id;
  Shape shape;
  std::vector<std::string> dims;
};
struct GroupDef {
  std::string name;
  std::string mesh;
  std::vector<std::string> gather;
};
struct ParamDef {
  std::string name;
  Shape shape;
  DType dtype = DType::kBF16;
  std::string group;
  std::vector<Placement> placements;
};

// Every mesh spans ranks 0..N-1, rank = row-major flat coordinate. Ranks
// share hosts `ranks_per_host` at a time, one NIC per GPU.
TrainerSpec BuildTrainer(const std::vector<MeshDef>& meshes, const std::vector<GroupDef>& groups,
                         const std::vector<ParamDef>& params, int ranks_per_host = 8);

// Appends a tensor (and its scale for fp8) to `rank`, packed in region
// "weights" whose size grows to fit.
void AddTensor(InferenceRank* rank, const std::string& name, const Shape& shape, DType dtype,
               std::optional<TpSlice> tp = std::nullopt,
               std::optional<ExpertRange> experts = std::nullopt);

// True if what `rank` holds of `name` after unshard (per the specs' local
// boxes) is one box; false if gathering leaves it holes.
bool HeldIsBox(const TrainerSpec& trainer, int32_t rank, const std::string& name);

// What each destination element received: (source index, source flat index),
// or (-1, -1) if nothing.
using ElementOrigin = std::pair<int32_t, int64_t>;

struct CheckResult {
  std::string error;  // empty when every check passed
  // Per destination, per element: where it came from (weight writes only).
  std::vector<std::vector<ElementOrigin>> origin;
};

// Independent checks: ops in bounds; every destination weight and scale byte
// written exactly once; bytes = elements x dtype size; each op's source box
// (elements, or blocks of 128 for scales) held by its sender after unshard,
// computed from the specs' local_offset/local_shape.
CheckResult CheckPlan(const TrainerSpec& trainer, const InferenceSpec& inference,
                      const RoutingTable& table);

// Independent checks of the planned exchange, over every trainer rank's
// extracted plan: each rank holds after unshard everything its writes read
// (fp8 boxes widened to whole 128x128 blocks); what rank i expects from rank
// j is exactly what j sends to i; what a rank sends lies inside its own
// shard (from the spec's local_offset/local_shape); the received pieces tile
// the held rows. Also totals what the ranks receive from peers against what
// full_tensor would have moved to them.
struct ExchangeCheck {
  std::string error;  // empty when every check passed
  // Set when the pipeline refuses the layout (ExtractTrainerRankPlan's own
  // error, e.g. a tensor sharded on two gathered mesh dims); nothing else
  // was checked then.
  std::string unsupported;
  uint64_t exchange_bytes = 0;
  uint64_t full_tensor_bytes = 0;
  int sources_exchanged = 0;  // (rank, source) pairs
  int sources_narrowed = 0;   // of them, whose pieces are narrowed to columns
};
ExchangeCheck CheckExchange(const TrainerSpec& trainer, const InferenceSpec& inference, const RoutingTable& table);

}  // namespace wsync::testing
