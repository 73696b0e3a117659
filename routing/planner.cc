#include "routing/planner.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <tuple>
#include <unordered_map>

#include "routing/holders.h"
#include "routing/mapping.h"
#include "routing/validate.h"

namespace wsync {

namespace {

// One piece of a destination that a single holder class can send.
struct Job {
  int32_t src = -1;
  int32_t dst = -1;
  int32_t mesh_group = -1;
  int32_t layout = -1;   // index into Planner::layouts_
  int32_t klass = -1;    // holder class within that layout
  int32_t owner = -1;    // class of Planner::shards_ holding most of it before unshard
  int32_t sender = -1;
  std::array<int8_t, kMaxDims> dst_to_src{};
  Box src_box;
  Box dst_box;
  uint64_t bytes = 0;    // weights + scales, for balancing
};

// a >= 0, b > 0; no a + b - 1, which overflows for a block near 2^63.
int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0); }

// The fp8 block size along source dim `d` of `seg` (the block rows or
// columns where it maps to one of the destination's last two dims), else 1.
int64_t BlockAlong(const Segment& seg, int nd, const QuantRule* quant, int d) {
  for (int k = 0; quant && k < 2; ++k)
    if (seg.dst_to_src[nd - 2 + k] == d) return k == 0 ? quant->block_rows : quant->block_cols;
  return 1;
}

std::string PlacementKey(const TrainerParam& p) {
  std::string k = p.mesh;
  k += '|';
  for (const Placement& pl : p.placements) k += std::to_string(pl.kind == Placement::Kind::kShard ? pl.dim : -1) + ",";
  k += '|';
  for (int64_t d : p.global_shape) k += std::to_string(d) + ",";
  k += '|';
  k += p.mesh_group;
  return k;
}

class Planner {
 public:
  Planner(const TrainerSpec& t, const InferenceSpec& i, const MappingSpec& m, const PlanOptions& o)
      : trainer_(t), inference_(i), mapping_(m), opt_(o) {}

  Status Run(RoutingTable* table);

 private:
  Status BuildSources(RoutingTable* table);
  Status BuildJobs(RoutingTable* table);
  Status SplitSegment(const Segment& seg, int32_t dst, const InferenceTensor& t,
                      const QuantRule* quant, const TensorWhere& where);
  bool ShardCutsPay(const Segment& seg, const InferenceTensor& t) const;
  void Assign(const RoutingTable& table);
  void EmitOps(RoutingTable* table);
  void RecordNeeds(RoutingTable* table) const;
  int32_t OwnerClass(const Job& job) const;
  void EmitRuns(const Job& job, WriteKind kind, const Box& dbox, const Shape& shape,
                int64_t esize, const Box& sbox, std::vector<WriteOp>* ops) const;

  const TrainerSpec& trainer_;
  const InferenceSpec& inference_;
  const MappingSpec& mapping_;
  const PlanOptions& opt_;

  SourceCatalog catalog_;
  std::vector<int32_t> source_layout_;       // catalog index -> layout
  std::vector<HolderLayout> layouts_;
  // Per layout, who holds what before unshard; no classes when the plan
  // all-gathers or unshard changes nothing.
  std::vector<HolderLayout> shards_;
  std::vector<const QuantRule*> dest_quant_;  // per destination
  std::vector<const InferenceTensor*> dest_tensor_;
  std::vector<int32_t> dest_rank_;
  std::vector<Job> jobs_;
};

Status Planner::Run(RoutingTable* table) {
  auto t0 = std::chrono::steady_clock::now();
  auto stage = [&](const char* name) {
    if (opt_.stage_seconds == nullptr) return;
    const auto now = std::chrono::steady_clock::now();
    opt_.stage_seconds->emplace_back(name, std::chrono::duration<double>(now - t0).count());
    t0 = now;
  };
  if (opt_.validate) {
    WSYNC_RETURN_IF_ERROR(ValidateTrainerSpec(trainer_, opt_.trainer_source));
    WSYNC_RETURN_IF_ERROR(ValidateInferenceSpec(inference_, opt_.inference_source));
    WSYNC_RETURN_IF_ERROR(ValidateMapping(mapping_, opt_.mapping_source));
    stage("validate");
  }
  WSYNC_RETURN_IF_ERROR(BuildSources(table));
  stage("sources");
  WSYNC_RETURN_IF_ERROR(BuildJobs(table));
  stage("jobs");
  Assign(*table);
  stage("assign");
  EmitOps(table);
  stage("ops");
  if (opt_.exchange) {
    RecordNeeds(table);
    stage("needs");
  }
  for (const TrainerRank& r : trainer_.ranks) table->trainer_endpoints.push_back({r.host, r.gpu, r.nic});
  for (const InferenceRank& r : inference_.ranks)
    table->inference_endpoints.push_back({r.host, r.gpu, r.nic});
  return Status::Ok();
}

Status Planner::BuildSources(RoutingTable* table) {
  catalog_ = BuildSourceCatalog(trainer_);
  std::unordered_map<std::string_view, MeshView> meshes;
  for (const TrainerRank& rank : trainer_.ranks) {
    for (const MeshCoord& m : rank.meshes) {
      MeshView& v = meshes[m.mesh];
      if (v.rank_at.empty()) {
        v.shape = m.shape;
        v.dim_names = m.dim_names;
        int64_t total = 1;
        for (int64_t s : m.shape) total *= s;
        v.rank_at.assign(total, -1);
      }
      int64_t flat = 0;
      for (size_t d = 0; d < m.shape.size(); ++d) flat = flat * m.shape[d] + m.coord[d];
      v.rank_at[flat] = rank.rank;
    }
  }
  std::unordered_map<std::string_view, int32_t> group_index;
  std::vector<std::vector<bool>> gathered;
  for (const MeshGroupSpec& g : trainer_.mesh_groups) {
    group_index.emplace(g.name, static_cast<int32_t>(table->mesh_groups.size()));
    auto mesh_it = meshes.find(g.mesh);
    if (mesh_it == meshes.end())
      return InvalidArgument(opt_.trainer_source + ": mesh group '" + g.name + "': mesh '" + g.mesh +
                             "' is reported by no rank");
    const MeshView& mesh = mesh_it->second;
    MeshGroupInfo info{g.name, mesh.rank_at};
    std::sort(info.ranks.begin(), info.ranks.end());
    table->mesh_groups.push_back(std::move(info));
    std::vector<bool> flags(mesh.shape.size(), false);
    for (size_t d = 0; d < mesh.dim_names.size(); ++d)
      for (const std::string& n : g.gather_dims) flags[d] = flags[d] || n == mesh.dim_names[d];
    gathered.push_back(std::move(flags));
  }
  std::unordered_map<std::string, int32_t> layout_index;
  table->sources.resize(catalog_.params.size());
  source_layout_.resize(catalog_.params.size());
  for (size_t i = 0; i < catalog_.params.size(); ++i) {
    const TrainerParam& p = *catalog_.params[i];
    SourceTensor& s = table->sources[i];
    s.name = p.name;
    s.global_shape = p.global_shape;
    s.dtype = p.dtype;
    auto group_it = group_index.find(p.mesh_group);
    if (group_it == group_index.end())
      return InvalidArgument(opt_.trainer_source + ": rank " + std::to_string(catalog_.first_rank[i]) +
                             ": tensor '" + p.name + "': mesh_group '" + p.mesh_group + "' is not in mesh_groups");
    s.mesh_group = group_it->second;
    auto [it, inserted] = layout_index.emplace(PlacementKey(p), static_cast<int32_t>(layouts_.size()));
    if (inserted) {
      auto layout = ComputeHolderLayout(p.global_shape, meshes[p.mesh], p.placements,
                                        gathered[s.mesh_group]);
      if (!layout.ok())
        return InvalidArgument(opt_.trainer_source + ": rank " + std::to_string(catalog_.first_rank[i]) +
                               ": tensor '" + p.name + "': mesh group '" + p.mesh_group + "': " +
                               layout.status().message());
      layouts_.push_back(std::move(layout).value());
      HolderLayout before;
      if (opt_.exchange) {
        // With nothing gathered every rank's shard is one box; the layout
        // fails only where unshard would, which was checked just above.
        auto shards = ComputeHolderLayout(p.global_shape, meshes[p.mesh], p.placements,
                                          std::vector<bool>(meshes[p.mesh].shape.size(), false));
        if (shards.ok() && shards->classes.size() != layouts_.back().classes.size()) before = std::move(*shards);
      }
      shards_.push_back(std::move(before));
    }
    source_layout_[i] = it->second;
    auto by_rank = [](const SourceTensor::Holder& a, const SourceTensor::Holder& b) { return a.rank < b.rank; };
    for (const HolderClass& c : layouts_[it->second].classes)
      for (int32_t r : c.ranks) s.holders.push_back({r, c.box});
    std::sort(s.holders.begin(), s.holders.end(), by_rank);
    for (const HolderClass& c : shards_[it->second].classes)
      for (int32_t r : c.ranks) s.shards.push_back({r, c.box});
    std::sort(s.shards.begin(), s.shards.end(), by_rank);
  }
  return Status::Ok();
}

Status Planner::BuildJobs(RoutingTable* table) {
  WSYNC_ASSIGN_OR_RETURN(Mapper mapper, Mapper::Create(mapping_, &catalog_, opt_.mapping_source));
  std::vector<uint8_t> used(catalog_.params.size(), 0);
  std::vector<Segment> segs;
  size_t total = 0;
  for (const InferenceRank& rank : inference_.ranks) total += rank.tensors.size();
  table->destinations.reserve(total);
  dest_quant_.reserve(total);
  dest_tensor_.reserve(total);
  for (const InferenceRank& rank : inference_.ranks) {
    for (const InferenceTensor& t : rank.tensors) {
      const int32_t dst = static_cast<int32_t>(table->destinations.size());
      DestTensor d;
      d.rank = rank.rank;
      d.name = t.name;
      d.shape = t.shape;
      d.dtype = t.dtype;
      d.where = t.where;
      d.bytes = static_cast<uint64_t>(DTypeSize(t.dtype));
      for (int64_t s : t.shape) d.bytes *= static_cast<uint64_t>(s);
      if (t.scale) {
        d.has_scale = true;
        d.scale_name = t.scale->name;
        d.scale_shape = t.scale->shape;
        d.scale_where = t.scale->where;
        d.scale_bytes = static_cast<uint64_t>(DTypeSize(t.scale->dtype));
        for (int64_t s : t.scale->shape) d.scale_bytes *= static_cast<uint64_t>(s);
      }
      table->destinations.push_back(std::move(d));
      const TensorWhere where{&opt_.inference_source, rank.rank, &t.name};
      Conversion conv;
      segs.clear();
      WSYNC_RETURN_IF_ERROR(mapper.Resolve(t, where, &segs, &conv, &used));
      dest_quant_.push_back(conv.quant);
      dest_tensor_.push_back(&t);
      dest_rank_.push_back(rank.rank);
      for (const Segment& seg : segs)
        WSYNC_RETURN_IF_ERROR(SplitSegment(seg, dst, t, conv.quant, where));
    }
  }
  return mapper.CheckAllUsed(used, opt_.trainer_source);
}

// Splits a segment along its source's holder grid: each piece has one class
// of candidate senders (e.g. experts spanning two EP slices).
Status Planner::SplitSegment(const Segment& seg, int32_t dst, const InferenceTensor& t,
                             const QuantRule* quant, const TensorWhere& where) {
  const int snd = seg.src_box.ndim;
  if (seg.src_box.NumElements() == 0) return Status::Ok();
  const HolderLayout& layout = layouts_[source_layout_[seg.source]];
  const HolderLayout& shards = shards_[source_layout_[seg.source]];
  const TrainerParam& p = *catalog_.params[seg.source];
  const int nd = static_cast<int>(t.shape.size());
  // Cut where the holder classes change and, for a planned exchange, where
  // the trainers' shards do when that pays (ShardCutsPay), so each piece has
  // one rank that holds most of it already. On fp8 block dims a shard cut
  // moves down to its block edge: a block is quantized whole, on one rank.
  const bool cut_shards = !shards.classes.empty() && ShardCutsPay(seg, t);
  std::array<std::vector<int64_t>, kMaxDims> all_cuts;
  for (int d = 0; d < snd; ++d) {
    all_cuts[d] = layout.cuts[d];
    if (!cut_shards) continue;
    const int64_t block = BlockAlong(seg, nd, quant, d);
    for (int64_t c : shards.cuts[d]) all_cuts[d].push_back(c == p.global_shape[d] ? c : c / block * block);
    std::sort(all_cuts[d].begin(), all_cuts[d].end());
    all_cuts[d].erase(std::unique(all_cuts[d].begin(), all_cuts[d].end()), all_cuts[d].end());
  }
  // Per dim: the cut intervals that intersect the box.
  std::array<std::pair<size_t, size_t>, kMaxDims> span{};  // [first, last] interval index
  for (int d = 0; d < snd; ++d) {
    const std::vector<int64_t>& cuts = all_cuts[d];
    const int64_t lo = seg.src_box.offset[d], hi = lo + seg.src_box.size[d];
    size_t a = std::upper_bound(cuts.begin(), cuts.end(), lo) - cuts.begin() - 1;
    size_t b = std::lower_bound(cuts.begin(), cuts.end(), hi) - cuts.begin() - 1;
    span[d] = {a, b};
  }
  std::array<size_t, kMaxDims> at{};
  for (int d = 0; d < snd; ++d) at[d] = span[d].first;
  while (true) {
    Job job;
    job.src = seg.source;
    job.dst = dst;
    job.mesh_group = -1;
    job.layout = source_layout_[seg.source];
    job.dst_to_src = seg.dst_to_src;
    job.src_box = seg.src_box;
    job.dst_box = seg.dst_box;
    for (int d = 0; d < snd; ++d) {
      const std::vector<int64_t>& cuts = all_cuts[d];
      const int64_t lo = std::max(seg.src_box.offset[d], cuts[at[d]]);
      const int64_t hi = std::min(seg.src_box.offset[d] + seg.src_box.size[d], cuts[at[d] + 1]);
      job.src_box.offset[d] = lo;
      job.src_box.size[d] = hi - lo;
    }
    for (int d = 0; d < nd; ++d) {
      const int sd = seg.dst_to_src[d];
      if (sd < 0) continue;
      job.dst_box.offset[d] = seg.dst_box.offset[d] + (job.src_box.offset[sd] - seg.src_box.offset[sd]);
      job.dst_box.size[d] = job.src_box.size[sd];
    }
    job.klass = layout.FindClass(job.src_box.offset, snd);
    if (job.klass < 0)
      return Internal(where + ": no trainer rank holds part of source '" + p.name + "' after unshard");
    // An uncut piece is balanced over all its holders, as under full_tensor:
    // the shard holding most of it may hold little, and every piece of the
    // tensor would prefer the same one.
    job.owner = cut_shards ? OwnerClass(job) : -1;
    uint64_t bytes = static_cast<uint64_t>(job.src_box.NumElements()) *
                     static_cast<uint64_t>(DTypeSize(t.dtype));
    if (quant) {
      const int64_t blocks[2] = {quant->block_rows, quant->block_cols};
      int64_t nblocks = 1;
      for (int d = 0; d < nd; ++d) {
        int64_t n = job.dst_box.size[d];
        if (d >= nd - 2) {
          const int64_t b = blocks[d - (nd - 2)];
          const int sd = seg.dst_to_src[d];
          const int64_t so = job.src_box.offset[sd], ss = job.src_box.size[sd];
          if (layout.classes.size() > 1 && (so % b != 0 || ((so + ss) % b != 0 && so + ss != p.global_shape[sd])))
            return InvalidArgument(where + ": fp8 block of source '" + p.name + "' on dim " +
                                   std::to_string(sd) + " is cut at " + std::to_string(so % b ? so : so + ss) +
                                   " by the trainer's sharding after unshard (a shard boundary must fall on a multiple of " +
                                   std::to_string(b) + ")");
          n = CeilDiv(so + ss, b) - so / b;
        }
        nblocks *= n;
      }
      bytes += static_cast<uint64_t>(nblocks) * static_cast<uint64_t>(DTypeSize(quant->scale_dtype));
    }
    job.bytes = bytes;
    jobs_.push_back(job);
    int d = snd - 1;  // odometer over the cut intervals
    for (; d >= 0; --d) {
      if (++at[d] <= span[d].second) break;
      at[d] = span[d].first;
    }
    if (d < 0) break;
  }
  return Status::Ok();
}

// Whether to cut `seg` at the trainers' shard edges. A cut adds a write per
// piece; what it saves is the rows its writer would otherwise receive from
// its peers. Not where:
// a piece would be smaller than PlanOptions::min_shard_piece_bytes (the
// write's fixed cost outweighs gathering it: replicated small tensors would
// be written once per shard and inference rank). Cuts moved to fp8 block
// edges may leave a piece across two shards; its writer then receives the
// rows it lacks, of every expert where the tensor is stacked (PlanExchange,
// rank_plan.cc).
bool Planner::ShardCutsPay(const Segment& seg, const InferenceTensor& t) const {
  const HolderLayout& layout = layouts_[source_layout_[seg.source]];
  const HolderLayout& shards = shards_[source_layout_[seg.source]];
  const int snd = seg.src_box.ndim;
  if (layout.FindClass(seg.src_box.offset, snd) < 0) return false;
  int64_t pieces = 1;
  for (int d = 0; d < snd; ++d) {
    if (shards.cuts[d] == layout.cuts[d]) continue;  // not a gathered dim
    const int64_t lo = seg.src_box.offset[d], hi = lo + seg.src_box.size[d];
    for (int64_t c : shards.cuts[d]) pieces += c > lo && c < hi;
  }
  const uint64_t bytes = static_cast<uint64_t>(seg.src_box.NumElements()) * static_cast<uint64_t>(DTypeSize(t.dtype));
  return pieces == 1 || bytes / static_cast<uint64_t>(pieces) >= opt_.min_shard_piece_bytes;
}

void Planner::Assign(const RoutingTable& table) {
  // NIC id per trainer rank: (host, nic) pairs.
  std::unordered_map<std::string, int32_t> nic_ids;
  std::vector<int32_t> nic_of(trainer_.ranks.size());
  for (const TrainerRank& r : trainer_.ranks) {
    auto [it, inserted] = nic_ids.emplace(r.host + "#" + std::to_string(r.nic),
                                          static_cast<int32_t>(nic_ids.size()));
    nic_of[r.rank] = it->second;
  }
  std::vector<std::vector<uint32_t>> by_group(table.mesh_groups.size());
  for (uint32_t j = 0; j < jobs_.size(); ++j) {
    jobs_[j].mesh_group = table.sources[jobs_[j].src].mesh_group;
    by_group[jobs_[j].mesh_group].push_back(j);
  }
  // Under a planned exchange, the copies of one uncut piece (one per engine
  // replica or TP rank holding it whole: norms, routers, MLA's replicated
  // projections) are one unit with one writer. It receives the piece once
  // and writes every copy, so the piece crosses hosts once, not once per
  // copy (Kimi-K2: 128 writers each gathered every replicated tensor).
  const auto shared = [this](const Job& j) { return j.owner < 0 && !shards_[j.layout].classes.empty(); };
  const auto key_less = [this](const Job& x, const Job& y) {
    return std::tie(x.layout, x.klass, x.src, x.src_box.ndim, x.src_box.offset, x.src_box.size) <
           std::tie(y.layout, y.klass, y.src, y.src_box.ndim, y.src_box.offset, y.src_box.size);
  };
  struct Unit {
    uint64_t bytes = 0;
    uint32_t begin = 0, end = 0;  // into `members`
  };
  std::vector<Unit> units;
  std::vector<uint64_t> rank_load(trainer_.ranks.size()), nic_load(nic_ids.size());
  for (std::vector<uint32_t>& members : by_group) {  // the group's jobs
    std::fill(rank_load.begin(), rank_load.end(), 0);
    std::fill(nic_load.begin(), nic_load.end(), 0);
    std::sort(members.begin(), members.end(), [&](uint32_t a, uint32_t b) {
      const bool sa = shared(jobs_[a]), sb = shared(jobs_[b]);
      if (sa != sb) return sb;  // single jobs first
      if (sa && key_less(jobs_[a], jobs_[b])) return true;
      if (sa && key_less(jobs_[b], jobs_[a])) return false;
      return a < b;
    });
    units.clear();
    for (uint32_t i = 0; i < members.size(); ++i) {
      const Job& job = jobs_[members[i]];
      // Sorted: a shared job after one of equal key joins its unit.
      const bool joins = i > 0 && shared(job) && shared(jobs_[members[i - 1]]) && !key_less(jobs_[members[i - 1]], job);
      if (!joins) units.push_back(Unit{0, i, i});
      units.back().bytes += job.bytes;
      units.back().end = i + 1;
    }
    std::sort(units.begin(), units.end(), [&](const Unit& a, const Unit& b) {
      if (a.bytes != b.bytes) return a.bytes > b.bytes;
      return members[a.begin] < members[b.begin];
    });
    for (const Unit& unit : units) {
      const Job& first = jobs_[members[unit.begin]];
      // Prefer the ranks that hold most of the piece before unshard: they
      // receive the least of it from their peers.
      const std::vector<int32_t>& cands = first.owner >= 0 ? shards_[first.layout].classes[first.owner].ranks
                                                           : layouts_[first.layout].classes[first.klass].ranks;
      int32_t best = cands[0];
      uint64_t best_load = rank_load[best] + nic_load[nic_of[best]];
      for (size_t i = 1; i < cands.size(); ++i) {
        const int32_t r = cands[i];
        const uint64_t load = rank_load[r] + nic_load[nic_of[r]];
        if (load < best_load) {  // ranks ascend: ties keep the lowest
          best = r;
          best_load = load;
        }
      }
      for (uint32_t i = unit.begin; i < unit.end; ++i) jobs_[members[i]].sender = best;
      rank_load[best] += unit.bytes;
      nic_load[nic_of[best]] += unit.bytes;
    }

    // A rank receives one box per source (SourceTensor::needs, the bounding
    // box of its writes): a rank given two non-adjacent uncut slices of a
    // tensor (TP column slices, say) receives the slices between them too,
    // which their own writers on its host receive as well. Where a tensor's
    // uncut slices are alike (same bytes, apart along one dim only), they
    // are dealt out again in order, each writer taking as many as it had:
    // the same loads, and each writer's slices adjacent.
    std::sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) { return a.begin < b.begin; });
    const auto job_of = [&](const Unit& u) -> Job& { return jobs_[members[u.begin]]; };
    for (size_t u = 0; u < units.size();) {
      const Job& head = job_of(units[u]);
      size_t e = u + 1;
      while (shared(head) && e < units.size() && shared(job_of(units[e])) &&
             std::tie(head.layout, head.klass, head.src) ==
                 std::tie(job_of(units[e]).layout, job_of(units[e]).klass, job_of(units[e]).src))
        ++e;
      int along = -1;  // the one dim the slices step along
      bool alike = e - u > 1;
      for (size_t k = u + 1; k < e && alike; ++k) {
        const Box& a = head.src_box;
        const Box& b = job_of(units[k]).src_box;
        alike = units[k].bytes == units[u].bytes && a.ndim == b.ndim && a.size == b.size;
        for (int d = 0; d < a.ndim && alike; ++d) {
          if (a.offset[d] == b.offset[d]) continue;
          if (along < 0) along = d;
          alike = d == along;
        }
      }
      if (alike) {
        // Writers in the order they first appear, each with its count.
        std::vector<std::pair<int32_t, size_t>> writers;
        for (size_t k = u; k < e; ++k) {
          const int32_t w = job_of(units[k]).sender;
          auto it = std::find_if(writers.begin(), writers.end(), [w](const auto& p) { return p.first == w; });
          if (it == writers.end()) writers.emplace_back(w, 1);
          else ++it->second;
        }
        size_t k = u;
        for (const auto& [w, count] : writers)
          for (size_t c = 0; c < count; ++c, ++k)
            for (uint32_t i = units[k].begin; i < units[k].end; ++i) jobs_[members[i]].sender = w;
      }
      u = e;
    }
  }
}

// The shard class that holds the largest part of `job`'s source box before
// unshard, or -1 without a planned exchange. A piece cut at shard edges lies
// in one shard; one widened to fp8 block edges spans a few.
int32_t Planner::OwnerClass(const Job& job) const {
  const HolderLayout& shards = shards_[job.layout];
  if (shards.classes.empty()) return -1;
  const std::vector<int32_t>& holders = layouts_[job.layout].classes[job.klass].ranks;
  int32_t best = -1;
  int64_t best_overlap = 0;
  for (size_t c = 0; c < shards.classes.size(); ++c) {
    const Box& b = shards.classes[c].box;
    int64_t overlap = 1;
    for (int d = 0; d < job.src_box.ndim && overlap > 0; ++d) {
      const int64_t lo = std::max(b.offset[d], job.src_box.offset[d]);
      const int64_t hi = std::min(b.offset[d] + b.size[d], job.src_box.offset[d] + job.src_box.size[d]);
      overlap *= std::max<int64_t>(0, hi - lo);
    }
    // A shard's ranks hold the piece after unshard too (they are among the
    // holder class) unless the shard lies elsewhere; check one to be sure.
    if (overlap > best_overlap &&
        std::binary_search(holders.begin(), holders.end(), shards.classes[c].ranks.front())) {
      best = static_cast<int32_t>(c);
      best_overlap = overlap;
    }
  }
  return best;
}

// SourceTensor::needs: per (source, writing rank) the bounding box of what
// its writes read, in the element grid, fp8 boxes widened to whole blocks
// (the quantize reads them whole). Ops of one (rank, source) are adjacent.
void Planner::RecordNeeds(RoutingTable* table) const {
  const std::vector<WriteOp>& ops = table->ops;
  for (size_t i = 0; i < ops.size();) {
    const WriteOp& first = ops[i];
    SourceTensor& src = table->sources[first.src];
    const int n = first.src_box.ndim;
    std::array<int64_t, kMaxDims> lo, hi;
    lo.fill(INT64_MAX);
    hi.fill(INT64_MIN);
    size_t e = i;
    for (; e < ops.size() && ops[e].src_rank == first.src_rank && ops[e].src == first.src &&
           ops[e].mesh_group == first.mesh_group;
         ++e) {
      const WriteOp& op = ops[e];
      const DestTensor& dst = table->destinations[op.dst];
      const bool blocks = op.kind == WriteKind::kScale || dst.dtype == DType::kFP8E4M3;
      const QuantRule* q = dest_quant_[op.dst];
      if (blocks && q != nullptr) {
        src.block_rows = q->block_rows;
        src.block_cols = q->block_cols;
      }
      for (int d = 0; d < n; ++d) {
        int64_t a = op.src_box.offset[d], b = a + op.src_box.size[d];
        if (blocks && q != nullptr && d >= n - 2) {
          const int64_t block = d == n - 2 ? q->block_rows : q->block_cols;
          if (op.kind == WriteKind::kScale) {
            a *= block;
            b *= block;
          } else {
            a = a / block * block;
            b = CeilDiv(b, block) * block;
          }
          b = std::min(b, src.global_shape[d]);
        }
        lo[d] = std::min(lo[d], a);
        hi[d] = std::max(hi[d], b);
      }
    }
    Box need;
    need.ndim = static_cast<int8_t>(n);
    for (int d = 0; d < n; ++d) {
      need.offset[d] = lo[d];
      need.size[d] = hi[d] - lo[d];
    }
    if (!src.shards.empty()) src.needs.push_back({first.src_rank, need});
    i = e;
  }
  for (SourceTensor& src : table->sources)
    std::sort(src.needs.begin(), src.needs.end(),
              [](const SourceTensor::Holder& a, const SourceTensor::Holder& b) { return a.rank < b.rank; });
}

// How EmitRuns cuts `dbox` of a tensor of `shape` into ops: the box's
// contiguous runs are its extent in the dims from `k` on (k: the last dim the
// box does not span whole) at each index of the dims before. With `strided`,
// the runs along dim k - 1 are one op of `planes` planes (a trainer rank's
// rows of every stacked expert); the ops step through the dims before it.
struct RunLayout {
  int k = 0;
  int plane_dim = -1;  // destination dim the planes step along; -1: none
  int64_t planes = 1;
  int64_t ops = 0;

  RunLayout(const Box& dbox, const Shape& shape, const std::array<int8_t, kMaxDims>& dst_to_src, bool strided) {
    const int nd = static_cast<int>(shape.size());
    if (dbox.NumElements() == 0) return;
    k = nd - 1;
    while (k >= 0 && dbox.offset[k] == 0 && dbox.size[k] == shape[k]) --k;
    if (strided && k >= 1 && dbox.size[k - 1] > 1 && dst_to_src[k - 1] >= 0) {
      plane_dim = k - 1;
      planes = dbox.size[plane_dim];
    }
    ops = 1;
    for (int d = 0; d < (plane_dim >= 0 ? plane_dim : k); ++d) ops *= dbox.size[d];
  }
};

void Planner::EmitRuns(const Job& job, WriteKind kind, const Box& dbox, const Shape& shape,
                       int64_t esize, const Box& sbox, std::vector<WriteOp>* ops) const {
  const int nd = static_cast<int>(shape.size());
  const RunLayout layout(dbox, shape, job.dst_to_src, opt_.exchange);
  if (layout.ops == 0) return;
  const int k = layout.k;
  const int outer = layout.plane_dim >= 0 ? layout.plane_dim : k;  // the odometer's dims: [0, outer)
  std::array<int64_t, kMaxDims> stride{};
  stride[nd - 1] = 1;
  for (int d = nd - 2; d >= 0; --d) stride[d] = stride[d + 1] * shape[d + 1];
  Box run = dbox;  // one op's extent: one index of each outer dim, planes along plane_dim
  for (int d = 0; d < outer; ++d) run.size[d] = 1;
  WriteOp op;
  op.mesh_group = job.mesh_group;
  op.src_rank = job.sender;
  op.src = job.src;
  op.dst_rank = dest_rank_[job.dst];
  op.dst = job.dst;
  op.kind = kind;
  op.src_box = sbox;
  if (layout.plane_dim >= 0) {
    op.planes = static_cast<uint32_t>(layout.planes);
    op.plane_dim = job.dst_to_src[layout.plane_dim];
    op.plane_stride = static_cast<uint64_t>(stride[layout.plane_dim] * esize);
  }
  const uint64_t op_bytes = static_cast<uint64_t>(run.NumElements() * esize);
  while (true) {
    int64_t off = 0;
    for (int d = 0; d < nd; ++d) off += run.offset[d] * stride[d];
    op.dst_offset = static_cast<uint64_t>(off * esize);
    op.bytes = op_bytes;
    for (int d = 0; d < nd; ++d) {
      const int sd = job.dst_to_src[d];
      if (sd < 0) continue;
      op.src_box.offset[sd] = sbox.offset[sd] + (run.offset[d] - dbox.offset[d]);
      op.src_box.size[sd] = run.size[d];
    }
    ops->push_back(op);
    int d = outer - 1;  // odometer over the outer dims
    for (; d >= 0; --d) {
      if (++run.offset[d] < dbox.offset[d] + dbox.size[d]) break;
      run.offset[d] = dbox.offset[d];
    }
    if (d < 0) break;
  }
}

// The scale blocks a job covers: its rows/cols rounded out to block edges
// (block-aligned or ending at the tensor end, checked when splitting).
void ScaleBoxes(const Job& job, const QuantRule& q, int nd, Box* dsb, Box* ssb) {
  *dsb = job.dst_box;
  *ssb = job.src_box;
  const int64_t blocks[2] = {q.block_rows, q.block_cols};
  for (int k = 0; k < 2; ++k) {
    const int dd = nd - 2 + k;
    const int sd = job.dst_to_src[dd];
    const int64_t b = blocks[k];
    dsb->offset[dd] = job.dst_box.offset[dd] / b;
    dsb->size[dd] = CeilDiv(job.dst_box.offset[dd] + job.dst_box.size[dd], b) - dsb->offset[dd];
    ssb->offset[sd] = job.src_box.offset[sd] / b;
    ssb->size[sd] = CeilDiv(job.src_box.offset[sd] + job.src_box.size[sd], b) - ssb->offset[sd];
  }
}

void Planner::EmitOps(RoutingTable* table) {
  // Emit in job order sorted by the op key's prefix; then only runs of ops
  // sharing (group, sender, source, destination) may need reordering, which
  // is far cheaper than sorting every op.
  // The keys side by side (a million jobs at Kimi-K2 scale): sorting them
  // touches no Job. Every field is >= 0 here, so the unsigned packing keeps
  // the order: (group, sender, source, destination, offset, index), and
  // destinations ascend by rank.
  struct Key {
    uint64_t group_sender, src_dst, linear;
    uint32_t job;
    bool operator<(const Key& o) const {
      return std::tie(group_sender, src_dst, linear, job) < std::tie(o.group_sender, o.src_dst, o.linear, o.job);
    }
  };
  std::vector<Key> keys(jobs_.size());
  for (uint32_t j = 0; j < jobs_.size(); ++j) {
    const Job& job = jobs_[j];
    keys[j] = {static_cast<uint64_t>(job.mesh_group) << 32 | static_cast<uint32_t>(job.sender),
               static_cast<uint64_t>(job.src) << 32 | static_cast<uint32_t>(job.dst),
               BoxByteOffset(job.dst_box, dest_tensor_[job.dst]->shape, 1), j};
  }
  std::sort(keys.begin(), keys.end());
  std::vector<uint32_t> order(jobs_.size());
  for (size_t i = 0; i < keys.size(); ++i) order[i] = keys[i].job;
  keys = {};
  int64_t total = 0;
  for (const Job& job : jobs_) {
    const InferenceTensor& t = *dest_tensor_[job.dst];
    total += RunLayout(job.dst_box, t.shape, job.dst_to_src, opt_.exchange).ops;
    if (const QuantRule* q = dest_quant_[job.dst]) {
      Box dsb, ssb;
      ScaleBoxes(job, *q, static_cast<int>(t.shape.size()), &dsb, &ssb);
      total += RunLayout(dsb, t.scale->shape, job.dst_to_src, opt_.exchange).ops;
    }
  }
  std::vector<WriteOp>& ops = table->ops;
  ops.reserve(static_cast<size_t>(total));
  for (uint32_t j : order) {
    const Job& job = jobs_[j];
    const InferenceTensor& t = *dest_tensor_[job.dst];
    EmitRuns(job, WriteKind::kWeight, job.dst_box, t.shape, DTypeSize(t.dtype), job.src_box, &ops);
    if (const QuantRule* q = dest_quant_[job.dst]) {
      Box dsb, ssb;
      ScaleBoxes(job, *q, static_cast<int>(t.shape.size()), &dsb, &ssb);
      EmitRuns(job, WriteKind::kScale, dsb, t.scale->shape, DTypeSize(t.scale->dtype), ssb, &ops);
    }
  }
  auto same_group = [](const WriteOp& a, const WriteOp& b) {
    return a.mesh_group == b.mesh_group && a.src_rank == b.src_rank && a.src == b.src && a.dst == b.dst;
  };
  auto within = [](const WriteOp& a, const WriteOp& b) {
    if (a.kind != b.kind) return a.kind < b.kind;
    return a.dst_offset < b.dst_offset;
  };
  for (size_t i = 0; i < ops.size();) {
    size_t e = i + 1;
    while (e < ops.size() && same_group(ops[i], ops[e])) ++e;
    if (!std::is_sorted(ops.begin() + i, ops.begin() + e, within))
      std::sort(ops.begin() + i, ops.begin() + e, within);
    i = e;
  }
}

}  // namespace

StatusOr<RoutingTable> Plan(const TrainerSpec& trainer, const InferenceSpec& inference,
                            const MappingSpec& mapping, const PlanOptions& options) {
  RoutingTable table;
  Planner planner(trainer, inference, mapping, options);
  WSYNC_RETURN_IF_ERROR(planner.Run(&table));
  return table;
}

uint64_t BoxByteOffset(const Box& box, const Shape& shape, int64_t elem_size) {
  int64_t off = 0, stride = 1;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    off += box.offset[d] * stride;
    stride *= shape[d];
  }
  return static_cast<uint64_t>(off * elem_size);
}

}  // namespace wsync
