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

// Whatever the plan, inference host C must receive the 100 + 4 bytes its
// rank holds, and the two trainer hosts must send them, at best 52 each.
TEST(LinkLimitTest, AnyPlanLimitIsWhatTheEnginesHoldSharedByTheTrainerHosts) {
  Case c;
  DestTensor w;
  w.rank = 0;
  w.bytes = 100;
  w.scale_bytes = 4;
  c.table.destinations.push_back(w);
  WriteOp op;  // the plan's writes do not enter this limit
  op.src_rank = 0;
  op.dst_rank = 0;
  op.bytes = 1000;
  c.table.ops.push_back(op);
  const LinkLimit limit = ComputeAnyPlanLimit(c.table, c.trainer, c.inference, 1.0);
  EXPECT_EQ(limit.hosts.at("C").ingress(), 104u);
  EXPECT_EQ(limit.hosts.at("A").egress(), 52u);
  EXPECT_EQ(limit.hosts.at("B").egress(), 52u);
  EXPECT_EQ(limit.busiest, "C ingress");
  EXPECT_DOUBLE_EQ(limit.seconds, 104 * 8 / 1e9);
}

// Rank 0 (host A) exchanges with rank 2 (host B) and receives 1 row of a
// 4x4 bf16 box (8 bytes); rank 1 (A) all-gathers with rank 3 (B) and
// receives rank 3's chunk, 2 rows (16 bytes). Peers on the same host cost
// the link nothing.
TEST(LinkLimitTest, ExchangeBytesCountOnlyThePiecesThatCrossHosts) {
  Case c;
  auto source = [](std::vector<int32_t> ranks) {
    RankSource s;
    s.name = "w";
    s.dtype = DType::kBF16;
    s.held = Whole(4, 4);
    s.gather_dim = 0;
    s.gather_ranks = std::move(ranks);
    return s;
  };
  std::vector<TrainerRankPlan> plans(4);
  for (int32_t r = 0; r < 4; ++r) plans[r].rank = r;
  RankSource x = source({0, 2});
  x.recv_rows = {{0, 0}, {2, 1}};
  x.send_rows = {{0, 0}, {0, 1}};
  RankSource g = source({1, 3});
  RankSource local = source({0, 1});  // both on host A
  plans[0].groups.push_back(RankMeshGroup{});
  plans[0].groups[0].sources = {x};
  plans[1].groups.push_back(RankMeshGroup{});
  plans[1].groups[0].sources = {g, local};
  const LinkLimit bytes = ComputeExchangeLinkBytes(c.table, c.trainer, c.inference, plans, 1.0);
  EXPECT_EQ(bytes.hosts.at("A").gather_ingress, 24u);
  EXPECT_EQ(bytes.hosts.at("B").gather_egress, 24u);
  EXPECT_EQ(bytes.hosts.at("A").gather_egress, 0u);
  EXPECT_EQ(bytes.busiest, "A ingress");
}

}  // namespace
}  // namespace wsync::demo
