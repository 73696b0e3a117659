// How the transport tests' processes find each other: small files in a
// per-test temp directory, written atomically (tmp + rename), polled with a
// deadline. Shared by transport_test and transport_peer.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace wsync::transport::testing {

inline void WriteFileAtomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::rename(tmp.c_str(), path.c_str());
}

inline std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::optional<std::string> WaitForFile(const std::string& path, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto bytes = ReadFile(path)) return bytes;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return std::nullopt;
}

// The test payload: bytes from a seeded generator, the same in every process.
inline std::vector<uint8_t> RandomBytes(uint64_t seed, size_t n) {
  std::mt19937_64 gen(seed);
  std::vector<uint8_t> out(n);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = gen();
    for (int b = 0; b < 8; ++b) out[i + b] = static_cast<uint8_t>(v >> (8 * b));
  }
  for (; i < n; ++i) out[i] = static_cast<uint8_t>(gen());
  return out;
}

}  // namespace wsync::transport::testing
