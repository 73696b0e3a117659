#include "routing/dtype.h"

namespace wsync {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kBF16: return "bf16";
    case DType::kFP16: return "fp16";
    case DType::kFP32: return "fp32";
    case DType::kFP8E4M3: return "fp8_e4m3";
  }
  return "?";
}

std::optional<DType> ParseDType(std::string_view s) {
  if (s == "bf16" || s == "bfloat16" || s == "torch.bfloat16") return DType::kBF16;
  if (s == "fp16" || s == "float16" || s == "torch.float16") return DType::kFP16;
  if (s == "fp32" || s == "float32" || s == "torch.float32") return DType::kFP32;
  if (s == "fp8_e4m3" || s == "float8_e4m3fn" || s == "torch.float8_e4m3fn") return DType::kFP8E4M3;
  return std::nullopt;
}

}  // namespace wsync
