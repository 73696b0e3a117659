#include "routing/json_reader.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace wsync {

using nlohmann::json;

JsonObjectReader::JsonObjectReader(const json& j, std::string where)
    : valid_(j.is_object()), j_(j), where_(std::move(where)) {
  if (!valid_) Fail(std::string("expected a JSON object, got ") + j.type_name());
}

void JsonObjectReader::Fail(const std::string& what) {
  if (status_.ok()) status_ = InvalidArgument(where_ + ": " + what);
}

bool JsonObjectReader::Has(const char* key) const {
  return valid_ && j_.contains(key);
}

const json* JsonObjectReader::Find(const char* key, bool required) {
  if (std::find(known_.begin(), known_.end(), key) == known_.end()) {
    if (known_.empty()) known_.reserve(16);  // one allocation for a typical object's keys
    known_.emplace_back(key);
  }
  if (!valid_) return nullptr;
  auto it = j_.find(key);
  if (it == j_.end()) {
    if (required) Fail(std::string("missing key '") + key + "'");
    return nullptr;
  }
  return &*it;
}

bool JsonObjectReader::Int(const char* key, int64_t* out, bool required) {
  const json* v = Find(key, required);
  if (!v) return false;
  if (!v->is_number_integer()) {
    Fail(std::string("'") + key + "' must be an integer, got " + v->dump());
    return false;
  }
  *out = v->get<int64_t>();
  return true;
}

bool JsonObjectReader::Int32(const char* key, int32_t* out, bool required) {
  int64_t v = 0;
  if (!Int(key, &v, required)) return false;
  if (v < INT32_MIN || v > INT32_MAX) {
    Fail(std::string("'") + key + "' out of range: " + std::to_string(v));
    return false;
  }
  *out = static_cast<int32_t>(v);
  return true;
}

bool JsonObjectReader::Uint(const char* key, uint64_t* out, bool required) {
  const json* v = Find(key, required);
  if (!v) return false;
  if (!v->is_number_unsigned()) {
    Fail(std::string("'") + key + "' must be a non-negative integer, got " + v->dump());
    return false;
  }
  *out = v->get<uint64_t>();
  return true;
}

bool JsonObjectReader::Str(const char* key, std::string* out, bool required) {
  const json* v = Find(key, required);
  if (!v) return false;
  if (!v->is_string()) {
    Fail(std::string("'") + key + "' must be a string, got " + v->dump());
    return false;
  }
  *out = v->get<std::string>();
  return true;
}

bool JsonObjectReader::Name(const char* key, std::string* out, bool required) {
  std::string name;
  if (!Str(key, &name, required)) return false;
  const auto control = std::find_if(name.begin(), name.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
  if (name.empty() || name.size() > kMaxNameBytes || control != name.end()) {
    Fail(std::string("'") + key + "' must be 1 to " + std::to_string(kMaxNameBytes) +
         " bytes without control characters, got " +
         (name.empty() ? std::string("an empty string")
                       : control != name.end()
                             ? "a control character (byte " + std::to_string(static_cast<unsigned char>(*control)) +
                                   ") at offset " + std::to_string(control - name.begin())
                             : std::to_string(name.size()) + " bytes"));
    return false;
  }
  *out = std::move(name);
  return true;
}

bool JsonObjectReader::IntArray(const char* key, std::vector<int64_t>* out, bool required) {
  const json* v = Find(key, required);
  if (!v) return false;
  if (!v->is_array()) {
    Fail(std::string("'") + key + "' must be an array of integers, got " + v->dump());
    return false;
  }
  out->clear();
  out->reserve(v->size());
  for (const json& e : *v) {
    if (!e.is_number_integer()) {
      Fail(std::string("'") + key + "' must be an array of integers, got " + v->dump());
      return false;
    }
    out->push_back(e.get<int64_t>());
  }
  return true;
}

bool JsonObjectReader::StrArray(const char* key, std::vector<std::string>* out, bool required) {
  const json* v = Find(key, required);
  if (!v) return false;
  if (!v->is_array()) {
    Fail(std::string("'") + key + "' must be an array of strings, got " + v->dump());
    return false;
  }
  out->clear();
  for (const json& e : *v) {
    if (!e.is_string()) {
      Fail(std::string("'") + key + "' must be an array of strings, got " + v->dump());
      return false;
    }
    out->push_back(e.get<std::string>());
  }
  return true;
}

bool JsonObjectReader::Dtype(const char* key, DType* out, bool required) {
  std::string s;
  if (!Str(key, &s, required)) return false;
  auto d = ParseDType(s);
  if (!d) {
    Fail(std::string("'") + key + "': unknown dtype '" + s +
         "' (expected bf16, fp16, fp32 or fp8_e4m3)");
    return false;
  }
  *out = *d;
  return true;
}

const json* JsonObjectReader::Object(const char* key, bool required) {
  const json* v = Find(key, required);
  if (v && !v->is_object()) {
    Fail(std::string("'") + key + "' must be an object, got " + v->type_name());
    return nullptr;
  }
  return v;
}

const json* JsonObjectReader::Array(const char* key, bool required) {
  const json* v = Find(key, required);
  if (v && !v->is_array()) {
    Fail(std::string("'") + key + "' must be an array, got " + v->type_name());
    return nullptr;
  }
  return v;
}

const json* JsonObjectReader::Raw(const char* key, bool required) {
  return Find(key, required);
}

Status JsonObjectReader::Finish() {
  if (!status_.ok() || !valid_) return status_;
  for (auto it = j_.begin(); it != j_.end(); ++it) {
    if (std::find(known_.begin(), known_.end(), it.key()) == known_.end()) {
      std::vector<std::string> sorted = known_;
      std::sort(sorted.begin(), sorted.end());
      std::string list;
      for (const std::string& k : sorted) list += (list.empty() ? "" : ", ") + k;
      Fail("unknown key '" + it.key() + "' (expected one of: " + list + ")");
      break;
    }
  }
  return status_;
}

StatusOr<json> ParseJsonText(std::string_view text, const std::string& where) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        return InvalidArgument(where + ": malformed JSON: nested deeper than " + std::to_string(kMaxJsonDepth) +
                               " levels at byte " + std::to_string(i));
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  // nlohmann reports the error position only through its exceptions
  // (parse_error, and out_of_range for a number like 1e999); they are caught
  // right here and turned into a Status.
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    std::string msg = e.what();
    auto pos = msg.find("] ");
    if (pos != std::string::npos) msg = msg.substr(pos + 2);
    return InvalidArgument(where + ": malformed JSON: " + msg);
  }
}

StatusOr<json> ReadJsonFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path + ": cannot open: " + std::strerror(errno));
  std::stringstream buf;
  buf << in.rdbuf();
  return ParseJsonText(buf.str(), path);
}

Status WriteJsonFileAtomic(const json& j, const std::string& path, int indent) {
  return WriteTextFileAtomic(j.dump(indent, ' ', false, json::error_handler_t::replace) + '\n', path);
}

Status WriteTextFileAtomic(const std::string& text, const std::string& path) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return Internal(tmp + ": cannot create: " + std::strerror(errno));
  const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int err = errno;
  if (std::fclose(f) != 0 || !wrote) {
    std::remove(tmp.c_str());
    return Internal(tmp + ": write failed: " + std::strerror(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    return Internal(path + ": rename from " + tmp + " failed: " + std::strerror(e));
  }
  return Status::Ok();
}

}  // namespace wsync
