#include "routing/json_text.h"

#include <vector>

namespace wsync {

void AppendJsonString(std::string* out, std::string_view s) {
  bool plain = true;
  for (const char c : s) plain = plain && c >= 0x20 && c < 0x7f && c != '"' && c != '\\';
  if (!plain) {
    *out += nlohmann::json(std::string(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return;
  }
  *out += '"';
  out->append(s);
  *out += '"';
}

std::string ObjectTextWith(const nlohmann::json& head,
                           std::initializer_list<std::pair<std::string_view, std::string_view>> raw) {
  // Head's members written first and the text sized once: appending a large
  // member (a slice's plan, hundreds of KB) to a small string and then the
  // members after it would copy it twice and leave twice its size allocated.
  std::vector<std::pair<std::string_view, std::string>> members;
  size_t bytes = 2;
  for (const auto& [k, v] : head.items()) {
    members.emplace_back(k, v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    bytes += k.size() + members.back().second.size() + 8;  // a key that needs escaping may grow a little more
  }
  for (const auto& [k, v] : raw) bytes += k.size() + v.size() + 4;
  std::string out = "{";
  out.reserve(bytes + 1);  // and a newline a caller writing a file adds (without copying the text)
  auto member = [&](std::string_view k, std::string_view v) {
    if (out.size() > 1) out += ',';
    AppendJsonString(&out, k);
    out += ':';
    out.append(v);
  };
  auto next = raw.begin();
  for (const auto& [k, v] : members) {
    for (; next != raw.end() && next->first < k; ++next) member(next->first, next->second);
    member(k, v);
  }
  for (; next != raw.end(); ++next) member(next->first, next->second);
  out += '}';
  return out;
}

std::string ObjectTextWith(const nlohmann::json& head, std::string_view key, std::string_view raw) {
  return ObjectTextWith(head, {{key, raw}});
}

}  // namespace wsync
