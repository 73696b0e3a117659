// The bytes-over-links limit of `wsync bench cluster`, on hand-made tables
// whose per-host bytes are worked out by hand in the comments.
#include <gtest/gtest.h>

#include "demo/link_limit.h"

namespace wsync::demo {
namespace {

TrainerParam Param(const std::string& name, Shape local_shape) {
  TrainerParam p;
  p.name = name;
  p.local_shape = std::move(local_shape);
  p.dtype = DType::kBF16;
  return p;
}

Box Whole(int64_t rows, int64_t cols) {
  Box b;
  b.ndim = 2;
  b.size = {rows, cols, 0, 0};
  return b;
}

// Trainer ranks 0,1 on host A, 2,3 on host B; inference rank 0 on host C.
struct Case {
  TrainerSpec trainer;
  InferenceSpec inference;
  RoutingTable table;
  Case() {
    for (int32_t r = 0; r < 4; ++r) {
      TrainerRank rank;
      rank.rank = r;
      rank.host = r < 2 ? "A" : "B";
      trainer.ranks.push_back(rank);
    }
    InferenceRank i;
    i.rank = 0;
    i.host = "C";
    inference.ranks.push_back(i);
  }
  // A 4x4 bf16 tensor (32 bytes) held whole by all four ranks after unshard;
  // `local_rows` rows of it on each rank before.
  void AddSource(const std::string& name, int64_t local_rows) {
    SourceTensor s;
    s.name = name;
    s.dtype = DType::kBF16;
    for (int32_t r = 0; r < 4; ++r) {
      s.holders.push_back({r, Whole(4, 4)});
      trainer.ranks[r].params.push_back(Param(name, {local_rows, 4}));
    }
    table.sources.push_back(s);
  }
};

TEST(LinkLimitTest, ShardedAcrossTwoHostsEachHostReceivesAndSendsHalf) {
  Case c;
  c.AddSource("w", 1);  // 8 bytes per rank, 16 per host
  WriteOp op;
  op.src_rank = 0;
  op.dst_rank = 0;
  op.bytes = 100;
  c.table.ops.push_back(op);
  const LinkLimit limit = ComputeLinkLimit(c.table, c.trainer, c.inference, 1.0);
  EXPECT_EQ(limit.hosts.at("A").egress(), 116u);  // 100 written + its 16-byte half sent to B
  EXPECT_EQ(limit.hosts.at("A").ingress(), 16u);  // B's half
  EXPECT_EQ(limit.hosts.at("B").egress(), 16u);
  EXPECT_EQ(limit.hosts.at("B").ingress(), 16u);
  EXPECT_EQ(limit.hosts.at("C").ingress(), 100u);
  EXPECT_EQ(limit.busiest, "A egress");
  EXPECT_EQ(limit.busiest_bytes, 116u);
  EXPECT_DOUBLE_EQ(limit.seconds, 116 * 8 / 1e9);
}

TEST(LinkLimitTest, ReplicatedTensorNeedsNoGatherTraffic) {
  Case c;
  c.AddSource("norm", 4);  // every rank already holds the whole tensor
  const LinkLimit limit = ComputeLinkLimit(c.table, c.trainer, c.inference, 1.0);
  EXPECT_EQ(limit.hosts.at("A").egress() + limit.hosts.at("A").ingress(), 0u);
  EXPECT_EQ(limit.hosts.at("B").egress() + limit.hosts.at("B").ingress(), 0u);
  EXPECT_EQ(limit.busiest_bytes, 0u);
}

TEST(LinkLimitTest, GatherGroupInsideOneHostStaysOffTheLink) {
  Case c;
  SourceTensor s;
  s.name = "expert";
  s.dtype = DType::kBF16;
  for (int32_t r : {0, 1}) {  // both on host A, 2 rows each of a 4x4 tensor
    s.holders.push_back({r, Whole(4, 4)});
    c.trainer.ranks[r].params.push_back(Param("expert", {2, 4}));
  }
  c.table.sources.push_back(s);
  const LinkLimit limit = ComputeLinkLimit(c.table, c.trainer, c.inference, 1.0);
  EXPECT_EQ(limit.busiest_bytes, 0u);
}

}  // namespace
}  // namespace wsync::demo
