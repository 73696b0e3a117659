// Structural validation of the three spec documents (docs/SCHEMA.md).
//
// The JSON loaders (spec_io.h) call these after parsing; code that builds the
// structs directly (the model generator, the controller) calls them itself,
// and Plan() runs them unless told not to. Each returns the first problem as
// one line: "<source>: rank R: tensor 'NAME': what is wrong (expected ...)".
// Cross-document checks (mapping rules against trainer names, shapes that do
// not tile) belong to the planner, which sees all three.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "routing/metadata.h"

namespace wsync {

// Ranks 0..N-1 once each; meshes consistent (same id -> same shape and dim
// names; every coordinate reported exactly once); params name a mesh the rank
// reports and an existing mesh group on that mesh; one placement per mesh
// dim; local_shape/local_offset equal the DTensor/FSDP2 torch.chunk shard
// (an empty shard's offset is not checked); the same name has identical
// global shape, dtype, mesh, placements and mesh group on every rank of its
// mesh, and every rank of the mesh reports it.
Status ValidateTrainerSpec(const TrainerSpec& spec, const std::string& source);

// Ranks 0..N-1 once each; region ids unique; tensor names unique per rank;
// tensors and scales inside their regions and not overlapping; tp and expert
// slices consistent with the shape, and within one instance the same tp
// split for a tensor on every rank and no slice held twice; fp8 tensors carry an fp32 scale whose
// shape is the 128x128 block grid of the last two dims (leading dims equal);
// other dtypes carry none.
Status ValidateInferenceSpec(const InferenceSpec& spec, const std::string& source);

// Patterns well formed ({L}, {E}, {*} and other {Name} decimal placeholders;
// braces balanced); every placeholder a source uses is bound by the engine
// pattern ({E} also by stack_experts); stack_experts parts use {E} or
// expert_dim, not both; shards > 0; a chunk has 0 <= index < count and a
// dim below kMaxDims (not on tied or {*} rules); quantize rules have
// positive blocks and at most one rule per dtype.
Status ValidateMapping(const MappingSpec& spec, const std::string& source);

// Bytes of a tensor of `shape` with `elem_size`-byte elements; nullopt when
// a dim is negative or the size does not fit in int64 (so 2^62 elements of
// a shape that passed can be counted, chunked and offset without overflow).
std::optional<int64_t> ShapeBytes(const std::vector<int64_t>& shape, int64_t elem_size);

// Ranks listed as 0..N-1, each once (N > 0); `role` names them in the error.
template <typename RankT>
Status ValidateRankSequence(const std::vector<RankT>& ranks, const std::string& role, const std::string& source) {
  if (ranks.empty()) return InvalidArgument(source + ": no " + role + " ranks");
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int32_t r = ranks[i].rank;
    if (r == static_cast<int32_t>(i)) continue;
    if (i > 0 && r == ranks[i - 1].rank) return InvalidArgument(source + ": rank " + std::to_string(r) + " listed twice");
    return InvalidArgument(source + ": rank " + std::to_string(i) + " missing (ranks must be 0.." +
                           std::to_string(ranks.size() - 1) + ", each once; found " + std::to_string(r) + ")");
  }
  return Status::Ok();
}

}  // namespace wsync
