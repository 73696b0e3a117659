#include "common/checksum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace wsync {
namespace {

// Known answers from the reference implementation (Python's xxhash 3.x,
// xxh64 with seed 0) over bytes (i * 131 + 7) mod 256: every tail path
// (0-3 single bytes, one 4-byte word, 8-byte words) and the 32-byte stripes.
TEST(ChecksumTest, MatchesTheReferenceXxh64) {
  std::vector<uint8_t> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 131 + 7);
  const std::pair<size_t, uint64_t> known[] = {
      {0, 0xef46db3751d8e999ull},  {1, 0xa96c7f0ce858bbb7ull},  {3, 0xbed43740ee6332bbull},
      {4, 0xfa212ae44b3bb23dull},  {7, 0x2744460dd675d2c0ull},  {8, 0x994b676b71ce94ddull},
      {31, 0x6711d55e306b5d8full}, {32, 0x07f7b8e3bc5d6e25ull}, {33, 0x09f85eeb4e1cbe9full},
      {100, 0x9ddada11d3dc2d8full}, {1000, 0x0bf0bdbcc82eb373ull}};
  for (const auto& [n, want] : known) EXPECT_EQ(Checksum64(data.data(), n), want) << n << " bytes";
  EXPECT_EQ(Checksum64("abc", 3), 0x44bc2cf5ad770999ull);
}

// Pieces of every size, split anywhere, hash as the whole.
TEST(ChecksumTest, AStreamInPiecesEqualsTheWhole) {
  std::vector<uint8_t> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 131 + 7);
  EXPECT_EQ(Checksum64Stream().Final(), 0xef46db3751d8e999ull);
  for (size_t piece : {size_t{1}, size_t{5}, size_t{31}, size_t{32}, size_t{33}, size_t{333}}) {
    Checksum64Stream s;
    for (size_t at = 0; at < data.size(); at += piece) s.Update(data.data() + at, std::min(piece, data.size() - at));
    EXPECT_EQ(s.Final(), 0x0bf0bdbcc82eb373ull) << "pieces of " << piece;
  }
}

TEST(ChecksumTest, OneFlippedBitChangesIt) {
  std::vector<uint8_t> data(4096, 0x5A);
  const uint64_t h = Checksum64(data.data(), data.size());
  for (size_t at : {size_t{0}, size_t{31}, size_t{2048}, size_t{4095}}) {
    data[at] ^= 1;
    EXPECT_NE(Checksum64(data.data(), data.size()), h) << at;
    data[at] ^= 1;
  }
}

TEST(ChecksumTest, TextRoundTripsAndRefusesAnythingElse) {
  EXPECT_EQ(ChecksumText(0x07f7b8e3bc5d6e25ull), "07f7b8e3bc5d6e25");
  EXPECT_EQ(ParseChecksumText("07f7b8e3bc5d6e25"), 0x07f7b8e3bc5d6e25ull);
  EXPECT_FALSE(ParseChecksumText("7f7b8e3bc5d6e25").has_value());
  EXPECT_FALSE(ParseChecksumText("07F7B8E3BC5D6E25").has_value());
  EXPECT_FALSE(ParseChecksumText("07f7b8e3bc5d6e2g").has_value());
}

}  // namespace
}  // namespace wsync
