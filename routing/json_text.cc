#include "routing/json_text.h"

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
  std::string out = "{";
  auto member = [&](std::string_view k) {
    if (out.size() > 1) out += ',';
    AppendJsonString(&out, k);
    out += ':';
  };
  auto next = raw.begin();
  for (const auto& [k, v] : head.items()) {
    for (; next != raw.end() && next->first < std::string_view(k); ++next) {
      member(next->first);
      out.append(next->second);
    }
    member(k);
    out += v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  for (; next != raw.end(); ++next) {
    member(next->first);
    out.append(next->second);
  }
  out += '}';
  return out;
}

std::string ObjectTextWith(const nlohmann::json& head, std::string_view key, std::string_view raw) {
  return ObjectTextWith(head, {{key, raw}});
}

}  // namespace wsync
