// The tiny llama fixture (tests/routing/data, written by make_fixtures.py):
// exact ops for a few tensors, derived by hand from the layout rules, plus
// the independent byte-coverage check over the whole plan.
#include <algorithm>
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "routing/json_reader.h"
#include "routing/json_text.h"
#include "routing/plan_summary.h"
#include "routing/planner.h"
#include "routing/plan_io.h"
#include "routing/rank_plan.h"
#include "routing/spec_io.h"
#include "tests/routing/test_specs.h"

namespace wsync {
namespace {

std::string Data(const std::string& f) { return std::string(WSYNC_ROUTING_TEST_DATA) + "/" + f; }

struct Tiny {
  TrainerSpec trainer;
  InferenceSpec inference;
  MappingSpec mapping;
};

// These goldens pin the plan of the full_tensor pipeline (every rank of a
// gather group holds the whole tensor); the planned exchange, which cuts
// pieces at shard edges, has goldens of its own below.
PlanOptions AllGather() {
  PlanOptions o;
  o.exchange = false;
  return o;
}

// Cut at every shard edge, however small the pieces: the goldens' tensors
// are tiny, and the choice of where cuts pay has goldens of its own.
PlanOptions Exchange() {
  PlanOptions o;
  o.exchange = true;
  o.min_shard_piece_bytes = 0;
  return o;
}

Tiny LoadTiny() {
  Tiny t;
  auto config = ReadJsonFile(Data("tiny_config.json"));
  auto tr = ParseTrainerSpecFromFile(Data("tiny_trainer.json"));
  auto in = ParseInferenceSpecFromFile(Data("tiny_inference.json"));
  auto mp = ParseMappingSpecFromFile(Data("tiny_mapping.json"), &*config);
  EXPECT_TRUE(tr.ok() && in.ok() && mp.ok());
  t.trainer = *tr;
  t.inference = *in;
  t.mapping = *mp;
  return t;
}

// Compact view of one op for comparisons: source name, kind, box, offset, bytes.
struct OpView {
  std::string src;
  char kind;
  std::vector<int64_t> offset, size;
  uint64_t dst_offset, bytes;
  bool operator==(const OpView&) const = default;
};

std::ostream& operator<<(std::ostream& os, const OpView& v) {
  os << v.src << " " << v.kind << " off[";
  for (auto x : v.offset) os << x << ",";
  os << "] size[";
  for (auto x : v.size) os << x << ",";
  return os << "] @" << v.dst_offset << " +" << v.bytes;
}

std::vector<OpView> OpsFor(const RoutingTable& t, int32_t rank, const std::string& name,
                           std::vector<int32_t>* senders = nullptr) {
  std::vector<std::pair<const WriteOp*, OpView>> out;
  for (const WriteOp& op : t.ops) {
    const DestTensor& d = t.destinations[op.dst];
    if (d.rank != rank || d.name != name) continue;
    OpView v{t.sources[op.src].name, op.kind == WriteKind::kScale ? 's' : 'w', {}, {}, op.dst_offset, op.bytes};
    for (int i = 0; i < op.src_box.ndim; ++i) {
      v.offset.push_back(op.src_box.offset[i]);
      v.size.push_back(op.src_box.size[i]);
    }
    out.push_back({&op, v});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.second.kind == 's', a.second.dst_offset) < std::make_pair(b.second.kind == 's', b.second.dst_offset);
  });
  std::vector<OpView> views;
  for (auto& [op, v] : out) {
    views.push_back(v);
    if (senders) senders->push_back(op->src_rank);
  }
  return views;
}

const std::string L0 = "model.layers.0.";

TEST(PlannerGoldenTest, WholePlanPassesTheIndependentChecker) {
  Tiny t = LoadTiny();
  auto table = Plan(t.trainer, t.inference, t.mapping);
  ASSERT_TRUE(table.ok()) << table.status().message();
  auto check = testing::CheckPlan(t.trainer, t.inference, *table);
  EXPECT_EQ(check.error, "");
  EXPECT_EQ(table->mesh_groups.size(), 1u);
  EXPECT_EQ(table->mesh_groups[0].ranks, (std::vector<int32_t>{0, 1, 2, 3}));
  ASSERT_EQ(table->trainer_endpoints.size(), 4u);
  EXPECT_EQ(table->trainer_endpoints[3].host, "trainer-1");
  EXPECT_EQ(table->trainer_endpoints[3].nic, 1);
  ASSERT_EQ(table->inference_endpoints.size(), 2u);
}

TEST(PlannerGoldenTest, FusedQkvWithReplicatedKvHeads) {
  Tiny t = LoadTiny();
  auto table = Plan(t.trainer, t.inference, t.mapping, AllGather());
  ASSERT_TRUE(table.ok()) << table.status().message();
  // TP 2 on dim 0: q rows [0,128) on rank 0 and [128,256) on rank 1; the one
  // kv head (shards 1) is replicated, so both ranks get all of k and v.
  const uint64_t part = 128 * 256 * 2;
  std::vector<OpView> want0 = {
      {L0 + "self_attn.q_proj.weight", 'w', {0, 0}, {128, 256}, 0, part},
      {L0 + "self_attn.k_proj.weight", 'w', {0, 0}, {128, 256}, part, part},
      {L0 + "self_attn.v_proj.weight", 'w', {0, 0}, {128, 256}, 2 * part, part}};
  EXPECT_EQ(OpsFor(*table, 0, L0 + "self_attn.qkv_proj.weight"), want0);
  std::vector<OpView> want1 = want0;
  want1[0].offset = {128, 0};
  EXPECT_EQ(OpsFor(*table, 1, L0 + "self_attn.qkv_proj.weight"), want1);
}

TEST(PlannerGoldenTest, RowParallelAndFp8ScalesAreOneContiguousWriteEach) {
  Tiny t = LoadTiny();
  auto table = Plan(t.trainer, t.inference, t.mapping, AllGather());
  ASSERT_TRUE(table.ok()) << table.status().message();
  // o_proj TP on dim 1: rank 1 holds columns [128, 256) of every row; the
  // destination is the whole local tensor, so one write.
  std::vector<OpView> want_o = {{L0 + "self_attn.o_proj.weight", 'w', {0, 128}, {256, 128}, 0, 256 * 128 * 2}};
  EXPECT_EQ(OpsFor(*table, 1, L0 + "self_attn.o_proj.weight"), want_o);
  // down_proj fp8 [256, 512] TP dim 1: 1-byte weights, then the 2x2 block
  // grid of columns [256, 512) = blocks [2, 4) of the source's 2x4 grid.
  std::vector<int32_t> senders;
  std::vector<OpView> want_down = {
      {L0 + "mlp.down_proj.weight", 'w', {0, 256}, {256, 256}, 0, 256 * 256},
      {L0 + "mlp.down_proj.weight", 's', {0, 2}, {2, 2}, 0, 16}};
  EXPECT_EQ(OpsFor(*table, 1, L0 + "mlp.down_proj.weight", &senders), want_down);
  ASSERT_EQ(senders.size(), 2u);
  EXPECT_EQ(senders[0], senders[1]) << "the rank that quantizes a box sends its scales";
}

TEST(PlannerGoldenTest, TiedLmHeadAndUnevenVocabSplit) {
  Tiny t = LoadTiny();
  auto table = Plan(t.trainer, t.inference, t.mapping, AllGather());
  ASSERT_TRUE(table.ok()) << table.status().message();
  // 1003 rows over TP 2: 502 + 501.
  std::vector<OpView> want = {{"model.embed_tokens.weight", 'w', {502, 0}, {501, 256}, 0, 501 * 256 * 2}};
  EXPECT_EQ(OpsFor(*table, 1, "lm_head.weight"), want);
  EXPECT_EQ(OpsFor(*table, 1, "model.embed_tokens.weight"), want);
}

TEST(PlannerGoldenTest, SendersAreBalancedAndDeterministic) {
  Tiny t = LoadTiny();
  auto a = Plan(t.trainer, t.inference, t.mapping);
  auto b = Plan(t.trainer, t.inference, t.mapping);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->ops.size(), b->ops.size());
  for (size_t i = 0; i < a->ops.size(); ++i) {
    EXPECT_EQ(a->ops[i].src_rank, b->ops[i].src_rank);
    EXPECT_EQ(a->ops[i].dst_offset, b->ops[i].dst_offset);
    EXPECT_EQ(a->ops[i].src_box, b->ops[i].src_box);
  }
  std::vector<uint64_t> load(4, 0);
  uint64_t total = 0, biggest = 0;
  for (const WriteOp& op : a->ops) {
    load[op.src_rank] += op.bytes;
    total += op.bytes;
    biggest = std::max(biggest, op.bytes);
  }
  // Greedy largest-first: no rank exceeds the mean by more than the largest job.
  for (uint64_t l : load) EXPECT_LE(l, total / 4 + biggest);
}

}  // namespace
}  // namespace wsync

namespace wsync {
namespace {

// Trainer experts [8, 4, 4] on mesh [fsdp 2, ep 2] with [Shard(1), Shard(0)]:
// after gathering fsdp, ranks with ep coordinate 0 (ranks 0, 2) hold experts
// [0, 4) and ranks with ep 1 (ranks 1, 3) hold [4, 8).
struct EpCase {
  TrainerSpec trainer;
  InferenceSpec inference;
  MappingSpec mapping;
};

EpCase MakeEpCase(std::vector<Placement> placements) {
  EpCase c;
  c.trainer = testing::BuildTrainer({{"experts", {2, 2}, {"fsdp", "ep"}}}, {{"experts", "experts", {"fsdp"}}},
                                    {{"moe.w", {8, 4, 4}, DType::kBF16, "experts", placements}});
  InferenceRank r;
  r.rank = 0;
  r.host = "infer-0";
  testing::AddTensor(&r, "experts.w", {4, 4, 4}, DType::kBF16, std::nullopt, ExpertRange{2, 6});
  c.inference.ranks.push_back(r);
  c.mapping.rules.push_back({MappingRule::Kind::kStackExperts, "experts.w", {{"moe.w", 0, std::nullopt}}, 0});
  return c;
}

TEST(PlannerGoldenTest, ExpertsSpanningTwoEpSlicesAreSplitBetweenTheirHolders) {
  EpCase c = MakeEpCase({Placement::Shard(1), Placement::Shard(0)});
  auto table = Plan(c.trainer, c.inference, c.mapping, AllGather());
  ASSERT_TRUE(table.ok()) << table.status().message();
  ASSERT_EQ(table->ops.size(), 2u);
  const WriteOp& a = table->ops[0];
  const WriteOp& b = table->ops[1];
  // Experts [2, 4) from rank 0 (ep 0, lowest rank), [4, 6) from rank 1 (ep 1).
  EXPECT_EQ(a.src_rank, 0);
  EXPECT_EQ(a.src_box.offset[0], 2);
  EXPECT_EQ(a.src_box.size[0], 2);
  EXPECT_EQ(a.dst_offset, 0u);
  EXPECT_EQ(a.bytes, 2u * 16 * 2);
  EXPECT_EQ(b.src_rank, 1);
  EXPECT_EQ(b.src_box.offset[0], 4);
  EXPECT_EQ(b.src_box.size[0], 2);
  EXPECT_EQ(b.dst_offset, 64u);
  EXPECT_EQ(b.bytes, 64u);
  EXPECT_EQ(testing::CheckPlan(c.trainer, c.inference, *table).error, "");
}

TEST(PlannerGoldenTest, GatheringFsdpInsideEpOnTheSameDimIsRefusedNamingTheTensor) {
  // [Shard(0), Shard(0)] over [fsdp, ep]: gathering fsdp leaves each rank
  // every other slice of experts, which no box describes.
  EpCase c = MakeEpCase({Placement::Shard(0), Placement::Shard(0)});
  PlanOptions opt;
  opt.trainer_source = "trainer.json";
  auto table = Plan(c.trainer, c.inference, c.mapping, opt);
  ASSERT_FALSE(table.ok());
  EXPECT_NE(table.status().message().find("trainer.json: rank 0: tensor 'moe.w': mesh group 'experts'"),
            std::string::npos) << table.status().message();
  EXPECT_NE(table.status().message().find("non-contiguous"), std::string::npos);
}

TEST(PlannerGoldenTest, QkvSendersArePinned) {
  // Regression pin of the balancer's choices for one tensor (greedy
  // largest-first over all 4 ranks, ties to the lowest rank).
  Tiny t = LoadTiny();
  auto table = Plan(t.trainer, t.inference, t.mapping, AllGather());
  ASSERT_TRUE(table.ok());
  std::vector<int32_t> senders;
  OpsFor(*table, 0, L0 + "self_attn.qkv_proj.weight", &senders);
  EXPECT_EQ(senders, (std::vector<int32_t>{2, 3, 0}));
}

// The planned exchange (the default). Tiny's bf16 tensors are FSDP-sharded on
// dim 0 and every engine tensor's rows fall inside one trainer shard once the
// planner cuts pieces at shard edges, so no rank needs a peer's rows: those
// sources gather nothing. down_proj is fp8 (128x128 blocks) while each shard
// holds 64 rows, so a block's writer must receive the other half of its rows,
// and only those: whole rows of the row-blocks it writes.
TEST(PlannerGoldenTest, ExchangeMovesOnlyTheRowsOfTheBlocksEachWriterQuantizes) {
  Tiny t = LoadTiny();
  auto table = Plan(t.trainer, t.inference, t.mapping, Exchange());
  ASSERT_TRUE(table.ok()) << table.status().message();
  ASSERT_EQ(testing::CheckPlan(t.trainer, t.inference, *table).error, "");
  const testing::ExchangeCheck check = testing::CheckExchange(t.trainer, t.inference, *table);
  ASSERT_EQ(check.error, "");
  ASSERT_EQ(check.unsupported, "");

  const std::string down = L0 + "mlp.down_proj.weight";  // [256, 512] bf16, rank r holds rows [64r, 64r + 64)
  const int64_t row_bytes = 512 * 2;
  // Expected from the ops alone: each writer's row-blocks, less its own rows.
  std::map<int32_t, std::set<int64_t>> row_blocks;
  for (const WriteOp& op : table->ops) {
    if (table->sources[op.src].name != down || op.kind != WriteKind::kWeight) continue;
    const int64_t lo = op.src_box.offset[0], hi = lo + op.src_box.size[0];
    EXPECT_EQ(lo % 128, 0);
    EXPECT_EQ(hi % 128, 0);
    for (int64_t b = lo / 128; b < hi / 128; ++b) {
      row_blocks[op.src_rank].insert(b);
      // The writer holds half of the block already: ranks 2b and 2b + 1.
      EXPECT_TRUE(op.src_rank == 2 * b || op.src_rank == 2 * b + 1) << "block row " << b << " from rank " << op.src_rank;
    }
  }
  ASSERT_FALSE(row_blocks.empty());
  uint64_t want = 0;
  for (const auto& [rank, blocks] : row_blocks) {
    for (int64_t b : blocks)
      for (int64_t row = 128 * b; row < 128 * b + 128; ++row)
        if (row / 64 != rank) want += row_bytes;
  }

  uint64_t got = 0;
  for (const TrainerRank& r : t.trainer.ranks) {
    auto plan = ExtractTrainerRankPlan(*table, t.trainer, t.inference, r.rank);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    for (const RankSource& s : plan->groups.at(0).sources) {
      if (s.name != L0 + "mlp.down_proj.weight" && s.name != "model.layers.1.mlp.down_proj.weight") {
        EXPECT_EQ(s.gather_dim, -1) << s.name << " on rank " << r.rank;
        EXPECT_TRUE(s.held == s.local) << s.name << " on rank " << r.rank;
        continue;
      }
      if (s.name != down) continue;
      if (!row_blocks.count(r.rank)) {
        // Writes nothing of it: receives nothing, only sends.
        if (s.exchange()) {
          for (size_t i = 0; i < s.recv_rows.size(); ++i)
            if (s.gather_ranks[i] != r.rank) EXPECT_EQ(s.recv_rows[i].size, 0) << "rank " << r.rank;
        }
        continue;
      }
      ASSERT_TRUE(s.exchange()) << "rank " << r.rank;
      for (size_t i = 0; i < s.recv_rows.size(); ++i)
        if (s.gather_ranks[i] != r.rank) got += static_cast<uint64_t>(s.recv_rows[i].size) * row_bytes;
    }
  }
  EXPECT_EQ(got, want);
  EXPECT_LT(want, 4u * 192 * row_bytes);  // what full_tensor moves for it: 3/4 of the tensor to each rank
  EXPECT_LT(check.exchange_bytes, check.full_tensor_bytes / 4);
}

// Experts [8, 4, 4] with [Shard(1), Shard(0)]: a destination of whole experts
// cut at the FSDP edge of dim 1 is written piece by piece from the shards as
// they are; nobody gathers, where full_tensor moved every expert twice.
TEST(PlannerGoldenTest, BoxesHeldWholeNeedNoExchange) {
  EpCase c = MakeEpCase({Placement::Shard(1), Placement::Shard(0)});
  auto table = Plan(c.trainer, c.inference, c.mapping, Exchange());
  ASSERT_TRUE(table.ok()) << table.status().message();
  ASSERT_EQ(testing::CheckPlan(c.trainer, c.inference, *table).error, "");
  const testing::ExchangeCheck check = testing::CheckExchange(c.trainer, c.inference, *table);
  ASSERT_EQ(check.error, "");
  EXPECT_EQ(check.exchange_bytes, 0u);
  EXPECT_EQ(check.full_tensor_bytes, 4u * 4 * 2 * 4 * 2);  // each rank: 4 experts x 2 of its 4 rows x 4 x bf16
  std::set<int32_t> writers;
  for (const WriteOp& op : table->ops) {
    writers.insert(op.src_rank);
    EXPECT_EQ(op.src_box.size[1], 2);  // never across the shard edge
  }
  EXPECT_EQ(writers, (std::set<int32_t>{0, 1, 2, 3}));
  for (int32_t rank = 0; rank < 4; ++rank) {
    auto plan = ExtractTrainerRankPlan(*table, c.trainer, c.inference, rank);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    for (const RankSource& s : plan->groups.at(0).sources) EXPECT_EQ(s.gather_dim, -1);
  }
}

// With the default minimum piece, tiny experts are not cut at the shard
// edge: one write per destination box, as under full_tensor, and the writer
// receives the rows of its box from its peer.
TEST(PlannerGoldenTest, PiecesBelowTheMinimumAreNotCutAtShardEdges) {
  EpCase c = MakeEpCase({Placement::Shard(1), Placement::Shard(0)});
  PlanOptions opt;
  opt.exchange = true;
  ASSERT_GT(opt.min_shard_piece_bytes, 64u);  // a piece here: 2 experts x 2 rows x 4 x bf16
  auto table = Plan(c.trainer, c.inference, c.mapping, opt);
  auto full = Plan(c.trainer, c.inference, c.mapping, AllGather());
  ASSERT_TRUE(table.ok() && full.ok());
  ASSERT_EQ(testing::CheckPlan(c.trainer, c.inference, *table).error, "");
  const testing::ExchangeCheck check = testing::CheckExchange(c.trainer, c.inference, *table);
  ASSERT_EQ(check.error, "");
  EXPECT_EQ(table->ops.size(), full->ops.size());
  for (const WriteOp& op : table->ops) EXPECT_EQ(op.src_box.size[1], 4);  // across the shard edge
  // Each EP slice is written by one of its two ranks, which receives the
  // other shard's 2 rows of every expert of its slice (the exchange narrows
  // only the row dim, so the 2 experts it does not write come too): 2 slices
  // x 4 experts x 2 rows x 4 x bf16, where full_tensor moves as much to each
  // of the 4 ranks.
  EXPECT_EQ(check.exchange_bytes, 2u * 4 * 2 * 4 * 2);
  EXPECT_EQ(check.full_tensor_bytes, 2 * check.exchange_bytes);
}

// bf16 "o.w" [256, cols], FSDP (Shard(0)) over 4 trainer ranks, 2 per host,
// held by `replicas` engines of TP `tp` on its columns (one host each).
struct ColumnSliced {
  TrainerSpec trainer;
  InferenceSpec inference;
  MappingSpec mapping;
};
ColumnSliced MakeColumnSliced(int64_t cols, int32_t replicas, int32_t tp) {
  ColumnSliced c;
  c.trainer = testing::BuildTrainer({{"dense", {4}, {"fsdp"}}}, {{"dense", "dense", {"fsdp"}}},
                                    {{"o.w", {256, cols}, DType::kBF16, "dense", {Placement::Shard(0)}}},
                                    /*ranks_per_host=*/2);
  for (int32_t r = 0; r < replicas * tp; ++r) {
    InferenceRank rank;
    rank.rank = r;
    rank.instance = r / tp;
    rank.host = "infer-" + std::to_string(r / tp);
    testing::AddTensor(&rank, "o.w", {256, cols / tp}, DType::kBF16, TpSlice{1, r % tp, tp});
    c.inference.ranks.push_back(rank);
  }
  c.mapping.rules.push_back({MappingRule::Kind::kDirect, "o.w", {{"o.w", 0, std::nullopt}}, 0});
  return c;
}

// A row-parallel weight below the minimum piece: bf16 [256, 256], FSDP over
// 4 ranks on 2 hosts (64 rows each), held by 2 engine replicas of TP 2 on
// its columns. Each column half is one piece of all 256 rows; its 2 copies
// (one per replica) are written by one rank, which receives the other 192
// rows of its 128 columns only: half of each row, once. Every writer
// gathering whole rows, once per copy, would move 4 x 192 rows x 256 x bf16.
TEST(PlannerGoldenTest, CopiesOfAPieceHaveOneWriterThatReceivesOnlyItsColumns) {
  const ColumnSliced c = MakeColumnSliced(256, /*replicas=*/2, /*tp=*/2);
  const TrainerSpec& trainer = c.trainer;
  const InferenceSpec& inference = c.inference;
  const MappingSpec& mapping = c.mapping;
  PlanOptions opt;  // the defaults: the exchange, pieces of at least 128 KiB
  ASSERT_GT(opt.min_shard_piece_bytes, 256u * 128 * 2 / 4);
  auto table = Plan(trainer, inference, mapping, opt);
  ASSERT_TRUE(table.ok()) << table.status().message();
  ASSERT_EQ(testing::CheckPlan(trainer, inference, *table).error, "");
  const testing::ExchangeCheck check = testing::CheckExchange(trainer, inference, *table);
  ASSERT_EQ(check.error, "");
  ASSERT_EQ(check.unsupported, "");

  std::map<int64_t, std::set<int32_t>> writers;  // column half -> trainer ranks writing it
  for (const WriteOp& op : table->ops) {
    EXPECT_EQ(op.src_box.size[0], 256);  // uncut
    writers[op.src_box.offset[1] / 128].insert(op.src_rank);
  }
  ASSERT_EQ(writers.size(), 2u);
  EXPECT_EQ(writers[0].size(), 1u);
  EXPECT_EQ(writers[1].size(), 1u);
  EXPECT_NE(*writers[0].begin(), *writers[1].begin());  // the two halves balanced over two ranks
  EXPECT_EQ(check.exchange_bytes, 2u * 192 * 128 * 2);
  // The plan summary counts the same bytes from the rank plans, half of
  // them between hosts (the writer's 64 rows on its own host come over NVLink).
  auto summary = SummarizeFromRankPlans(*table, trainer, inference, LinkModel{});
  ASSERT_TRUE(summary.ok()) << summary.status().message();
  EXPECT_EQ(summary->exchange_bytes, check.exchange_bytes);
  EXPECT_EQ(summary->exchange_cross_host_bytes, 2u * 128 * 128 * 2);
  EXPECT_EQ(summary->exchange_repeat_cross_host_bytes, 0u);  // each element crosses into a host once
  // full_tensor: both ranks of a host receive the other host's two 64-row
  // shards, whole rows; the second copy into each host is the repeat.
  auto full = Plan(trainer, inference, mapping, AllGather());
  ASSERT_TRUE(full.ok()) << full.status().message();
  auto full_summary = SummarizeFromRankPlans(*full, trainer, inference, LinkModel{});
  ASSERT_TRUE(full_summary.ok()) << full_summary.status().message();
  EXPECT_EQ(full_summary->exchange_cross_host_bytes, 4u * 128 * 256 * 2);
  EXPECT_EQ(full_summary->exchange_repeat_cross_host_bytes, 2u * 128 * 256 * 2);

  for (int32_t rank = 0; rank < 4; ++rank) {
    auto plan = ExtractTrainerRankPlan(*table, trainer, inference, rank);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    const RankSource& s = plan->groups.at(0).sources.at(0);
    ASSERT_TRUE(s.exchange()) << "rank " << rank;
    ASSERT_EQ(s.send_cols.size(), 4u) << "rank " << rank;
    for (size_t i = 0; i < 4; ++i) {
      const int32_t peer = s.gather_ranks[i];
      // To each writer its 64 rows of that writer's half; to the others nothing.
      for (int64_t half : {0, 1}) {
        if (*writers[half].begin() != peer) continue;
        EXPECT_EQ(s.send_rows[i].size, 64) << "rank " << rank << " to " << peer;
        EXPECT_EQ(s.send_cols[i], (Rows{128 * half, 128})) << "rank " << rank << " to " << peer;
      }
    }
    // The slice carries the narrowed pieces, [index, begin, rows, col begin, cols].
    auto back = ParseTrainerRankPlan(nlohmann::json::parse(ToJsonText(*plan)));
    ASSERT_TRUE(back.ok()) << back.status().message();
    const RankSource& got = back->groups.at(0).sources.at(0);
    EXPECT_EQ(got.held, s.held);
    for (size_t i = 0; i < 4; ++i)
      if (s.send_rows[i].size > 0) EXPECT_EQ(got.send_cols.at(i), s.send_cols[i]) << "rank " << rank << " piece " << i;
    EXPECT_EQ(ToJson(*back).dump(), ToJsonText(*plan));
  }
}

// More uncut slices than holders: bf16 [256, 1024], FSDP over 4 ranks on 2
// hosts, one engine of TP 8 on its columns. Balanced in turn, rank 0 would
// write slices 0 and 4 and so receive the columns of slices 1-3 too, which
// ranks 1 and 2 receive as well. Dealt out again in order, each rank writes
// two adjacent slices, receives only their 256 columns of the 192 rows it
// lacks, and nothing enters a host twice.
TEST(PlannerGoldenTest, AlikeSlicesOfATensorGoToEachWriterAdjacent) {
  const ColumnSliced c = MakeColumnSliced(1024, /*replicas=*/1, /*tp=*/8);
  const TrainerSpec& trainer = c.trainer;
  const InferenceSpec& inference = c.inference;
  const MappingSpec& mapping = c.mapping;
  auto table = Plan(trainer, inference, mapping, PlanOptions{});
  ASSERT_TRUE(table.ok()) << table.status().message();
  ASSERT_EQ(testing::CheckPlan(trainer, inference, *table).error, "");
  const testing::ExchangeCheck check = testing::CheckExchange(trainer, inference, *table);
  ASSERT_EQ(check.error, "");
  std::map<int32_t, std::set<int64_t>> slices;  // trainer rank -> the TP slices it writes
  for (const WriteOp& op : table->ops) slices[op.src_rank].insert(op.src_box.offset[1] / 128);
  ASSERT_EQ(slices.size(), 4u);
  for (const auto& [rank, s] : slices) {
    ASSERT_EQ(s.size(), 2u) << "rank " << rank;
    EXPECT_EQ(*s.rbegin(), *s.begin() + 1) << "rank " << rank << " writes slices " << *s.begin() << " and "
                                           << *s.rbegin();
  }
  EXPECT_EQ(check.exchange_bytes, 4u * 192 * 256 * 2);
  auto summary = SummarizeFromRankPlans(*table, trainer, inference, LinkModel{});
  ASSERT_TRUE(summary.ok()) << summary.status().message();
  EXPECT_EQ(summary->exchange_bytes, check.exchange_bytes);
  EXPECT_EQ(summary->exchange_cross_host_bytes, 4u * 128 * 256 * 2);
  EXPECT_EQ(summary->exchange_repeat_cross_host_bytes, 0u);
}

// Stacked fp8 experts [4, rows, 128], EP over experts and FSDP over rows: 2
// experts per EP slice, rows/2 per shard. Cut at the shard edge, a piece's
// rows are contiguous within one expert only; where the edge falls inside a
// 128-row block, the cut moves to a block edge and the writer of the block
// receives the rows it lacks of both experts of its slice.
struct StackedFp8 {
  TrainerSpec trainer;
  InferenceSpec inference;
  MappingSpec mapping;
};

StackedFp8 MakeStackedFp8(int64_t rows) {
  StackedFp8 c;
  c.trainer = testing::BuildTrainer({{"experts", {2, 2}, {"fsdp", "ep"}}}, {{"experts", "experts", {"fsdp"}}},
                                    {{"moe.w", {4, rows, 128}, DType::kBF16, "experts",
                                      {Placement::Shard(1), Placement::Shard(0)}}});
  InferenceRank r;
  r.rank = 0;
  r.host = "infer-0";
  testing::AddTensor(&r, "experts.w", {4, rows, 128}, DType::kFP8E4M3, std::nullopt, ExpertRange{0, 4});
  c.inference.ranks.push_back(r);
  c.mapping.rules.push_back({MappingRule::Kind::kStackExperts, "experts.w", {{"moe.w", 0, std::nullopt}}, 0});
  c.mapping.quant.push_back(QuantRule{});
  return c;
}

TEST(PlannerGoldenTest, StackedExpertsAreCutAtBlockEdgesAndExchangeOnlyTheStraddledRows) {
  for (const int64_t rows : {256, 384}) {  // shard edge at row 128 (a block edge), at 192 (inside one)
    SCOPED_TRACE("rows " + std::to_string(rows));
    StackedFp8 c = MakeStackedFp8(rows);
    auto table = Plan(c.trainer, c.inference, c.mapping, Exchange());
    auto full = Plan(c.trainer, c.inference, c.mapping, AllGather());
    ASSERT_TRUE(table.ok()) << table.status().message();
    ASSERT_TRUE(full.ok()) << full.status().message();
    ASSERT_EQ(testing::CheckPlan(c.trainer, c.inference, *table).error, "");
    const testing::ExchangeCheck check = testing::CheckExchange(c.trainer, c.inference, *table);
    ASSERT_EQ(check.error, "");
    if (rows == 256) {
      // A write per (EP slice, expert, shard) for weights and scales, where
      // full_tensor writes each EP slice's experts at once; nobody receives a
      // row: each shard is written as it is. The experts of one (slice,
      // shard) are one strided op of a plane each.
      EXPECT_EQ(full->ops.size(), 2u * 2);
      EXPECT_EQ(WriteCount(table->ops), 2u * 2 * 2 * 2);
      EXPECT_EQ(table->ops.size(), 2u * 2 * 2);
      for (const WriteOp& op : table->ops) {
        EXPECT_EQ(op.planes, 2u);
        EXPECT_EQ(op.plane_dim, 0);  // the source's expert dim
        // An expert apart at the destination: 256 rows of 128 fp8 bytes, or
        // 2 x 1 fp32 scale blocks.
        EXPECT_EQ(op.plane_stride, op.kind == WriteKind::kWeight ? 256u * 128 : 2u * 4);
      }
      EXPECT_EQ(check.exchange_bytes, 0u);
      EXPECT_GT(check.full_tensor_bytes, 0u);
    } else {
      // Cut at row 128 or 256 (the shard edge 192 lies in the block
      // [128, 256)), so again a write per (EP slice, expert, piece) for
      // weights and scales; the block's writer receives its 64 rows from the
      // other shard, of both experts: 2 slices x 2 experts x 64 rows x 128 x
      // bf16, where full_tensor moves 192 rows of both experts to each of 4
      // ranks.
      EXPECT_EQ(WriteCount(table->ops), 2u * 2 * 2 * 2);
      EXPECT_EQ(table->ops.size(), 2u * 2 * 2);
      EXPECT_EQ(check.exchange_bytes, 2u * 2 * 64 * 128 * 2);
      EXPECT_EQ(check.full_tensor_bytes, 4u * 2 * 192 * 128 * 2);
      for (int32_t rank = 0; rank < 4; ++rank) {
        auto plan = ExtractTrainerRankPlan(*table, c.trainer, c.inference, rank);
        ASSERT_TRUE(plan.ok()) << plan.status().message();
        const RankSource& s = plan->groups.at(0).sources.at(0);
        EXPECT_TRUE(s.exchange()) << "rank " << rank;
        EXPECT_EQ(s.held.size[0], 2) << "rank " << rank;  // both experts of its slice
      }
    }
  }
}

// A strided op (one trainer rank's rows of each stacked expert) travels as
// one entry through plan.json and both slices, and expands into the same
// single writes wherever it is expanded: in the table, in a trainer's slice
// and in an inference rank's.
TEST(StridedWritesTest, RoundTripAndExpandToTheSameWritesEverywhere) {
  StackedFp8 c = MakeStackedFp8(256);
  auto table = Plan(c.trainer, c.inference, c.mapping, Exchange());
  ASSERT_TRUE(table.ok()) << table.status().message();
  ASSERT_TRUE(std::any_of(table->ops.begin(), table->ops.end(), [](const WriteOp& op) { return op.planes > 1; }));
  auto back = PlanFromJson(PlanToJson(*table), "plan.json");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(PlanToText(*back), PlanToText(*table));

  RoutingTable plain = *table;
  plain.ops = ExpandPlanes(table->ops);
  EXPECT_EQ(plain.ops.size(), WriteCount(table->ops));
  for (const WriteOp& op : plain.ops) EXPECT_EQ(op.planes, 1u);
  for (int32_t rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE("trainer rank " + std::to_string(rank));
    auto strided = ExtractTrainerRankPlan(*table, c.trainer, c.inference, rank);
    auto want = ExtractTrainerRankPlan(plain, c.trainer, c.inference, rank);
    ASSERT_TRUE(strided.ok() && want.ok());
    EXPECT_EQ(strided->writes, want->writes);  // counted as writes that land
    auto parsed = ParseTrainerRankPlan(nlohmann::json::parse(ToJsonText(*strided)));
    ASSERT_TRUE(parsed.ok()) << parsed.status().message();
    EXPECT_EQ(ToJsonText(*parsed), ToJsonText(*strided));
    ExpandPlanes(&*parsed);
    EXPECT_EQ(ToJsonText(*parsed), ToJsonText(*want));
  }
  InferenceRankPlan strided = ExtractInferenceRankPlan(*table, 0);
  InferenceRankPlan want = ExtractInferenceRankPlan(plain, 0);
  EXPECT_LT(strided.writes.size(), want.writes.size());
  EXPECT_EQ(WriteCount(strided), want.writes.size());
  auto parsed = ParseInferenceRankPlan(nlohmann::json::parse(ToJsonText(strided)));
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(ToJsonText(*parsed), ToJsonText(strided));
  ExpandPlanes(&*parsed);
  EXPECT_EQ(ToJsonText(*parsed), ToJsonText(want));
}

// A malformed strided write in plan.json or a slice is one line naming what
// is wrong, before anything expands it into writes outside its tensor.
TEST(StridedWritesTest, MalformedOnesAreRefusedSayingWhy) {
  StackedFp8 c = MakeStackedFp8(256);
  auto table = Plan(c.trainer, c.inference, c.mapping, Exchange());
  ASSERT_TRUE(table.ok()) << table.status().message();
  const nlohmann::json good = PlanToJson(*table);
  size_t k = 0;
  while (good["ops"][k].size() != 13) ++k;  // the first strided op
  auto refused = [&](size_t field, const nlohmann::json& value) {
    nlohmann::json j = good;
    j["ops"][k][field] = value;
    auto r = PlanFromJson(j, "plan.json");
    return r.ok() ? std::string("accepted") : r.status().message();
  };
  const std::string at = "plan.json: ops[" + std::to_string(k) + "]: ";
  const uint64_t bytes = good["ops"][k][9].get<uint64_t>();  // 2 planes
  EXPECT_EQ(refused(10, 0), at + "a strided write needs at least one plane");
  EXPECT_EQ(refused(10, 3), at + "its box spans 2 along plane_dim 0, not its 3 planes");
  EXPECT_EQ(refused(11, 5), at + "plane_dim 5 is not a dim of its 3-d box");
  EXPECT_EQ(refused(9, bytes + 1), at + std::to_string(bytes + 1) + " bytes do not divide into 2 equal planes");
  EXPECT_EQ(refused(12, 1), at + "planes of " + std::to_string(bytes / 2) + " bytes overlap at a stride of 1");
  EXPECT_EQ(refused(12, UINT64_MAX), at + "a stride of 18446744073709551615 bytes over 2 planes passes 2^64");
  EXPECT_EQ(refused(12, -1), at + "planes, plane_dim and plane_stride must be integers");

  InferenceRankPlan incoming = ExtractInferenceRankPlan(*table, 0);
  nlohmann::json slice = ToJson(incoming);
  size_t w = 0;
  while (slice["writes"][w].size() != 6) ++w;
  slice["writes"][w][5] = 0;
  auto r = ParseInferenceRankPlan(slice);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "rank plan: write to '" + slice["writes"][w][3].get<std::string>() +
                                      "': planes of " +
                                      std::to_string(slice["writes"][w][2].get<uint64_t>() / 2) +
                                      " bytes overlap at a stride of 0");
}

// A trainer slice lists only the non-empty exchange pieces, [gather index,
// begin, rows]; parsed back, every gather rank has its piece again, and a
// list out of order or naming a rank outside the group is one error line.
TEST(RankPlanTextTest, ExchangePiecesAreListedOnlyWhereNonEmpty) {
  StackedFp8 c = MakeStackedFp8(384);
  auto table = Plan(c.trainer, c.inference, c.mapping, Exchange());
  ASSERT_TRUE(table.ok()) << table.status().message();
  auto plan = ExtractTrainerRankPlan(*table, c.trainer, c.inference, 0);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const RankSource& src = plan->groups.at(0).sources.at(0);
  ASSERT_TRUE(src.exchange());
  const nlohmann::json j = nlohmann::json::parse(ToJsonText(*plan));
  const nlohmann::json& sj = j["groups"][0]["sources"][0];
  size_t listed = 0;
  for (size_t i = 0; i < src.recv_rows.size(); ++i) {
    if (src.recv_rows[i].size == 0) continue;
    ASSERT_LT(listed, sj["recv"].size());
    EXPECT_EQ(sj["recv"][listed], nlohmann::json::array({i, src.recv_rows[i].offset, src.recv_rows[i].size}));
    ++listed;
  }
  EXPECT_EQ(sj["recv"].size(), listed);
  auto back = ParseTrainerRankPlan(j);
  ASSERT_TRUE(back.ok()) << back.status().message();
  const RankSource& got = back->groups.at(0).sources.at(0);
  ASSERT_EQ(got.recv_rows.size(), src.gather_ranks.size());
  ASSERT_EQ(got.send_rows.size(), src.gather_ranks.size());
  for (size_t i = 0; i < src.recv_rows.size(); ++i) {
    EXPECT_EQ(got.recv_rows[i].size, src.recv_rows[i].size) << i;
    EXPECT_EQ(got.send_rows[i].size, src.send_rows[i].size) << i;
    if (src.recv_rows[i].size > 0) EXPECT_EQ(got.recv_rows[i].offset, src.recv_rows[i].offset) << i;
    if (src.send_rows[i].size > 0) EXPECT_EQ(got.send_rows[i].offset, src.send_rows[i].offset) << i;
  }
  nlohmann::json bad = j;
  bad["groups"][0]["sources"][0]["send"] = nlohmann::json::array({nlohmann::json::array({7, 0, 1})});
  auto r = ParseTrainerRankPlan(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "rank plan: source '" + src.name +
                                      "': 'send' index 7 is out of order or not one of its " +
                                      std::to_string(src.gather_ranks.size()) + " gather ranks");
  bad = j;
  bad["groups"][0]["sources"][0]["recv"] = nlohmann::json::array({nlohmann::json::array({0, 0, 1, 0, 128})});
  r = ParseTrainerRankPlan(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "rank plan: source '" + src.name + "': 'recv' entries are [gather index, begin, rows]");
  bad = j;
  bad["groups"][0]["sources"][0].erase("send");
  r = ParseTrainerRankPlan(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "rank plan: source '" + src.name + "': 'recv' and 'send' come together");
}

// The slices the controller serves are written as text; they must be the
// trees' own dump, byte for byte, exchange rows, scale writes and names that
// need escaping included.
TEST(RankPlanTextTest, IsTheTreesDumpByteForByte) {
  StackedFp8 c = MakeStackedFp8(384);
  for (const bool exchange : {true, false}) {
    size_t writes = 0;  // of the 4 ranks (with full_tensor some ranks write nothing)
    auto table = Plan(c.trainer, c.inference, c.mapping, exchange ? Exchange() : AllGather());
    ASSERT_TRUE(table.ok()) << table.status().message();
    for (int32_t rank = 0; rank < 4; ++rank) {
      auto plan = ExtractTrainerRankPlan(*table, c.trainer, c.inference, rank);
      ASSERT_TRUE(plan.ok()) << plan.status().message();
      EXPECT_EQ(plan->groups.at(0).sources.at(0).exchange(), exchange);
      EXPECT_EQ(ToJsonText(*plan), ToJson(*plan).dump()) << "rank " << rank;
      for (RankSource& s : plan->groups.at(0).sources) {
        writes += s.writes.size();
        if (!s.writes.empty()) s.writes[0].dst_name = "experts \"w\"\t\u00e9";
      }
      plan->groups[0].sources[0].name = "src \u00e9\\";
      plan->groups[0].name = "group \"g\"";
      plan->peers.push_back({7, "host-\u00e9", {{"weights", "ab\"cd"}}});
      EXPECT_EQ(ToJsonText(*plan), ToJson(*plan).dump()) << "rank " << rank;
    }
    EXPECT_GT(writes, 0u) << (exchange ? "exchange" : "full_tensor");
    // plan.json too: scales, endpoints and names that need escaping.
    ASSERT_TRUE(std::any_of(table->destinations.begin(), table->destinations.end(),
                            [](const DestTensor& d) { return d.has_scale; }));
    EXPECT_EQ(PlanToText(*table), PlanToJson(*table).dump());
    table->destinations.at(0).name = "dst \"\u00e9\"";
    table->sources.at(0).name = "src\\\t";
    table->mesh_groups.at(0).name = "g\u00e9";
    EXPECT_EQ(PlanToText(*table), PlanToJson(*table).dump());
  }
  auto table = Plan(c.trainer, c.inference, c.mapping, Exchange());
  ASSERT_TRUE(table.ok()) << table.status().message();
  InferenceRankPlan incoming = ExtractInferenceRankPlan(*table, 0);
  ASSERT_FALSE(incoming.writes.empty());
  EXPECT_EQ(ToJsonText(incoming), ToJson(incoming).dump());
  incoming.writes[0].tensor = "w\\\u00e9";
  EXPECT_EQ(ToJsonText(incoming), ToJson(incoming).dump());
  // Several members written as text, before, between and after the tree's.
  const nlohmann::json whole = {{"b", 1}, {"d", {2, 3}}, {"a", "x"}, {"c", {{"k", true}}}, {"e", nullptr}};
  EXPECT_EQ(ObjectTextWith({{"b", 1}, {"d", {2, 3}}}, {{"a", "\"x\""}, {"c", "{\"k\":true}"}, {"e", "null"}}),
            whole.dump());
}

}  // namespace
}  // namespace wsync
