// The steps of XXH64 (the public xxHash 64-bit algorithm, seed 0), written
// once for both callers that must compute the same function: the host's
// stream (common/checksum.cc) and the GPU's leaves (common/checksum_cuda.cu).
// `Loads` gives Load64/Load32 (little-endian, at the caller's alignment).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define WSYNC_XXH64_FN __host__ __device__ __forceinline__
#else
#define WSYNC_XXH64_FN inline
#endif

namespace wsync::xxh64 {

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kP3 = 0x165667B19E3779F9ull;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ull;
// The four lanes before the first stripe.
constexpr uint64_t kLane1 = kP1 + kP2, kLane2 = kP2, kLane3 = 0, kLane4 = 0 - kP1;

WSYNC_XXH64_FN uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
WSYNC_XXH64_FN uint64_t Round(uint64_t acc, uint64_t input) { return Rotl(acc + input * kP2, 31) * kP1; }
WSYNC_XXH64_FN uint64_t Merge(uint64_t acc, uint64_t v) { return (acc ^ Round(0, v)) * kP1 + kP4; }

// The lanes folded into one, for an input of 32 bytes or more.
WSYNC_XXH64_FN uint64_t Converge(uint64_t v1, uint64_t v2, uint64_t v3, uint64_t v4) {
  uint64_t h = Rotl(v1, 1) + Rotl(v2, 7) + Rotl(v3, 12) + Rotl(v4, 18);
  h = Merge(h, v1);
  h = Merge(h, v2);
  h = Merge(h, v3);
  return Merge(h, v4);
}

// From the folded lanes (or kP5 under 32 bytes) and the input's length: the
// last [p, end) (under 32 bytes) and the avalanche.
template <typename Loads>
WSYNC_XXH64_FN uint64_t Finish(uint64_t h, uint64_t length, const uint8_t* p, const uint8_t* end) {
  h += length;
  for (; end - p >= 8; p += 8) h = Rotl(h ^ Round(0, Loads::Load64(p)), 27) * kP1 + kP4;
  if (end - p >= 4) {
    h = Rotl(h ^ (static_cast<uint64_t>(Loads::Load32(p)) * kP1), 23) * kP2 + kP3;
    p += 4;
  }
  for (; p < end; ++p) h = Rotl(h ^ (*p * kP5), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

}  // namespace wsync::xxh64
