// The planner: metadata model -> static RoutingTable (routing_table.h).
//
// Called once per setup by the controller and by `wsync plan`. Semantics
// (docs/SCHEMA.md): after unsharding over its MeshGroup's gather dims (by
// default the planned exchange, which brings a rank only the rows it
// writes; full_tensor without it) a trainer rank holds a box of each
// source; every destination byte (weights and fp8 block scales) of every
// inference rank is written exactly once, by one rank that holds the
// needed source box. Among candidates the planner
// balances bytes per sender rank and per sender NIC (host, nic), greedily
// largest job first, ties to the lowest rank; loads are balanced per
// MeshGroup, because MeshGroups run one after another. Writes are split only
// where the destination bytes stop being contiguous. Same input -> same table.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "routing/metadata.h"
#include "routing/routing_table.h"

namespace wsync {

struct PlanOptions {
  // Run ValidateTrainerSpec/ValidateInferenceSpec/ValidateMapping first.
  // Only skip when the specs were just parsed (the parsers validate).
  bool validate = true;
  // Names used in error lines (usually the file names).
  std::string trainer_source = "trainer";
  std::string inference_source = "inference";
  std::string mapping_source = "mapping";
  // Planned exchange instead of full_tensor: cut each destination piece at
  // the trainers' shard boundaries (whole fp8 blocks), give it to the rank
  // that already holds most of it, and record what each writer needs
  // (SourceTensor::needs), so a rank receives only the rows it writes.
  // false (full_tensor): every rank of a gather group all-gathers the whole
  // tensor, as the reference does. The default since strided writes keep
  // the plan as small as full_tensor's (Kimi-K2 256 -> 128: 18 M writes in
  // 0.99 M ops, against 0.92 M).
  bool exchange = true;
  // With the exchange: a destination piece is cut at shard edges only where
  // each part keeps at least this many bytes (and where the cut saves an
  // exchange, planner.cc ShardCutsPay). A write costs about 2 us of fixed
  // work; at 50 GB/s (a 400 Gb/s NIC) that is ~100 KB of wire time, so a
  // smaller part costs more as a write of its own than as rows gathered.
  uint64_t min_shard_piece_bytes = 128 << 10;
  // If set, the seconds each planning stage took, in order (bench plan).
  std::vector<std::pair<std::string, double>>* stage_seconds = nullptr;
};

StatusOr<RoutingTable> Plan(const TrainerSpec& trainer, const InferenceSpec& inference,
                            const MappingSpec& mapping, const PlanOptions& options = {});

// Bytes of `box` written row-major at `offset`, within a tensor of `shape`:
// the byte offset of the box start (valid when the box is contiguous there).
uint64_t BoxByteOffset(const Box& box, const Shape& shape, int64_t elem_size);

}  // namespace wsync
