#include "tests/routing/test_specs.h"

#include <algorithm>
#include <sstream>

namespace wsync::testing {

std::vector<std::pair<int64_t, int64_t>> TorchChunks(int64_t n, int64_t k) {
  std::vector<std::pair<int64_t, int64_t>> out;
  const int64_t c = n == 0 ? 0 : (n + k - 1) / k;
  if (c > 0)
    for (int64_t s = 0; s < n; s += c) out.push_back({s, std::min(c, n - s)});
  while (static_cast<int64_t>(out.size()) < k) out.push_back({n, 0});
  return out;
}

TrainerSpec BuildTrainer(const std::vector<MeshDef>& meshes, const std::vector<GroupDef>& groups,
                         const std::vector<ParamDef>& params, int ranks_per_host) {
  TrainerSpec spec;
  int64_t n = 1;
  for (int64_t s : meshes.at(0).shape) n *= s;
  for (const GroupDef& g : groups) spec.mesh_groups.push_back({g.name, g.mesh, g.gather});
  for (int64_t r = 0; r < n; ++r) {
    TrainerRank rank;
    rank.rank = static_cast<int32_t>(r);
    rank.host = "trainer-" + std::to_string(r / ranks_per_host);
    rank.gpu = static_cast<int32_t>(r % ranks_per_host);
    rank.nic = rank.gpu;
    for (const MeshDef& m : meshes) {
      MeshCoord c{m.id, m.shape, m.dims, {}};
      c.coord.resize(m.shape.size());
      int64_t rest = r;
      for (size_t d = m.shape.size(); d-- > 0;) {
        c.coord[d] = rest % m.shape[d];
        rest /= m.shape[d];
      }
      rank.meshes.push_back(c);
    }
    for (const ParamDef& p : params) {
      const GroupDef* g = nullptr;
      for (const GroupDef& x : groups)
        if (x.name == p.group) g = &x;
      const MeshCoord* mc = nullptr;
      for (const MeshCoord& c : rank.meshes)
        if (c.mesh == g->mesh) mc = &c;
      TrainerParam tp;
      tp.name = p.name;
      tp.global_shape = p.shape;
      tp.dtype = p.dtype;
      tp.mesh = g->mesh;
      tp.placements = p.placements;
      tp.mesh_group = p.group;
      Shape off(p.shape.size(), 0), size = p.shape;
      for (size_t m = 0; m < p.placements.size(); ++m) {
        if (p.placements[m].kind != Placement::Kind::kShard) continue;
        const int d = p.placements[m].dim;
        auto pieces = TorchChunks(size[d], mc->shape[m]);
        auto [o, s] = pieces[mc->coord[m]];
        off[d] += s > 0 ? o : size[d];
        size[d] = s;
      }
      tp.local_shape = size;
      tp.local_offset = off;
      rank.params.push_back(tp);
    }
    spec.ranks.push_back(std::move(rank));
  }
  return spec;
}

namespace {

int64_t Elements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

int64_t Esize(DType t) { return t == DType::kFP8E4M3 ? 1 : t == DType::kFP32 ? 4 : 2; }

}  // namespace

void AddTensor(InferenceRank* rank, const std::string& name, const Shape& shape, DType dtype,
               std::optional<TpSlice> tp, std::optional<ExpertRange> experts) {
  if (rank->regions.empty()) rank->regions.push_back({"weights", 0, ""});
  MemoryRegion& region = rank->regions[0];
  InferenceTensor t;
  t.name = name;
  t.shape = shape;
  t.dtype = dtype;
  t.tp = tp;
  t.experts = experts;
  t.where = {"weights", region.size};
  region.size += static_cast<uint64_t>(Elements(shape) * Esize(dtype));
  if (dtype == DType::kFP8E4M3) {
    ScaleTensor s;
    s.name = name + "_scale_inv";
    s.shape = shape;
    const size_t nd = shape.size();
    s.shape[nd - 2] = (shape[nd - 2] + 127) / 128;
    s.shape[nd - 1] = (shape[nd - 1] + 127) / 128;
    s.where = {"weights", region.size};
    region.size += static_cast<uint64_t>(Elements(s.shape) * 4);
    t.scale = s;
  }
  rank->tensors.push_back(t);
}

namespace {

struct HeldBox {
  bool ok = false;  // union is a box
  Shape lo, hi;
};

// Union of the local boxes of every rank agreeing with `rank` on the
// non-gathered mesh dims; a box iff its volume equals the bounding box's.
HeldBox Held(const TrainerSpec& spec, int32_t rank, const std::string& name) {
  const TrainerParam* mine = nullptr;
  for (const TrainerParam& p : spec.ranks[rank].params)
    if (p.name == name) mine = &p;
  HeldBox h;
  if (!mine) return h;
  const MeshGroupSpec* g = nullptr;
  for (const MeshGroupSpec& x : spec.mesh_groups)
    if (x.name == mine->mesh_group) g = &x;
  auto coord_of = [&](int32_t r) -> const MeshCoord* {
    for (const MeshCoord& m : spec.ranks[r].meshes)
      if (m.mesh == mine->mesh) return &m;
    return nullptr;
  };
  const MeshCoord* me = coord_of(rank);
  const size_t nd = mine->global_shape.size();
  h.lo.assign(nd, INT64_MAX);
  h.hi.assign(nd, INT64_MIN);
  std::map<std::pair<Shape, Shape>, int64_t> boxes;  // distinct local boxes (replicas repeat)
  for (const TrainerRank& other : spec.ranks) {
    const MeshCoord* oc = coord_of(other.rank);
    if (!oc) continue;
    bool same = true;
    for (size_t d = 0; d < me->coord.size(); ++d) {
      const bool gathered = std::find(g->gather_dims.begin(), g->gather_dims.end(),
                                      me->dim_names[d]) != g->gather_dims.end();
      if (!gathered && oc->coord[d] != me->coord[d]) same = false;
    }
    if (!same) continue;
    for (const TrainerParam& p : other.params) {
      if (p.name != name) continue;
      int64_t v = 1;
      for (size_t d = 0; d < nd; ++d) v *= p.local_shape[d];
      if (v == 0) break;
      boxes[{p.local_offset, p.local_shape}] = v;
    }
  }
  int64_t volume = 0, bbox = 1;
  for (const auto& [box, v] : boxes) {
    volume += v;
    for (size_t d = 0; d < nd; ++d) {
      h.lo[d] = std::min(h.lo[d], box.first[d]);
      h.hi[d] = std::max(h.hi[d], box.first[d] + box.second[d]);
    }
  }
  if (boxes.empty()) {  // every shard empty: the empty box at the origin
    h.lo.assign(nd, 0);
    h.hi.assign(nd, 0);
  }
  for (size_t d = 0; d < nd; ++d) bbox *= boxes.empty() ? 0 : h.hi[d] - h.lo[d];
  h.ok = volume == bbox;
  return h;
}

}  // namespace

bool HeldIsBox(const TrainerSpec& trainer, int32_t rank, const std::string& name) {
  return Held(trainer, rank, name).ok;
}

CheckResult CheckPlan(const TrainerSpec& trainer, const InferenceSpec& inference,
                      const RoutingTable& table) {
  CheckResult res;
  std::ostringstream err;
  // Destinations mirror the inference spec, in order.
  std::vector<const InferenceTensor*> tensors;
  for (const InferenceRank& r : inference.ranks)
    for (const InferenceTensor& t : r.tensors) tensors.push_back(&t);
  if (tensors.size() != table.destinations.size()) {
    res.error = "destination count " + std::to_string(table.destinations.size()) + " != " +
                std::to_string(tensors.size());
    return res;
  }
  std::vector<std::vector<uint8_t>> wcount(tensors.size()), scount(tensors.size());
  res.origin.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    wcount[i].assign(Elements(tensors[i]->shape) * Esize(tensors[i]->dtype), 0);
    res.origin[i].assign(Elements(tensors[i]->shape), {-1, -1});
    if (tensors[i]->scale) scount[i].assign(Elements(tensors[i]->scale->shape) * 4, 0);
  }
  std::map<std::pair<int32_t, int32_t>, HeldBox> held;
  // Strided ops are checked as their planes, expanded here by the rule
  // routing_table.h states, not by the code under test.
  std::vector<std::pair<size_t, WriteOp>> plain;
  for (size_t k = 0; k < table.ops.size(); ++k) {
    const WriteOp& op = table.ops[k];
    if (op.planes <= 1) {
      plain.push_back({k, op});
      continue;
    }
    if (op.plane_dim < 0 || op.plane_dim >= op.src_box.ndim || op.src_box.size[op.plane_dim] != op.planes ||
        op.bytes % op.planes != 0) {
      if (res.error.empty()) res.error = "op " + std::to_string(k) + ": malformed strided op";
      continue;
    }
    for (uint32_t p = 0; p < op.planes; ++p) {
      WriteOp one = op;
      one.planes = 1;
      one.src_box.offset[op.plane_dim] += p;
      one.src_box.size[op.plane_dim] = 1;
      one.dst_offset += p * op.plane_stride;
      one.bytes /= op.planes;
      plain.push_back({k, one});
    }
  }
  for (const auto& [k, op] : plain) {
    auto fail = [&, k = k](const std::string& what) {
      if (res.error.empty()) res.error = "op " + std::to_string(k) + ": " + what;
    };
    if (op.dst < 0 || op.dst >= static_cast<int32_t>(tensors.size())) { fail("bad dst"); continue; }
    if (op.src < 0 || op.src >= static_cast<int32_t>(table.sources.size())) { fail("bad src"); continue; }
    const InferenceTensor& t = *tensors[op.dst];
    const std::string& src_name = table.sources[op.src].name;
    const TrainerParam* sp = nullptr;
    for (const TrainerParam& p : trainer.ranks[op.src_rank].params)
      if (p.name == src_name) sp = &p;
    if (!sp) { fail("sender " + std::to_string(op.src_rank) + " lacks " + src_name); continue; }
    const bool scale = op.kind == WriteKind::kScale;
    const int64_t esize = scale ? 4 : Esize(t.dtype);
    if (op.src_box.NumElements() * esize != static_cast<int64_t>(op.bytes)) { fail("bytes != box"); continue; }
    std::vector<uint8_t>& count = scale ? scount[op.dst] : wcount[op.dst];
    if (op.dst_offset + op.bytes > count.size()) { fail("write past the end of " + t.name); continue; }
    for (uint64_t b = op.dst_offset; b < op.dst_offset + op.bytes; ++b) ++count[b];
    // Held by the sender?
    auto key = std::make_pair(op.src_rank, op.src);
    if (!held.count(key)) held[key] = Held(trainer, op.src_rank, src_name);
    const HeldBox& h = held[key];
    if (!h.ok) { fail("rank " + std::to_string(op.src_rank) + " holds a non-box of " + src_name); continue; }
    const size_t nd = sp->global_shape.size();
    for (size_t d = 0; d < nd; ++d) {
      int64_t lo = op.src_box.offset[d], hi = lo + op.src_box.size[d];
      if (scale && d + 2 >= nd) {
        lo *= 128;
        hi = std::min(hi * 128, sp->global_shape[d]);
      }
      if (lo < h.lo[d] || hi > h.hi[d])
        fail("source box of " + src_name + " dim " + std::to_string(d) + " [" + std::to_string(lo) +
             "," + std::to_string(hi) + ") not held by rank " + std::to_string(op.src_rank));
    }
    if (scale) continue;
    // Element origins: the source box row-major lands contiguously.
    std::vector<int64_t> idx(nd, 0);
    int64_t pos = static_cast<int64_t>(op.dst_offset) / esize;
    const int64_t n = op.src_box.NumElements();
    for (int64_t e = 0; e < n; ++e) {
      int64_t flat = 0;
      for (size_t d = 0; d < nd; ++d) flat = flat * sp->global_shape[d] + op.src_box.offset[d] + idx[d];
      res.origin[op.dst][pos++] = {op.src, flat};
      for (size_t d = nd; d-- > 0;) {
        if (++idx[d] < op.src_box.size[d]) break;
        idx[d] = 0;
      }
    }
  }
  for (size_t i = 0; i < tensors.size() && res.error.empty(); ++i) {
    for (size_t b = 0; b < wcount[i].size(); ++b)
      if (wcount[i][b] != 1) {
        res.error = "tensor " + tensors[i]->name + " byte " + std::to_string(b) + " written " +
                    std::to_string(wcount[i][b]) + " times";
        break;
      }
    for (size_t b = 0; b < scount[i].size() && res.error.empty(); ++b)
      if (scount[i][b] != 1)
        res.error = "scale of " + tensors[i]->name + " byte " + std::to_string(b) + " written " +
                    std::to_string(scount[i][b]) + " times";
  }
  return res;
}

ExchangeCheck CheckExchange(const TrainerSpec& trainer, const InferenceSpec& inference, const RoutingTable& table) {
  ExchangeCheck res;
  auto fail = [&](const std::string& m) {
    if (res.error.empty()) res.error = m;
  };
  std::vector<TrainerRankPlan> plans;
  for (const TrainerRank& r : trainer.ranks) {
    auto plan = ExtractTrainerRankPlan(table, trainer, inference, r.rank);
    if (!plan.ok()) {
      res.unsupported = "rank " + std::to_string(r.rank) + ": " + plan.status().message();
      return res;
    }
    plans.push_back(std::move(plan).value());
  }
  auto find_source = [&](int32_t rank, const std::string& group, const std::string& name) -> const RankSource* {
    for (const RankMeshGroup& g : plans[rank].groups)
      if (g.name == group)
        for (const RankSource& s : g.sources)
          if (s.name == name) return &s;
    return nullptr;
  };
  auto spec_param = [&](int32_t rank, const std::string& name) -> const TrainerParam* {
    for (const TrainerParam& p : trainer.ranks[rank].params)
      if (p.name == name) return &p;
    return nullptr;
  };
  for (const TrainerRankPlan& plan : plans) {
    for (const RankMeshGroup& g : plan.groups) {
      for (const RankSource& s : g.sources) {
        const std::string where = "rank " + std::to_string(plan.rank) + " '" + s.name + "'";
        const TrainerParam* p = spec_param(plan.rank, s.name);
        if (p == nullptr) {
          fail(where + ": not in the spec");
          continue;
        }
        const int n = static_cast<int>(p->global_shape.size());
        int64_t esize = DTypeSize(p->dtype), local_n = esize;
        for (int d = 0; d < n; ++d) {
          local_n *= p->local_shape[d];
          if (s.local.offset[d] != p->local_offset[d] || s.local.size[d] != p->local_shape[d])
            fail(where + ": local shard differs from the spec's");
        }
        const HeldBox h = Held(trainer, plan.rank, s.name);
        int64_t full_n = esize;
        for (int d = 0; d < n; ++d) full_n *= h.hi[d] - h.lo[d];
        res.full_tensor_bytes += static_cast<uint64_t>(full_n - local_n);
        // Everything the writes read lies in what the rank holds.
        for (const RankWrite& w : s.writes) {
          const bool scale = w.kind == WriteKind::kScale, fp8 = scale || w.dst_dtype == DType::kFP8E4M3;
          for (int d = 0; d < n; ++d) {
            int64_t lo = w.src_box.offset[d], hi = lo + w.src_box.size[d];
            if (fp8 && d >= n - 2) {
              lo = scale ? lo * 128 : lo / 128 * 128;
              hi = std::min<int64_t>(scale ? hi * 128 : (hi + 127) / 128 * 128, p->global_shape[d]);
            }
            if (lo < s.held.offset[d] || hi > s.held.offset[d] + s.held.size[d])
              fail(where + ": a write reads dim " + std::to_string(d) + " [" + std::to_string(lo) + ", " +
                   std::to_string(hi) + ") outside what the rank holds");
          }
        }
        if (!s.exchange()) {
          // (Two empty boxes are the same, whatever their offsets.)
          if (s.gather_dim < 0 && (s.held.NumElements() > 0 || s.local.NumElements() > 0)) {
            for (int d = 0; d < n; ++d)
              if (s.held.offset[d] != s.local.offset[d] || s.held.size[d] != s.local.size[d])
                fail(where + ": holds " + BoxText(s.held) + ", more than its shard " + BoxText(s.local) +
                     ", without gathering");
          } else {
            res.exchange_bytes += static_cast<uint64_t>(full_n - local_n);
          }
          continue;
        }
        ++res.sources_exchanged;
        res.sources_narrowed += !s.send_cols.empty();
        const int gd = s.gather_dim;
        // Outside the exchanged dim the rank holds its shard's extent, or,
        // in the last dim where pieces are narrowed, a part of it.
        for (int d = 0; d < n; ++d) {
          if (d == gd) continue;
          const int64_t lo = p->local_offset[d], hi = lo + p->local_shape[d];
          const bool narrowed = !s.send_cols.empty() && d == gd + 1 && d == n - 1;
          if (narrowed ? (s.held.offset[d] < lo || s.held.offset[d] + s.held.size[d] > hi)
                       : (s.held.offset[d] != lo || s.held.size[d] != p->local_shape[d]))
            fail(where + ": holds " + BoxText(s.held) + " beyond its shard in dim " + std::to_string(d));
        }
        // A received row spans every other dim of what the rank holds: of
        // every expert, where experts are stacked before the row dim.
        int64_t inner = esize;
        for (int d = 0; d < n; ++d)
          if (d != gd) inner *= s.held.size[d];
        int64_t at = s.held.offset[gd];
        for (size_t i = 0; i < s.gather_ranks.size(); ++i) {
          const int32_t peer = s.gather_ranks[i];
          const Rows& r = s.recv_rows[i];
          if (r.size > 0 && r.offset != at) fail(where + ": received pieces do not tile the held rows");
          at += r.size;
          const RankSource* ps = find_source(peer, g.name, s.name);
          const TrainerParam* pp = spec_param(peer, s.name);
          if (ps == nullptr || pp == nullptr || !ps->exchange()) {
            fail(where + ": peer " + std::to_string(peer) + " does not take part in the exchange");
            continue;
          }
          auto me = std::find(ps->gather_ranks.begin(), ps->gather_ranks.end(), plan.rank);
          if (me == ps->gather_ranks.end()) {
            fail(where + ": peer " + std::to_string(peer) + " does not list this rank");
            continue;
          }
          const Rows& sent = ps->send_rows[me - ps->gather_ranks.begin()];
          if (!(sent == r) && (sent.size != 0 || r.size != 0))
            fail(where + ": expects rows " + std::to_string(r.offset) + "+" + std::to_string(r.size) + " from rank " +
                 std::to_string(peer) + ", which sends " + std::to_string(sent.offset) + "+" + std::to_string(sent.size));
          if (sent.size > 0 && (sent.offset < pp->local_offset[gd] ||
                                sent.offset + sent.size > pp->local_offset[gd] + pp->local_shape[gd]))
            fail(where + ": rank " + std::to_string(peer) + " sends rows outside its shard");
          // The piece spans, in every other dim, what this rank holds: the
          // peer's shard there, or the columns it narrows the piece to
          // (which must lie in its shard).
          for (int d = 0; d < n && sent.size > 0; ++d) {
            if (d == gd) continue;
            int64_t lo = pp->local_offset[d], size = pp->local_shape[d];
            if (!ps->send_cols.empty() && d == gd + 1) {
              const Rows& c = ps->send_cols[me - ps->gather_ranks.begin()];
              if (c.offset < lo || c.offset + c.size > lo + size)
                fail(where + ": rank " + std::to_string(peer) + " sends cols outside its shard");
              lo = c.offset;
              size = c.size;
            }
            if (lo != s.held.offset[d] || size != s.held.size[d])
              fail(where + ": rank " + std::to_string(peer) + " sends dim " + std::to_string(d) + " [" +
                   std::to_string(lo) + ", " + std::to_string(lo + size) + "), the rank holds " + BoxText(s.held));
          }
          if (peer != plan.rank) res.exchange_bytes += static_cast<uint64_t>(r.size * inner);
        }
        if (at != s.held.offset[gd] + s.held.size[gd]) fail(where + ": received pieces do not cover the held rows");
      }
    }
  }
  return res;
}

}  // namespace wsync::testing
