#include "routing/holders.h"

#include <algorithm>
#include <map>

#include "routing/chunking.h"

namespace wsync {

int HolderLayout::FindClass(const std::array<int64_t, kMaxDims>& point, int ndim) const {
  for (size_t i = 0; i < classes.size(); ++i) {
    const Box& b = classes[i].box;
    bool inside = true;
    for (int d = 0; d < ndim && inside; ++d)
      inside = point[d] >= b.offset[d] && point[d] < b.offset[d] + b.size[d];
    if (inside) return static_cast<int>(i);
  }
  return -1;
}

StatusOr<HolderLayout> ComputeHolderLayout(const Shape& global, const MeshView& mesh,
                                           const std::vector<Placement>& placements,
                                           const std::vector<bool>& gathered) {
  const int nd = static_cast<int>(global.size());
  const size_t md = mesh.shape.size();
  std::map<std::vector<int64_t>, size_t> by_box;  // offsets+sizes -> class
  HolderLayout layout;
  std::vector<int64_t> coord(md, 0);
  std::vector<Range> held;
  std::vector<int64_t> key;
  for (size_t flat = 0; flat < mesh.rank_at.size(); ++flat) {
    size_t rest = flat;
    for (size_t d = md; d-- > 0;) {
      coord[d] = static_cast<int64_t>(rest % mesh.shape[d]);
      rest /= mesh.shape[d];
    }
    int bad_dim = -1;
    if (!HeldShard(global, mesh.shape, coord, placements, gathered, &held, &bad_dim))
      return InvalidArgument("after gathering, rank " + std::to_string(mesh.rank_at[flat]) +
                             " would hold a non-contiguous slice of dim " + std::to_string(bad_dim) +
                             " (gathered mesh dims shard inside non-gathered ones on that dim)");
    bool empty = false;
    key.clear();
    for (int d = 0; d < nd; ++d) {
      empty |= held[d].size == 0;
      key.push_back(held[d].offset);
      key.push_back(held[d].size);
    }
    if (empty) continue;
    auto [it, inserted] = by_box.emplace(key, layout.classes.size());
    if (inserted) {
      HolderClass c;
      c.box.ndim = static_cast<int8_t>(nd);
      for (int d = 0; d < nd; ++d) {
        c.box.offset[d] = held[d].offset;
        c.box.size[d] = held[d].size;
      }
      layout.classes.push_back(std::move(c));
    }
    layout.classes[it->second].ranks.push_back(mesh.rank_at[flat]);
  }
  for (HolderClass& c : layout.classes) std::sort(c.ranks.begin(), c.ranks.end());
  std::sort(layout.classes.begin(), layout.classes.end(), [nd](const HolderClass& a, const HolderClass& b) {
    for (int d = 0; d < nd; ++d)
      if (a.box.offset[d] != b.box.offset[d]) return a.box.offset[d] < b.box.offset[d];
    return false;
  });
  for (int d = 0; d < nd; ++d) {
    std::vector<int64_t>& cuts = layout.cuts[d];
    cuts.push_back(0);
    cuts.push_back(global[d]);
    for (const HolderClass& c : layout.classes) {
      cuts.push_back(c.box.offset[d]);
      cuts.push_back(c.box.offset[d] + c.box.size[d]);
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  }
  return layout;
}

}  // namespace wsync
