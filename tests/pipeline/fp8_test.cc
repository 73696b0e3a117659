// Pins the fp8 reference kernels against brute-force paths written from the
// format's definition (OCP float8_e4m3fn), not from pipeline/fp8.cc: the GPU
// kernel will be checked against these functions, so they must be right.
#include "pipeline/fp8.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <vector>

namespace wsync {
namespace {

// e4m3fn value of a code, straight from the definition, in double.
double RefDecode(uint8_t code) {
  const int s = code >> 7, e = (code >> 3) & 0xF, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? m * std::pow(2.0, -9) : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
  return s ? -mag : mag;
}

// Nearest code by exhaustive search over all finite codes of the input's
// sign; ties go to the even code; beyond 448 saturates; NaN is 0x7F.
uint8_t RefEncode(float f) {
  if (std::isnan(f)) return 0x7F;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const double a = std::fabs(static_cast<double>(f));
  if (a > 448.0) return sign | 0x7E;
  int best = 0;
  double best_dist = std::numeric_limits<double>::infinity();
  for (int code = 0; code <= 0x7E; ++code) {
    const double d = std::fabs(a - RefDecode(static_cast<uint8_t>(code)));
    if (d < best_dist || (d == best_dist && (code & 1) == 0)) {
      best = code;
      best_dist = d;
    }
  }
  return sign | static_cast<uint8_t>(best);
}

// Nearest bf16 by comparing the two bf16 neighbours of x; ties to even.
uint16_t RefBf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint16_t lo = static_cast<uint16_t>(bits >> 16);  // truncation: toward zero
  const uint16_t hi = static_cast<uint16_t>(lo + 1);      // next away from zero
  const double dl = std::fabs(static_cast<double>(x)) -
                    std::fabs(static_cast<double>(std::bit_cast<float>(uint32_t{lo} << 16)));
  // Rounding up past the largest finite bf16 goes to infinity, which sits
  // where the next binade would start: 2^128.
  const double hi_mag = (hi & 0x7FFF) == 0x7F80
                            ? std::ldexp(1.0, 128)
                            : std::fabs(static_cast<double>(std::bit_cast<float>(uint32_t{hi} << 16)));
  const double dh = hi_mag - std::fabs(static_cast<double>(x));
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

float FromBits(uint32_t b) { return std::bit_cast<float>(b); }

TEST(E4M3Test, DecodeMatchesDefinitionForAll256Codes) {
  for (int code = 0; code < 256; ++code) {
    const double want = RefDecode(static_cast<uint8_t>(code));
    const float got = E4M3ToFp32(static_cast<uint8_t>(code));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << code;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << "code " << code;
      EXPECT_EQ(std::signbit(got), (code & 0x80) != 0) << "code " << code;
    }
  }
  EXPECT_EQ(E4M3ToFp32(0x7E), 448.0f);
  EXPECT_EQ(E4M3ToFp32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(E4M3ToFp32(0x08), std::ldexp(1.0f, -6));
}

TEST(E4M3Test, EncodeRoundTripsEveryFiniteCode) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) continue;
    EXPECT_EQ(Fp32ToE4M3(E4M3ToFp32(static_cast<uint8_t>(code))), code);
  }
}

void ExpectEncodeMatches(float f) {
  ASSERT_EQ(Fp32ToE4M3(f), RefEncode(f))
      << "input " << f << " (bits 0x" << std::hex << std::bit_cast<uint32_t>(f) << ")";
}

TEST(E4M3Test, EncodeMatchesBruteForceAtTiesAndNeighbours) {
  // Every midpoint between adjacent codes (exact in fp32: 5 significant bits)
  // and the floats just around it and around each code.
  for (int code = 0; code < 0x7E; ++code) {
    const float lo = E4M3ToFp32(static_cast<uint8_t>(code));
    const float hi = E4M3ToFp32(static_cast<uint8_t>(code + 1));
    const float mid = (lo + hi) / 2;
    for (float v : {lo, hi, mid}) {
      for (float w : {v, std::nextafter(v, 0.0f), std::nextafter(v, 1e9f)}) {
        ExpectEncodeMatches(w);
        ExpectEncodeMatches(-w);
      }
    }
  }
  // Ties resolve to even: 2^-10 (between 0 and 2^-9) -> 0; 3*2^-10 -> 2*2^-9;
  // 17/16*2^... : 1.0625 sits between 1.0 (0x38) and 1.125 (0x39) -> 1.0.
  EXPECT_EQ(Fp32ToE4M3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(Fp32ToE4M3(3 * std::ldexp(1.0f, -10)), 0x02);
  EXPECT_EQ(Fp32ToE4M3(1.0625f), 0x38);
  EXPECT_EQ(Fp32ToE4M3(1.1875f), 0x3A);  // between 1.125 (0x39) and 1.25 (0x3A)
}

TEST(E4M3Test, EncodeSaturatesAndCanonicalizesNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {448.0f, 449.0f, 463.99f, 464.0f, 465.0f, 479.0f, 480.0f, 1e6f, 3e38f, inf}) {
    EXPECT_EQ(Fp32ToE4M3(v), 0x7E) << v;
    EXPECT_EQ(Fp32ToE4M3(-v), 0xFE) << v;
  }
  EXPECT_EQ(Fp32ToE4M3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(Fp32ToE4M3(-std::numeric_limits<float>::quiet_NaN()), 0x7F);  // as the GPU does
  EXPECT_EQ(Fp32ToE4M3(FromBits(0x7F800001u)), 0x7F);  // signalling NaN payload
  EXPECT_EQ(Fp32ToE4M3(0.0f), 0x00);
  EXPECT_EQ(Fp32ToE4M3(-0.0f), 0x80);
  EXPECT_EQ(Fp32ToE4M3(FromBits(1)), 0x00);             // fp32 subnormal
  EXPECT_EQ(Fp32ToE4M3(-FromBits(0x007FFFFFu)), 0x80);  // largest fp32 subnormal
}

TEST(E4M3Test, EncodeMatchesBruteForceOnAllBf16AndRandomFloats) {
  for (uint32_t b = 0; b < 0x10000; ++b) ExpectEncodeMatches(FromBits(b << 16));

  std::mt19937 rng(12345);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_real_distribution<float> in_range(-500.0f, 500.0f);
  // Magnitudes 2^-14 .. 2^9 with every mantissa pattern equally likely.
  std::uniform_int_distribution<uint32_t> exp_field(113, 136), mant(0, 0x7FFFFF);
  for (int i = 0; i < 300000; ++i) {
    ExpectEncodeMatches(FromBits(any_bits(rng)));
    ExpectEncodeMatches(in_range(rng));
    ExpectEncodeMatches(FromBits((any_bits(rng) & 0x80000000u) | (exp_field(rng) << 23) | mant(rng)));
  }
}

TEST(Bf16Test, ConversionsAreExactAndRoundToNearestEven) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = Bf16ToFp32(static_cast<uint16_t>(b));
    EXPECT_EQ(std::bit_cast<uint32_t>(f), b << 16);
    if (!std::isnan(f)) {
      EXPECT_EQ(Fp32ToBf16(f), b);
    }
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 1000000; ++i) {
    const float f = FromBits(any_bits(rng));
    if (std::isnan(f)) {
      EXPECT_EQ(Fp32ToBf16(f), 0x7FFF);
      continue;
    }
    ASSERT_EQ(Fp32ToBf16(f), RefBf16(f)) << f;
  }
  EXPECT_EQ(Fp32ToBf16(FromBits(0x3F808000u)), 0x3F80);  // tie, even stays
  EXPECT_EQ(Fp32ToBf16(FromBits(0x3F818000u)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(Fp32ToBf16(FromBits(0x7F7FFFFFu)), 0x7F80);  // overflows to inf
}

// A bf16 test tensor whose blocks cover the cases a weight can hit.
struct TestMatrix {
  int64_t rows, cols, stride;
  std::vector<uint16_t> data;
  Bf16MatrixView view() const { return {data.data(), rows, cols, stride}; }
  float at(int64_t r, int64_t c) const { return Bf16ToFp32(data[r * stride + c]); }
};

TestMatrix MakeTestMatrix(int64_t rows, int64_t cols, int64_t stride, uint32_t seed) {
  TestMatrix m{rows, cols, stride, std::vector<uint16_t>(rows * stride, 0x7FC0)};  // padding is NaN
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t block = (r / 128) * 7 + c / 128;
      float v = normal(rng);
      switch (block % 6) {
        case 0: break;
        case 1: v *= 1e-20f; break;           // tiny block: small scale_inv
        case 2: v = 0.0f; break;              // all-zero block
        case 3: v *= 3e4f; break;             // large values
        case 4: v = (r + c) % 3 ? -0.0f : std::ldexp(1.0f, -133) * (c % 5); break;  // bf16 subnormals
        case 5: v *= (c % 17 == 0) ? 1000.0f : 0.01f; break;  // outliers push others to fp8 subnormals
      }
      m.data[r * stride + c] = Fp32ToBf16(v);
    }
  }
  return m;
}

TEST(Fp8BlockTest, HandComputedBlock) {
  // amax 2 -> scale_inv 2/448; 1 -> 224 = 1.75*2^7 (0x76); -2 -> -448 (0xFE);
  // 0.5 -> 112 = 1.75*2^6 (0x6E); 0.01 -> 2.24, between 2.0 (0x40) and
  // 2.25 (0x41), nearer 2.25; -0 stays -0 (0x80).
  const std::vector<uint16_t> x = {Fp32ToBf16(1.0f), Fp32ToBf16(-2.0f), Fp32ToBf16(0.5f),
                                   Fp32ToBf16(0.01f), Fp32ToBf16(-0.0f), 0};
  auto q = QuantizeFp8Blocks({x.data(), 2, 3, 3});
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->q, (std::vector<uint8_t>{0x76, 0xFE, 0x6E, 0x41, 0x80, 0x00}));
  EXPECT_EQ(q->scale_inv, std::vector<float>{2.0f / 448.0f});

  const std::vector<uint16_t> zeros(6, 0);
  auto z = QuantizeFp8Blocks({zeros.data(), 2, 3, 3});
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(z->scale_inv, std::vector<float>{1.0f});  // all-zero block convention
  EXPECT_EQ(z->q, std::vector<uint8_t>(6, 0x00));
}

TEST(Fp8BlockTest, MatchesPerElementBruteForce) {
  const TestMatrix m = MakeTestMatrix(300, 700, 713, 1);
  auto q = QuantizeFp8Blocks(m.view());
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  ASSERT_EQ(q->scale_inv.size(), 3u * 6u);

  // amax per block by a map keyed on block coordinates.
  std::map<std::pair<int64_t, int64_t>, double> amax;
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t c = 0; c < m.cols; ++c) {
      double& a = amax[{r / 128, c / 128}];
      a = std::max(a, std::fabs(static_cast<double>(m.at(r, c))));
    }
  for (const auto& [block, a] : amax) {
    const float want = a == 0.0 ? 1.0f : static_cast<float>(a) / 448.0f;
    EXPECT_EQ(q->scale_inv[block.first * 6 + block.second], want)
        << "block " << block.first << "," << block.second;
  }
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) {
      const double a = amax[{r / 128, c / 128}];
      const float s = a == 0.0 ? 1.0f : static_cast<float>(a) / 448.0f;
      const uint8_t want = RefEncode(m.at(r, c) / s);
      ASSERT_EQ(q->q[r * m.cols + c], want) << "element " << r << "," << c;
      // The block's largest magnitude uses the full range.
      if (a > 0 && std::fabs(m.at(r, c)) == a) {
        ASSERT_EQ(q->q[r * m.cols + c] & 0x7F, 0x7E);
      }
    }
  }
}

// Every finite bf16 value under block scales from tiny to huge: each block
// is one cap (its amax) and then every value no larger, so the vectorized
// encode meets every quotient range a real block can produce.
TEST(Fp8BlockTest, EveryFiniteBf16UnderManyScalesMatchesBruteForce) {
  for (float cap_f : {1e-30f, 3e-7f, 1.0f / 448.0f, 0.02f, 1.0f, 3.5f, 448.0f, 7e4f, 3e38f}) {
    const uint16_t cap = Fp32ToBf16(cap_f);
    const float a = Bf16ToFp32(cap);
    // Block rows of 128 x 128: the cap opens every block, then the values.
    std::vector<uint16_t> values;
    for (uint32_t b = 0; b < 0x10000; ++b) {
      const auto bits = static_cast<uint16_t>(b);
      if ((bits & 0x7F80u) == 0x7F80u || std::fabs(Bf16ToFp32(bits)) > a) continue;
      if (values.size() % (128 * 128) == 0) values.push_back(cap);
      values.push_back(bits);
    }
    values.resize((values.size() + 128 * 128 - 1) / (128 * 128) * (128 * 128), 0);
    const int64_t rows = static_cast<int64_t>(values.size()) / 128;
    auto q = QuantizeFp8Blocks({values.data(), rows, 128, 128});
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    const float s = a / 448.0f;
    for (float got : q->scale_inv) ASSERT_EQ(got, s) << "cap " << cap_f;
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(q->q[i], RefEncode(Bf16ToFp32(values[i]) / s))
          << "cap " << cap_f << ", bf16 0x" << std::hex << values[i];
    }
  }
}

TEST(Fp8BlockTest, DequantizedErrorIsWithinHalfAnFp8Step) {
  const TestMatrix m = MakeTestMatrix(257, 385, 385, 2);
  auto q = QuantizeFp8Blocks(m.view());
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  const std::vector<float> deq = DequantizeFp8Blocks(*q);
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) {
      const double x = m.at(r, c);
      const double s = q->scale_inv[(r / 128) * 4 + c / 128];
      // Half a step of 3 mantissa bits (2^-4 relative), or half the smallest
      // subnormal step (2^-10 * s); fp32 rounding of x/s and q*s adds ~2^-23.
      const double bound = (std::fabs(x) * 0x1p-4 + s * 0x1p-10) * (1 + 0x1p-20);
      ASSERT_LE(std::fabs(x - deq[r * m.cols + c]), bound) << "element " << r << "," << c;
    }
  }
}

TEST(Fp8BlockTest, BoxEqualsTheSliceOfTheWholeTensor) {
  const TestMatrix m = MakeTestMatrix(300, 700, 700, 3);
  auto whole = QuantizeFp8Blocks(m.view());
  ASSERT_TRUE(whole.ok());
  const int64_t grid_cols = 6;
  for (MatrixBox box : {MatrixBox{0, 300, 0, 700}, MatrixBox{128, 256, 0, 128},
                        MatrixBox{256, 300, 512, 700}, MatrixBox{0, 256, 128, 640},
                        MatrixBox{128, 128, 0, 700}}) {
    const int64_t rows = box.row_end - box.row_begin, cols = box.col_end - box.col_begin;
    const int64_t q_stride = cols + 5, s_stride = Fp8BlockCount(cols) + 2;
    std::vector<uint8_t> qbuf(std::max<int64_t>(rows, 1) * q_stride, 0xAB);
    std::vector<float> sbuf(std::max<int64_t>(Fp8BlockCount(rows), 1) * s_stride, -1.0f);
    ASSERT_TRUE(QuantizeFp8BlocksInBox(m.view(), box, qbuf.data(), q_stride, sbuf.data(), s_stride)
                    .ok());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(qbuf[r * q_stride + c], whole->q[(box.row_begin + r) * m.cols + box.col_begin + c]);
      }
      for (int64_t c = cols; c < q_stride; ++c) ASSERT_EQ(qbuf[r * q_stride + c], 0xAB);  // stride gap untouched
    }
    for (int64_t br = 0; br < Fp8BlockCount(rows); ++br) {
      for (int64_t bc = 0; bc < Fp8BlockCount(cols); ++bc) {
        EXPECT_EQ(sbuf[br * s_stride + bc],
                  whole->scale_inv[(box.row_begin / 128 + br) * grid_cols + box.col_begin / 128 + bc]);
      }
    }
  }
}

TEST(Fp8BlockTest, RejectsBoxesThatCutBlocksAndWritesNothing) {
  const TestMatrix m = MakeTestMatrix(300, 700, 700, 4);
  std::vector<uint8_t> qbuf(300 * 700, 0xAB);
  std::vector<float> sbuf(3 * 6, -1.0f);
  for (MatrixBox box : {MatrixBox{64, 128, 0, 128}, MatrixBox{0, 200, 0, 128},
                        MatrixBox{0, 128, 100, 256}, MatrixBox{0, 128, 0, 650}}) {
    Status s = QuantizeFp8BlocksInBox(m.view(), box, qbuf.data(), 700, sbuf.data(), 6);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("cuts a 128x128 block"), std::string::npos) << s.message();
  }
  Status s = QuantizeFp8BlocksInBox(m.view(), {0, 384, 0, 128}, qbuf.data(), 700, sbuf.data(), 6);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s.ToString();
  for (uint8_t b : qbuf) ASSERT_EQ(b, 0xAB);
  for (float f : sbuf) ASSERT_EQ(f, -1.0f);
}

TEST(Fp8BlockTest, RejectsNonFiniteInputNamingTheElementAndWritesNothing) {
  TestMatrix m = MakeTestMatrix(200, 200, 200, 5);
  m.data[150 * 200 + 7] = 0x7F80;  // +inf
  std::vector<uint8_t> qbuf(200 * 200, 0xAB);
  std::vector<float> sbuf(4, -1.0f);
  Status s = QuantizeFp8BlocksInBox(m.view(), {0, 200, 0, 200}, qbuf.data(), 200, sbuf.data(), 2);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("element [150, 7] is infinite"), std::string::npos) << s.message();
  for (uint8_t b : qbuf) ASSERT_EQ(b, 0xAB);
  for (float f : sbuf) ASSERT_EQ(f, -1.0f);
  // The same tensor quantizes fine where the box avoids the bad block.
  EXPECT_TRUE(QuantizeFp8BlocksInBox(m.view(), {0, 128, 0, 200}, qbuf.data(), 200, sbuf.data(), 2)
                  .ok());
  m.data[150 * 200 + 7] = 0xFFC1;  // -NaN
  EXPECT_NE(QuantizeFp8Blocks(m.view()).status().message().find("is NaN"), std::string::npos);
}

}  // namespace
}  // namespace wsync
