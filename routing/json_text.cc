#include "routing/json_text.h"

namespace wsync {

void AppendJsonString(std::string* out, std::string_view s) {
  bool plain = true;
  for (const char c : s) plain = plain && c >= 0x20 && c < 0x7f && c != '"' && c != '\\';
  if (!plain) {
    *out += nlohmann::json(std::string(s)).dump();
    return;
  }
  *out += '"';
  out->append(s);
  *out += '"';
}

std::string ObjectTextWith(const nlohmann::json& head, std::string_view key, std::string_view raw) {
  std::string out = "{";
  bool placed = false;
  auto member = [&](std::string_view k, auto&& value) {
    if (out.size() > 1) out += ',';
    AppendJsonString(&out, k);
    out += ':';
    value();
  };
  for (const auto& [k, v] : head.items()) {
    if (!placed && std::string_view(k) > key) {
      member(key, [&] { out.append(raw); });
      placed = true;
    }
    member(k, [&] { out += v.dump(); });
  }
  if (!placed) member(key, [&] { out.append(raw); });
  out += '}';
  return out;
}

}  // namespace wsync
