// Hex text of bytes, and back: memory descriptors and CUDA IPC handles in
// JSON documents.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace wsync {

// The bytes `text` spells as pairs of hex digits (either case); nullopt for
// an odd length or a character that is not a hex digit.
inline std::optional<std::string> HexToBytes(std::string_view text) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (text.size() % 2 != 0) return std::nullopt;
  std::string raw(text.size() / 2, '\0');
  for (size_t i = 0; i < raw.size(); ++i) {
    const int hi = nibble(text[2 * i]), lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    raw[i] = static_cast<char>(hi << 4 | lo);
  }
  return raw;
}

}  // namespace wsync
