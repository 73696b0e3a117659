// DTensor / FSDP2 sharding arithmetic: which slice of a global tensor a rank
// holds before and after full_tensor.
//
// Used by validation (local_shape/local_offset must equal this) and by the
// planner (what a trainer rank holds after unshard). The rules follow
// torch.chunk exactly, because that is what DTensor Shard(d) and FSDP2 use:
// chunk size ceil(n/k), the last chunk shorter, trailing chunks empty.
#pragma once

#include <cstdint>
#include <vector>

#include "routing/metadata.h"

namespace wsync {

// A half-open interval [offset, offset + size) on one tensor dim.
struct Range {
  int64_t offset = 0;
  int64_t size = 0;
  bool operator==(const Range&) const = default;
};

// Piece `index` of `count` of a length-n range, torch.chunk style.
Range ChunkRange(int64_t n, int64_t count, int64_t index);

// The local shard a rank at `coord` holds: mesh dims are applied in order,
// each Shard(d) chunking the current range of tensor dim d. Inputs must be
// consistent (placements.size() == mesh_shape.size() == coord.size(), shard
// dims < global.size()); validation checks that first.
void LocalShard(const Shape& global, const Shape& mesh_shape,
                const std::vector<int64_t>& coord,
                const std::vector<Placement>& placements,
                std::vector<Range>* out);

// What the rank at `coord` holds after all-gathering the mesh dims flagged in
// `gathered`: the union of the local shards of every coordinate that agrees
// with `coord` on the other dims. Returns false if that union is not one box
// on some tensor dim (a gathered dim sharding inside a non-gathered one on the
// same tensor dim with interleaved pieces); `bad_dim` then names that dim.
bool HeldShard(const Shape& global, const Shape& mesh_shape,
               const std::vector<int64_t>& coord,
               const std::vector<Placement>& placements,
               const std::vector<bool>& gathered, std::vector<Range>* out,
               int* bad_dim);

}  // namespace wsync
