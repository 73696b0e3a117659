// DTensor/FSDP2 shard arithmetic against torch.chunk written out by hand.
#include "routing/chunking.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace wsync
