// Strict, exception-free reading of one JSON object for the spec loaders.
//
// Internal to routing/ (spec_io and plan_io), except ParseJsonText, which
// the controller also uses for request bodies. Every field accessor records the
// key as known, so Finish() can reject unknown keys (typos must not pass
// silently). The first error wins and is reported as one line prefixed with
// `where` ("trainer.json: rank 3: tensor 'x'").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "routing/dtype.h"

namespace wsync {

class JsonObjectReader {
 public:
  JsonObjectReader(const nlohmann::json& j, std::string where);

  // Each returns false (and records an error unless the field is optional and
  // absent) when the field is missing or has the wrong type.
  bool Int(const char* key, int64_t* out, bool required = true);
  bool Int32(const char* key, int32_t* out, bool required = true);
  bool Uint(const char* key, uint64_t* out, bool required = true);
  bool Str(const char* key, std::string* out, bool required = true);
  // A name that travels into plans, logs and replies (tensor, region): a
  // string of 1 to kMaxNameBytes bytes without control characters.
  bool Name(const char* key, std::string* out, bool required = true);
  static constexpr size_t kMaxNameBytes = 1024;
  bool IntArray(const char* key, std::vector<int64_t>* out, bool required = true);
  bool StrArray(const char* key, std::vector<std::string>* out, bool required = true);
  bool Dtype(const char* key, DType* out, bool required = true);
  // Returns the member (object or array as asked) or nullptr.
  const nlohmann::json* Object(const char* key, bool required = true);
  const nlohmann::json* Array(const char* key, bool required = true);
  // Any JSON value; the caller checks its type.
  const nlohmann::json* Raw(const char* key, bool required = true);
  bool Has(const char* key) const;

  void Fail(const std::string& what);  // records "<where>: what"
  bool ok() const { return status_.ok(); }
  // Checks for unknown keys; returns the first error.
  Status Finish();
  const std::string& where() const { return where_; }

 private:
  const nlohmann::json* Find(const char* key, bool required);
  bool valid_ = false;
  const nlohmann::json& j_;
  std::string where_;
  // The keys asked for, each once. A short vector, not a set: a reader is
  // made per object (a Kimi-K2 world is ~400k tensor entries), and a set
  // allocated a node per key, a good part of the cost of reading a world.
  std::vector<std::string> known_;
  Status status_;
};

// Documents nested deeper than this are refused before parsing: copying,
// comparing and printing a JSON value recurse once per level, so a few MB
// of "[[[[..." would otherwise exhaust a thread's stack. Ours nest < 10.
inline constexpr int kMaxJsonDepth = 64;

// Parses `text`; malformed JSON (including numbers out of range such as
// 1e999), or nesting deeper than kMaxJsonDepth, gives one line starting with
// `where` and naming the parser's position. Never throws.
StatusOr<nlohmann::json> ParseJsonText(std::string_view text, const std::string& where);

// Reads a whole file into JSON (ParseJsonText, `where` = the path).
StatusOr<nlohmann::json> ReadJsonFile(const std::string& path);

// Writes `j` to `path` through a temp file + rename, so readers never see a
// half-written file. indent < 0 writes compactly.
Status WriteJsonFileAtomic(const nlohmann::json& j, const std::string& path, int indent);
// `text` as it is, through a temp file and a rename.
Status WriteTextFileAtomic(const std::string& text, const std::string& path);

}  // namespace wsync
