#include "common/checksum.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/xxh64_steps.h"

namespace wsync {
namespace {

using xxh64::Round;

struct HostLoads {
  static uint64_t Load64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);  // little-endian hosts only (x86-64, aarch64)
    return v;
  }
  static uint32_t Load32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
};

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
  v_[0] = Round(v_[0], HostLoads::Load64(p));
  v_[1] = Round(v_[1], HostLoads::Load64(p + 8));
  v_[2] = Round(v_[2], HostLoads::Load64(p + 16));
  v_[3] = Round(v_[3], HostLoads::Load64(p + 24));
}

uint64_t Xxh64Stream::Final() const {
  const uint64_t h = total_ >= 32 ? xxh64::Converge(v_[0], v_[1], v_[2], v_[3]) : xxh64::kP5;
  return xxh64::Finish<HostLoads>(h, total_, tail_, tail_ + tail_bytes_);
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
