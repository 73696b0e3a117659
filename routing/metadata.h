// The metadata model: what trainer ranks and inference ranks report about
// their weights, and the rules that map trainer names to engine names.
//
// These structs are the in-memory form of the JSON documents described in
// docs/SCHEMA.md (wsync.trainer/v1, wsync.inference/v1, wsync.mapping/v1).
// The loaders in spec_io.h build them from JSON and validate them; the
// planner (planner.h) turns them into a RoutingTable. The controller fills
// them from agent registrations; the CLI from files or the model generator.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "routing/dtype.h"

namespace wsync {

using Shape = std::vector<int64_t>;

// ---------------------------------------------------------------- trainer --

// One DTensor placement on one mesh dimension.
struct Placement {
  enum class Kind : uint8_t { kReplicate, kShard };
  Kind kind = Kind::kReplicate;
  int32_t dim = -1;  // tensor dim for kShard

  static Placement Replicate() { return {Kind::kReplicate, -1}; }
  static Placement Shard(int32_t d) { return {Kind::kShard, d}; }
  bool operator==(const Placement&) const = default;
};

// A device mesh as one rank sees it. Every rank in the mesh reports the same
// id, shape and dim names and a distinct coordinate.
struct MeshCoord {
  std::string mesh;                     // mesh id, e.g. "pp0/dense"
  Shape shape;                          // e.g. {16, 8}
  std::vector<std::string> dim_names;   // e.g. {"fsdp", "ep"}
  std::vector<int64_t> coord;           // this rank's coordinate, row-major
};

// One parameter as one trainer rank holds it (a DTensor's local shard).
struct TrainerParam {
  std::string name;                     // trainer (HF or torchtitan) name
  Shape global_shape;
  DType dtype = DType::kBF16;
  std::string mesh;                     // mesh id, must be in TrainerRank::meshes
  std::vector<Placement> placements;    // one per mesh dim
  Shape local_shape;                    // torch.chunk semantics, may be empty
  Shape local_offset;
  std::string mesh_group;               // must name a MeshGroupSpec
};

struct TrainerRank {
  int32_t rank = -1;                    // global trainer rank
  std::string host;                     // node name; NICs are per host
  int32_t gpu = 0;                      // local GPU index on host
  int32_t nic = 0;                      // local NIC index on host this GPU writes through
  std::vector<MeshCoord> meshes;
  std::vector<TrainerParam> params;
};

// A MeshGroup: parameters that share one mesh and one unshard pattern; they
// are processed together, MeshGroups one after another in `order`.
struct MeshGroupSpec {
  std::string name;
  std::string mesh;
  // Mesh dims whose Shard placements full_tensor all-gathers. Dims not listed
  // (e.g. "ep") stay sharded: a rank then holds only its slice afterwards.
  std::vector<std::string> gather_dims;
};

struct TrainerSpec {
  std::vector<MeshGroupSpec> mesh_groups;  // execution order
  std::vector<TrainerRank> ranks;          // sorted by rank, 0..N-1
};

// -------------------------------------------------------------- inference --

// Tensor-parallel slice: each part of the (possibly fused) tensor is chunked
// along `dim` into `size` pieces and this rank holds piece `rank`.
struct TpSlice {
  int32_t dim = 0;
  int32_t rank = 0;
  int32_t size = 1;
};

// Expert range of a stacked expert tensor (dim 0): experts [start, end).
struct ExpertRange {
  int64_t start = 0;
  int64_t end = 0;
};

// Where a destination tensor's bytes live: a registered region plus offset.
struct RegionRef {
  std::string region;   // id in InferenceRank::regions
  uint64_t offset = 0;  // bytes from the region start
};

struct ScaleTensor {
  std::string name;     // e.g. "...weight_scale_inv"
  Shape shape;          // block grid, e.g. {ceil(out/128), ceil(in/128)}
  DType dtype = DType::kFP32;
  RegionRef where;
};

struct InferenceTensor {
  std::string name;     // engine name, e.g. model.layers.0.self_attn.qkv_proj.weight
  Shape shape;          // local shape on this rank
  DType dtype = DType::kBF16;
  std::optional<TpSlice> tp;
  std::optional<ExpertRange> experts;
  RegionRef where;
  std::optional<ScaleTensor> scale;  // required iff dtype is fp8
};

// A registered memory region. `descriptor` is the transport's serialized
// remote descriptor ({address, [(nic address, key)]}); "" in a dry run.
struct MemoryRegion {
  std::string id;
  uint64_t size = 0;
  std::string descriptor;
};

// Who decides when an inference rank's weights change (docs/PYTHON.md,
// "Engine-paced updates"): the trainers (kPush, today's default: writes land
// whenever a version is pushed), or the engine: trainers write into the
// engine's weights only while it is inside update() (kLive), or into its
// shadow whenever they push, except while update() copies one out (kShadow).
enum class Pacing { kPush, kLive, kShadow };
inline const char* PacingName(Pacing p) {
  return p == Pacing::kLive ? "live" : p == Pacing::kShadow ? "shadow" : "push";
}
inline std::optional<Pacing> ParsePacing(std::string_view text) {
  for (Pacing p : {Pacing::kPush, Pacing::kLive, Pacing::kShadow})
    if (text == PacingName(p)) return p;
  return std::nullopt;
}

// ---------------------------------------------------------------- mapping --

// One source of an engine tensor. Patterns may hold {L} (layer index, bound
// by matching the engine name) and {E} (expert index, bound per expert).
struct MappingPart {
  std::string source;          // trainer name pattern
  // For a stacked trainer tensor (no {E} in `source`): the dim holding experts.
  std::optional<int32_t> expert_dim;
  // Heads-style replication: if set and smaller than the TP size, this part
  // is chunked into `shards` pieces and TP rank r holds piece r*shards/size
  // (GQA k/v heads replicated when tp > num_kv_heads). May be "{name}" in
  // JSON, resolved from the model config at load time.
  std::optional<int64_t> shards;
  // Takes piece `index` of `count` equal pieces of the source along source
  // dim `dim` instead of the whole source; TP, `shards` and expert ranges
  // then apply to that piece as if it were the source (HF's fused experts
  // gate_up_proj [E, 2I, H]: gate = piece 0 of 2 on dim 1, up = piece 1).
  struct Chunk {
    int32_t dim = 0;
    int64_t index = 0;
    int64_t count = 1;
  };
  std::optional<Chunk> chunk = std::nullopt;
  // The source's rows (dim 0) hold this many heads, each in interleaved RoPE
  // order (x0, y0, x1, y1, ...: Meta's and torchtitan's Llama wq/wk); the
  // engine wants HF's half-split order (x0, x1, ..., y0, y1, ...). Engine
  // row h*hd + j*hd/2 + i comes from source row h*hd + 2i + j, one write per
  // row. May be "{name}" in JSON like `shards`. Not for fp8 destinations.
  std::optional<int64_t> rope_interleaved_heads = std::nullopt;
};

struct MappingRule {
  enum class Kind : uint8_t { kDirect, kConcat, kStackExperts, kTied, kSkip };
  Kind kind = Kind::kDirect;
  std::string engine;               // engine name pattern ({L}); for kSkip a trainer pattern
  std::vector<MappingPart> parts;   // kDirect/kTied: one; kConcat: several
  int32_t concat_dim = 0;           // kConcat, and the per-expert concat of kStackExperts
};

struct QuantRule {
  DType dtype = DType::kFP8E4M3;
  int64_t block_rows = 128;
  int64_t block_cols = 128;
  DType scale_dtype = DType::kFP32;
  std::string scale_suffix = "_scale_inv";  // engine scale name = weight name + suffix
};

struct MappingSpec {
  std::string name;
  std::vector<MappingRule> rules;   // first match wins
  std::vector<QuantRule> quant;     // one per destination dtype that needs a transform
};

// ----------------------------------------------- inference (continued) --

struct InferenceRank {
  int32_t rank = -1;       // global inference rank
  int32_t instance = 0;    // engine replica this rank belongs to
  std::string host;
  int32_t gpu = 0;
  int32_t nic = 0;
  Pacing pacing = Pacing::kPush;  // "pacing" in JSON; absent: push
  // The names this engine's tensors take from the trainer's, when the
  // engine derives them itself (wsync.vllm reads them off the model vLLM
  // built): every rank of the world brings the same one, and the
  // controller plans with it ("mapping" in JSON, a wsync.mapping/v1 object).
  std::optional<MappingSpec> mapping;
  std::vector<MemoryRegion> regions;
  std::vector<InferenceTensor> tensors;
};

struct InferenceSpec {
  std::vector<InferenceRank> ranks;  // sorted by rank, 0..N-1
};

}  // namespace wsync
