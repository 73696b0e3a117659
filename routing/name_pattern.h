// Tensor-name patterns of the mapping rules: "model.layers.{L}.mlp.{E}.w1".
//
// `{*}` matches any non-empty text; every other `{Name}` (L = layer, E =
// expert, ...) matches a decimal number. Matching binds the placeholders,
// expanding substitutes them. Used by validate (syntax) and mapping (rules).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace wsync {

// Placeholder values bound by a match (or set by the caller, e.g. {E}).
// Views point into the pattern (names) and the matched name (values).
struct PatternBindings {
  static constexpr int kMax = 8;
  int count = 0;
  std::array<std::string_view, kMax> names{};
  std::array<std::string_view, kMax> values{};

  const std::string_view* Find(std::string_view name) const;
  bool Set(std::string_view name, std::string_view value);  // false if full
};

class NamePattern {
 public:
  // Error message (no prefix) on bad syntax: unbalanced braces, empty or
  // non-alphanumeric placeholder names, two placeholders back to back.
  static StatusOr<NamePattern> Compile(std::string text);

  const std::string& text() const { return text_; }
  bool HasPlaceholder(std::string_view name) const;
  // Distinct placeholder names, in order of first use.
  std::vector<std::string> placeholders() const;
  bool is_literal() const { return tokens_.size() <= 1 && (tokens_.empty() || !tokens_[0].is_var); }

  // True if `name` matches; the bindings are added to `b`.
  bool Match(std::string_view name, PatternBindings* b) const;
  // Substitutes every placeholder from `b`; false if one is unbound.
  bool Expand(const PatternBindings& b, std::string* out) const;

 private:
  struct Token {
    bool is_var = false;
    bool star = false;
    uint32_t pos = 0;  // literal text or placeholder name, as a range of text_
    uint32_t len = 0;
  };
  // Views are made on use: text_ may move (small-string storage) with *this.
  std::string_view View(const Token& t) const { return std::string_view(text_).substr(t.pos, t.len); }
  bool MatchFrom(size_t tok, std::string_view rest, PatternBindings* b) const;

  std::string text_;
  std::vector<Token> tokens_;
};

}  // namespace wsync
