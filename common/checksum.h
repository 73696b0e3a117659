// Checksums of written bytes (issue #10's integrity check): XXH64 (the
// public xxHash 64-bit algorithm, seed 0), fast enough to run over every
// byte of an update on the host (several GB/s per core). An integrity
// check against corruption and stray writes, not a defence against an
// attacker who can write (the control plane's signatures and the
// registration scopes are that).
//
// A WriteChecksum names one write by where it lands (inference rank,
// region, offset, length); the trainer that posted it computes the hash of
// the bytes it sent, the inference rank hashes the same range of its memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace wsync {

uint64_t Checksum64(const void* data, size_t bytes);

// The same hash over bytes that arrive in pieces (memory read back from a
// device a buffer at a time): Update in order, then Final.
class Checksum64Stream {
 public:
  void Update(const void* data, size_t bytes);
  uint64_t Final() const;

 private:
  void Stripe(const uint8_t* p);
  uint64_t v_[4] = {0x9E3779B185EBCA87ull + 0xC2B2AE3D27D4EB4Full, 0xC2B2AE3D27D4EB4Full, 0,
                    0 - 0x9E3779B185EBCA87ull};
  uint8_t tail_[32] = {};
  size_t tail_bytes_ = 0;
  uint64_t total_ = 0;
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
