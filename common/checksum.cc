#include "common/checksum.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace wsync {
namespace {

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kP3 = 0x165667B19E3779F9ull;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ull;

inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // little-endian hosts only (x86-64, aarch64)
  return v;
}
inline uint32_t Load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t Round(uint64_t acc, uint64_t input) { return Rotl(acc + input * kP2, 31) * kP1; }
inline uint64_t Merge(uint64_t acc, uint64_t v) { return (acc ^ Round(0, v)) * kP1 + kP4; }

}  // namespace

void Xxh64Stream::Update(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  const uint8_t* const end = p + bytes;
  total_ += bytes;
  if (tail_bytes_ > 0) {
    const size_t take = std::min(bytes, 32 - tail_bytes_);
    std::memcpy(tail_ + tail_bytes_, p, take);
    tail_bytes_ += take;
    p += take;
    if (tail_bytes_ < 32) return;
    Stripe(tail_);
    tail_bytes_ = 0;
  }
  for (; end - p >= 32; p += 32) Stripe(p);
  std::memcpy(tail_, p, static_cast<size_t>(end - p));
  tail_bytes_ = static_cast<size_t>(end - p);
}

void Xxh64Stream::Stripe(const uint8_t* p) {
  v_[0] = Round(v_[0], Load64(p));
  v_[1] = Round(v_[1], Load64(p + 8));
  v_[2] = Round(v_[2], Load64(p + 16));
  v_[3] = Round(v_[3], Load64(p + 24));
}

uint64_t Xxh64Stream::Final() const {
  uint64_t h;
  if (total_ >= 32) {
    h = Rotl(v_[0], 1) + Rotl(v_[1], 7) + Rotl(v_[2], 12) + Rotl(v_[3], 18);
    for (uint64_t v : v_) h = Merge(h, v);
  } else {
    h = kP5;
  }
  h += total_;
  const uint8_t* p = tail_;
  const uint8_t* const end = tail_ + tail_bytes_;
  for (; p + 8 <= end; p += 8) h = Rotl(h ^ Round(0, Load64(p)), 27) * kP1 + kP4;
  if (p + 4 <= end) {
    h = Rotl(h ^ (static_cast<uint64_t>(Load32(p)) * kP1), 23) * kP2 + kP3;
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

uint64_t Xxh64(const void* data, size_t bytes) {
  Xxh64Stream s;
  s.Update(data, bytes);
  return s.Final();
}

namespace {

// The leaf hashes as the next level's bytes: 8 each, little-endian (the
// hosts wsync runs on are little-endian, so the array's own bytes).
uint64_t TreeOf(std::vector<uint64_t> level) {
  static_assert(sizeof(uint64_t) == 8);
  while (level.size() * 8 > kChecksumLeafBytes) {
    const auto* p = reinterpret_cast<const uint8_t*>(level.data());
    const size_t bytes = level.size() * 8;
    std::vector<uint64_t> up((bytes + kChecksumLeafBytes - 1) / kChecksumLeafBytes);
    for (size_t i = 0; i < up.size(); ++i) {
      up[i] = Xxh64(p + i * kChecksumLeafBytes, std::min<size_t>(kChecksumLeafBytes, bytes - i * kChecksumLeafBytes));
    }
    level = std::move(up);
  }
  return Xxh64(level.data(), level.size() * 8);
}

}  // namespace

uint64_t Checksum64(const void* data, size_t bytes) {
  if (bytes <= kChecksumLeafBytes) return Xxh64(data, bytes);
  const auto* p = static_cast<const uint8_t*>(data);
  std::vector<uint64_t> leaves((bytes + kChecksumLeafBytes - 1) / kChecksumLeafBytes);
  for (size_t i = 0; i < leaves.size(); ++i) {
    leaves[i] = Xxh64(p + i * kChecksumLeafBytes, std::min<size_t>(kChecksumLeafBytes, bytes - i * kChecksumLeafBytes));
  }
  return TreeOf(std::move(leaves));
}

void Checksum64Stream::Update(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  total_ += bytes;
  while (bytes > 0) {
    const size_t take = static_cast<size_t>(std::min<uint64_t>(bytes, kChecksumLeafBytes - leaf_bytes_));
    leaf_.Update(p, take);
    leaf_bytes_ += take;
    p += take;
    bytes -= take;
    if (leaf_bytes_ == kChecksumLeafBytes) {
      leaves_.push_back(leaf_.Final());
      leaf_ = Xxh64Stream();
      leaf_bytes_ = 0;
    }
  }
}

uint64_t Checksum64Stream::Final() const {
  if (total_ <= kChecksumLeafBytes) return leaves_.empty() ? leaf_.Final() : leaves_[0];
  std::vector<uint64_t> leaves = leaves_;
  if (leaf_bytes_ > 0) leaves.push_back(leaf_.Final());
  return TreeOf(std::move(leaves));
}

std::string ChecksumText(uint64_t h) {
  static const char kHex[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4) s[static_cast<size_t>(i)] = kHex[h & 0xF];
  return s;
}

std::optional<uint64_t> ParseChecksumText(const std::string& text) {
  if (text.size() != 16) return std::nullopt;
  uint64_t h = 0;
  for (char c : text) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return std::nullopt;
    h = (h << 4) | static_cast<uint64_t>(d);
  }
  return h;
}

}  // namespace wsync
