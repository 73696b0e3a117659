// Element types wsync moves, with their byte sizes and schema spellings.
// Used by the metadata model, the planner and (later) the quantize stage.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace wsync {

enum class DType : uint8_t { kBF16, kFP16, kFP32, kFP8E4M3 };

// Bytes per element.
constexpr int64_t DTypeSize(DType t) {
  switch (t) {
    case DType::kBF16: return 2;
    case DType::kFP16: return 2;
    case DType::kFP32: return 4;
    case DType::kFP8E4M3: return 1;
  }
  return 0;
}

// Schema spelling: "bf16", "fp16", "fp32", "fp8_e4m3".
std::string_view DTypeName(DType t);
// Accepts the schema spellings and torch's ("bfloat16", "float8_e4m3fn", ...).
std::optional<DType> ParseDType(std::string_view s);

}  // namespace wsync
