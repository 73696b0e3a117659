// ValidateTrainerSpec: see validate.h.
#include <string_view>
#include <unordered_map>

#include "routing/chunking.h"
#include "routing/routing_table.h"
#include "routing/validate.h"

namespace wsync {

namespace {

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string NamesStr(const std::vector<std::string>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + s[i];
  return out + "]";
}

std::string PlacementsStr(const std::vector<Placement>& ps) {
  std::string out = "[";
  for (size_t i = 0; i < ps.size(); ++i) {
    out += i ? ", " : "";
    out += ps[i].kind == Placement::Kind::kShard ? "Shard(" + std::to_string(ps[i].dim) + ")"
                                                 : std::string("Replicate()");
  }
  return out + "]";
}

struct MeshInfo {
  const MeshCoord* first = nullptr;
  int32_t first_rank = -1;
  std::vector<int32_t> rank_at;  // flat coord -> rank, -1 if none
};

Status Fail(const std::string& source, int32_t rank, const std::string& what) {
  return InvalidArgument(source + ": rank " + std::to_string(rank) + ": " + what);
}

Status CheckParamShape(const std::string& source, const TrainerRank& rank, const TrainerParam& p,
                       const MeshCoord& mesh, std::vector<Range>* scratch) {
  const std::string where = "tensor '" + p.name + "': ";
  const size_t nd = p.global_shape.size();
  if (nd == 0 || nd > static_cast<size_t>(kMaxDims))
    return Fail(source, rank.rank, where + "global_shape " + ShapeStr(p.global_shape) +
                                       " must have 1 to " + std::to_string(kMaxDims) + " dims");
  for (int64_t d : p.global_shape)
    if (d < 0) return Fail(source, rank.rank, where + "negative global_shape " + ShapeStr(p.global_shape));
  if (!ShapeBytes(p.global_shape, DTypeSize(p.dtype)))
    return Fail(source, rank.rank, where + "global_shape " + ShapeStr(p.global_shape) + " is too large (" +
                                       "over 2^63 bytes)");
  if (p.placements.size() != mesh.shape.size())
    return Fail(source, rank.rank,
                where + std::to_string(p.placements.size()) + " placements " +
                    PlacementsStr(p.placements) + " on mesh '" + mesh.mesh + "' of " +
                    std::to_string(mesh.shape.size()) + " dims (expected one per mesh dim)");
  for (const Placement& pl : p.placements)
    if (pl.kind == Placement::Kind::kShard && (pl.dim < 0 || static_cast<size_t>(pl.dim) >= nd))
      return Fail(source, rank.rank, where + "placement Shard(" + std::to_string(pl.dim) +
                                         ") names a dim outside global_shape " +
                                         ShapeStr(p.global_shape));
  if (p.local_shape.size() != nd || p.local_offset.size() != nd)
    return Fail(source, rank.rank, where + "local_shape " + ShapeStr(p.local_shape) +
                                       " / local_offset " + ShapeStr(p.local_offset) +
                                       " must have " + std::to_string(nd) + " dims like global_shape");
  LocalShard(p.global_shape, mesh.shape, mesh.coord, p.placements, scratch);
  bool empty = false;
  for (const Range& r : *scratch) empty |= r.size == 0;
  for (size_t d = 0; d < nd; ++d) {
    if ((*scratch)[d].size != p.local_shape[d] ||
        (!empty && (*scratch)[d].offset != p.local_offset[d])) {
      Shape want_shape(nd), want_offset(nd);
      for (size_t k = 0; k < nd; ++k) {
        want_shape[k] = (*scratch)[k].size;
        want_offset[k] = (*scratch)[k].offset;
      }
      return Fail(source, rank.rank,
                  where + "local_shape " + ShapeStr(p.local_shape) + " local_offset " +
                      ShapeStr(p.local_offset) + " do not match " + PlacementsStr(p.placements) +
                      " at coord " + ShapeStr(mesh.coord) + " of mesh '" + mesh.mesh + "' " +
                      ShapeStr(mesh.shape) + " (expected local_shape " + ShapeStr(want_shape) +
                      " local_offset " + ShapeStr(want_offset) + ", torch.chunk sharding)");
    }
  }
  return Status::Ok();
}

}  // namespace

std::optional<int64_t> ShapeBytes(const std::vector<int64_t>& shape, int64_t elem_size) {
  int64_t n = elem_size;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return std::nullopt;
  return n;
}

Status ValidateTrainerSpec(const TrainerSpec& spec, const std::string& source) {
  WSYNC_RETURN_IF_ERROR(ValidateRankSequence(spec.ranks, "trainer", source));
  // Meshes: one shape/dim-name set per id, every coordinate exactly once.
  std::unordered_map<std::string_view, MeshInfo> meshes;
  std::vector<std::string_view> mesh_order;  // first appearance, for deterministic errors
  for (const TrainerRank& rank : spec.ranks) {
    for (size_t mi = 0; mi < rank.meshes.size(); ++mi) {
      const MeshCoord& m = rank.meshes[mi];
      for (size_t mj = 0; mj < mi; ++mj)
        if (rank.meshes[mj].mesh == m.mesh)
          return Fail(source, rank.rank, "mesh '" + m.mesh + "' reported twice");
      if (m.shape.empty() || m.shape.size() != m.dim_names.size() || m.shape.size() != m.coord.size())
        return Fail(source, rank.rank, "mesh '" + m.mesh + "': shape " + ShapeStr(m.shape) +
                                           ", dim_names " + NamesStr(m.dim_names) + " and coord " +
                                           ShapeStr(m.coord) + " must have the same non-zero length");
      constexpr int64_t kMaxMeshRanks = int64_t{1} << 24;
      int64_t flat = 0, total = 1;
      for (size_t d = 0; d < m.shape.size(); ++d) {
        if (m.shape[d] <= 0 || m.coord[d] < 0 || m.coord[d] >= m.shape[d])
          return Fail(source, rank.rank, "mesh '" + m.mesh + "': coord " + ShapeStr(m.coord) +
                                             " outside shape " + ShapeStr(m.shape));
        // Checked before multiplying: [2^32, 2^32] must not wrap to 0.
        if (m.shape[d] > kMaxMeshRanks / total)
          return Fail(source, rank.rank, "mesh '" + m.mesh + "': shape " + ShapeStr(m.shape) +
                                             " too large (over 2^24 ranks)");
        flat = flat * m.shape[d] + m.coord[d];
        total *= m.shape[d];
      }
      MeshInfo& info = meshes[m.mesh];
      if (!info.first) {
        mesh_order.push_back(m.mesh);
        info.first = &m;
        info.first_rank = rank.rank;
        info.rank_at.assign(total, -1);
      } else if (info.first->shape != m.shape || info.first->dim_names != m.dim_names) {
        return Fail(source, rank.rank,
                    "mesh '" + m.mesh + "' has shape " + ShapeStr(m.shape) + " dim_names " +
                        NamesStr(m.dim_names) + " but rank " + std::to_string(info.first_rank) +
                        " reports shape " + ShapeStr(info.first->shape) + " dim_names " +
                        NamesStr(info.first->dim_names));
      }
      if (info.rank_at[flat] >= 0)
        return Fail(source, rank.rank, "mesh '" + m.mesh + "': coord " + ShapeStr(m.coord) +
                                           " is also reported by rank " +
                                           std::to_string(info.rank_at[flat]));
      info.rank_at[flat] = rank.rank;
    }
  }
  for (std::string_view id : mesh_order) {
    const MeshInfo& info = meshes.at(id);
    for (size_t flat = 0; flat < info.rank_at.size(); ++flat) {
      if (info.rank_at[flat] >= 0) continue;
      Shape coord(info.first->shape.size());
      size_t rest = flat;
      for (size_t d = coord.size(); d-- > 0;) {
        coord[d] = static_cast<int64_t>(rest % info.first->shape[d]);
        rest /= info.first->shape[d];
      }
      return InvalidArgument(source + ": mesh '" + std::string(id) + "' " +
                             ShapeStr(info.first->shape) + ": coord " + ShapeStr(coord) +
                             " is reported by no rank");
    }
  }
  std::unordered_map<std::string_view, const MeshGroupSpec*> groups;
  for (const MeshGroupSpec& g : spec.mesh_groups) {
    if (!groups.emplace(g.name, &g).second)
      return InvalidArgument(source + ": mesh group '" + g.name + "' listed twice");
    auto it = meshes.find(g.mesh);
    if (it == meshes.end())
      return InvalidArgument(source + ": mesh group '" + g.name + "': mesh '" + g.mesh +
                             "' is reported by no rank");
    for (const std::string& d : g.gather_dims) {
      bool found = false;
      for (const std::string& n : it->second.first->dim_names) found |= n == d;
      if (!found)
        return InvalidArgument(source + ": mesh group '" + g.name + "': gather dim '" + d +
                               "' is not a dim of mesh '" + g.mesh + "' " +
                               NamesStr(it->second.first->dim_names));
    }
  }
  // Params: per-rank checks, then the same definition on every mesh rank.
  struct FirstSeen {
    const TrainerParam* param;
    int32_t rank;
    int64_t count;
  };
  std::unordered_map<std::string_view, FirstSeen> seen;
  std::vector<std::string_view> param_order;
  std::vector<Range> scratch;
  for (const TrainerRank& rank : spec.ranks) {
    std::unordered_map<std::string_view, int> local;
    local.reserve(rank.params.size());
    for (const TrainerParam& p : rank.params) {
      if (!local.emplace(p.name, 0).second)
        return Fail(source, rank.rank, "tensor '" + p.name + "' listed twice");
      const MeshCoord* mesh = nullptr;
      for (const MeshCoord& m : rank.meshes)
        if (m.mesh == p.mesh) mesh = &m;
      if (!mesh)
        return Fail(source, rank.rank, "tensor '" + p.name + "': mesh '" + p.mesh +
                                           "' is not one of this rank's meshes");
      auto g = groups.find(p.mesh_group);
      if (g == groups.end())
        return Fail(source, rank.rank, "tensor '" + p.name + "': mesh_group '" + p.mesh_group +
                                           "' is not in mesh_groups");
      if (g->second->mesh != p.mesh)
        return Fail(source, rank.rank, "tensor '" + p.name + "': mesh '" + p.mesh +
                                           "' differs from mesh '" + g->second->mesh +
                                           "' of its mesh_group '" + p.mesh_group + "'");
      WSYNC_RETURN_IF_ERROR(CheckParamShape(source, rank, p, *mesh, &scratch));
      auto [it, inserted] = seen.emplace(p.name, FirstSeen{&p, rank.rank, 0});
      ++it->second.count;
      if (inserted) {
        param_order.push_back(p.name);
        continue;
      }
      const TrainerParam& q = *it->second.param;
      std::string diff;
      if (q.global_shape != p.global_shape)
        diff = "global_shape " + ShapeStr(p.global_shape) + " vs " + ShapeStr(q.global_shape);
      else if (q.dtype != p.dtype)
        diff = std::string("dtype ") + std::string(DTypeName(p.dtype)) + " vs " +
               std::string(DTypeName(q.dtype));
      else if (q.mesh != p.mesh)
        diff = "mesh '" + p.mesh + "' vs '" + q.mesh + "'";
      else if (q.placements != p.placements)
        diff = "placements " + PlacementsStr(p.placements) + " vs " + PlacementsStr(q.placements);
      else if (q.mesh_group != p.mesh_group)
        diff = "mesh_group '" + p.mesh_group + "' vs '" + q.mesh_group + "'";
      if (!diff.empty())
        return Fail(source, rank.rank, "tensor '" + p.name + "': " + diff + " on rank " +
                                           std::to_string(it->second.rank) +
                                           " (a parameter must be identical on every rank)");
    }
  }
  for (std::string_view name : param_order) {
    const FirstSeen& first = seen.at(name);
    const MeshInfo& info = meshes.at(first.param->mesh);
    const int64_t want = static_cast<int64_t>(info.rank_at.size());
    if (first.count == want) continue;
    int32_t missing = -1;
    for (int32_t r : info.rank_at) {
      bool has = false;
      for (const TrainerParam& p : spec.ranks[r].params) has |= p.name == name;
      if (!has) {
        missing = r;
        break;
      }
    }
    return Fail(source, missing, "tensor '" + std::string(name) + "' is missing (reported by " +
                                     std::to_string(first.count) + " of the " + std::to_string(want) +
                                     " ranks of mesh '" + first.param->mesh + "')");
  }
  return Status::Ok();
}

}  // namespace wsync
