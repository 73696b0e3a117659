#include "routing/chunking.h"

#include <algorithm>

namespace wsync {

Range ChunkRange(int64_t n, int64_t count, int64_t index) {
  if (n <= 0 || count <= 0) return {0, 0};
  const int64_t chunk = (n + count - 1) / count;
  const int64_t begin = std::min(n, index * chunk);
  const int64_t end = std::min(n, begin + chunk);
  return {begin, end - begin};
}

void LocalShard(const Shape& global, const Shape& mesh_shape,
                const std::vector<int64_t>& coord,
                const std::vector<Placement>& placements,
                std::vector<Range>* out) {
  out->assign(global.size(), Range{});
  for (size_t d = 0; d < global.size(); ++d) (*out)[d] = {0, global[d]};
  for (size_t m = 0; m < placements.size(); ++m) {
    const Placement& p = placements[m];
    if (p.kind != Placement::Kind::kShard) continue;
    Range& r = (*out)[p.dim];
    const Range sub = ChunkRange(r.size, mesh_shape[m], coord[m]);
    r.offset = sub.size > 0 ? r.offset + sub.offset : r.offset + r.size;
    r.size = sub.size;
  }
}

namespace {

// Union of the intervals of tensor dim `dim` over every assignment of the
// gathered mesh dims that shard it; false if the union has a hole.
bool HeldRange(int64_t n, const Shape& mesh_shape,
               const std::vector<int64_t>& coord,
               const std::vector<Placement>& placements,
               const std::vector<bool>& gathered, int dim, Range* out) {
  std::vector<int> shard_dims;   // mesh dims sharding `dim`, in order
  std::vector<int> varying;      // positions in shard_dims that are gathered
  for (size_t m = 0; m < placements.size(); ++m) {
    if (placements[m].kind == Placement::Kind::kShard && placements[m].dim == dim) {
      if (gathered[m]) varying.push_back(static_cast<int>(shard_dims.size()));
      shard_dims.push_back(static_cast<int>(m));
    }
  }
  // The gathered mesh dims the innermost that shard `dim` (always so with
  // one mesh dim sharding it, as FSDP's): the pieces they give tile the
  // range the outer ones leave, so that range is the union; no need to
  // enumerate them (a 128-way gather was 128 pieces, per tensor and rank,
  // for each of the controller's 256 trainer slices).
  const size_t outer = shard_dims.size() - varying.size();
  bool innermost = true;
  for (size_t i = 0; i < varying.size(); ++i) innermost = innermost && varying[i] == static_cast<int>(outer + i);
  if (innermost) {
    Range r{0, n};
    for (size_t i = 0; i < outer; ++i) {
      const Range sub = ChunkRange(r.size, mesh_shape[shard_dims[i]], coord[shard_dims[i]]);
      r.offset = sub.size > 0 ? r.offset + sub.offset : r.offset + r.size;
      r.size = sub.size;
    }
    *out = r.size > 0 ? r : Range{0, 0};
    return true;
  }
  std::vector<int64_t> c(shard_dims.size());
  for (size_t i = 0; i < shard_dims.size(); ++i) c[i] = coord[shard_dims[i]];
  for (int v : varying) c[v] = 0;
  std::vector<Range> pieces;
  while (true) {
    Range r{0, n};
    for (size_t i = 0; i < shard_dims.size(); ++i) {
      const Range sub = ChunkRange(r.size, mesh_shape[shard_dims[i]], c[i]);
      r.offset = sub.size > 0 ? r.offset + sub.offset : r.offset + r.size;
      r.size = sub.size;
    }
    if (r.size > 0) pieces.push_back(r);
    size_t k = 0;  // odometer over the gathered coordinates
    for (; k < varying.size(); ++k) {
      if (++c[varying[k]] < mesh_shape[shard_dims[varying[k]]]) break;
      c[varying[k]] = 0;
    }
    if (k == varying.size()) break;
  }
  if (pieces.empty()) {
    *out = {0, 0};
    return true;
  }
  std::sort(pieces.begin(), pieces.end(),
            [](const Range& a, const Range& b) { return a.offset < b.offset; });
  int64_t end = pieces[0].offset;
  for (const Range& r : pieces) {
    if (r.offset > end) return false;
    end = std::max(end, r.offset + r.size);
  }
  *out = {pieces[0].offset, end - pieces[0].offset};
  return true;
}

}  // namespace

bool HeldShard(const Shape& global, const Shape& mesh_shape,
               const std::vector<int64_t>& coord,
               const std::vector<Placement>& placements,
               const std::vector<bool>& gathered, std::vector<Range>* out,
               int* bad_dim) {
  out->assign(global.size(), Range{});
  for (size_t d = 0; d < global.size(); ++d) {
    if (!HeldRange(global[d], mesh_shape, coord, placements, gathered,
                   static_cast<int>(d), &(*out)[d])) {
      if (bad_dim) *bad_dim = static_cast<int>(d);
      return false;
    }
  }
  return true;
}

}  // namespace wsync
