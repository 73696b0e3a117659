#include "demo/reference.h"

#include <cstring>
#include <regex>

#include "demo/synthetic.h"
#include "pipeline/fp8.h"

namespace wsync::demo {
namespace {

// A dense row-major array of fixed-size elements.
struct NdArray {
  Shape shape;
  int64_t esize = 2;
  std::vector<uint8_t> data;

  int64_t Count() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// Elements before dim `d` (outer), along it, and after it (inner).
void Split(const Shape& s, int d, int64_t* outer, int64_t* inner) {
  *outer = 1;
  *inner = 1;
  for (int i = 0; i < d; ++i) *outer *= s[i];
  for (size_t i = d + 1; i < s.size(); ++i) *inner *= s[i];
}

NdArray Concat(const std::vector<NdArray>& parts, int d) {
  NdArray out;
  out.shape = parts[0].shape;
  out.esize = parts[0].esize;
  out.shape[d] = 0;
  for (const NdArray& p : parts) out.shape[d] += p.shape[d];
  out.data.resize(static_cast<size_t>(out.Count() * out.esize));
  int64_t outer, inner;
  Split(out.shape, d, &outer, &inner);
  uint8_t* dst = out.data.data();
  for (int64_t o = 0; o < outer; ++o) {
    for (const NdArray& p : parts) {
      const int64_t n = p.shape[d] * inner * p.esize;
      std::memcpy(dst, p.data.data() + o * n, static_cast<size_t>(n));
      dst += n;
    }
  }
  return out;
}

NdArray Slice(const NdArray& a, int d, int64_t begin, int64_t end) {
  NdArray out;
  out.shape = a.shape;
  out.esize = a.esize;
  out.shape[d] = end - begin;
  out.data.resize(static_cast<size_t>(out.Count() * out.esize));
  int64_t outer, inner;
  Split(a.shape, d, &outer, &inner);
  const int64_t row = inner * a.esize;
  for (int64_t o = 0; o < outer; ++o) {
    std::memcpy(out.data.data() + o * (end - begin) * row, a.data.data() + (o * a.shape[d] + begin) * row,
                static_cast<size_t>((end - begin) * row));
  }
  return out;
}

NdArray FromBf16(const Shape& shape, const std::vector<uint16_t>& v) {
  NdArray a;
  a.shape = shape;
  a.esize = 2;
  a.data.resize(v.size() * 2);
  std::memcpy(a.data.data(), v.data(), a.data.size());
  return a;
}

}  // namespace

// Pattern -> regex: {*} any text, {Name} a decimal number bound to Name.
Reference::EnginePattern Reference::CompilePattern(const std::string& pattern) {
  std::string re;
  std::vector<std::string> names;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '{') {
      const size_t close = pattern.find('}', i);
      const std::string var = pattern.substr(i + 1, close - i - 1);
      names.push_back(var);
      re += var == "*" ? "(.+)" : "([0-9]+)";
      i = close;
    } else {
      if (std::strchr(".^$|()[]*+?\\", pattern[i]) != nullptr) re += '\\';
      re += pattern[i];
    }
  }
  return EnginePattern{std::regex(re), std::move(names)};
}

namespace {

bool MatchPattern(const std::regex& re, const std::vector<std::string>& names, const std::string& name,
                  std::vector<std::pair<std::string, std::string>>* bound) {
  std::smatch m;
  if (!std::regex_match(name, m, re)) return false;
  for (size_t k = 0; k < names.size(); ++k) bound->emplace_back(names[k], m[k + 1].str());
  return true;
}

std::string Expand(std::string text, const std::vector<std::pair<std::string, std::string>>& bound) {
  for (const auto& [var, value] : bound) {
    const std::string key = "{" + var + "}";
    for (size_t p = text.find(key); p != std::string::npos; p = text.find(key)) text.replace(p, key.size(), value);
  }
  return text;
}

}  // namespace

Reference::Reference(const TrainerSpec& trainer, const MappingSpec& mapping) : mapping_(mapping) {
  for (const TrainerRank& r : trainer.ranks) {
    for (const TrainerParam& p : r.params) sources_.emplace(p.name, SourceInfo{p.global_shape, p.dtype});
  }
  for (const MappingRule& r : mapping_.rules) patterns_.push_back(CompilePattern(r.engine));
}

StatusOr<ExpectedTensor> Reference::Expected(const InferenceTensor& t, uint64_t version) const {
  auto where = [&](const std::string& what) { return InvalidArgument("reference: tensor '" + t.name + "': " + what); };
  const MappingRule* rule = nullptr;
  std::vector<std::pair<std::string, std::string>> bound;
  for (size_t i = 0; i < mapping_.rules.size(); ++i) {
    const MappingRule& r = mapping_.rules[i];
    if (r.kind == MappingRule::Kind::kSkip) continue;
    bound.clear();
    if (MatchPattern(patterns_[i].re, patterns_[i].names, t.name, &bound)) {
      rule = &r;
      break;
    }
  }
  if (rule == nullptr) return where("no mapping rule matches");

  auto full_source = [&](const std::string& name) -> StatusOr<NdArray> {
    auto it = sources_.find(name);
    if (it == sources_.end()) return where("source '" + name + "' is not a trainer tensor");
    return FromBf16(it->second.shape, SyntheticTensor(name, it->second.shape, version));
  };

  // 1. Fuse: the whole logical engine tensor (experts: only this rank's).
  NdArray fused;
  int concat_dim = 0;
  std::vector<int64_t> part_extent;
  if (rule->kind == MappingRule::Kind::kStackExperts) {
    // Without an expert range the rank holds every expert (experts split
    // by tensor parallelism, not expert parallelism).
    const int64_t first = t.experts ? t.experts->start : 0;
    const int64_t last = t.experts ? t.experts->end : t.shape[0];
    std::vector<NdArray> experts;
    for (int64_t e = first; e < last; ++e) {
      std::vector<NdArray> parts;
      auto with_e = bound;
      with_e.emplace_back("E", std::to_string(e));
      for (const MappingPart& part : rule->parts) {
        WSYNC_ASSIGN_OR_RETURN(NdArray src, full_source(Expand(part.source, with_e)));
        if (part.expert_dim) {
          src = Slice(src, *part.expert_dim, e, e + 1);
          src.shape.erase(src.shape.begin() + *part.expert_dim);
        }
        parts.push_back(std::move(src));
      }
      if (e == first) {
        for (const NdArray& p : parts) part_extent.push_back(p.shape[rule->concat_dim]);
      }
      NdArray one = Concat(parts, rule->concat_dim);
      one.shape.insert(one.shape.begin(), 1);
      experts.push_back(std::move(one));
    }
    fused = Concat(experts, 0);
    concat_dim = rule->concat_dim + 1;
  } else {
    std::vector<NdArray> parts;
    for (const MappingPart& part : rule->parts) {
      WSYNC_ASSIGN_OR_RETURN(NdArray src, full_source(Expand(part.source, bound)));
      parts.push_back(std::move(src));
    }
    concat_dim = rule->kind == MappingRule::Kind::kConcat ? rule->concat_dim : 0;
    for (const NdArray& p : parts) part_extent.push_back(p.shape.empty() ? 1 : p.shape[concat_dim]);
    fused = parts.size() == 1 ? std::move(parts[0]) : Concat(parts, concat_dim);
  }

  // 2. Quantize (or convert) the fused tensor.
  NdArray weight, scale;
  const bool fp8 = t.dtype == DType::kFP8E4M3;
  if (fp8) {
    const int n = static_cast<int>(fused.shape.size());
    if (n < 2) return where("fp8 needs at least 2 dims");
    const int64_t rows = fused.shape[n - 2], cols = fused.shape[n - 1];
    const int64_t mats = fused.Count() / (rows * cols);
    weight.shape = fused.shape;
    weight.esize = 1;
    scale.shape = fused.shape;
    scale.shape[n - 2] = Fp8BlockCount(rows);
    scale.shape[n - 1] = Fp8BlockCount(cols);
    scale.esize = 4;
    for (int64_t m = 0; m < mats; ++m) {
      Bf16MatrixView view{reinterpret_cast<const uint16_t*>(fused.data.data()) + m * rows * cols, rows, cols, cols};
      WSYNC_ASSIGN_OR_RETURN(Fp8BlockTensor q, QuantizeFp8Blocks(view));
      weight.data.insert(weight.data.end(), q.q.begin(), q.q.end());
      const auto* s = reinterpret_cast<const uint8_t*>(q.scale_inv.data());
      scale.data.insert(scale.data.end(), s, s + q.scale_inv.size() * 4);
    }
  } else if (t.dtype == DType::kBF16) {
    weight = std::move(fused);
  } else if (t.dtype == DType::kFP32) {
    weight.shape = fused.shape;
    weight.esize = 4;
    weight.data.resize(static_cast<size_t>(fused.Count()) * 4);
    const auto* src = reinterpret_cast<const uint16_t*>(fused.data.data());
    for (int64_t i = 0; i < fused.Count(); ++i) {
      const float f = Bf16ToFp32(src[i]);
      std::memcpy(weight.data.data() + i * 4, &f, 4);
    }
  } else {
    return where("reference has no conversion to " + std::string(DTypeName(t.dtype)));
  }

  // 3. Slice for tensor parallelism: along the concat dim every part is cut
  // separately (vLLM's fused layouts); along another dim, the whole tensor.
  if (t.tp && t.tp->size > 1) {
    const int d = t.tp->dim;
    const int n = static_cast<int>(weight.shape.size());
    const bool block_dim = fp8 && d >= n - 2;
    auto cut = [&](const NdArray& a, int64_t begin, int64_t end, bool blocks) {
      if (!blocks) return Slice(a, d, begin, end);
      return Slice(a, d, begin / kFp8BlockSize, Fp8BlockCount(end));
    };
    std::vector<std::pair<int64_t, int64_t>> ranges;  // element ranges along d to keep
    if (d == concat_dim) {
      int64_t offset = 0;
      for (size_t p = 0; p < part_extent.size(); ++p) {
        const int64_t len = part_extent[p];
        const int64_t size = t.tp->size;
        const std::optional<int64_t>& shards = rule->parts[std::min(p, rule->parts.size() - 1)].shards;
        const bool replicated = shards && *shards < size;
        const int64_t count = replicated ? *shards : size;
        const int64_t piece = replicated ? t.tp->rank * *shards / size : t.tp->rank;
        ranges.emplace_back(offset + piece * len / count, offset + (piece + 1) * len / count);
        offset += len;
      }
    } else {
      const int64_t len = weight.shape[d];
      ranges.emplace_back(t.tp->rank * len / t.tp->size, (t.tp->rank + 1) * len / t.tp->size);
    }
    std::vector<NdArray> w_parts, s_parts;
    for (auto [b, e] : ranges) {
      if (block_dim && (b % kFp8BlockSize != 0 || (e % kFp8BlockSize != 0 && e != weight.shape[d]))) {
        return where("tensor-parallel cut [" + std::to_string(b) + ", " + std::to_string(e) +
                     ") is not on a 128 block boundary");
      }
      w_parts.push_back(cut(weight, b, e, false));
      if (fp8) s_parts.push_back(cut(scale, b, e, block_dim));
    }
    weight = Concat(w_parts, d);
    if (fp8) scale = Concat(s_parts, d);
  }
  if (weight.shape != t.shape) return where("reference shape differs from the layout's");
  return ExpectedTensor{std::move(weight.data), std::move(scale.data)};
}

}  // namespace wsync::demo
