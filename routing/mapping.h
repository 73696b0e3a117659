// Mapping resolution: which trainer tensor boxes fill one engine tensor.
//
// Called by the planner for every destination tensor of every inference rank.
// For an engine tensor it finds the first matching rule of the MappingSpec
// (docs/SCHEMA.md, wsync.mapping/v1) and lists source segments: a box of one
// trainer tensor (global element coords) and the box of the destination
// local tensor it lands in (a part may read only a chunk of its source, or
// its rows reordered per RoPE head; consecutive segments that form one box
// are merged). Segments tile the destination exactly; every
// inconsistency (no rule, unknown source, shapes that do not tile, dtypes
// with no rule, fp8 blocks cut by a TP/concat boundary) is one error line
// naming the inference file, rank and tensor.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "routing/metadata.h"
#include "routing/name_pattern.h"
#include "routing/routing_table.h"

namespace wsync {

// The distinct trainer tensors (by name), in order of first appearance.
struct SourceCatalog {
  std::vector<const TrainerParam*> params;   // the first rank's entry per name
  std::vector<int32_t> first_rank;           // rank that reported it first
  std::unordered_map<std::string_view, int32_t> index;

  int32_t Find(std::string_view name) const {
    auto it = index.find(name);
    return it == index.end() ? -1 : it->second;
  }
};
SourceCatalog BuildSourceCatalog(const TrainerSpec& spec);

// One piece of a destination tensor: `src_box` of catalog source `source`
// lands in `dst_box` of the destination local tensor. dst_to_src[d] is the
// source dim of destination dim d, or -1 for a destination dim with no
// source dim (the expert dim of per-expert sources, size 1 in the box). The
// two boxes have the same element count and the same row-major order.
struct Segment {
  int32_t source = -1;
  Box src_box;
  Box dst_box;
  std::array<int8_t, kMaxDims> dst_to_src{};
};

// Names one destination tensor in error lines ("<source>: rank R: tensor
// 'NAME'"); the string is only built when an error is reported.
struct TensorWhere {
  const std::string* source;
  int32_t rank;
  const std::string* name;
  std::string str() const {
    return *source + ": rank " + std::to_string(rank) + ": tensor '" + *name + "'";
  }
};
inline std::string operator+(const TensorWhere& w, const std::string& s) { return w.str() + s; }
inline std::string operator+(const TensorWhere& w, const char* s) { return w.str() + s; }

// How a destination is produced from its sources' dtype.
struct Conversion {
  const QuantRule* quant = nullptr;  // set for quantized (fp8) destinations
};

class Mapper {
 public:
  // `catalog` must outlive the Mapper. `mapping_source` names the mapping
  // file in error messages.
  static StatusOr<Mapper> Create(const MappingSpec& spec, const SourceCatalog* catalog,
                                 std::string mapping_source);

  // Appends the segments of tensor `t` of inference rank `rank` to `out` and
  // marks the sources used in `used` (size = catalog size). `where` prefixes
  // errors.
  Status Resolve(const InferenceTensor& t, const TensorWhere& where, std::vector<Segment>* out,
                 Conversion* conv, std::vector<uint8_t>* used) const;

  // Trainer tensors neither used nor skipped are an error (named with the
  // trainer file `trainer_source` and the first rank reporting them).
  Status CheckAllUsed(const std::vector<uint8_t>& used, const std::string& trainer_source) const;

 private:
  struct Rule {
    const MappingRule* rule = nullptr;
    NamePattern engine;
    std::vector<NamePattern> sources;
  };
  // Expands source pattern `i` of `rule` with `b`, marks it used, returns its
  // catalog index; NotFound naming the rule if it is not a trainer tensor.
  StatusOr<int32_t> FindSource(const Rule& rule, size_t i, const PatternBindings& b, const TensorWhere& where,
                               std::vector<uint8_t>* used) const;
  // The box of its source that part `i` of `rule` reads (the whole source, or
  // its chunk): shape and offset in source coords. Errors name the rule.
  struct PartView {
    Shape shape;
    std::array<int64_t, kMaxDims> base{};
  };
  StatusOr<PartView> ViewOf(const Rule& rule, size_t i, int32_t idx, const TensorWhere& where) const;
  Status ResolveRule(const Rule& rule, const PatternBindings& b, const InferenceTensor& t,
                     const TensorWhere& where, std::vector<Segment>* out,
                     std::vector<uint8_t>* used) const;
  Status ResolveStack(const Rule& rule, const PatternBindings& b, const InferenceTensor& t,
                      const TensorWhere& where, std::vector<Segment>* out,
                      std::vector<uint8_t>* used) const;

  const MappingSpec* spec_ = nullptr;
  const SourceCatalog* catalog_ = nullptr;
  std::string mapping_source_;
  std::vector<Rule> rules_;   // non-skip rules, in order
  std::vector<NamePattern> skips_;
};

}  // namespace wsync
