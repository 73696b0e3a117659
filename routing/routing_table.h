// The static routing table: every write every trainer rank issues per update.
//
// Produced once by the planner (planner.h) from the metadata model; consumed
// by the controller (which hands each trainer rank its slice), the trainer
// agent's pipeline (which executes it), the inference agent (which expects
// per-version immediate counts from it) and the CLI summary.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "routing/dtype.h"
#include "routing/metadata.h"

namespace wsync {

constexpr int kMaxDims = 4;

// An axis-aligned box in a tensor's element grid (or block grid for scales).
struct Box {
  int8_t ndim = 0;
  std::array<int64_t, kMaxDims> offset{};
  std::array<int64_t, kMaxDims> size{};

  int64_t NumElements() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= size[i];
    return n;
  }
  bool operator==(const Box&) const = default;
};

// What a write carries: the quantized/converted weight, or its block scales.
enum class WriteKind : uint8_t { kWeight, kScale };

// A trainer tensor as the pipeline sees it after full_tensor (and after the
// dtype transform for its destinations).
struct SourceTensor {
  std::string name;          // trainer name
  Shape global_shape;
  DType dtype = DType::kBF16;  // trainer dtype
  int32_t mesh_group = -1;
  // Trainer ranks that hold `box` of this tensor after unshard. For a fully
  // gathered tensor the box is the whole tensor and every mesh rank holds it.
  struct Holder {
    int32_t rank;
    Box box;
  };
  std::vector<Holder> holders;
  // Planned exchange (PlanOptions::exchange): what each rank holds before
  // unshard (its DTensor local shard), and, per rank that writes part of
  // this tensor, the bounding box of what its writes read (element grid,
  // widened to whole fp8 blocks). A rank then receives only that box's rows
  // from its peers instead of the whole tensor. Both sorted by rank; empty
  // when the plan all-gathers.
  std::vector<Holder> shards;
  std::vector<Holder> needs;
  // The fp8 blocks some write of it quantizes (rows, cols of the last two
  // dims); 0 when every write copies. An exchange must not split a block.
  int64_t block_rows = 0;
  int64_t block_cols = 0;
};

// One destination tensor on one inference rank (weight and optional scale).
struct DestTensor {
  int32_t rank = -1;          // inference rank
  std::string name;           // engine name
  Shape shape;
  DType dtype = DType::kBF16;
  RegionRef where;
  uint64_t bytes = 0;
  // Scale tensor (fp8 only): name, block-grid shape, location, bytes.
  bool has_scale = false;
  std::string scale_name;
  Shape scale_shape;
  RegionRef scale_where;
  uint64_t scale_bytes = 0;
};

// One contiguous one-sided write: `src_box` of source `src` (in the
// destination dtype's element grid, or the block grid for kScale), laid out
// row-major, lands at `dst_offset` bytes into destination `dst`'s weight (or
// scale) memory. Invariant: the box's bytes are contiguous at the destination.
//
// Or, with planes > 1, that many such writes at a constant stride (a strided
// op): plane p is index src_box.offset[plane_dim] + p of source dim
// `plane_dim` (the box spans all planes there; every plane has the same
// shape) and lands at dst_offset + p * plane_stride. One trainer rank's rows
// of each of 384 stacked experts are one op instead of 384 (PlaneOf expands
// one). Only planned-exchange tables have them (PlanOptions::exchange).
struct WriteOp {
  int32_t mesh_group = -1;
  int32_t src_rank = -1;      // trainer rank that issues it
  int32_t src = -1;           // index into RoutingTable::sources
  int32_t dst_rank = -1;      // inference rank
  int32_t dst = -1;           // index into RoutingTable::destinations
  WriteKind kind = WriteKind::kWeight;
  Box src_box;
  uint64_t dst_offset = 0;
  uint64_t bytes = 0;         // of all its planes together
  uint32_t planes = 1;
  int32_t plane_dim = -1;     // source dim the planes step along; -1 with one plane
  uint64_t plane_stride = 0;  // destination bytes from one plane to the next
};

// Plane p (< op.planes) of an op, as an op of one plane.
WriteOp PlaneOf(const WriteOp& op, uint32_t p);
// The one-sided writes `ops` stand for (their planes), and those ops with
// every strided one expanded in place: what independent checks walk.
uint64_t WriteCount(const std::vector<WriteOp>& ops);
std::vector<WriteOp> ExpandPlanes(const std::vector<WriteOp>& ops);
// Why `planes` planes of `bytes` in all, `plane_stride` bytes apart at the
// destination and stepping along dim `plane_dim` of `box` (nullptr: a write
// without its source box), are not a strided write; empty if they are. What
// the plan and slice parsers check before anything expands them.
std::string StridedWriteError(uint64_t planes, int64_t plane_dim, uint64_t plane_stride, uint64_t bytes,
                              const Box* box);

struct MeshGroupInfo {
  std::string name;
  std::vector<int32_t> ranks;   // trainer ranks taking part
};

// Where a rank sends or receives from: host and NIC index on that host.
struct Endpoint {
  std::string host;
  int32_t gpu = 0;
  int32_t nic = 0;
};

struct RoutingTable {
  std::vector<MeshGroupInfo> mesh_groups;   // execution order
  std::vector<SourceTensor> sources;
  std::vector<DestTensor> destinations;
  // Sorted by (mesh_group, src_rank, src, dst_rank, dst, kind, dst_offset):
  // one MeshGroup's writes are contiguous and in pipeline order.
  std::vector<WriteOp> ops;
  std::vector<Endpoint> trainer_endpoints;    // index = trainer rank
  std::vector<Endpoint> inference_endpoints;  // index = inference rank
};

}  // namespace wsync
