#include "demo/reference.h"

#include <algorithm>
#include <bit>
#include <cmath>
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

// Elements [first, first + count) of a row-major tensor of `shape`, straight
// from the definition (SyntheticBf16), one last-dim row at a time only so
// the row index is computed once per row.
void Evaluate(uint64_t name_hash, const Shape& shape, uint64_t first, uint64_t count, uint64_t version,
              uint32_t drift, uint16_t* out) {
  const size_t n = shape.size();
  const uint64_t cols = n >= 1 && shape[n - 1] > 0 ? static_cast<uint64_t>(shape[n - 1]) : 1;
  const uint64_t rows = n >= 2 && shape[n - 2] > 0 ? static_cast<uint64_t>(shape[n - 2]) : 1;
  for (uint64_t k = 0; k < count;) {
    const uint64_t flat = first + k;
    const int64_t row = n >= 2 ? static_cast<int64_t>((flat / cols) % rows) : 0;
    const uint64_t run = std::min(count - k, cols - flat % cols);
    for (uint64_t j = 0; j < run; ++j) out[k + j] = SyntheticBf16(name_hash, flat + j, row, version, drift);
    k += run;
  }
}

NdArray Bf16Array(const Shape& shape) {
  NdArray a;
  a.shape = shape;
  a.esize = 2;
  a.data.resize(static_cast<size_t>(a.Count()) * 2);
  return a;
}

// The whole source tensor at `version`.
NdArray WholeSource(const std::string& name, const Shape& shape, uint64_t version, uint32_t drift) {
  NdArray a = Bf16Array(shape);
  Evaluate(NameHash(name), shape, 0, static_cast<uint64_t>(a.Count()), version, drift,
           reinterpret_cast<uint16_t*>(a.data.data()));
  return a;
}

// Index `e` of dim `d` of the source tensor, that dim dropped.
NdArray SourceExpert(const std::string& name, const Shape& shape, int d, int64_t e, uint64_t version,
                     uint32_t drift) {
  Shape one = shape;
  one.erase(one.begin() + d);
  NdArray a = Bf16Array(one);
  int64_t outer, inner;
  Split(shape, d, &outer, &inner);
  const uint64_t h = NameHash(name);
  auto* out = reinterpret_cast<uint16_t*>(a.data.data());
  for (int64_t o = 0; o < outer; ++o) {
    Evaluate(h, shape, static_cast<uint64_t>((o * shape[d] + e) * inner), static_cast<uint64_t>(inner), version, drift,
             out + o * inner);
  }
  return a;
}

// fp8 e4m3fn of y = x / scale, from the format's definition rather than
// pipeline/fp8.cc's integer rounding (the code under test): the nearest
// value m * 2^(e-3) with 8 <= m <= 16 for 2^e <= |y| (e >= -6), or m * 2^-9
// below 2^-6, m rounded to even in double arithmetic; saturated at 448.
uint8_t E4M3Code(float y) {
  if (std::isnan(y)) return 0x7F;
  const uint8_t sign = std::signbit(y) ? 0x80 : 0x00;
  const float a = std::fabs(y);
  if (a >= 448.0f) return sign | 0x7E;
  constexpr double kRoundEven = 0x1p52;  // x + 2^52 - 2^52 rounds x >= 0 to an integer, ties to even
  if (a < 0x1p-6f) return sign | static_cast<uint8_t>((a * 512.0 + kRoundEven) - kRoundEven);  // 0..8
  const int e = static_cast<int>(std::bit_cast<uint32_t>(a) >> 23) - 127;  // -6..8
  const double to_m = std::bit_cast<double>(static_cast<uint64_t>(1023 + 3 - e) << 52);  // 2^(3-e)
  const int m = static_cast<int>((a * to_m + kRoundEven) - kRoundEven);  // 8..16; 16 is the next exponent's 8
  return sign | static_cast<uint8_t>(((e + 7) << 3) + (m - 8));
}

// Block fp8 of one row-major bf16 matrix, the plain way: per 128 x 128 block
// scale = amax / 448 in fp32 (1 for an all-zero block), then every element
// e4m3(x / scale). `scale_inv` is row-major over the blocks.
void QuantizeMatrix(const uint16_t* x, int64_t rows, int64_t cols, uint8_t* q, float* scale_inv) {
  const int64_t block = kFp8BlockSize;
  const int64_t block_cols = (cols + block - 1) / block;
  auto value = [](uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); };
  std::vector<float> amax(static_cast<size_t>(block_cols));
  for (int64_t r0 = 0; r0 < rows; r0 += block) {
    const int64_t r1 = std::min(rows, r0 + block);
    std::fill(amax.begin(), amax.end(), 0.0f);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = 0; c < cols; ++c) amax[c / block] = std::max(amax[c / block], std::fabs(value(x[r * cols + c])));
    }
    float* s = scale_inv + (r0 / block) * block_cols;
    for (int64_t b = 0; b < block_cols; ++b) s[b] = amax[b] == 0.0f ? 1.0f : amax[b] / 448.0f;
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = 0; c < cols; ++c) q[r * cols + c] = E4M3Code(value(x[r * cols + c]) / s[c / block]);
    }
  }
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

struct Reference::Unsliced {
  const MappingRule* rule = nullptr;
  NdArray weight, scale;             // scale: fp8 only
  int concat_dim = 0;                // in `weight`'s dims
  std::vector<int64_t> part_extent;  // each part's extent along concat_dim
};

Reference::Reference(const TrainerSpec& trainer, const MappingSpec& mapping, uint32_t drift)
    : mapping_(mapping), drift_(drift) {
  for (const TrainerRank& r : trainer.ranks) {
    for (const TrainerParam& p : r.params) sources_.emplace(p.name, SourceInfo{p.global_shape, p.dtype});
  }
  for (const MappingRule& r : mapping_.rules) patterns_.push_back(CompilePattern(r.engine));
}

StatusOr<ExpectedTensor> Reference::Expected(const InferenceTensor& t, uint64_t version) const {
  WSYNC_ASSIGN_OR_RETURN(Unsliced whole, Build(t, version));
  return Cut(whole, t);
}

StatusOr<std::vector<ExpectedTensor>> Reference::ExpectedOnRanks(const std::vector<const InferenceTensor*>& tensors,
                                                                 uint64_t version) const {
  std::vector<ExpectedTensor> out;
  if (tensors.empty()) return out;
  const InferenceTensor& first = *tensors.front();
  for (const InferenceTensor* t : tensors) {
    const bool same = t->name == first.name && t->dtype == first.dtype &&
                      t->experts.has_value() == first.experts.has_value() &&
                      (!t->experts || (t->experts->start == first.experts->start && t->experts->end == first.experts->end));
    if (!same) return InvalidArgument("reference: tensor '" + t->name + "' is not the same engine tensor as '" +
                                      first.name + "' (name, dtype and expert range must match)");
  }
  WSYNC_ASSIGN_OR_RETURN(Unsliced whole, Build(first, version));
  for (const InferenceTensor* t : tensors) {
    WSYNC_ASSIGN_OR_RETURN(ExpectedTensor e, Cut(whole, *t));
    out.push_back(std::move(e));
  }
  return out;
}

StatusOr<Reference::Unsliced> Reference::Build(const InferenceTensor& t, uint64_t version) const {
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

  auto source = [&](const std::string& name) -> StatusOr<const SourceInfo*> {
    auto it = sources_.find(name);
    if (it == sources_.end()) return where("source '" + name + "' is not a trainer tensor");
    return &it->second;
  };

  // 1. Fuse: the whole logical engine tensor (experts: only this rank's).
  Unsliced out;
  out.rule = rule;
  NdArray fused;
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
        const std::string name = Expand(part.source, with_e);
        WSYNC_ASSIGN_OR_RETURN(const SourceInfo* src, source(name));
        if (part.expert_dim) {
          const int d = *part.expert_dim;
          if (d < 0 || d >= static_cast<int>(src->shape.size()) || e >= src->shape[d]) {
            return where("expert " + std::to_string(e) + " is not in source '" + name + "'");
          }
          parts.push_back(SourceExpert(name, src->shape, d, e, version, drift_));
        } else {
          parts.push_back(WholeSource(name, src->shape, version, drift_));
        }
      }
      if (e == first) {
        for (const NdArray& p : parts) out.part_extent.push_back(p.shape[rule->concat_dim]);
      }
      NdArray one = parts.size() == 1 ? std::move(parts[0]) : Concat(parts, rule->concat_dim);
      one.shape.insert(one.shape.begin(), 1);
      experts.push_back(std::move(one));
    }
    fused = experts.size() == 1 ? std::move(experts[0]) : Concat(experts, 0);
    out.concat_dim = rule->concat_dim + 1;
  } else {
    std::vector<NdArray> parts;
    for (const MappingPart& part : rule->parts) {
      const std::string name = Expand(part.source, bound);
      WSYNC_ASSIGN_OR_RETURN(const SourceInfo* src, source(name));
      parts.push_back(WholeSource(name, src->shape, version, drift_));
    }
    out.concat_dim = rule->kind == MappingRule::Kind::kConcat ? rule->concat_dim : 0;
    for (const NdArray& p : parts) out.part_extent.push_back(p.shape.empty() ? 1 : p.shape[out.concat_dim]);
    fused = parts.size() == 1 ? std::move(parts[0]) : Concat(parts, out.concat_dim);
  }

  // 2. Quantize (or convert) the fused tensor.
  NdArray& weight = out.weight;
  NdArray& scale = out.scale;
  if (t.dtype == DType::kFP8E4M3) {
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
    weight.data.resize(static_cast<size_t>(fused.Count()));
    scale.data.resize(static_cast<size_t>(scale.Count()) * 4);
    const int64_t blocks = scale.Count() / mats;
    for (int64_t m = 0; m < mats; ++m) {
      QuantizeMatrix(reinterpret_cast<const uint16_t*>(fused.data.data()) + m * rows * cols, rows, cols,
                     weight.data.data() + m * rows * cols, reinterpret_cast<float*>(scale.data.data()) + m * blocks);
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
  return out;
}

StatusOr<ExpectedTensor> Reference::Cut(const Unsliced& whole, const InferenceTensor& t) const {
  auto where = [&](const std::string& what) { return InvalidArgument("reference: tensor '" + t.name + "': " + what); };
  const MappingRule* rule = whole.rule;
  const bool fp8 = t.dtype == DType::kFP8E4M3;
  const std::vector<int64_t>& part_extent = whole.part_extent;
  const int concat_dim = whole.concat_dim;
  // 3. Slice for tensor parallelism: along the concat dim every part is cut
  // separately (vLLM's fused layouts); along another dim, the whole tensor.
  if (!(t.tp && t.tp->size > 1)) {
    if (whole.weight.shape != t.shape) return where("reference shape differs from the layout's");
    return ExpectedTensor{whole.weight.data, whole.scale.data};
  }
  const NdArray& weight = whole.weight;
  const NdArray& scale = whole.scale;
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
  NdArray w = Concat(w_parts, d);
  if (w.shape != t.shape) return where("reference shape differs from the layout's");
  return ExpectedTensor{std::move(w.data), fp8 ? Concat(s_parts, d).data : std::vector<uint8_t>{}};
}

}  // namespace wsync::demo
