// ValidateInferenceSpec and ValidateMapping: see validate.h.
#include <algorithm>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "routing/name_pattern.h"
#include "routing/routing_table.h"
#include "routing/validate.h"

namespace wsync {

namespace {

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Only for shapes CheckTensor passed (their size fits in int64).
uint64_t Bytes(const Shape& shape, DType dtype) {
  return static_cast<uint64_t>(ShapeBytes(shape, DTypeSize(dtype)).value_or(0));
}

int64_t Blocks(int64_t n) { return n / 128 + (n % 128 != 0); }  // ceil(n / 128), no overflow

struct Extent {
  uint64_t begin, end;
  const std::string* region;
  const std::string* name;
};

Status CheckTensor(const std::string& where, const InferenceTensor& t) {
  const size_t nd = t.shape.size();
  if (nd == 0 || nd > static_cast<size_t>(kMaxDims))
    return InvalidArgument(where + "shape " + ShapeStr(t.shape) + " must have 1 to " +
                           std::to_string(kMaxDims) + " dims");
  for (int64_t d : t.shape)
    if (d < 0) return InvalidArgument(where + "negative shape " + ShapeStr(t.shape));
  // A size that wrapped around would pass the region bounds check below.
  if (!ShapeBytes(t.shape, DTypeSize(t.dtype)))
    return InvalidArgument(where + "shape " + ShapeStr(t.shape) + " is too large (over 2^63 bytes)");
  if (t.tp) {
    if (t.tp->size < 1 || t.tp->rank < 0 || t.tp->rank >= t.tp->size)
      return InvalidArgument(where + "tp rank " + std::to_string(t.tp->rank) + " of size " +
                             std::to_string(t.tp->size) + " (expected 0 <= rank < size)");
    if (t.tp->dim < 0 || static_cast<size_t>(t.tp->dim) >= nd)
      return InvalidArgument(where + "tp dim " + std::to_string(t.tp->dim) + " outside shape " +
                             ShapeStr(t.shape));
  }
  if (t.experts) {
    if (t.experts->start < 0 || t.experts->end <= t.experts->start)
      return InvalidArgument(where + "experts [" + std::to_string(t.experts->start) + ", " +
                             std::to_string(t.experts->end) + ") is empty or negative");
    if (nd < 2 || t.shape[0] != t.experts->end - t.experts->start)
      return InvalidArgument(where + "shape " + ShapeStr(t.shape) + " does not hold experts [" +
                             std::to_string(t.experts->start) + ", " +
                             std::to_string(t.experts->end) + ") on dim 0 (expected " +
                             std::to_string(t.experts->end - t.experts->start) + ")");
    if (t.tp && t.tp->dim == 0)
      return InvalidArgument(where + "tp dim 0 is the expert dim of a stacked expert tensor");
  }
  if (t.dtype == DType::kFP8E4M3) {
    if (!t.scale)
      return InvalidArgument(where + "fp8_e4m3 tensor has no scale (expected a fp32 block-scale tensor)");
    if (nd < 2)
      return InvalidArgument(where + "fp8_e4m3 tensor must have at least 2 dims for 128x128 block scales");
    Shape want = t.shape;
    want[nd - 2] = Blocks(want[nd - 2]);
    want[nd - 1] = Blocks(want[nd - 1]);
    if (t.scale->shape != want)
      return InvalidArgument(where + "scale '" + t.scale->name + "' has shape " +
                             ShapeStr(t.scale->shape) + ", expected block grid " + ShapeStr(want) +
                             " (128x128 blocks of " + ShapeStr(t.shape) + ")");
    if (t.scale->dtype != DType::kFP32)
      return InvalidArgument(where + "scale '" + t.scale->name + "' dtype " +
                             std::string(DTypeName(t.scale->dtype)) + " (expected fp32)");
  } else if (t.scale) {
    return InvalidArgument(where + "has a scale but dtype " + std::string(DTypeName(t.dtype)) +
                           " (only fp8_e4m3 tensors carry scales)");
  }
  return Status::Ok();
}

// Engine replicas are copies of one engine: each instance holds the same
// engine tensors (split over its ranks however it likes). One that lacks a
// tensor would otherwise be left on old weights while its version completes.
Status CheckInstancesAgree(const InferenceSpec& spec, const std::string& source) {
  std::map<int32_t, std::pair<int32_t, std::set<std::string>>> by_instance;  // instance -> (first rank, names)
  for (const InferenceRank& rank : spec.ranks) {
    auto [it, inserted] = by_instance.try_emplace(rank.instance, rank.rank, std::set<std::string>{});
    it->second.first = std::min(it->second.first, rank.rank);
    for (const InferenceTensor& t : rank.tensors) it->second.second.insert(t.name);
  }
  if (by_instance.size() < 2) return Status::Ok();
  const auto& [first_instance, first] = *by_instance.begin();
  for (const auto& [instance, held] : by_instance) {
    const std::string where = source + ": rank " + std::to_string(held.first) + ": instance " +
                              std::to_string(instance) + " ";
    for (const std::string& name : first.second) {
      if (held.second.count(name) == 0) {
        return InvalidArgument(where + "lacks tensor '" + name + "' that instance " + std::to_string(first_instance) +
                               " holds; every engine replica must hold the same tensors");
      }
    }
    for (const std::string& name : held.second) {
      if (first.second.count(name) == 0) {
        return InvalidArgument(where + "holds tensor '" + name + "' that instance " +
                               std::to_string(first_instance) + " lacks; every engine replica must hold the same tensors");
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidateInferenceSpec(const InferenceSpec& spec, const std::string& source) {
  WSYNC_RETURN_IF_ERROR(ValidateRankSequence(spec.ranks, "inference", source));
  // Within one engine replica, the TP/EP slices of a tensor agree on the
  // split and no two ranks hold the same slice.
  struct Slices {
    int32_t first_rank;
    TpSlice tp;
    std::vector<std::pair<std::pair<int32_t, int64_t>, int32_t>> held;  // (tp rank, first expert) -> rank
  };
  std::unordered_map<std::string, Slices> replicas;
  std::string key;
  std::vector<Extent> extents;
  for (const InferenceRank& rank : spec.ranks) {
    const std::string rank_where = source + ": rank " + std::to_string(rank.rank) + ": ";
    std::unordered_map<std::string_view, uint64_t> regions;
    for (const MemoryRegion& m : rank.regions)
      if (!regions.emplace(m.id, m.size).second)
        return InvalidArgument(rank_where + "region '" + m.id + "' listed twice");
    std::unordered_set<std::string_view> names;
    names.reserve(rank.tensors.size() * 2);
    extents.clear();
    for (const InferenceTensor& t : rank.tensors) {
      const std::string where = rank_where + "tensor '" + t.name + "': ";
      if (!names.insert(t.name).second)
        return InvalidArgument(rank_where + "tensor '" + t.name + "' listed twice");
      WSYNC_RETURN_IF_ERROR(CheckTensor(where, t));
      if (t.tp || t.experts) {
        key = std::to_string(rank.instance);
        key += '|';
        key += t.name;
        const TpSlice tp = t.tp.value_or(TpSlice{});
        auto [it, inserted] = replicas.try_emplace(key, Slices{rank.rank, tp, {}});
        Slices& sl = it->second;
        if (sl.tp.size != tp.size || sl.tp.dim != tp.dim)
          return InvalidArgument(where + "tp {dim " + std::to_string(tp.dim) + ", size " +
                                 std::to_string(tp.size) + "} but rank " + std::to_string(sl.first_rank) +
                                 " of instance " + std::to_string(rank.instance) + " has tp {dim " +
                                 std::to_string(sl.tp.dim) + ", size " + std::to_string(sl.tp.size) + "}");
        const std::pair<int32_t, int64_t> slice{tp.rank, t.experts ? t.experts->start : 0};
        for (const auto& [other, owner] : sl.held)
          if (other == slice)
            return InvalidArgument(where + "holds the same slice (tp rank " + std::to_string(tp.rank) +
                                   (t.experts ? ", experts from " + std::to_string(slice.second) : "") +
                                   ") as rank " + std::to_string(owner) + " of instance " +
                                   std::to_string(rank.instance));
        sl.held.push_back({slice, rank.rank});
      }
      auto place = [&](const RegionRef& at, uint64_t bytes, const std::string& name) -> Status {
        auto it = regions.find(at.region);
        if (it == regions.end())
          return InvalidArgument(where + "region '" + at.region + "' of '" + name +
                                 "' is not a region of this rank");
        if (at.offset > it->second || bytes > it->second - at.offset)
          return OutOfRange(where + "'" + name + "' at offset " + std::to_string(at.offset) + " + " +
                            std::to_string(bytes) + " bytes leaves region '" + at.region + "' of " +
                            std::to_string(it->second) + " bytes");
        if (bytes > 0) extents.push_back({at.offset, at.offset + bytes, &at.region, &name});
        return Status::Ok();
      };
      WSYNC_RETURN_IF_ERROR(place(t.where, Bytes(t.shape, t.dtype), t.name));
      if (t.scale) {
        if (!names.insert(t.scale->name).second)
          return InvalidArgument(where + "scale name '" + t.scale->name + "' is used twice");
        WSYNC_RETURN_IF_ERROR(place(t.scale->where, Bytes(t.scale->shape, t.scale->dtype), t.scale->name));
      }
    }
    std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
      if (*a.region != *b.region) return *a.region < *b.region;
      return a.begin < b.begin;
    });
    for (size_t i = 1; i < extents.size(); ++i) {
      const Extent& a = extents[i - 1];
      const Extent& b = extents[i];
      if (*a.region == *b.region && b.begin < a.end)
        return InvalidArgument(rank_where + "tensor '" + *b.name + "' [" + std::to_string(b.begin) +
                               ", " + std::to_string(b.end) + ") overlaps tensor '" + *a.name + "' [" +
                               std::to_string(a.begin) + ", " + std::to_string(a.end) +
                               ") in region '" + *a.region + "'");
    }
  }
  return CheckInstancesAgree(spec, source);
}

Status ValidateMapping(const MappingSpec& spec, const std::string& source) {
  for (size_t i = 0; i < spec.rules.size(); ++i) {
    const MappingRule& rule = spec.rules[i];
    const std::string where =
        source + ": rules[" + std::to_string(i) + "] '" + rule.engine + "': ";
    auto engine = NamePattern::Compile(rule.engine);
    if (!engine.ok()) return InvalidArgument(where + engine.status().message());
    if (rule.kind == MappingRule::Kind::kSkip) continue;
    const bool stack = rule.kind == MappingRule::Kind::kStackExperts;
    if (rule.parts.empty()) return InvalidArgument(where + "has no source");
    if ((rule.kind == MappingRule::Kind::kDirect || rule.kind == MappingRule::Kind::kTied) &&
        rule.parts.size() != 1)
      return InvalidArgument(where + "a direct or tied rule has exactly one source");
    if (rule.concat_dim < 0 || rule.concat_dim >= kMaxDims)
      return InvalidArgument(where + "concat dim " + std::to_string(rule.concat_dim) + " out of range");
    for (const MappingPart& part : rule.parts) {
      auto src = NamePattern::Compile(part.source);
      if (!src.ok()) return InvalidArgument(where + src.status().message());
      for (const std::string& name : src->placeholders()) {
        if (stack && name == "E") continue;
        if (!engine->HasPlaceholder(name))
          return InvalidArgument(where + "source '" + part.source + "' uses {" + name +
                                 "} which the engine pattern does not bind");
      }
      if (stack) {
        const bool per_expert = src->HasPlaceholder("E");
        if (per_expert == part.expert_dim.has_value())
          return InvalidArgument(where + "source '" + part.source +
                                 "' needs either {E} in its name or expert_dim (not both)");
        if (part.expert_dim && (*part.expert_dim < 0 || *part.expert_dim >= kMaxDims))
          return InvalidArgument(where + "expert_dim out of range");
      }
      if (part.shards && *part.shards <= 0)
        return InvalidArgument(where + "shards must be positive, got " + std::to_string(*part.shards));
      if (part.chunk) {
        const MappingPart::Chunk& c = *part.chunk;
        if (c.dim < 0 || c.dim >= kMaxDims)
          return InvalidArgument(where + "source '" + part.source + "': chunk dim " + std::to_string(c.dim) +
                                 " out of range [0, " + std::to_string(kMaxDims) + ")");
        if (c.count < 1 || c.index < 0 || c.index >= c.count)
          return InvalidArgument(where + "source '" + part.source + "': chunk index " + std::to_string(c.index) +
                                 " of count " + std::to_string(c.count) + " (need count >= 1, 0 <= index < count)");
        if (rule.kind == MappingRule::Kind::kTied)
          return InvalidArgument(where + "a tied rule copies its source whole; chunk is not allowed");
      }
      if (part.rope_interleaved_heads) {
        if (*part.rope_interleaved_heads <= 0)
          return InvalidArgument(where + "source '" + part.source + "': rope_interleaved_heads must be positive, got " +
                                 std::to_string(*part.rope_interleaved_heads));
        if (stack || rule.kind == MappingRule::Kind::kTied)
          return InvalidArgument(where + "source '" + part.source +
                                 "': rope_interleaved_heads is only for source and concat rules");
      }
    }
    if (engine->HasPlaceholder("*") &&
        (rule.kind != MappingRule::Kind::kDirect || rule.parts[0].source.find("{*}") == std::string::npos ||
         rule.parts[0].chunk || rule.parts[0].rope_interleaved_heads))
      return InvalidArgument(where + "{*} is only allowed in an identity rule {engine: X, source: X}");
  }
  for (size_t i = 0; i < spec.quant.size(); ++i) {
    const QuantRule& q = spec.quant[i];
    const std::string where = source + ": quantize[" + std::to_string(i) + "]: ";
    if (q.block_rows <= 0 || q.block_cols <= 0)
      return InvalidArgument(where + "block sizes must be positive");
    if (q.dtype != DType::kFP8E4M3)
      return InvalidArgument(where + "only fp8_e4m3 quantization is supported, got " +
                             std::string(DTypeName(q.dtype)));
    for (size_t j = 0; j < i; ++j)
      if (spec.quant[j].dtype == q.dtype)
        return InvalidArgument(where + "second rule for dtype " + std::string(DTypeName(q.dtype)));
  }
  return Status::Ok();
}

}  // namespace wsync
