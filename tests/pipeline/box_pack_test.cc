// Box cutting for the pack stage: which boxes are written straight from the
// buffer they are cut from (ContiguousIn), and the pitched-copy shape the
// GPU pack takes (AsPitchedRuns), against a plain element-by-element index
// walk of random boxes in random held tensors.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "pipeline/box_pack.h"

namespace wsync {
namespace {

// Row-major element indices of `box` inside `held`, by the definition.
std::vector<int64_t> Indices(const Box& box, const Box& held) {
  std::vector<int64_t> out;
  const int n = box.ndim;
  std::vector<int64_t> at(n, 0);
  if (box.NumElements() == 0) return out;
  while (true) {
    int64_t index = 0;
    for (int d = 0; d < n; ++d) index = index * held.size[d] + (box.offset[d] - held.offset[d] + at[d]);
    out.push_back(index);
    int d = n - 1;
    for (; d >= 0; --d) {
      if (++at[d] < box.size[d]) break;
      at[d] = 0;
    }
    if (d < 0) return out;
  }
}

TEST(BoxPackTest, RowShardsOfAMatrixAreOneRunAndColumnShardsAreNot) {
  const Box held{2, {0, 0}, {8, 6}};
  int64_t first = -1;
  EXPECT_TRUE(ContiguousIn(Box{2, {4, 0}, {4, 6}}, held, &first));
  EXPECT_EQ(first, 24);
  EXPECT_TRUE(ContiguousIn(Box{2, {3, 2}, {1, 3}}, held, &first));  // part of one row
  EXPECT_EQ(first, 20);
  EXPECT_FALSE(ContiguousIn(Box{2, {0, 3}, {8, 3}}, held, &first));
  EXPECT_FALSE(ContiguousIn(Box{2, {0, 0}, {0, 6}}, held, &first));  // empty
  // A held box that does not start at the origin (an expert range).
  EXPECT_TRUE(ContiguousIn(Box{3, {5, 0, 0}, {2, 4, 4}}, Box{3, {4, 0, 0}, {4, 4, 4}}, &first));
  EXPECT_EQ(first, 16);
}

TEST(BoxPackTest, PitchedRunsOfAColumnShardAreItsRows) {
  PitchedRuns r;
  ASSERT_TRUE(AsPitchedRuns(Box{2, {0, 2048}, {4096, 2048}}, Box{2, {0, 0}, {4096, 4096}}, &r));
  EXPECT_EQ(r.first, 2048);
  EXPECT_EQ(r.run, 2048);
  EXPECT_EQ(r.rows, 4096);
  EXPECT_EQ(r.pitch, 4096);
  EXPECT_EQ(r.planes, 1);
  // Stacked experts cut in their last dim: the expert and row dims merge.
  ASSERT_TRUE(AsPitchedRuns(Box{3, {0, 0, 64}, {8, 32, 64}}, Box{3, {0, 0, 0}, {8, 32, 128}}, &r));
  EXPECT_EQ(r.run, 64);
  EXPECT_EQ(r.rows, 8 * 32);
  EXPECT_EQ(r.planes, 1);
}

TEST(BoxPackTest, RandomBoxesMatchTheIndexWalk) {
  std::mt19937 rng(20261202);
  int contiguous = 0, pitched = 0, refused = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 4);
    Box held, box;
    held.ndim = box.ndim = static_cast<int8_t>(n);
    for (int d = 0; d < n; ++d) {
      held.offset[d] = rng() % 3;
      held.size[d] = 1 + rng() % 5;
      const int64_t lo = rng() % held.size[d];
      // Whole dims often, so contiguous and pitched boxes both come up.
      box.size[d] = rng() % 2 ? held.size[d] - lo : rng() % (held.size[d] - lo + 1);
      box.offset[d] = held.offset[d] + lo;
      if (box.size[d] == held.size[d] - lo && rng() % 2) {
        box.offset[d] = held.offset[d];
        box.size[d] = held.size[d];
      }
    }
    const std::vector<int64_t> want = Indices(box, held);

    // PackBox of element indices (stored as fp32 values) gives the walk.
    std::vector<float> data(static_cast<size_t>(held.NumElements()));
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
    std::vector<float> packed(want.size());
    PackBox(reinterpret_cast<const uint8_t*>(data.data()), held, DType::kFP32, box, DType::kFP32,
            reinterpret_cast<uint8_t*>(packed.data()));
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(packed[i], static_cast<float>(want[i])) << "trial " << trial;

    bool consecutive = !want.empty();
    for (size_t i = 1; i < want.size(); ++i) consecutive = consecutive && want[i] == want[i - 1] + 1;
    int64_t first = -1;
    ASSERT_EQ(ContiguousIn(box, held, &first), consecutive) << "trial " << trial;
    if (consecutive) {
      EXPECT_EQ(first, want[0]);
      ++contiguous;
    }

    PitchedRuns r;
    if (!AsPitchedRuns(box, held, &r)) {
      EXPECT_TRUE(want.empty() || n >= 3) << "trial " << trial << ": only a box cut in 3+ dims is refused";
      ++refused;
      continue;
    }
    std::vector<int64_t> got;
    for (int64_t p = 0; p < r.planes; ++p) {
      for (int64_t row = 0; row < r.rows; ++row) {
        for (int64_t e = 0; e < r.run; ++e) got.push_back(r.first + p * r.plane_pitch + row * r.pitch + e);
      }
    }
    ASSERT_EQ(got, want) << "trial " << trial;
    ++pitched;
  }
  // The generator reaches every kind.
  EXPECT_GT(contiguous, 100);
  EXPECT_GT(pitched, 1000);
  EXPECT_GT(refused, 10);
}

}  // namespace
}  // namespace wsync
