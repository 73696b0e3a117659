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

// The tree of common/checksum.h, written out plainly: XXH64 of each 4 KiB
// leaf, the hashes as little-endian bytes, again until one leaf is left.
uint64_t TreeByHand(const uint8_t* p, size_t n) {
  if (n <= 4096) return Xxh64(p, n);
  std::vector<uint8_t> up;
  for (size_t at = 0; at < n; at += 4096) {
    const uint64_t h = Xxh64(p + at, std::min<size_t>(4096, n - at));
    for (int b = 0; b < 8; ++b) up.push_back(static_cast<uint8_t>(h >> (8 * b)));
  }
  return TreeByHand(up.data(), up.size());
}

// Past one leaf the hash is the tree's (one, two and three levels above the
// leaves), the same whole or in pieces of any size; up to one leaf it is
// plain XXH64, as above.
TEST(ChecksumTest, PastOneLeafItIsTheTreeOfLeafHashes) {
  std::vector<uint8_t> data((5u << 20) + 3);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  EXPECT_EQ(Checksum64(data.data(), 1000), Xxh64(data.data(), 1000));
  EXPECT_EQ(Checksum64(data.data(), 4096), Xxh64(data.data(), 4096));
  for (size_t n : {size_t{4097}, size_t{8192 + 5}, size_t{512 * 4096}, size_t{512 * 4096 + 1}, data.size()}) {
    const uint64_t want = TreeByHand(data.data(), n);
    EXPECT_EQ(Checksum64(data.data(), n), want) << n << " bytes";
    EXPECT_NE(want, Xxh64(data.data(), n)) << n << " bytes";
    for (size_t piece : {size_t{1000}, size_t{4096}, size_t{4097}, size_t{(1u << 20) + 7}}) {
      Checksum64Stream s;
      for (size_t at = 0; at < n; at += piece) s.Update(data.data() + at, std::min(piece, n - at));
      EXPECT_EQ(s.Final(), want) << n << " bytes in pieces of " << piece;
    }
  }
  const uint64_t whole = Checksum64(data.data(), data.size());
  for (size_t at : {size_t{0}, size_t{4095}, size_t{4096}, size_t{3u << 20}, data.size() - 1}) {
    data[at] ^= 0x20;
    EXPECT_NE(Checksum64(data.data(), data.size()), whole) << "byte " << at << " flipped";
    data[at] ^= 0x20;
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
