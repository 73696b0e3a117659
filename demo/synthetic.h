// Deterministic synthetic weights for the demo, the integration tests and
// the cluster benchmark: the value of every element of every trainer tensor
// at every version is a pure function of (name, global index, version), so
// a fake trainer can fill its shard and the reference checker can build the
// full tensor without either seeing the other.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "routing/metadata.h"
#include "routing/routing_table.h"

namespace wsync::demo {

uint64_t NameHash(std::string_view name);

// bf16 bits of element `flat_index` (row-major in the global tensor) whose
// second-to-last-dim index is `row`. Magnitudes vary by row so fp8 blocks get
// different scales.
uint16_t SyntheticBf16(uint64_t name_hash, uint64_t flat_index, int64_t row, uint64_t version);

// Fills `out` (row-major over `box`) with the synthetic values of `box` of a
// tensor of `global_shape`.
void FillSyntheticBox(std::string_view name, const Shape& global_shape, const Box& box,
                      uint64_t version, uint16_t* out);

// The whole tensor.
std::vector<uint16_t> SyntheticTensor(std::string_view name, const Shape& global_shape, uint64_t version);

}  // namespace wsync::demo
