// DTensor/FSDP2 shard arithmetic against torch.chunk written out by hand.
#include "routing/chunking.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tests/routing/test_specs.h"

namespace wsync {
namespace {

TEST(ChunkingTest, MatchesTorchChunkIncludingEmptyTrailingPieces) {
  for (int64_t n = 0; n <= 40; ++n) {
    for (int64_t k = 1; k <= 9; ++k) {
      auto want = testing::TorchChunks(n, k);
      for (int64_t i = 0; i < k; ++i) {
        const Range r = ChunkRange(n, k, i);
        EXPECT_EQ(r.size, want[i].second) << "n=" << n << " k=" << k << " i=" << i;
        if (r.size > 0) {
          EXPECT_EQ(r.offset, want[i].first) << "n=" << n << " k=" << k << " i=" << i;
        }
      }
    }
  }
}

TEST(ChunkingTest, FiveRowsOverFourRanksLeavesTheLastEmpty) {
  // torch.chunk(5 rows, 4) -> 2, 2, 1, 0: FSDP2 gives rank 3 an empty shard.
  EXPECT_EQ(ChunkRange(5, 4, 0), (Range{0, 2}));
  EXPECT_EQ(ChunkRange(5, 4, 2), (Range{4, 1}));
  EXPECT_EQ(ChunkRange(5, 4, 3).size, 0);
}

TEST(ChunkingTest, NestedShardsOnOneDimApplyMeshDimsInOrder) {
  // Mesh [2, 3], both Shard(0) on 10 rows: first 5/5, then each 5 -> 2, 2, 1.
  std::vector<Range> out;
  LocalShard({10, 4}, {2, 3}, {1, 2}, {Placement::Shard(0), Placement::Shard(0)}, &out);
  EXPECT_EQ(out[0], (Range{9, 1}));
  EXPECT_EQ(out[1], (Range{0, 4}));
}

TEST(ChunkingTest, HeldAfterGatheringFsdpKeepsTheEpSlice) {
  // Experts mesh [fsdp 2, ep 2], placements [Shard(1), Shard(0)] on [8, 6]:
  // after gathering fsdp, rank (f, e) holds experts chunk e, all columns.
  std::vector<Range> out;
  int bad = -1;
  ASSERT_TRUE(HeldShard({8, 6}, {2, 2}, {1, 1}, {Placement::Shard(1), Placement::Shard(0)},
                        {true, false}, &out, &bad));
  EXPECT_EQ(out[0], (Range{4, 4}));
  EXPECT_EQ(out[1], (Range{0, 6}));
}

TEST(ChunkingTest, GatheringAnOuterShardInsideAnInnerOneIsNotABox) {
  // [Shard(0) gathered, Shard(0) kept] on 8 rows: rank (*, 0) holds rows
  // {0,1} and {4,5}: not contiguous, so it cannot be described by a box.
  std::vector<Range> out;
  int bad = -1;
  EXPECT_FALSE(HeldShard({8}, {2, 2}, {0, 0}, {Placement::Shard(0), Placement::Shard(0)},
                         {true, false}, &out, &bad));
  EXPECT_EQ(bad, 0);
}

// HeldShard against the union of every gathered rank's own shard, taken
// row by row, over meshes of up to three dims all sharding one tensor dim
// (sizes that leave empty and uneven chunks), every gathered subset and
// every coordinate.
TEST(ChunkingTest, HeldShardIsTheUnionOfTheGatheredShards) {
  for (const Shape& mesh : {Shape{3}, Shape{2, 3}, Shape{3, 2}, Shape{2, 2, 3}}) {
    const size_t dims = mesh.size();
    const std::vector<Placement> placements(dims, Placement::Shard(0));
    int64_t ranks = 1;
    for (int64_t m : mesh) ranks *= m;
    for (int64_t n : {0, 1, 5, 7, 12, 13}) {
      for (unsigned subset = 0; subset < (1u << dims); ++subset) {
        std::vector<bool> gathered(dims);
        for (size_t m = 0; m < dims; ++m) gathered[m] = (subset >> m) & 1;
        for (int64_t linear = 0; linear < ranks; ++linear) {
          std::vector<int64_t> coord(dims);
          for (int64_t m = static_cast<int64_t>(dims) - 1, rest = linear; m >= 0; --m) {
            coord[m] = rest % mesh[m];
            rest /= mesh[m];
          }
          // The rows held by the ranks that differ from `coord` only in gathered dims.
          std::vector<bool> held(static_cast<size_t>(n), false);
          for (int64_t other = 0; other < ranks; ++other) {
            std::vector<int64_t> c(dims);
            bool same_group = true;
            for (int64_t m = static_cast<int64_t>(dims) - 1, rest = other; m >= 0; --m) {
              c[m] = rest % mesh[m];
              rest /= mesh[m];
              same_group = same_group && (gathered[m] || c[m] == coord[m]);
            }
            if (!same_group) continue;
            std::vector<Range> local;
            LocalShard({n}, mesh, c, placements, &local);
            for (int64_t row = local[0].offset; row < local[0].offset + local[0].size; ++row) held[row] = true;
          }
          const auto first = std::find(held.begin(), held.end(), true);
          const auto last = std::find(held.rbegin(), held.rend(), true).base();
          const bool box = std::find(first, last, false) == last;
          std::vector<Range> out;
          int bad = -1;
          const std::string what = "n=" + std::to_string(n) + " mesh dims " + std::to_string(dims) +
                                   " gathered " + std::to_string(subset) + " rank " + std::to_string(linear);
          ASSERT_EQ(HeldShard({n}, mesh, coord, placements, gathered, &out, &bad), box) << what;
          if (!box) continue;
          const Range want = first == held.end()
                                 ? Range{0, 0}
                                 : Range{first - held.begin(), static_cast<int64_t>(last - first)};
          EXPECT_EQ(out[0], want) << what;
        }
      }
    }
  }
}

}  // namespace
}  // namespace wsync
