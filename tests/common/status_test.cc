#include "common/status.h"

#include <gtest/gtest.h>

namespace wsync {
namespace {

StatusOr<int> ParsePositive(int x) {
  if (x <= 0) return InvalidArgument("x must be positive, got " + std::to_string(x));
  return x;
}

Status UsesMacros(int x, int* out) {
  WSYNC_ASSIGN_OR_RETURN(int v, ParsePositive(x));
  *out = v * 2;
  return Status::Ok();
}

TEST(StatusTest, ErrorCarriesCodeAndContext) {
  Status s = NotFound("tensor 'w' unknown").WithContext("inference.json: rank 1");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "NOT_FOUND: inference.json: rank 1: tensor 'w' unknown");
}

TEST(StatusTest, MacrosPropagateAndSetOutputOnlyOnSuccess) {
  int out = -1;
  EXPECT_TRUE(UsesMacros(4, &out).ok());
  EXPECT_EQ(out, 8);
  out = -1;
  Status s = UsesMacros(-3, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out, -1);
}

}  // namespace
}  // namespace wsync
