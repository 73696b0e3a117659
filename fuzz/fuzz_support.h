// Helpers shared by the fuzz targets in this folder (docs/FUZZING.md).
//
// A target feeds libFuzzer's bytes to one parser of external input through
// the same public function its callers use, and turns every broken promise
// into a crash libFuzzer records: an exception escaping the parser, an error
// without a message, a parsed value that does not survive its own writer.
// ASan and UBSan (the fuzz build's flags) catch the rest.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include "common/status.h"

namespace wsync::fuzz {

// A property the parser promised does not hold: print it and abort, so
// libFuzzer keeps the input as a crash.
[[noreturn]] inline void Broken(const std::string& what) {
  std::fprintf(stderr, "wsync fuzz: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// Errors are one clear line: never an OK status turned error without words.
inline void CheckError(const Status& s, const char* parser) {
  if (!s.ok() && s.message().empty()) Broken(std::string(parser) + " returned an error without a message");
}

inline std::string_view Bytes(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A scratch folder of this process (the file variants of the parsers read
// paths); removed at exit.
inline const std::string& ScratchDir() {
  // Never destroyed: the atexit handler runs after static destructors.
  static const std::string* dir = [] {
    auto* d = new std::string((std::filesystem::temp_directory_path() /
                               ("wsync-fuzz-" + std::to_string(::getpid()))).string());
    std::filesystem::create_directories(*d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(ScratchDir(), ec);
    });
    return d;
  }();
  return *dir;
}

inline void WriteFile(const std::string& path, std::string_view bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) Broken("cannot write scratch file " + path);
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) Broken("short write " + path);
  std::fclose(f);
}

// The input as a file in the scratch dir, for the ...FromFile parsers.
inline std::string InputFile(const char* name, std::string_view bytes) {
  const std::string path = ScratchDir() + "/" + name;
  WriteFile(path, bytes);
  return path;
}

// A file of the source tree (fixtures the targets plan against).
inline std::string SourcePath(const std::string& rel) { return std::string(WSYNC_SOURCE_DIR) + "/" + rel; }

}  // namespace wsync::fuzz
