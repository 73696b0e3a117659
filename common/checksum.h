// Checksums of written bytes (issue #10's integrity check), fast enough to
// run over every byte of an update: on the host (several GB/s per core) and,
// for bytes in GPU memory, by kernels where the bytes are
// (common/checksum_cuda.h), with the same result either way. An integrity
// check against corruption and stray writes, not a defence against an
// attacker who can write (the control plane's signatures and the
// registration scopes are that).
//
// The hash ("wsync checksum v2", issue #34): XXH64 (the public xxHash 64-bit
// algorithm, seed 0) is serial over its input, so bytes are hashed as a
// tree a GPU can run in parallel. Checksum64 of n bytes is
//   XXH64(bytes)                                   where n <= 4096 (a leaf),
//   Checksum64(XXH64(leaf 0) | XXH64(leaf 1) | ...) otherwise,
// the leaves being the 4096-byte pieces in order (the last may be shorter)
// and each leaf hash 8 bytes, little-endian: fan-out 512, so 4 levels cover
// 512 GiB. A write of at most 4 KiB hashes as plain XXH64 (v1's value).
//
// A WriteChecksum names one write by where it lands (inference rank,
// region, offset, length); the trainer that posted it computes the hash of
// the bytes it sent, the inference rank hashes the same range of its memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/xxh64_steps.h"

namespace wsync {

constexpr uint64_t kChecksumLeafBytes = 4096;

uint64_t Checksum64(const void* data, size_t bytes);

// Plain XXH64 (seed 0) of bytes that arrive in pieces: Update in order,
// then Final. The tree's leaves and its levels are hashed with it.
class Xxh64Stream {
 public:
  void Update(const void* data, size_t bytes);
  uint64_t Final() const;

 private:
  void Stripe(const uint8_t* p);
  uint64_t v_[4] = {xxh64::kLane1, xxh64::kLane2, xxh64::kLane3, xxh64::kLane4};
  uint8_t tail_[32] = {};
  size_t tail_bytes_ = 0;
  uint64_t total_ = 0;
};
uint64_t Xxh64(const void* data, size_t bytes);

// Checksum64 over bytes that arrive in pieces (memory read back from a
// device a buffer at a time): Update in order, then Final. Keeps 8 bytes per
// 4 KiB leaf until Final.
class Checksum64Stream {
 public:
  void Update(const void* data, size_t bytes);
  uint64_t Final() const;

 private:
  Xxh64Stream leaf_;
  uint64_t leaf_bytes_ = 0;
  uint64_t total_ = 0;
  std::vector<uint64_t> leaves_;  // hashes of the whole leaves so far
};

// A range of memory to hash where the bytes are (a device's memory, for
// the hashers of DeviceOps::Checksums and common/checksum_cuda.h).
struct ChecksumPiece {
  const void* data = nullptr;
  uint64_t bytes = 0;
};

// 16 lower-case hex digits, and back (nullopt unless exactly that).
std::string ChecksumText(uint64_t h);
std::optional<uint64_t> ParseChecksumText(const std::string& text);

struct WriteChecksum {
  int32_t dst_rank = -1;
  std::string region;
  uint64_t offset = 0;  // bytes from the region start
  uint64_t bytes = 0;
  uint64_t hash = 0;
};

}  // namespace wsync
