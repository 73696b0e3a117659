// Who holds what after unshard: the holder layout of one trainer tensor.
//
// Used by the planner. After full_tensor over a MeshGroup's gather dims, the
// ranks of a mesh fall into classes that hold the same box of a tensor (all
// ranks for a fully gathered tensor; one class per EP slice for experts).
// The class boxes tile the tensor on a grid of per-dim cut points, so a
// needed box is split along the cuts and each piece has exactly one class of
// candidate senders. Classes are computed once per (mesh, placements, shape)
// and shared, so 128 ranks holding the same dense tensor cost one list.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "routing/metadata.h"
#include "routing/routing_table.h"

namespace wsync {

// A device mesh as the planner sees it: who sits at each coordinate.
struct MeshView {
  Shape shape;
  std::vector<std::string> dim_names;
  std::vector<int32_t> rank_at;  // row-major flat coordinate -> trainer rank
};

struct HolderClass {
  Box box;                      // held after unshard (non-empty)
  std::vector<int32_t> ranks;   // ascending
};

struct HolderLayout {
  std::vector<HolderClass> classes;                 // sorted by box offset
  std::array<std::vector<int64_t>, kMaxDims> cuts;  // per dim: 0 = c0 < c1 < ... = n

  // Index of the class whose box contains `point`, or -1.
  int FindClass(const std::array<int64_t, kMaxDims>& point, int ndim) const;
};

// Fails (message without prefix) when gathering leaves some rank a
// non-contiguous slice.
StatusOr<HolderLayout> ComputeHolderLayout(const Shape& global, const MeshView& mesh,
                                           const std::vector<Placement>& placements,
                                           const std::vector<bool>& gathered);

}  // namespace wsync
