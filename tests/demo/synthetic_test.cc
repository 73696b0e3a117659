// The demo's synthetic weights: the fast box filler the fake trainer uses
// gives, element for element, the values of the definition (written out
// here again the plain way, as the generator was before it was made fast),
// and the reference's per-group path gives every rank what its one-rank
// path gives.
#include <gtest/gtest.h>

#include <cstring>

#include "demo/reference.h"
#include "demo/synthetic.h"
#include "models/generate.h"
#include "pipeline/fp8.h"

namespace wsync::demo {
namespace {

// The generator as first written: SplitMix64 of (name, flat index, version),
// scaled per row, rounded with the pipeline's bf16 conversion.
uint16_t Definition(std::string_view name, uint64_t flat, int64_t row, uint64_t version) {
  uint64_t h = 1469598103934665603ull;
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  uint64_t x = h ^ (flat * 0xD1B54A32D192ED03ull) ^ (version * 0x8CB92BA72F3D8DD7ull);
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  const float unit = static_cast<float>(x >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
  const float scales[5] = {0.25f, 0.5f, 1.0f, 2.0f, 4.0f};
  return Fp32ToBf16(unit * scales[row % 5] * 0.05f);
}

Box MakeBox(const Shape& offset, const Shape& size) {
  Box b;
  b.ndim = static_cast<int8_t>(size.size());
  for (size_t d = 0; d < size.size(); ++d) {
    b.offset[d] = offset[d];
    b.size[d] = size[d];
  }
  return b;
}

TEST(Synthetic, BoxFillMatchesTheDefinitionElementByElement) {
  struct Case {
    Shape global, offset, size;
  };
  const Case cases[] = {
      {{1000}, {0}, {1000}},
      {{1000}, {337}, {101}},
      {{37, 129}, {0, 0}, {37, 129}},
      {{37, 129}, {5, 64}, {19, 65}},
      {{6, 40, 24}, {2, 8, 0}, {3, 17, 24}},
      {{6, 40, 24}, {0, 13, 7}, {6, 1, 9}},
      {{2, 3, 10, 16}, {1, 1, 3, 5}, {1, 2, 6, 11}},
  };
  for (const Case& c : cases) {
    const Box box = MakeBox(c.offset, c.size);
    std::vector<uint16_t> got(static_cast<size_t>(box.NumElements()));
    for (uint64_t version : {1ull, 7ull}) {
      FillSyntheticBox("layers.3.w", c.global, box, version, got.data());
      // Walk the box by a plain multi-index; flat index and row from it.
      const size_t n = c.global.size();
      std::vector<int64_t> idx(n, 0);
      for (size_t k = 0; k < got.size(); ++k) {
        uint64_t flat = 0;
        for (size_t d = 0; d < n; ++d) flat = flat * c.global[d] + (c.offset[d] + idx[d]);
        const int64_t row = n >= 2 ? c.offset[n - 2] + idx[n - 2] : 0;
        ASSERT_EQ(got[k], Definition("layers.3.w", flat, row, version)) << "element " << k;
        ASSERT_EQ(SyntheticBf16(NameHash("layers.3.w"), flat, row, version), got[k]);
        for (size_t d = n; d-- > 0;) {
          if (++idx[d] < c.size[d]) break;
          idx[d] = 0;
        }
      }
    }
  }
}

TEST(Synthetic, VersionsAndNamesGiveDifferentWeights) {
  const Shape shape = {64, 64};
  EXPECT_NE(SyntheticTensor("a", shape, 1), SyntheticTensor("a", shape, 2));
  EXPECT_NE(SyntheticTensor("a", shape, 1), SyntheticTensor("b", shape, 1));
}

TEST(Reference, OneCopyCutForEveryRankEqualsEachRanksOwnReference) {
  StatusOr<GeneratedSpecs> specs =
      GenerateFromClusterFile(std::string(WSYNC_SOURCE_DIR) + "/examples/small-moe-fp8-4x2/cluster.json");
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  const Reference reference(specs->trainer, specs->mapping);
  ASSERT_EQ(specs->inference.ranks.size(), 2u);
  const InferenceRank& r0 = specs->inference.ranks[0];
  const InferenceRank& r1 = specs->inference.ranks[1];
  ASSERT_EQ(r0.tensors.size(), r1.tensors.size());
  for (size_t i = 0; i < r0.tensors.size(); ++i) {
    const InferenceTensor& a = r0.tensors[i];
    const InferenceTensor& b = r1.tensors[i];
    ASSERT_EQ(a.name, b.name);
    StatusOr<std::vector<ExpectedTensor>> both = reference.ExpectedOnRanks({&a, &b}, 3);
    ASSERT_TRUE(both.ok()) << both.status().ToString();
    StatusOr<ExpectedTensor> alone_a = reference.Expected(a, 3);
    StatusOr<ExpectedTensor> alone_b = reference.Expected(b, 3);
    ASSERT_TRUE(alone_a.ok() && alone_b.ok()) << a.name;
    EXPECT_EQ((*both)[0].weight, alone_a->weight) << a.name;
    EXPECT_EQ((*both)[0].scale, alone_a->scale) << a.name;
    EXPECT_EQ((*both)[1].weight, alone_b->weight) << b.name;
    EXPECT_EQ((*both)[1].scale, alone_b->scale) << b.name;
  }
  // Two different engine tensors are never cut from one copy.
  ASSERT_GE(r0.tensors.size(), 2u);
  EXPECT_FALSE(reference.ExpectedOnRanks({&r0.tensors[0], &r1.tensors[1]}, 3).ok());
}

}  // namespace
}  // namespace wsync::demo
