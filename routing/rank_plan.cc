#include "routing/rank_plan.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include "routing/chunking.h"
#include "routing/json_text.h"

namespace wsync {
namespace {

Box BoxFromRanges(const std::vector<Range>& ranges) {
  Box b;
  b.ndim = static_cast<int8_t>(ranges.size());
  for (size_t i = 0; i < ranges.size(); ++i) {
    b.offset[i] = ranges[i].offset;
    b.size[i] = ranges[i].size;
  }
  return b;
}

const MeshCoord* FindMesh(const TrainerRank& r, const std::string& mesh) {
  for (const MeshCoord& m : r.meshes) {
    if (m.mesh == mesh) return &m;
  }
  return nullptr;
}

// Row-major index of a coordinate in a mesh.
int64_t Linear(const Shape& shape, const std::vector<int64_t>& coord) {
  int64_t idx = 0;
  for (size_t i = 0; i < shape.size(); ++i) idx = idx * shape[i] + coord[i];
  return idx;
}

}  // namespace

std::string BoxText(const Box& b) {
  std::string s = "[";
  for (int d = 0; d < b.ndim; ++d)
    s += (d ? ", " : "") + std::to_string(b.offset[d]) + ":" + std::to_string(b.offset[d] + b.size[d]);
  return s + "]";
}

bool WholeBlocks(const Box& held, const Shape& global, int64_t block_rows, int64_t block_cols) {
  const int n = held.ndim;
  if (n < 2) return false;
  for (int k = 0; k < 2; ++k) {
    const int d = n - 2 + k;
    const int64_t b = k == 0 ? block_rows : block_cols, end = held.offset[d] + held.size[d];
    if (held.offset[d] % b != 0 || (end % b != 0 && end != global[d])) return false;
  }
  return true;
}

namespace {

Rows Intersect(Rows a, Rows b) {
  const int64_t lo = std::max(a.offset, b.offset), hi = std::min(a.offset + a.size, b.offset + b.size);
  return hi > lo ? Rows{lo, hi - lo} : Rows{lo, 0};
}

// Replaces the all-gather of `rs` (rank `rank`'s view of `src`) by the
// planned exchange: each rank of the gather group receives only the rows its
// writes read. When no rank needs a row from a peer there is nothing to
// exchange: every rank writes from its own shard, as if nothing were
// gathered, provided no shard cuts an fp8 block (the quantize reads blocks
// whole). Every rank of the group reaches the same decision from the same
// table, so they all run the exchange collective or all skip it.
void PlanExchange(const SourceTensor& src, int32_t rank, RankSource* rs) {
  const int gd = rs->gather_dim;
  const int n = rs->held.ndim;
  const Rows held{rs->held.offset[gd], rs->held.size[gd]};
  const int64_t parts = static_cast<int64_t>(rs->gather_ranks.size());
  const Rows mine{rs->local.offset[gd], rs->local.size[gd]};
  const bool quantized = src.block_rows > 0;
  const int64_t block = !quantized ? 1 : gd == n - 2 ? rs->block_rows : gd == n - 1 ? rs->block_cols : 1;
  // The last dim, where it follows the exchanged one, is narrowed to what
  // each rank's writes read (whole fp8 blocks: the needs are widened).
  const int cd = gd + 1 == n - 1 ? gd + 1 : -1;
  const Rows cols = cd < 0 ? Rows{} : Rows{rs->held.offset[cd], rs->held.size[cd]};
  Rows need, need_cols = cols;
  bool crosses = false, cuts_blocks = false;
  std::vector<Rows> recv(parts), send(parts), send_cols(cd < 0 ? 0 : parts, cols);
  for (int64_t i = 0; i < parts; ++i) {
    const Range c = ChunkRange(held.size, parts, i);
    const Rows chunk{held.offset + c.offset, c.size};
    const int64_t end = chunk.offset + chunk.size;
    cuts_blocks = cuts_blocks || (chunk.size > 0 && (chunk.offset % block != 0 ||
                                                     (end % block != 0 && end != src.global_shape[gd])));
    const Rows peer_need = ExchangeNeedRows(src, rs->gather_ranks[i], gd, held);
    crosses = crosses || Intersect(peer_need, chunk).size != peer_need.size;
    send[i] = Intersect(peer_need, mine);
    if (cd >= 0 && peer_need.size > 0) send_cols[i] = ExchangeNeedRows(src, rs->gather_ranks[i], cd, cols);
    if (rs->gather_ranks[i] == rank) {
      need = peer_need;
      if (cd >= 0 && need.size > 0) need_cols = send_cols[i];
    }
  }
  if (!crosses && !cuts_blocks) {
    rs->held = rs->local;
    rs->gather_dim = -1;
    rs->gather_ranks.clear();
    return;
  }
  // Where a dim before gather_dim spans several indices (stacked experts),
  // a piece is its rows of each of them; the executor packs and unpacks it.
  for (int64_t i = 0; i < parts; ++i) {
    const Range c = ChunkRange(held.size, parts, i);
    const Rows chunk{held.offset + c.offset, c.size};
    recv[i] = Intersect(need, chunk);
  }
  rs->held.offset[gd] = need.size > 0 ? need.offset : held.offset;
  rs->held.size[gd] = need.size;
  rs->recv_rows = std::move(recv);
  rs->send_rows = std::move(send);
  // Only where some piece is narrower than the shard: otherwise the slice
  // and the executor stay as they were.
  if (std::any_of(send_cols.begin(), send_cols.end(), [&](const Rows& r) { return !(r == cols); }) ||
      !(need_cols == cols)) {
    rs->held.offset[cd] = need_cols.offset;
    rs->held.size[cd] = need_cols.size;
    rs->send_cols = std::move(send_cols);
  }
}

}  // namespace

Rows ExchangeNeedRows(const SourceTensor& src, int32_t rank, int dim, Rows held) {
  auto it = std::lower_bound(src.needs.begin(), src.needs.end(), rank,
                             [](const SourceTensor::Holder& h, int32_t r) { return h.rank < r; });
  if (it == src.needs.end() || it->rank != rank) return Rows{held.offset, 0};
  return Intersect(Rows{it->box.offset[dim], it->box.size[dim]}, held);
}

namespace {

nlohmann::json BoxJson(const Box& b) {
  return {std::vector<int64_t>(b.offset.begin(), b.offset.begin() + b.ndim),
          std::vector<int64_t>(b.size.begin(), b.size.begin() + b.ndim)};
}

// A slice's numbers must be integers in the field's range: json's get<T>()
// converts a float silently, and undefined behaviour when it is out of range.
template <typename T>
StatusOr<T> IntOf(const nlohmann::json& j, const char* what) {
  using Limits = std::numeric_limits<T>;
  bool fits = false;
  if (j.is_number_unsigned()) {
    fits = j.get<uint64_t>() <= static_cast<uint64_t>(Limits::max());
  } else if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    fits = v >= 0 ? static_cast<uint64_t>(v) <= static_cast<uint64_t>(Limits::max())
                  : Limits::is_signed && v >= static_cast<int64_t>(Limits::min());
  }
  if (!fits)
    return InvalidArgument(std::string("rank plan: '") + what + "' must be an integer in range, got " + j.dump());
  return j.get<T>();
}

template <typename T>
StatusOr<std::vector<T>> IntsOf(const nlohmann::json& j, const char* what) {
  if (!j.is_array()) return InvalidArgument(std::string("rank plan: '") + what + "' must be an array of integers");
  std::vector<T> out;
  out.reserve(j.size());
  for (const nlohmann::json& e : j) {
    WSYNC_ASSIGN_OR_RETURN(T v, IntOf<T>(e, what));
    out.push_back(v);
  }
  return out;
}

StatusOr<Box> ParseBox(const nlohmann::json& j) {
  if (!j.is_array() || j.size() != 2 || !j[0].is_array() || !j[1].is_array() || j[0].size() != j[1].size() ||
      j[0].size() > static_cast<size_t>(kMaxDims)) {
    return InvalidArgument("rank plan: malformed box " + j.dump());
  }
  Box b;
  b.ndim = static_cast<int8_t>(j[0].size());
  for (int i = 0; i < b.ndim; ++i) {
    WSYNC_ASSIGN_OR_RETURN(b.offset[i], IntOf<int64_t>(j[0][i], "box"));
    WSYNC_ASSIGN_OR_RETURN(b.size[i], IntOf<int64_t>(j[1][i], "box"));
  }
  return b;
}

StatusOr<DType> DTypeOf(const nlohmann::json& j) {
  std::optional<DType> d = j.is_string() ? ParseDType(j.get<std::string>()) : std::nullopt;
  if (!d) return InvalidArgument("rank plan: unknown dtype " + j.dump());
  return *d;
}

}  // namespace

StatusOr<TrainerRankPlan> ExtractTrainerRankPlan(const RoutingTable& table, const TrainerSpec& trainer,
                                                 const InferenceSpec& inference, int32_t rank,
                                                 const std::vector<uint32_t>* rank_ops, bool list_writes) {
  if (rank < 0 || static_cast<size_t>(rank) >= trainer.ranks.size()) {
    return NotFound("trainer rank " + std::to_string(rank) + " is not in the plan (world of " +
                    std::to_string(trainer.ranks.size()) + ")");
  }
  const TrainerRank& me = trainer.ranks[rank];
  TrainerRankPlan plan;
  plan.rank = rank;
  plan.world = static_cast<int32_t>(trainer.ranks.size());

  // This rank's params by name, as a sorted vector of views of the spec's
  // own names: the controller extracts every rank's plan, and a hash map of
  // copied names (a node and a string per param, ~1,500 per rank) was a
  // quarter of the extraction's time at Kimi-K2 scale.
  using ParamByName = std::pair<std::string_view, const TrainerParam*>;
  std::vector<ParamByName> my_params;
  my_params.reserve(me.params.size());
  for (const TrainerParam& p : me.params) my_params.emplace_back(p.name, &p);
  std::stable_sort(my_params.begin(), my_params.end(),
                   [](const ParamByName& a, const ParamByName& b) { return a.first < b.first; });
  auto find_param = [&](std::string_view name) -> const TrainerParam* {
    auto it = std::lower_bound(my_params.begin(), my_params.end(), name,
                               [](const ParamByName& a, std::string_view n) { return a.first < n; });
    return it != my_params.end() && it->first == name ? it->second : nullptr;
  };
  std::unordered_map<std::string, const MeshGroupSpec*> group_specs;
  for (const MeshGroupSpec& g : trainer.mesh_groups) group_specs.emplace(g.name, &g);

  // This rank's writes, by source.
  std::unordered_map<int32_t, std::vector<const WriteOp*>> ops_by_source;
  if (rank_ops) {
    for (uint32_t i : *rank_ops)
      if (table.ops[i].src_rank == rank) ops_by_source[table.ops[i].src].push_back(&table.ops[i]);
  } else {
    for (const WriteOp& op : table.ops) {
      if (op.src_rank == rank) ops_by_source[op.src].push_back(&op);
    }
  }

  // rank-of-coordinate for each mesh this rank is in.
  std::unordered_map<std::string, std::vector<int32_t>> mesh_ranks;
  for (const MeshCoord& mine : me.meshes) {
    int64_t n = 1;
    for (int64_t d : mine.shape) n *= d;
    std::vector<int32_t> ranks(static_cast<size_t>(n), -1);
    for (const TrainerRank& r : trainer.ranks) {
      if (const MeshCoord* m = FindMesh(r, mine.mesh)) ranks[Linear(mine.shape, m->coord)] = r.rank;
    }
    mesh_ranks.emplace(mine.mesh, std::move(ranks));
  }

  std::set<int32_t> peers;
  for (size_t g = 0; g < table.mesh_groups.size(); ++g) {
    const MeshGroupInfo& info = table.mesh_groups[g];
    if (std::find(info.ranks.begin(), info.ranks.end(), rank) == info.ranks.end()) continue;
    auto spec_it = group_specs.find(info.name);
    if (spec_it == group_specs.end()) return Internal("mesh group '" + info.name + "' missing from trainer spec");
    const MeshGroupSpec& spec = *spec_it->second;
    const MeshCoord* coord = FindMesh(me, spec.mesh);
    if (coord == nullptr) return Internal("rank " + std::to_string(rank) + " lacks mesh '" + spec.mesh + "'");
    std::vector<bool> gathered(coord->shape.size(), false);
    for (size_t k = 0; k < coord->dim_names.size(); ++k) {
      gathered[k] = std::find(spec.gather_dims.begin(), spec.gather_dims.end(), coord->dim_names[k]) !=
                    spec.gather_dims.end();
    }

    RankMeshGroup group;
    group.name = info.name;
    group.ranks = info.ranks;
    for (size_t s = 0; s < table.sources.size(); ++s) {
      const SourceTensor& src = table.sources[s];
      if (src.mesh_group != static_cast<int32_t>(g)) continue;
      const TrainerParam* found = find_param(src.name);
      if (found == nullptr) {
        return Internal("rank " + std::to_string(rank) + " does not hold '" + src.name + "'");
      }
      const TrainerParam& param = *found;
      RankSource rs;
      rs.name = src.name;
      rs.global_shape = src.global_shape;
      rs.dtype = src.dtype;
      std::vector<Range> ranges;
      LocalShard(param.global_shape, coord->shape, coord->coord, param.placements, &ranges);
      rs.local = BoxFromRanges(ranges);
      int bad_dim = -1;
      if (!HeldShard(param.global_shape, coord->shape, coord->coord, param.placements, gathered, &ranges,
                     &bad_dim)) {
        return InvalidArgument("tensor '" + src.name + "': unsharding over " + info.name +
                               " does not give one box on dim " + std::to_string(bad_dim));
      }
      rs.held = BoxFromRanges(ranges);
      // The one gathered mesh dim that shards this tensor, if any.
      int32_t mesh_dim = -1;
      for (size_t k = 0; k < param.placements.size(); ++k) {
        if (!gathered[k] || param.placements[k].kind != Placement::Kind::kShard) continue;
        if (mesh_dim >= 0) {
          return InvalidArgument("tensor '" + src.name + "' is sharded on two gathered mesh dims of " +
                                 info.name + " (" + coord->dim_names[mesh_dim] + ", " + coord->dim_names[k] +
                                 "); the pipeline all-gathers along one");
        }
        mesh_dim = static_cast<int32_t>(k);
      }
      if (mesh_dim >= 0) {
        rs.gather_dim = param.placements[mesh_dim].dim;
        const std::vector<int32_t>& ranks = mesh_ranks[spec.mesh];
        std::vector<int64_t> c = coord->coord;
        for (int64_t i = 0; i < coord->shape[mesh_dim]; ++i) {
          c[mesh_dim] = i;
          rs.gather_ranks.push_back(ranks[Linear(coord->shape, c)]);
        }
      }
      // A planned exchange (shards recorded); a source nobody writes then
      // gathers nothing.
      if (rs.gather_dim >= 0 && !src.shards.empty()) PlanExchange(src, rank, &rs);
      std::optional<bool> whole_blocks;  // rs.held covers whole fp8 blocks; asked once per source
      for (const WriteOp* op : ops_by_source[static_cast<int32_t>(s)]) {
        const DestTensor& dst = table.destinations[op->dst];
        const DType dst_dtype = op->kind == WriteKind::kScale ? DType::kFP32 : dst.dtype;
        if (op->kind == WriteKind::kWeight && dst_dtype == DType::kFP8E4M3) {
          if (!whole_blocks) whole_blocks = WholeBlocks(rs.held, src.global_shape, rs.block_rows, rs.block_cols);
          if (!*whole_blocks) {
            return InvalidArgument("tensor '" + src.name + "': fp8 blocks need whole " +
                                   std::to_string(rs.block_rows) + "x" + std::to_string(rs.block_cols) +
                                   " blocks of the last two dims after unshard, but rank " + std::to_string(rank) +
                                   " holds " + BoxText(rs.held));
          }
        }
        plan.write_bytes += op->bytes;
        plan.writes += op->planes;
        peers.insert(op->dst_rank);
        if (!list_writes) continue;
        RankWrite w;
        w.dst_rank = op->dst_rank;
        w.kind = op->kind;
        w.dst_dtype = dst_dtype;
        w.src_box = op->src_box;
        w.region = op->kind == WriteKind::kScale ? dst.scale_where.region : dst.where.region;
        w.region_offset = (op->kind == WriteKind::kScale ? dst.scale_where.offset : dst.where.offset) + op->dst_offset;
        w.bytes = op->bytes;
        w.dst_name = op->kind == WriteKind::kScale ? dst.scale_name : dst.name;
        w.planes = op->planes;
        w.plane_dim = op->plane_dim;
        w.plane_stride = op->plane_stride;
        rs.writes.push_back(std::move(w));
      }
      group.sources.push_back(std::move(rs));
    }
    plan.groups.push_back(std::move(group));
  }
  for (int32_t r : peers) {
    const InferenceRank& ir = inference.ranks[r];
    InferencePeer peer;
    peer.rank = r;
    peer.host = ir.host;
    for (const MemoryRegion& region : ir.regions) peer.region_descriptors[region.id] = region.descriptor;
    plan.peers.push_back(std::move(peer));
  }
  return plan;
}

std::vector<std::vector<uint32_t>> OpsByTrainer(const RoutingTable& table, size_t trainer_ranks) {
  std::vector<std::vector<uint32_t>> ops_of(trainer_ranks);
  for (size_t i = 0; i < table.ops.size(); ++i) {
    const int32_t r = table.ops[i].src_rank;
    if (r >= 0 && static_cast<size_t>(r) < ops_of.size()) ops_of[r].push_back(static_cast<uint32_t>(i));
  }
  return ops_of;
}

StatusOr<std::vector<TrainerRankPlan>> ExtractTrainerRankPlans(const RoutingTable& table, const TrainerSpec& trainer,
                                                               const InferenceSpec& inference, bool writes) {
  const std::vector<std::vector<uint32_t>> ops_of =
      writes ? OpsByTrainer(table, trainer.ranks.size()) : std::vector<std::vector<uint32_t>>(trainer.ranks.size());
  std::vector<TrainerRankPlan> plans;
  plans.reserve(trainer.ranks.size());
  for (size_t r = 0; r < trainer.ranks.size(); ++r) {
    WSYNC_ASSIGN_OR_RETURN(TrainerRankPlan plan,
                           ExtractTrainerRankPlan(table, trainer, inference, static_cast<int32_t>(r), &ops_of[r]));
    plans.push_back(std::move(plan));
  }
  return plans;
}

InferenceRankPlan ExtractInferenceRankPlan(const RoutingTable& table, int32_t rank,
                                           const std::vector<uint32_t>* rank_ops) {
  InferenceRankPlan plan;
  plan.rank = rank;
  const size_t n = rank_ops ? rank_ops->size() : table.ops.size();
  if (rank_ops) plan.writes.reserve(n);
  for (size_t k = 0; k < n; ++k) {
    const WriteOp& op = table.ops[rank_ops ? (*rank_ops)[k] : k];
    if (op.dst_rank != rank) continue;
    const DestTensor& dst = table.destinations[op.dst];
    const bool scale = op.kind == WriteKind::kScale;
    const RegionRef& where = scale ? dst.scale_where : dst.where;
    plan.writes.push_back({where.region, where.offset + op.dst_offset, op.bytes, scale ? dst.scale_name : dst.name,
                           op.planes, op.plane_stride});
    plan.bytes += op.bytes;
  }
  return plan;
}

void ExpandPlanes(TrainerRankPlan* plan) {
  for (RankMeshGroup& g : plan->groups)
    for (RankSource& s : g.sources) {
      if (std::all_of(s.writes.begin(), s.writes.end(), [](const RankWrite& w) { return w.planes <= 1; })) continue;
      std::vector<RankWrite> plain;
      for (RankWrite& w : s.writes) {
        if (w.planes <= 1) {
          plain.push_back(std::move(w));
          continue;
        }
        RankWrite one = w;
        one.planes = 1;
        one.plane_dim = -1;
        one.plane_stride = 0;
        one.bytes = w.bytes / w.planes;
        one.src_box.size[w.plane_dim] = 1;
        for (uint32_t p = 0; p < w.planes; ++p) {
          one.src_box.offset[w.plane_dim] = w.src_box.offset[w.plane_dim] + p;
          one.region_offset = w.region_offset + p * w.plane_stride;
          plain.push_back(one);
        }
      }
      s.writes = std::move(plain);
    }
}

void ExpandPlanes(InferenceRankPlan* plan) {
  if (std::all_of(plan->writes.begin(), plan->writes.end(), [](const IncomingWrite& w) { return w.planes <= 1; }))
    return;
  std::vector<IncomingWrite> plain;
  for (IncomingWrite& w : plan->writes) {
    for (uint32_t p = 0; p < std::max<uint32_t>(w.planes, 1); ++p)
      plain.push_back({w.region, w.offset + p * w.plane_stride, w.bytes / std::max<uint32_t>(w.planes, 1), w.tensor});
  }
  plan->writes = std::move(plain);
}

uint64_t WriteCount(const InferenceRankPlan& plan) {
  uint64_t n = 0;
  for (const IncomingWrite& w : plan.writes) n += std::max<uint32_t>(w.planes, 1);
  return n;
}

namespace {
// Bytes of one index of the gather dim: every other dim of what it holds,
// or, with `cols`, that many in the dim the exchange narrows.
uint64_t GatherRowBytes(const RankSource& src, const Rows* cols = nullptr) {
  uint64_t b = DTypeSize(src.dtype);
  const int cd = src.exchange_col_dim();
  for (int d = 0; d < src.held.ndim; ++d)
    if (d != src.gather_dim)
      b *= static_cast<uint64_t>(d == cd && cols != nullptr ? cols->size : src.held.size[d]);
  return b;
}
}  // namespace

uint64_t UnshardBytesFrom(const RankSource& src, int64_t i) {
  const auto parts = static_cast<int64_t>(src.gather_ranks.size());
  const int64_t rows = src.exchange() ? src.recv_rows[i].size : ChunkRange(src.held.size[src.gather_dim], parts, i).size;
  return GatherRowBytes(src) * static_cast<uint64_t>(rows);
}

uint64_t UnshardBytesTo(const RankSource& src, int64_t i, int64_t mine) {
  const auto parts = static_cast<int64_t>(src.gather_ranks.size());
  const int64_t rows =
      src.exchange() ? src.send_rows[i].size : ChunkRange(src.held.size[src.gather_dim], parts, mine).size;
  return GatherRowBytes(src, src.send_cols.empty() ? nullptr : &src.send_cols[i]) * static_cast<uint64_t>(rows);
}

namespace {

constexpr const char* kTrainerPlanSchema = "wsync.trainer_rank_plan/v4";

// A slice names each source's all-gather group by its index into one table
// of the slice's distinct groups ("gather_sets", first-use order; -1: the
// source gathers nothing) instead of listing its up to 128 ranks in every
// source: a Kimi-K2 trainer slice has ~520 sources and two distinct groups,
// and the repeated lists were over a quarter of the bytes the controller
// serves. The parser expands the index back into gather_ranks.
struct GatherSets {
  std::vector<const std::vector<int32_t>*> sets;  // distinct non-empty gather_ranks
  std::vector<int32_t> index;                     // per source, groups then sources in order
};

GatherSets CollectGatherSets(const TrainerRankPlan& plan) {
  struct ByValue {
    bool operator()(const std::vector<int32_t>* a, const std::vector<int32_t>* b) const { return *a < *b; }
  };
  GatherSets out;
  std::map<const std::vector<int32_t>*, int32_t, ByValue> seen;
  for (const RankMeshGroup& g : plan.groups)
    for (const RankSource& s : g.sources) {
      if (s.gather_ranks.empty()) {
        out.index.push_back(-1);
        continue;
      }
      auto [it, fresh] = seen.emplace(&s.gather_ranks, static_cast<int32_t>(out.sets.size()));
      if (fresh) out.sets.push_back(&s.gather_ranks);
      out.index.push_back(it->second);
    }
  return out;
}

// A source of a trainer rank plan without its writes (ToJson adds them);
// `gather_set`: its index into the slice's gather_sets.
nlohmann::json SourceHeadJson(const RankSource& s, int32_t gather_set) {
  nlohmann::json j = {{"name", s.name}, {"global_shape", s.global_shape}, {"dtype", DTypeName(s.dtype)},
                      {"local", BoxJson(s.local)}, {"held", BoxJson(s.held)},
                      {"gather_dim", s.gather_dim}, {"gather_set", gather_set},
                      {"block", {s.block_rows, s.block_cols}}};
  if (s.exchange()) {
    for (const auto& [key, rows] : {std::pair{"recv", &s.recv_rows}, std::pair{"send", &s.send_rows}}) {
      const std::vector<Rows>* cols = rows == &s.send_rows && !s.send_cols.empty() ? &s.send_cols : nullptr;
      nlohmann::json list = nlohmann::json::array();
      for (size_t i = 0; i < rows->size(); ++i) {
        if ((*rows)[i].size == 0) continue;
        nlohmann::json piece = {i, (*rows)[i].offset, (*rows)[i].size};
        if (cols != nullptr) {
          piece.push_back((*cols)[i].offset);
          piece.push_back((*cols)[i].size);
        }
        list.push_back(std::move(piece));
      }
      j[key] = std::move(list);
    }
  }
  return j;
}

nlohmann::json PeersJson(const TrainerRankPlan& plan) {
  nlohmann::json peers = nlohmann::json::array();
  for (const InferencePeer& p : plan.peers) {
    peers.push_back({{"rank", p.rank}, {"host", p.host}, {"regions", p.region_descriptors}});
  }
  return peers;
}

// The plan without its groups: ToJson adds them.
nlohmann::json TrainerPlanHeadJson(const TrainerRankPlan& plan) {
  return {{"schema", kTrainerPlanSchema}, {"rank", plan.rank}, {"world", plan.world},
          {"peers", PeersJson(plan)}, {"write_bytes", plan.write_bytes}, {"writes", plan.writes}};
}

// ToJson(w).dump() of a RankWrite, appended.
void AppendWrite(std::string* out, const RankWrite& w) {
  *out += '[';
  AppendJsonInt(out, w.dst_rank);
  *out += w.kind == WriteKind::kScale ? ",\"s\"," : ",\"w\",";
  AppendJsonString(out, DTypeName(w.dst_dtype));
  *out += ",[";
  for (const bool sizes : {false, true}) {
    if (sizes) *out += ',';
    *out += '[';
    for (int d = 0; d < w.src_box.ndim; ++d) {
      if (d > 0) *out += ',';
      AppendJsonInt(out, sizes ? w.src_box.size[d] : w.src_box.offset[d]);
    }
    *out += ']';
  }
  *out += "],";
  AppendJsonString(out, w.region);
  *out += ',';
  AppendJsonInt(out, w.region_offset);
  *out += ',';
  AppendJsonInt(out, w.bytes);
  *out += ',';
  AppendJsonString(out, w.dst_name);
  if (w.planes > 1) {
    for (int64_t v : {int64_t{w.planes}, int64_t{w.plane_dim}}) {
      *out += ',';
      AppendJsonInt(out, v);
    }
    *out += ',';
    AppendJsonInt(out, w.plane_stride);
  }
  *out += ']';
}

void AppendBox(std::string* out, const Box& b) {
  *out += "[[";
  for (int d = 0; d < b.ndim; ++d) {
    if (d > 0) *out += ',';
    AppendJsonInt(out, b.offset[d]);
  }
  *out += "],[";
  for (int d = 0; d < b.ndim; ++d) {
    if (d > 0) *out += ',';
    AppendJsonInt(out, b.size[d]);
  }
  *out += "]]";
}

// The non-empty pieces only, as [gather index, begin, rows] (and, with
// `cols`, [..., col begin, cols]): most of a Kimi-K2 rank's 128 peers have
// no rows of a source for it, and listing them was most of a trainer
// slice's bytes.
void AppendRowsList(std::string* out, const std::vector<Rows>& rows, const std::vector<Rows>* cols = nullptr) {
  *out += '[';
  bool first = true;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].size == 0) continue;
    if (!first) *out += ',';
    first = false;
    *out += '[';
    AppendJsonInt(out, static_cast<int64_t>(i));
    *out += ',';
    AppendJsonInt(out, rows[i].offset);
    *out += ',';
    AppendJsonInt(out, rows[i].size);
    if (cols != nullptr) {
      *out += ',';
      AppendJsonInt(out, (*cols)[i].offset);
      *out += ',';
      AppendJsonInt(out, (*cols)[i].size);
    }
    *out += ']';
  }
  *out += ']';
}

// SourceHeadJson(s, gather_set) with its "writes", as dump() writes it
// (keys sorted).
void AppendSource(std::string* out, const RankSource& s, int32_t gather_set) {
  *out += "{\"block\":[";
  AppendJsonInt(out, s.block_rows);
  *out += ',';
  AppendJsonInt(out, s.block_cols);
  *out += "],\"dtype\":";
  AppendJsonString(out, DTypeName(s.dtype));
  *out += ",\"gather_dim\":";
  AppendJsonInt(out, s.gather_dim);
  *out += ",\"gather_set\":";
  AppendJsonInt(out, gather_set);
  *out += ",\"global_shape\":";
  AppendJsonIntArray(out, s.global_shape);
  *out += ",\"held\":";
  AppendBox(out, s.held);
  *out += ",\"local\":";
  AppendBox(out, s.local);
  *out += ",\"name\":";
  AppendJsonString(out, s.name);
  if (s.exchange()) {
    *out += ",\"recv\":";
    AppendRowsList(out, s.recv_rows);
    *out += ",\"send\":";
    AppendRowsList(out, s.send_rows, s.send_cols.empty() ? nullptr : &s.send_cols);
  }
  *out += ",\"writes\":[";
  for (size_t i = 0; i < s.writes.size(); ++i) {
    if (i > 0) *out += ',';
    AppendWrite(out, s.writes[i]);
  }
  *out += "]}";
}

}  // namespace

nlohmann::json ToJson(const TrainerRankPlan& plan) {
  const GatherSets gather = CollectGatherSets(plan);
  size_t next = 0;  // into gather.index
  nlohmann::json groups = nlohmann::json::array();
  for (const RankMeshGroup& g : plan.groups) {
    nlohmann::json sources = nlohmann::json::array();
    for (const RankSource& s : g.sources) {
      nlohmann::json writes = nlohmann::json::array();
      for (const RankWrite& w : s.writes) {
        writes.push_back({w.dst_rank, w.kind == WriteKind::kScale ? "s" : "w", DTypeName(w.dst_dtype),
                          BoxJson(w.src_box), w.region, w.region_offset, w.bytes, w.dst_name});
        if (w.planes > 1) {
          writes.back().push_back(w.planes);
          writes.back().push_back(w.plane_dim);
          writes.back().push_back(w.plane_stride);
        }
      }
      sources.push_back(SourceHeadJson(s, gather.index[next++]));
      sources.back()["writes"] = std::move(writes);
    }
    groups.push_back({{"name", g.name}, {"ranks", g.ranks}, {"sources", sources}});
  }
  nlohmann::json j = TrainerPlanHeadJson(plan);
  nlohmann::json sets = nlohmann::json::array();
  for (const std::vector<int32_t>* ranks : gather.sets) sets.push_back(*ranks);
  j["gather_sets"] = std::move(sets);
  j["groups"] = std::move(groups);
  return j;
}

std::string ToJsonText(const TrainerRankPlan& plan) {
  // One buffer, appended in dump()'s order (keys sorted): the slices of a
  // Kimi-K2 world are ~200 MB, and building each level as its own string
  // (or its head as a tree) cost most of the time to serve them.
  size_t writes = 0;
  for (const RankMeshGroup& g : plan.groups)
    for (const RankSource& s : g.sources) writes += s.writes.size();
  const GatherSets gather = CollectGatherSets(plan);
  size_t next = 0;  // into gather.index
  std::string out;
  out.reserve(256 + writes * 160 + plan.groups.size() * 1024);
  out += "{\"gather_sets\":[";
  for (size_t i = 0; i < gather.sets.size(); ++i) {
    if (i > 0) out += ',';
    AppendJsonIntArray(&out, *gather.sets[i]);
  }
  out += "],\"groups\":[";
  for (size_t gi = 0; gi < plan.groups.size(); ++gi) {
    const RankMeshGroup& g = plan.groups[gi];
    if (gi > 0) out += ',';
    out += "{\"name\":";
    AppendJsonString(&out, g.name);
    out += ",\"ranks\":";
    AppendJsonIntArray(&out, g.ranks);
    out += ",\"sources\":[";
    for (size_t si = 0; si < g.sources.size(); ++si) {
      if (si > 0) out += ',';
      AppendSource(&out, g.sources[si], gather.index[next++]);
    }
    out += "]}";
  }
  out += "],\"peers\":";
  out += PeersJson(plan).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  out += ",\"rank\":";
  AppendJsonInt(&out, plan.rank);
  out += ",\"schema\":\"";
  out += kTrainerPlanSchema;
  out += "\",\"world\":";
  AppendJsonInt(&out, plan.world);
  out += ",\"write_bytes\":";
  AppendJsonInt(&out, plan.write_bytes);
  out += ",\"writes\":";
  AppendJsonInt(&out, plan.writes);
  out += '}';
  return out;
}

nlohmann::json ToJson(const InferenceRankPlan& plan) {
  nlohmann::json writes = nlohmann::json::array();
  for (const IncomingWrite& w : plan.writes) {
    writes.push_back({w.region, w.offset, w.bytes, w.tensor});
    if (w.planes > 1) {
      writes.back().push_back(w.planes);
      writes.back().push_back(w.plane_stride);
    }
  }
  return {{"schema", "wsync.inference_rank_plan/v1"}, {"rank", plan.rank}, {"writes", std::move(writes)},
          {"bytes", plan.bytes}};
}

std::string ToJsonText(const InferenceRankPlan& plan) {
  std::string writes = "[";
  for (const IncomingWrite& w : plan.writes) {
    if (writes.size() > 1) writes += ',';
    writes += '[';
    AppendJsonString(&writes, w.region);
    writes += ',';
    AppendJsonInt(&writes, w.offset);
    writes += ',';
    AppendJsonInt(&writes, w.bytes);
    writes += ',';
    AppendJsonString(&writes, w.tensor);
    if (w.planes > 1) {
      writes += ',';
      AppendJsonInt(&writes, w.planes);
      writes += ',';
      AppendJsonInt(&writes, w.plane_stride);
    }
    writes += ']';
  }
  writes += ']';
  return ObjectTextWith({{"schema", "wsync.inference_rank_plan/v1"}, {"rank", plan.rank}, {"bytes", plan.bytes}},
                        "writes", writes);
}

StatusOr<TrainerRankPlan> ParseTrainerRankPlan(const nlohmann::json& j) {
  try {
    if (j.value("schema", "") != kTrainerPlanSchema) {
      return InvalidArgument(std::string("rank plan: expected schema ") + kTrainerPlanSchema +
                             " (a controller and agents of different wsync versions?)");
    }
    TrainerRankPlan plan;
    const nlohmann::json& sets_json = j.at("gather_sets");
    if (!sets_json.is_array()) return InvalidArgument("rank plan: 'gather_sets' must be an array of rank lists");
    std::vector<std::vector<int32_t>> gather_sets;
    gather_sets.reserve(sets_json.size());
    for (const nlohmann::json& set : sets_json) {
      WSYNC_ASSIGN_OR_RETURN(std::vector<int32_t> ranks, IntsOf<int32_t>(set, "gather_sets"));
      gather_sets.push_back(std::move(ranks));
    }
    WSYNC_ASSIGN_OR_RETURN(plan.rank, IntOf<int32_t>(j.at("rank"), "rank"));
    WSYNC_ASSIGN_OR_RETURN(plan.world, IntOf<int32_t>(j.at("world"), "world"));
    WSYNC_ASSIGN_OR_RETURN(plan.write_bytes, IntOf<uint64_t>(j.at("write_bytes"), "write_bytes"));
    WSYNC_ASSIGN_OR_RETURN(plan.writes, IntOf<uint64_t>(j.at("writes"), "writes"));
    for (const auto& gj : j.at("groups")) {
      RankMeshGroup g;
      g.name = gj.at("name").get<std::string>();
      WSYNC_ASSIGN_OR_RETURN(g.ranks, IntsOf<int32_t>(gj.at("ranks"), "ranks"));
      for (const auto& sj : gj.at("sources")) {
        RankSource s;
        s.name = sj.at("name").get<std::string>();
        WSYNC_ASSIGN_OR_RETURN(s.global_shape, IntsOf<int64_t>(sj.at("global_shape"), "global_shape"));
        WSYNC_ASSIGN_OR_RETURN(s.dtype, DTypeOf(sj.at("dtype")));
        WSYNC_ASSIGN_OR_RETURN(s.local, ParseBox(sj.at("local")));
        WSYNC_ASSIGN_OR_RETURN(s.held, ParseBox(sj.at("held")));
        WSYNC_ASSIGN_OR_RETURN(s.gather_dim, IntOf<int32_t>(sj.at("gather_dim"), "gather_dim"));
        const nlohmann::json& set_json = sj.at("gather_set");
        const StatusOr<int32_t> set = IntOf<int32_t>(set_json, "gather_set");
        if (!set.ok() || *set < -1 || static_cast<int64_t>(*set) >= static_cast<int64_t>(gather_sets.size()))
          return InvalidArgument("rank plan: source '" + s.name + "': 'gather_set' must be -1 (no all-gather) or " +
                                 "an index into the slice's " + std::to_string(gather_sets.size()) +
                                 " 'gather_sets', got " + set_json.dump());
        if (*set >= 0) s.gather_ranks = gather_sets[*set];
        // operator[] on a const json array does not check bounds: sizes first.
        const nlohmann::json& block = sj.at("block");
        if (!block.is_array() || block.size() != 2)
          return InvalidArgument("rank plan: source '" + s.name + "': 'block' must be [rows, cols]");
        WSYNC_ASSIGN_OR_RETURN(s.block_rows, IntOf<int64_t>(block[0], "block"));
        WSYNC_ASSIGN_OR_RETURN(s.block_cols, IntOf<int64_t>(block[1], "block"));
        // An exchange lists its non-empty pieces, [gather index, begin,
        // rows] in index order; the rest are empty (placed at the start of
        // what the rank holds, or of its shard, so nothing points outside).
        // Sent pieces narrowed in the last dim add [col begin, cols].
        const bool rows_known = s.gather_dim >= 0 && s.gather_dim < s.held.ndim && s.gather_dim < s.local.ndim;
        for (const auto& [key, rows, at] :
             {std::tuple{"recv", &s.recv_rows, rows_known ? s.held.offset[s.gather_dim] : 0},
              std::tuple{"send", &s.send_rows, rows_known ? s.local.offset[s.gather_dim] : 0}}) {
          auto it = sj.find(key);
          if (it == sj.end()) continue;
          if (!it->is_array())
            return InvalidArgument("rank plan: source '" + s.name + "': '" + key + "' must list [index, begin, rows]");
          rows->assign(s.gather_ranks.size(), Rows{at, 0});
          int64_t last = -1;
          const bool sends = rows == &s.send_rows;
          const int cd = s.gather_dim + 1;
          for (const auto& rj : *it) {
            const bool narrowed = sends && rj.is_array() && rj.size() == 5;
            if (!rj.is_array() || (rj.size() != 3 && !narrowed))
              return InvalidArgument("rank plan: source '" + s.name + "': '" + key + "' entries are [gather index, " +
                                     "begin, rows]" + (sends ? " or that and [col begin, cols]" : ""));
            if (narrowed && (!rows_known || cd != s.local.ndim - 1))
              return InvalidArgument("rank plan: source '" + s.name + "': a sent piece narrows dim " +
                                     std::to_string(cd) + ", which is not the last one after gather dim " +
                                     std::to_string(s.gather_dim));
            int64_t i = 0;
            Rows r, c;
            WSYNC_ASSIGN_OR_RETURN(i, IntOf<int64_t>(rj[0], key));
            WSYNC_ASSIGN_OR_RETURN(r.offset, IntOf<int64_t>(rj[1], key));
            WSYNC_ASSIGN_OR_RETURN(r.size, IntOf<int64_t>(rj[2], key));
            if (narrowed) {
              WSYNC_ASSIGN_OR_RETURN(c.offset, IntOf<int64_t>(rj[3], key));
              WSYNC_ASSIGN_OR_RETURN(c.size, IntOf<int64_t>(rj[4], key));
            }
            if (i <= last || i >= static_cast<int64_t>(rows->size()))
              return InvalidArgument("rank plan: source '" + s.name + "': '" + key + "' index " + std::to_string(i) +
                                     " is out of order or not one of its " + std::to_string(rows->size()) +
                                     " gather ranks");
            last = i;
            (*rows)[i] = r;
            if (narrowed) {
              if (s.send_cols.empty()) s.send_cols.assign(rows->size(), Rows{s.local.offset[cd], s.local.size[cd]});
              s.send_cols[i] = c;
            }
          }
        }
        if (sj.contains("recv") != sj.contains("send"))
          return InvalidArgument("rank plan: source '" + s.name + "': 'recv' and 'send' come together");
        if (sj.contains("recv") && s.gather_ranks.empty())
          return InvalidArgument("rank plan: source '" + s.name + "': an exchange needs a gather group");
        for (const auto& wj : sj.at("writes")) {
          if (!wj.is_array() || (wj.size() != 8 && wj.size() != 11))
            return InvalidArgument("rank plan: source '" + s.name + "': a write must be [dst_rank, kind, dtype, "
                                   "box, region, region_offset, bytes, dst_name] or that and [planes, plane_dim, "
                                   "plane_stride]");
          RankWrite w;
          WSYNC_ASSIGN_OR_RETURN(w.dst_rank, IntOf<int32_t>(wj[0], "dst_rank"));
          const std::string kind = wj[1].get<std::string>();
          if (kind != "w" && kind != "s")
            return InvalidArgument("rank plan: source '" + s.name + "': write kind '" + kind + "' is not \"w\" or \"s\"");
          w.kind = kind == "s" ? WriteKind::kScale : WriteKind::kWeight;
          WSYNC_ASSIGN_OR_RETURN(w.dst_dtype, DTypeOf(wj[2]));
          WSYNC_ASSIGN_OR_RETURN(w.src_box, ParseBox(wj[3]));
          w.region = wj[4].get<std::string>();
          WSYNC_ASSIGN_OR_RETURN(w.region_offset, IntOf<uint64_t>(wj[5], "region_offset"));
          WSYNC_ASSIGN_OR_RETURN(w.bytes, IntOf<uint64_t>(wj[6], "bytes"));
          w.dst_name = wj[7].get<std::string>();
          if (wj.size() == 11) {
            uint64_t planes = 0;
            WSYNC_ASSIGN_OR_RETURN(planes, IntOf<uint64_t>(wj[8], "planes"));
            WSYNC_ASSIGN_OR_RETURN(w.plane_dim, IntOf<int32_t>(wj[9], "plane_dim"));
            WSYNC_ASSIGN_OR_RETURN(w.plane_stride, IntOf<uint64_t>(wj[10], "plane_stride"));
            const std::string bad = StridedWriteError(planes, w.plane_dim, w.plane_stride, w.bytes, &w.src_box);
            if (!bad.empty())
              return InvalidArgument("rank plan: source '" + s.name + "': write to '" + w.dst_name + "': " + bad);
            w.planes = static_cast<uint32_t>(planes);
          }
          s.writes.push_back(std::move(w));
        }
        g.sources.push_back(std::move(s));
      }
      plan.groups.push_back(std::move(g));
    }
    for (const auto& pj : j.at("peers")) {
      InferencePeer p;
      WSYNC_ASSIGN_OR_RETURN(p.rank, IntOf<int32_t>(pj.at("rank"), "rank"));
      p.host = pj.at("host").get<std::string>();
      p.region_descriptors = pj.at("regions").get<std::map<std::string, std::string>>();
      plan.peers.push_back(std::move(p));
    }
    return plan;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(std::string("rank plan: malformed: ") + e.what());
  }
}

StatusOr<InferenceRankPlan> ParseInferenceRankPlan(const nlohmann::json& j) {
  try {
    if (j.value("schema", "") != "wsync.inference_rank_plan/v1") {
      return InvalidArgument("rank plan: expected schema wsync.inference_rank_plan/v1");
    }
    InferenceRankPlan plan;
    WSYNC_ASSIGN_OR_RETURN(plan.rank, IntOf<int32_t>(j.at("rank"), "rank"));
    const nlohmann::json& writes = j.at("writes");
    if (!writes.is_array()) return InvalidArgument("rank plan: 'writes' must be an array");
    for (const nlohmann::json& wj : writes) {
      if (!wj.is_array() || (wj.size() != 4 && wj.size() != 6) || !wj[0].is_string() || !wj[3].is_string()) {
        return InvalidArgument("rank plan: a write must be [region, offset, bytes, tensor] or that and "
                               "[planes, plane_stride], got " + wj.dump());
      }
      IncomingWrite w;
      w.region = wj[0].get<std::string>();
      WSYNC_ASSIGN_OR_RETURN(w.offset, IntOf<uint64_t>(wj[1], "write offset"));
      WSYNC_ASSIGN_OR_RETURN(w.bytes, IntOf<uint64_t>(wj[2], "write bytes"));
      w.tensor = wj[3].get<std::string>();
      if (wj.size() == 6) {
        uint64_t planes = 0;
        WSYNC_ASSIGN_OR_RETURN(planes, IntOf<uint64_t>(wj[4], "planes"));
        WSYNC_ASSIGN_OR_RETURN(w.plane_stride, IntOf<uint64_t>(wj[5], "plane_stride"));
        const std::string bad = StridedWriteError(planes, -1, w.plane_stride, w.bytes, nullptr);
        if (!bad.empty()) return InvalidArgument("rank plan: write to '" + w.tensor + "': " + bad);
        w.planes = static_cast<uint32_t>(planes);
      }
      plan.writes.push_back(std::move(w));
    }
    WSYNC_ASSIGN_OR_RETURN(plan.bytes, IntOf<uint64_t>(j.at("bytes"), "bytes"));
    return plan;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(std::string("rank plan: malformed: ") + e.what());
  }
}

}  // namespace wsync
