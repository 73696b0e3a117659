#include "routing/mapping.h"

#include "routing/chunking.h"

namespace wsync {

namespace {

std::string ShapeStr(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string TpStr(const TpSlice& tp) {
  return "tp {dim " + std::to_string(tp.dim) + ", rank " + std::to_string(tp.rank) + ", size " +
         std::to_string(tp.size) + "}";
}

// The piece of a part's length-n dim that TP rank tp.rank holds; a part with
// fewer shards than TP ranks is replicated (vLLM GQA k/v heads).
Range TpPiece(int64_t n, const std::optional<int64_t>& shards, const TpSlice& tp) {
  if (tp.size <= 1) return {0, n};
  if (shards && *shards < tp.size)
    return ChunkRange(n, *shards, static_cast<int64_t>(tp.rank) * *shards / tp.size);
  return ChunkRange(n, tp.size, tp.rank);
}

bool IsFloatCast(DType a, DType b) {
  auto plain = [](DType t) { return t == DType::kBF16 || t == DType::kFP16 || t == DType::kFP32; };
  return plain(a) && plain(b);
}

Box FullBox(const Shape& s) {
  Box b;
  b.ndim = static_cast<int8_t>(s.size());
  for (size_t i = 0; i < s.size(); ++i) b.size[i] = s[i];
  return b;
}

// A fp8 block may not be cut by a TP/concat/expert boundary: on both blocked
// dims the box must start on a block edge and end on one or at the tensor end,
// in the source and in the destination alike.
bool BlockAligned(int64_t off, int64_t size, int64_t extent, int64_t block) {
  return off % block == 0 && ((off + size) % block == 0 || off + size == extent);
}

std::string ChunkStr(const MappingPart::Chunk& c) {
  return "chunk {dim " + std::to_string(c.dim) + ", index " + std::to_string(c.index) + ", count " +
         std::to_string(c.count) + "}";
}

// Merges consecutive segments of `segs` from `first` on that are one box
// split in two: same source, identity dim map, adjacent on one dim in the
// source and the destination alike, equal on every other dim. An expert
// range of a fused gate_up source cut into its gate and up chunks thus goes
// back to one segment (one write per range) when TP does not split them.
void MergeAdjacent(std::vector<Segment>* segs, size_t first) {
  if (segs->size() - first < 2) return;
  size_t w = first;
  for (size_t r = first + 1; r < segs->size(); ++r) {
    Segment& a = (*segs)[w];
    const Segment& b = (*segs)[r];
    bool merged = false;
    const int nd = a.dst_box.ndim;
    bool identity = a.source == b.source && nd == a.src_box.ndim && b.dst_box.ndim == nd &&
                    b.src_box.ndim == nd;
    for (int d = 0; identity && d < nd; ++d)
      identity = a.dst_to_src[d] == d && b.dst_to_src[d] == d;
    if (identity) {
      int along = -1;
      bool ok = true;
      for (int d = 0; ok && d < nd; ++d) {
        const bool same = a.src_box.offset[d] == b.src_box.offset[d] && a.src_box.size[d] == b.src_box.size[d] &&
                          a.dst_box.offset[d] == b.dst_box.offset[d] && a.dst_box.size[d] == b.dst_box.size[d];
        if (same) continue;
        const bool next = a.src_box.offset[d] + a.src_box.size[d] == b.src_box.offset[d] &&
                          a.dst_box.offset[d] + a.dst_box.size[d] == b.dst_box.offset[d] &&
                          a.src_box.size[d] == a.dst_box.size[d] && b.src_box.size[d] == b.dst_box.size[d];
        ok = next && along < 0;
        along = d;
      }
      if (ok && along >= 0) {
        a.src_box.size[along] += b.src_box.size[along];
        a.dst_box.size[along] += b.dst_box.size[along];
        merged = true;
      }
    }
    if (!merged) (*segs)[++w] = b;
  }
  segs->resize(w + 1);
}

// Appends `seg` (part coords, `base` not yet added) one row at a time: row k
// of the engine piece comes from the source row holding it in interleaved
// RoPE order (MappingPart::rope_interleaved_heads). `rows` is the part's row
// count; the rank's piece must hold whole heads.
Status PushRopeRows(const Segment& seg, int64_t rows, int64_t heads, const std::array<int64_t, kMaxDims>& base,
                    const InferenceTensor& t, const TensorWhere& where, const std::string& name,
                    std::vector<Segment>* out) {
  const std::string what = where + ": source '" + name + "': rope_interleaved_heads " + std::to_string(heads);
  if (t.dtype == DType::kFP8E4M3)
    return InvalidArgument(what + ": reordering RoPE rows takes one write per row, which cuts fp8 128x128 "
                           "blocks; use a bf16 engine or a trainer that stores HF row order");
  if (rows % heads != 0 || (rows / heads) % 2 != 0)
    return InvalidArgument(what + ": " + std::to_string(rows) + " rows are not that many heads of an even size");
  const int64_t hd = rows / heads, half = hd / 2;
  const int64_t o = seg.src_box.offset[0], n = seg.src_box.size[0];
  if (o % hd != 0 || n % hd != 0)
    return InvalidArgument(what + ": this rank's rows [" + std::to_string(o) + ", " + std::to_string(o + n) +
                           ") cut a head of " + std::to_string(hd) + " rows (choose a TP size that divides the heads)");
  Segment row = seg;
  for (int d = 0; d < seg.src_box.ndim; ++d) row.src_box.offset[d] += base[d];
  row.src_box.size[0] = 1;
  row.dst_box.size[0] = 1;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t g = o + k, w = g % hd;  // engine (half-split) order
    row.src_box.offset[0] = base[0] + g - w + 2 * (w % half) + w / half;
    row.dst_box.offset[0] = seg.dst_box.offset[0] + k;
    out->push_back(row);
  }
  return Status::Ok();
}

}  // namespace

SourceCatalog BuildSourceCatalog(const TrainerSpec& spec) {
  SourceCatalog c;
  for (const TrainerRank& rank : spec.ranks) {
    for (const TrainerParam& p : rank.params) {
      auto [it, inserted] = c.index.emplace(p.name, static_cast<int32_t>(c.params.size()));
      if (!inserted) continue;
      c.params.push_back(&p);
      c.first_rank.push_back(rank.rank);
    }
  }
  return c;
}

StatusOr<Mapper> Mapper::Create(const MappingSpec& spec, const SourceCatalog* catalog,
                                std::string mapping_source) {
  Mapper m;
  m.spec_ = &spec;
  m.catalog_ = catalog;
  m.mapping_source_ = std::move(mapping_source);
  for (const MappingRule& r : spec.rules) {
    auto engine = NamePattern::Compile(r.engine);
    if (!engine.ok()) return InvalidArgument(m.mapping_source_ + ": " + engine.status().message());
    if (r.kind == MappingRule::Kind::kSkip) {
      m.skips_.push_back(std::move(engine).value());
      continue;
    }
    Rule rule;
    rule.rule = &r;
    rule.engine = std::move(engine).value();
    for (const MappingPart& p : r.parts) {
      auto src = NamePattern::Compile(p.source);
      if (!src.ok()) return InvalidArgument(m.mapping_source_ + ": " + src.status().message());
      rule.sources.push_back(std::move(src).value());
    }
    m.rules_.push_back(std::move(rule));
  }
  return m;
}

Status Mapper::Resolve(const InferenceTensor& t, const TensorWhere& where,
                       std::vector<Segment>* out, Conversion* conv,
                       std::vector<uint8_t>* used) const {
  for (const Rule& rule : rules_) {
    PatternBindings b;
    if (!rule.engine.Match(t.name, &b)) continue;
    const size_t first = out->size();
    if (rule.rule->kind == MappingRule::Kind::kStackExperts) {
      WSYNC_RETURN_IF_ERROR(ResolveStack(rule, b, t, where, out, used));
    } else {
      WSYNC_RETURN_IF_ERROR(ResolveRule(rule, b, t, where, out, used));
    }
    MergeAdjacent(out, first);
    // dtype: equal, a plain float cast, or a quantize rule.
    conv->quant = nullptr;
    if (t.dtype == DType::kFP8E4M3) {
      for (const QuantRule& q : spec_->quant)
        if (q.dtype == t.dtype) conv->quant = &q;
    }
    int32_t last = -1;
    for (size_t i = first; i < out->size(); ++i) {
      const int32_t s = (*out)[i].source;
      if (s == last) continue;
      last = s;
      const TrainerParam& p = *catalog_->params[s];
      if (p.dtype == t.dtype && t.dtype != DType::kFP8E4M3) continue;
      if (IsFloatCast(p.dtype, t.dtype)) continue;
      if (conv->quant && p.dtype != DType::kFP8E4M3) continue;
      return InvalidArgument(where + ": dtype " + std::string(DTypeName(t.dtype)) + " but source '" +
                             p.name + "' is " + std::string(DTypeName(p.dtype)) +
                             " and " + mapping_source_ + " has no quantize rule for it" +
                             " (only bf16/fp16/fp32 casts are implicit)");
    }
    if (!conv->quant) return Status::Ok();
    const QuantRule& q = *conv->quant;
    const size_t nd = t.shape.size();
    if (nd < 2) return InvalidArgument(where + ": fp8 tensor needs at least 2 dims for block scales");
    Shape want = t.shape;
    // ceil(n / block) that cannot overflow: a block may be any positive int64.
    want[nd - 2] = want[nd - 2] / q.block_rows + (want[nd - 2] % q.block_rows != 0);
    want[nd - 1] = want[nd - 1] / q.block_cols + (want[nd - 1] % q.block_cols != 0);
    if (!t.scale || t.scale->shape != want)
      return InvalidArgument(where + ": scale shape " + (t.scale ? ShapeStr(t.scale->shape) : "none") +
                             ", expected block grid " + ShapeStr(want) + " for " +
                             std::to_string(q.block_rows) + "x" + std::to_string(q.block_cols) +
                             " blocks");
    for (size_t i = first; i < out->size(); ++i) {
      const Segment& seg = (*out)[i];
      const Shape& src_shape = catalog_->params[seg.source]->global_shape;
      const int64_t blocks[2] = {q.block_rows, q.block_cols};
      for (int k = 0; k < 2; ++k) {
        const int dd = static_cast<int>(nd) - 2 + k;
        const int sd = seg.dst_to_src[dd];
        if (sd < 0)
          return InvalidArgument(where + ": fp8 blocks need the last two dims to come from the source");
        if (!BlockAligned(seg.src_box.offset[sd], seg.src_box.size[sd], src_shape[sd], blocks[k]) ||
            !BlockAligned(seg.dst_box.offset[dd], seg.dst_box.size[dd], t.shape[dd], blocks[k]))
          return InvalidArgument(
              where + ": fp8 block boundary: source '" + catalog_->params[seg.source]->name +
              "' rows/cols [" + std::to_string(seg.src_box.offset[sd]) + ", " +
              std::to_string(seg.src_box.offset[sd] + seg.src_box.size[sd]) + ") on dim " +
              std::to_string(sd) + " land at [" + std::to_string(seg.dst_box.offset[dd]) + ", " +
              std::to_string(seg.dst_box.offset[dd] + seg.dst_box.size[dd]) +
              ") (a TP/concat boundary must fall on a multiple of " + std::to_string(blocks[k]) + ")");
      }
    }
    return Status::Ok();
  }
  return NotFound(where + ": no rule of mapping " + mapping_source_ + " matches this engine tensor");
}

StatusOr<int32_t> Mapper::FindSource(const Rule& rule, size_t i, const PatternBindings& b,
                                     const TensorWhere& where, std::vector<uint8_t>* used) const {
  std::string name;
  if (!rule.sources[i].Expand(b, &name))
    return InvalidArgument(where + ": cannot expand source '" + rule.sources[i].text() + "'");
  const int32_t idx = catalog_->Find(name);
  if (idx < 0)
    return NotFound(where + ": source '" + name + "' (rule '" + rule.rule->engine + "' of " + mapping_source_ +
                    ") is not a trainer tensor");
  (*used)[idx] = 1;
  return idx;
}

StatusOr<Mapper::PartView> Mapper::ViewOf(const Rule& rule, size_t i, int32_t idx,
                                           const TensorWhere& where) const {
  const MappingPart& part = rule.rule->parts[i];
  const TrainerParam& p = *catalog_->params[idx];
  PartView v;
  v.shape = p.global_shape;
  if (!part.chunk) return v;
  const MappingPart::Chunk& c = *part.chunk;
  const std::string what = where + ": source '" + p.name + "' " + ShapeStr(p.global_shape) + ": " + ChunkStr(c);
  const std::string rule_of = " (rule '" + rule.rule->engine + "' of " + mapping_source_ + ")";
  if (c.dim >= static_cast<int32_t>(v.shape.size()))
    return InvalidArgument(what + " names a dim the source does not have" + rule_of);
  const int64_t n = v.shape[c.dim];
  if (n % c.count != 0)
    return InvalidArgument(what + ": dim " + std::to_string(c.dim) + " (" + std::to_string(n) +
                           ") does not divide into " + std::to_string(c.count) + " equal pieces" + rule_of);
  v.shape[c.dim] = n / c.count;
  v.base[c.dim] = c.index * v.shape[c.dim];
  return v;
}

Status Mapper::ResolveRule(const Rule& rule, const PatternBindings& b, const InferenceTensor& t,
                           const TensorWhere& where, std::vector<Segment>* out,
                           std::vector<uint8_t>* used) const {
  const TpSlice tp = t.tp.value_or(TpSlice{});
  const Shape& D = t.shape;
  const int nd = static_cast<int>(D.size());
  const int c = rule.rule->kind == MappingRule::Kind::kConcat ? rule.rule->concat_dim : 0;
  if (c >= nd)
    return InvalidArgument(where + ": concat dim " + std::to_string(c) + " outside shape " + ShapeStr(D));
  const size_t first = out->size();
  std::string name;
  Shape expect(D.size(), 0);
  int64_t cursor = 0;
  for (size_t i = 0; i < rule.sources.size(); ++i) {
    WSYNC_ASSIGN_OR_RETURN(const int32_t idx, FindSource(rule, i, b, where, used));
    name = catalog_->params[idx]->name;
    WSYNC_ASSIGN_OR_RETURN(const PartView view, ViewOf(rule, i, idx, where));
    const Shape& S = view.shape;  // the part: the source, or its chunk
    if (static_cast<int>(S.size()) != nd)
      return InvalidArgument(where + ": shape " + ShapeStr(D) + " has " + std::to_string(nd) +
                             " dims but source '" + name + "' is " + ShapeStr(S));
    Segment seg;
    seg.source = idx;
    seg.src_box = FullBox(S);
    for (int d = 0; d < nd; ++d) seg.dst_to_src[d] = static_cast<int8_t>(d);
    if (t.experts) {
      if (t.experts->end > S[0])
        return InvalidArgument(where + ": experts [" + std::to_string(t.experts->start) + ", " +
                               std::to_string(t.experts->end) + ") outside source '" + name + "' " +
                               ShapeStr(S));
      seg.src_box.offset[0] = t.experts->start;
      seg.src_box.size[0] = t.experts->end - t.experts->start;
    }
    if (tp.size > 1) {
      const Range piece = TpPiece(S[tp.dim], rule.rule->parts[i].shards, tp);
      seg.src_box.offset[tp.dim] = piece.offset;
      seg.src_box.size[tp.dim] = piece.size;
    }
    seg.dst_box.ndim = static_cast<int8_t>(nd);
    for (int d = 0; d < nd; ++d) {
      seg.dst_box.size[d] = seg.src_box.size[d];
      if (d == c) continue;
      if (i > 0 && expect[d] != seg.src_box.size[d])
        return InvalidArgument(where + ": parts do not tile: '" + name + "' gives " +
                               std::to_string(seg.src_box.size[d]) + " on dim " + std::to_string(d) +
                               ", the first part " + std::to_string(expect[d]));
      expect[d] = seg.src_box.size[d];
    }
    seg.dst_box.offset[c] = cursor;
    cursor += seg.src_box.size[c];
    if (const std::optional<int64_t>& heads = rule.rule->parts[i].rope_interleaved_heads) {
      WSYNC_RETURN_IF_ERROR(PushRopeRows(seg, S[0], *heads, view.base, t, where, name, out));
      continue;
    }
    for (int d = 0; d < nd; ++d) seg.src_box.offset[d] += view.base[d];
    out->push_back(seg);
  }
  expect[c] = cursor;
  if (expect != D) {
    out->resize(first);
    return InvalidArgument(where + ": shape " + ShapeStr(D) + " but its sources imply " +
                           ShapeStr(expect) + (t.tp ? " with " + TpStr(tp) : std::string()) +
                           " (rule '" + rule.rule->engine + "')");
  }
  return Status::Ok();
}

Status Mapper::ResolveStack(const Rule& rule, const PatternBindings& bound,
                            const InferenceTensor& t, const TensorWhere& where,
                            std::vector<Segment>* out, std::vector<uint8_t>* used) const {
  const Shape& D = t.shape;
  const int nd = static_cast<int>(D.size());
  if (nd < 2) return InvalidArgument(where + ": a stacked expert tensor needs >= 2 dims");
  const int64_t e0 = t.experts ? t.experts->start : 0;
  const int64_t e1 = t.experts ? t.experts->end : D[0];
  const int pe_nd = nd - 1;  // per-expert dims
  const int c = rule.rule->concat_dim;
  if (c >= pe_nd)
    return InvalidArgument(where + ": stack_experts dim " + std::to_string(c) +
                           " outside the per-expert shape of " + ShapeStr(D));
  // TP dims name engine dims; dim 0 is the expert dim.
  TpSlice tp = t.tp.value_or(TpSlice{});
  if (tp.size > 1 && tp.dim == 0)
    return InvalidArgument(where + ": tp dim 0 is the expert dim of a stacked expert tensor");
  tp.dim -= 1;
  PatternBindings b = bound;
  std::string name, num;
  Shape expect(pe_nd, 0);
  int64_t cursor = 0;
  for (size_t i = 0; i < rule.sources.size(); ++i) {
    const MappingPart& part = rule.rule->parts[i];
    const bool stacked = part.expert_dim.has_value();
    const int ed = stacked ? *part.expert_dim : -1;
    const int64_t first_e = stacked ? e0 : e0;
    const int64_t last_e = stacked ? e0 + 1 : e1;  // stacked: shape checked once
    Range piece;
    int64_t part_c = 0;
    for (int64_t e = first_e; e < last_e; ++e) {
      num = std::to_string(e);
      b.Set("E", num);
      WSYNC_ASSIGN_OR_RETURN(const int32_t idx, FindSource(rule, i, b, where, used));
      name = catalog_->params[idx]->name;
      WSYNC_ASSIGN_OR_RETURN(const PartView view, ViewOf(rule, i, idx, where));
      const Shape& S = view.shape;  // the part: the source, or its chunk
      Shape P;  // per-expert shape
      if (stacked) {
        if (ed >= static_cast<int>(S.size()) || static_cast<int>(S.size()) != nd)
          return InvalidArgument(where + ": source '" + name + "' " + ShapeStr(S) +
                                 " has no expert_dim " + std::to_string(ed) + " matching " + ShapeStr(D));
        if (e1 > S[ed])
          return InvalidArgument(where + ": experts [" + std::to_string(e0) + ", " + std::to_string(e1) +
                                 ") outside source '" + name + "' " + ShapeStr(S) + " (expert_dim " +
                                 std::to_string(ed) + ")");
        for (int d = 0; d < static_cast<int>(S.size()); ++d)
          if (d != ed) P.push_back(S[d]);
      } else {
        P = S;
        if (static_cast<int>(P.size()) != pe_nd)
          return InvalidArgument(where + ": source '" + name + "' " + ShapeStr(S) +
                                 " is not one expert of " + ShapeStr(D));
      }
      Segment seg;
      seg.source = idx;
      seg.src_box.ndim = static_cast<int8_t>(S.size());
      seg.dst_box.ndim = static_cast<int8_t>(nd);
      // Per-expert box in per-expert coords.
      std::array<int64_t, kMaxDims> po{}, ps{};
      for (int d = 0; d < pe_nd; ++d) ps[d] = P[d];
      if (tp.size > 1) {
        piece = TpPiece(P[tp.dim], part.shards, tp);
        po[tp.dim] = piece.offset;
        ps[tp.dim] = piece.size;
      }
      for (int d = 0; d < pe_nd; ++d) {
        if (d == c) continue;
        if ((i > 0 || e > first_e) && expect[d] != ps[d])
          return InvalidArgument(where + ": parts do not tile: '" + name + "' gives " +
                                 std::to_string(ps[d]) + " on per-expert dim " + std::to_string(d) +
                                 ", expected " + std::to_string(expect[d]));
        expect[d] = ps[d];
      }
      if (e > first_e && ps[c] != part_c)
        return InvalidArgument(where + ": source '" + name + "' " + ShapeStr(S) +
                               " differs in shape from the other experts");
      part_c = ps[c];
      // Destination: dim 0 = expert, dims 1.. = per-expert dims.
      for (int d = 0; d < pe_nd; ++d) {
        seg.dst_box.offset[d + 1] = d == c ? cursor : 0;
        seg.dst_box.size[d + 1] = ps[d];
      }
      if (stacked) {
        // One segment for the whole expert range when the expert dim leads
        // (row-major orders agree); else one per expert.
        int s = 0;
        for (int d = 0; d < static_cast<int>(S.size()); ++d) {
          if (d == ed) continue;
          seg.src_box.offset[d] = po[s];
          seg.src_box.size[d] = ps[s];
          seg.dst_to_src[s + 1] = static_cast<int8_t>(d);
          ++s;
        }
        seg.dst_to_src[0] = static_cast<int8_t>(ed);
        const int64_t step = ed == 0 ? e1 - e0 : 1;
        for (int64_t x = e0; x < e1; x += step) {
          seg.src_box.offset[ed] = x;
          seg.src_box.size[ed] = step;
          seg.dst_box.offset[0] = x - e0;
          seg.dst_box.size[0] = step;
          Segment placed = seg;
          for (int d = 0; d < nd; ++d) placed.src_box.offset[d] += view.base[d];
          out->push_back(placed);
        }
      } else {
        for (int d = 0; d < pe_nd; ++d) {
          seg.src_box.offset[d] = po[d];
          seg.src_box.size[d] = ps[d];
          seg.dst_to_src[d + 1] = static_cast<int8_t>(d);
        }
        seg.dst_to_src[0] = -1;
        seg.dst_box.offset[0] = e - e0;
        seg.dst_box.size[0] = 1;
        for (int d = 0; d < pe_nd; ++d) seg.src_box.offset[d] += view.base[d];
        out->push_back(seg);
      }
    }
    cursor += part_c;
  }
  expect[c] = cursor;
  Shape want(D.begin() + 1, D.end());
  if (expect != want)
    return InvalidArgument(where + ": per-expert shape " + ShapeStr(want) + " but its sources imply " +
                           ShapeStr(expect) + (t.tp ? " with " + TpStr(*t.tp) : std::string()) +
                           " (rule '" + rule.rule->engine + "')");
  return Status::Ok();
}

Status Mapper::CheckAllUsed(const std::vector<uint8_t>& used, const std::string& trainer_source) const {
  for (size_t i = 0; i < used.size(); ++i) {
    if (used[i]) continue;
    const std::string& name = catalog_->params[i]->name;
    bool skipped = false;
    for (const NamePattern& s : skips_) {
      PatternBindings b;
      if (s.Match(name, &b)) {
        skipped = true;
        break;
      }
    }
    if (!skipped)
      return InvalidArgument(trainer_source + ": rank " + std::to_string(catalog_->first_rank[i]) +
                             ": tensor '" + name + "': used by no engine tensor and not skipped by " +
                             mapping_source_ + " (add a rule or a skip)");
  }
  return Status::Ok();
}

}  // namespace wsync
