#include "routing/dtype.h"

#include <gtest/gtest.h>

namespace wsync {
namespace {

TEST(DTypeTest, SchemaAndTorchSpellingsRoundTrip) {
  for (DType t : {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP8E4M3}) {
    auto parsed = ParseDType(DTypeName(t));
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_EQ(ParseDType("float8_e4m3fn"), DType::kFP8E4M3);
  EXPECT_EQ(ParseDType("bfloat16"), DType::kBF16);
  EXPECT_FALSE(ParseDType("int4").has_value());
  EXPECT_EQ(DTypeSize(DType::kFP8E4M3), 1);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2);
}

}  // namespace
}  // namespace wsync
