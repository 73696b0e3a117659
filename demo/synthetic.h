// Deterministic synthetic weights for the demo, the integration tests and
// the cluster benchmark: the value of every element of every trainer tensor
// at every version is a pure function of (name, global index, version), so
// a fake trainer can fill its shard and the reference checker can build the
// full tensor without either seeing the other.
//
// SyntheticBf16 is the definition, one element at a time; the reference
// (demo/reference.cc) evaluates it that way. FillSyntheticBox is the fast
// path the fake trainer fills ~1 GB with per version: one index computation
// per row instead of per element, the same values (tests/demo pins that).
#pragma once

#include <bit>
#include <cstdint>
#include <string_view>
#include <vector>

#include "routing/metadata.h"
#include "routing/routing_table.h"

namespace wsync::demo {

uint64_t NameHash(std::string_view name);

namespace synthetic_detail {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline constexpr uint64_t kIndexMul = 0xD1B54A32D192ED03ull;
inline constexpr uint64_t kVersionMul = 0x8CB92BA72F3D8DD7ull;
inline constexpr float kRowScale[5] = {0.25f, 0.5f, 1.0f, 2.0f, 4.0f};

// The element's value before rounding to bf16: (unit * row scale) * 0.05 in
// that order, a magnitude below 0.2, never NaN or infinite.
inline float SyntheticValue(uint64_t name_hash, uint64_t flat_index, float row_scale, uint64_t version_key) {
  const uint64_t u = SplitMix64(name_hash ^ (flat_index * kIndexMul) ^ version_key);
  const float unit = static_cast<float>(u >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // [-1, 1)
  return unit * row_scale * 0.05f;
}

// Round to nearest even; the values above are finite, so no NaN case
// (pipeline/fp8.h's Fp32ToBf16 gives the same bits for them).
inline uint16_t RoundToBf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// The version whose value an element has at `version`. With drift period
// P > 1 each element changes at one version in every P (which one is its
// own), so about 1/P of the elements change from one version to the next,
// as an optimizer step at an RL learning rate changes a few percent of bf16
// weights (docs/DELTAS.md); P <= 1: every element, every version.
inline uint64_t LastChange(uint64_t name_hash, uint64_t flat_index, uint64_t version, uint32_t period) {
  if (period <= 1) return version;
  const uint64_t phase = SplitMix64(name_hash ^ (flat_index * kIndexMul) ^ 0x5BD1E995ull) % period;
  const uint64_t back = (version + phase) % period;
  return back > version ? 0 : version - back;
}

}  // namespace synthetic_detail

// bf16 bits of element `flat_index` (row-major in the global tensor) whose
// second-to-last-dim index is `row`. Magnitudes vary by row so fp8 blocks get
// different scales. `drift`: synthetic_detail::LastChange's period.
inline uint16_t SyntheticBf16(uint64_t name_hash, uint64_t flat_index, int64_t row, uint64_t version,
                              uint32_t drift = 1) {
  using namespace synthetic_detail;
  const uint64_t key = LastChange(name_hash, flat_index, version, drift) * kVersionMul;
  return RoundToBf16(SyntheticValue(name_hash, flat_index, kRowScale[row % 5], key));
}

// Fills `out` (row-major over `box`) with the synthetic values of `box` of a
// tensor of `global_shape`.
void FillSyntheticBox(std::string_view name, const Shape& global_shape, const Box& box,
                      uint64_t version, uint16_t* out, uint32_t drift = 1);

// The whole tensor.
std::vector<uint16_t> SyntheticTensor(std::string_view name, const Shape& global_shape, uint64_t version,
                                      uint32_t drift = 1);

}  // namespace wsync::demo
