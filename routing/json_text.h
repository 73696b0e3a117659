// Writing large JSON documents as text without building them as trees: a
// plan or plan slice with millions of writes costs seconds and gigabytes as
// an nlohmann::json tree, and most of that in malloc and free. The writers
// here append exactly what json::dump() would produce (keys sorted, no
// spaces), so a document written either way is byte for byte the same; the
// tests compare the two. Used by plan_io (plan.json) and rank_plan (the
// slices the controller serves).
#pragma once

#include <charconv>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

namespace wsync {

template <typename T>
void AppendJsonInt(std::string* out, T v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out->append(buf, r.ptr);
}

template <typename Container>
void AppendJsonIntArray(std::string* out, const Container& values) {
  *out += '[';
  bool first = true;
  for (const auto v : values) {
    if (!first) *out += ',';
    first = false;
    AppendJsonInt(out, v);
  }
  *out += ']';
}

// A JSON string as dump() writes it (printable ASCII fast, the rest through
// nlohmann's own escaping). Invalid UTF-8 is replaced (U+FFFD), not thrown
// on: a plan or slice is served whole or not at all, never half-written.
void AppendJsonString(std::string* out, std::string_view s);

template <typename Container>
void AppendJsonStringArray(std::string* out, const Container& values) {
  *out += '[';
  bool first = true;
  for (const auto& v : values) {
    if (!first) *out += ',';
    first = false;
    AppendJsonString(out, v);
  }
  *out += ']';
}

// `head`, an object, as dump() writes it, with one more member `key` whose
// value is the JSON text `raw`, in its sorted place among head's keys.
std::string ObjectTextWith(const nlohmann::json& head, std::string_view key, std::string_view raw);
// The same with several such members, given in key order.
std::string ObjectTextWith(const nlohmann::json& head,
                           std::initializer_list<std::pair<std::string_view, std::string_view>> raw);

}  // namespace wsync
