#include "routing/name_pattern.h"

#include <cctype>

namespace wsync {

const std::string_view* PatternBindings::Find(std::string_view name) const {
  for (int i = 0; i < count; ++i)
    if (names[i] == name) return &values[i];
  return nullptr;
}

bool PatternBindings::Set(std::string_view name, std::string_view value) {
  for (int i = 0; i < count; ++i) {
    if (names[i] == name) {
      values[i] = value;
      return true;
    }
  }
  if (count == kMax) return false;
  names[count] = name;
  values[count] = value;
  ++count;
  return true;
}

StatusOr<NamePattern> NamePattern::Compile(std::string text) {
  NamePattern p;
  p.text_ = std::move(text);
  const std::string& t = p.text_;
  size_t i = 0;
  while (i < t.size()) {
    if (t[i] == '{') {
      const size_t close = t.find('}', i);
      if (close == std::string::npos) return InvalidArgument("unbalanced '{' in '" + t + "'");
      std::string_view name(t.data() + i + 1, close - i - 1);
      if (name.empty()) return InvalidArgument("empty placeholder '{}' in '" + t + "'");
      const bool star = name == "*";
      if (!star) {
        for (char c : name)
          if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_')
            return InvalidArgument("bad placeholder '{" + std::string(name) + "}' in '" + t + "'");
      }
      if (!p.tokens_.empty() && p.tokens_.back().is_var)
        return InvalidArgument("two placeholders back to back in '" + t + "'");
      p.tokens_.push_back({true, star, static_cast<uint32_t>(i + 1),
                           static_cast<uint32_t>(close - i - 1)});
      i = close + 1;
    } else if (t[i] == '}') {
      return InvalidArgument("unbalanced '}' in '" + t + "'");
    } else {
      const size_t next = t.find_first_of("{}", i);
      const size_t end = next == std::string::npos ? t.size() : next;
      p.tokens_.push_back({false, false, static_cast<uint32_t>(i), static_cast<uint32_t>(end - i)});
      i = end;
    }
  }
  return p;
}

bool NamePattern::HasPlaceholder(std::string_view name) const {
  for (const Token& t : tokens_)
    if (t.is_var && View(t) == name) return true;
  return false;
}

std::vector<std::string> NamePattern::placeholders() const {
  std::vector<std::string> out;
  for (const Token& t : tokens_) {
    if (!t.is_var) continue;
    std::string n(View(t));
    bool seen = false;
    for (const auto& o : out) seen |= o == n;
    if (!seen) out.push_back(std::move(n));
  }
  return out;
}

bool NamePattern::MatchFrom(size_t tok, std::string_view rest, PatternBindings* b) const {
  if (tok == tokens_.size()) return rest.empty();
  const Token& t = tokens_[tok];
  const std::string_view text = View(t);
  if (!t.is_var) {
    if (rest.substr(0, text.size()) != text) return false;
    return MatchFrom(tok + 1, rest.substr(text.size()), b);
  }
  if (const std::string_view* bound = b->Find(text)) {
    // Second use of a placeholder must repeat the first value.
    if (rest.substr(0, bound->size()) != *bound) return false;
    return MatchFrom(tok + 1, rest.substr(bound->size()), b);
  }
  size_t max_len = rest.size();
  if (!t.star) {
    max_len = 0;
    while (max_len < rest.size() && std::isdigit(static_cast<unsigned char>(rest[max_len])))
      ++max_len;
  }
  const int saved = b->count;
  for (size_t len = max_len; len >= 1; --len) {
    b->count = saved;
    if (!b->Set(text, rest.substr(0, len))) return false;
    if (MatchFrom(tok + 1, rest.substr(len), b)) return true;
  }
  b->count = saved;
  return false;
}

bool NamePattern::Match(std::string_view name, PatternBindings* b) const {
  return MatchFrom(0, name, b);
}

bool NamePattern::Expand(const PatternBindings& b, std::string* out) const {
  out->clear();
  for (const Token& t : tokens_) {
    if (!t.is_var) {
      out->append(View(t));
      continue;
    }
    const std::string_view* v = b.Find(View(t));
    if (!v) return false;
    out->append(*v);
  }
  return true;
}

}  // namespace wsync
