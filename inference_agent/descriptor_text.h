// Text form of a transport MemoryDescriptor for JSON documents: the
// `descriptor` string of a wsync.inference/v1 region is the lowercase hex of
// MemoryDescriptor::Serialize() (raw bytes are not valid JSON strings).
// Written by the inference agent; read by whoever writes into the region
// (trainer agent, test writers) with DescriptorFromText.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "transport/engine.h"

namespace wsync::inference {

inline std::string DescriptorToText(const transport::MemoryDescriptor& d) {
  static constexpr char kDigits[] = "0123456789abcdef";
  const std::string raw = d.Serialize();
  std::string out;
  out.reserve(raw.size() * 2);
  for (unsigned char c : raw) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

inline StatusOr<transport::MemoryDescriptor> DescriptorFromText(std::string_view text) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (text.empty()) return InvalidArgument("memory descriptor: empty (a dry-run spec has no descriptors)");
  if (text.size() % 2 != 0) return InvalidArgument("memory descriptor: odd number of hex digits");
  std::string raw(text.size() / 2, '\0');
  for (size_t i = 0; i < raw.size(); ++i) {
    const int hi = nibble(text[2 * i]), lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return InvalidArgument("memory descriptor: not hex text");
    raw[i] = static_cast<char>(hi << 4 | lo);
  }
  return transport::MemoryDescriptor::Parse(raw);
}

}  // namespace wsync::inference
