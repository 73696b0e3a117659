// Summarize's link terms on a hand-made table whose times are worked out by
// hand: two trainer ranks on host A (NICs 0 and 1) each write 1 GB, one to
// each of two inference ranks on host B (NICs 0 and 1), over 8 Gbit/s
// (1 GB/s) links with no fixed costs.
#include <gtest/gtest.h>

#include "routing/plan_summary.h"

namespace wsync {
namespace {

RoutingTable TwoByTwo() {
  RoutingTable t;
  t.mesh_groups.push_back({"g", {0, 1}});
  t.trainer_endpoints = {{"A", 0, 0}, {"A", 1, 1}};
  t.inference_endpoints = {{"B", 0, 0}, {"B", 1, 1}};
  for (int32_t r : {0, 1}) {
    WriteOp op;
    op.src_rank = r;
    op.dst_rank = r;
    op.bytes = 1'000'000'000;
    op.mesh_group = 0;
    t.ops.push_back(op);
  }
  return t;
}

LinkModel Plain() {
  LinkModel m;
  m.nic_gbps = 8;
  m.nic_efficiency = 1;
  m.per_write_us = 0;
  m.allgather_call_us = 0;
  m.barrier_us = 0;
  return m;
}

TEST(PlanSummaryTest, EachNicCarriesItsOwnRanksBytes) {
  const PlanSummary s = Summarize(TwoByTwo(), Plain());
  EXPECT_DOUBLE_EQ(s.receive_bound_seconds, 1.0);
  EXPECT_DOUBLE_EQ(s.sender_bound_seconds, 1.0);
  EXPECT_DOUBLE_EQ(s.predicted_seconds, 1.0);
}

TEST(PlanSummaryTest, OneLinkPerHostCarriesEveryRankOfTheHost) {
  LinkModel m = Plain();
  m.one_link_per_host = true;
  const PlanSummary s = Summarize(TwoByTwo(), m);
  EXPECT_DOUBLE_EQ(s.receive_bound_seconds, 2.0);  // B's one link receives both GB
  EXPECT_DOUBLE_EQ(s.sender_bound_seconds, 2.0);   // A's one link sends both
  EXPECT_DOUBLE_EQ(s.predicted_seconds, 2.0);
  EXPECT_EQ(s.receiver_nic_bytes.count, 1u);
}

// A delta version, by hand: each rank finds changes in its 1 GB at 4 GB/s
// (0.25 s), sends 10% of it (0.1 s at 1 GB/s); each receiver takes its
// 0.1 GB (0.1 s) and applies over its 1 GB at 2 GB/s (0.5 s).
TEST(PlanSummaryTest, ADeltaVersionSendsItsFractionAfterTheFindAndAppliesAfterTheLanding) {
  LinkModel m = Plain();
  m.delta_fraction = 0.1;
  m.delta_find_gbps = 4;
  m.delta_apply_gbps = 2;
  const PlanSummary s = Summarize(TwoByTwo(), m);
  EXPECT_DOUBLE_EQ(s.predicted_seconds, 1.0);  // the whole version is unchanged
  EXPECT_NEAR(s.delta_sender_bound_seconds, 0.35, 1e-12);
  EXPECT_NEAR(s.delta_receive_bound_seconds, 0.6, 1e-12);
  EXPECT_NEAR(s.delta_predicted_seconds, 0.6, 1e-12);
}

// On a host the pack takes turns with the find on the rank's thread: at
// 2 GB/s over the same 1 GB it adds 0.5 s before the writes can finish.
TEST(PlanSummaryTest, ADeltaVersionOnAHostWaitsForThePackAndTheFind) {
  LinkModel m = Plain();
  m.delta_fraction = 0.1;
  m.delta_find_gbps = 4;
  m.delta_apply_gbps = 2;
  m.pack_gbps = 2;
  const PlanSummary s = Summarize(TwoByTwo(), m);
  EXPECT_DOUBLE_EQ(s.predicted_seconds, 1.0);
  EXPECT_NEAR(s.delta_sender_bound_seconds, 0.85, 1e-12);  // 0.25 + 0.5, then the last 0.1 s of writes
  EXPECT_NEAR(s.delta_predicted_seconds, 0.85, 1e-12);
}

TEST(PlanSummaryTest, NoDeltaFractionPredictsNoDeltaVersion) {
  const PlanSummary s = Summarize(TwoByTwo(), Plain());
  EXPECT_EQ(s.delta_predicted_seconds, 0.0);
}

}  // namespace
}  // namespace wsync
