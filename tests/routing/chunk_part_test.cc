// Parts that read a piece of their source: `chunk` (transformers 5.x fused
// experts gate_up_proj [E, 2I, H] into vLLM's w13_weight, split per half
// under TP, whole per expert range under EP) and `rope_interleaved_heads`
// (torchtitan Llama wq/wk rows into HF order). Expected destination
// elements come from layouts written out here (vLLM's per-half TP cut,
// torchtitan's own permute), checked against the independent checker's
// byte origins, plus exact ops for a few cases and the one-line errors.
#include <algorithm>
#include <functional>
#include <map>
#include <numeric>

#include <gtest/gtest.h>

#include "routing/planner.h"
#include "routing/spec_io.h"
#include "tests/routing/test_specs.h"

namespace wsync {
namespace {

using testing::TorchChunks;

// Source element (source index, flat index) that destination element `l`
// must hold, for every element of one destination tensor.
using Expect = std::function<std::pair<std::string, std::vector<int64_t>>(const std::vector<int64_t>&)>;

// Plans, runs the independent checker and compares every destination's
// element origins with `expect[d]` (destinations in inference order).
void PlanAndCompare(const TrainerSpec& trainer, const InferenceSpec& inference, const MappingSpec& mapping,
                    const std::vector<Expect>& expect, RoutingTable* out = nullptr, bool exchange = true) {
  PlanOptions options;
  options.exchange = exchange;
  options.min_shard_piece_bytes = 0;
  auto table = Plan(trainer, inference, mapping, options);
  ASSERT_TRUE(table.ok()) << table.status().message();
  auto check = testing::CheckPlan(trainer, inference, *table);
  ASSERT_EQ(check.error, "");
  std::map<std::string, std::pair<int32_t, const TrainerParam*>> src;
  for (size_t i = 0; i < table->sources.size(); ++i)
    for (const TrainerParam& p : trainer.ranks[0].params)
      if (p.name == table->sources[i].name) src[p.name] = {static_cast<int32_t>(i), &p};
  size_t dst = 0;
  for (const InferenceRank& rank : inference.ranks) {
    for (const InferenceTensor& t : rank.tensors) {
      ASSERT_LT(dst, expect.size());
      std::vector<int64_t> l(t.shape.size(), 0);
      for (size_t flat = 0; flat < check.origin[dst].size(); ++flat) {
        auto [name, g] = expect[dst](l);
        const auto& [index, p] = src.at(name);
        int64_t gflat = 0;
        for (size_t d = 0; d < g.size(); ++d) gflat = gflat * p->global_shape[d] + g[d];
        ASSERT_EQ(check.origin[dst][flat], std::make_pair(index, gflat))
            << "rank " << rank.rank << " tensor " << t.name << " element " << flat;
        for (size_t d = l.size(); d-- > 0;) {
          if (++l[d] < t.shape[d]) break;
          l[d] = 0;
        }
      }
      ++dst;
    }
  }
  if (out) *out = std::move(table).value();
}

MappingPart Chunked(const std::string& source, int64_t index, int64_t count) {
  MappingPart p{source, 0, std::nullopt};
  p.chunk = MappingPart::Chunk{1, index, count};
  return p;
}

// transformers 5.x experts on a [fsdp 2, ep 2] mesh, Shard(1), Shard(0):
// after gathering fsdp, ranks 0 and 2 hold experts [0, E/2), 1 and 3 the rest.
TrainerSpec FusedTrainer(int64_t E, int64_t I, int64_t H) {
  return testing::BuildTrainer(
      {{"experts", {2, 2}, {"fsdp", "ep"}}}, {{"experts", "experts", {"fsdp"}}},
      {{"experts.gate_up_proj", {E, 2 * I, H}, DType::kBF16, "experts", {Placement::Shard(1), Placement::Shard(0)}},
       {"experts.down_proj", {E, H, I}, DType::kBF16, "experts", {Placement::Shard(1), Placement::Shard(0)}}});
}

MappingSpec FusedMapping() {
  MappingSpec m;
  m.name = "fused";
  m.rules.push_back({MappingRule::Kind::kStackExperts, "w13_weight",
                     {Chunked("experts.gate_up_proj", 0, 2), Chunked("experts.gate_up_proj", 1, 2)}, 0});
  m.rules.push_back(
      {MappingRule::Kind::kStackExperts, "w2_weight", {{"experts.down_proj", 0, std::nullopt}}, 0});
  m.quant.push_back(QuantRule{});
  return m;
}

// vLLM's w13 on TP rank r of T: per expert, gate rows chunk r, then up rows
// chunk r; w2 columns chunk r.
InferenceSpec TpEngine(int64_t E, int64_t I, int64_t H, int64_t T, DType dtype, std::vector<Expect>* expect) {
  InferenceSpec spec;
  for (int64_t r = 0; r < T; ++r) {
    InferenceRank rank;
    rank.rank = static_cast<int32_t>(r);
    rank.host = "infer-0";
    rank.gpu = rank.nic = static_cast<int32_t>(r);
    const TpSlice tp13{1, static_cast<int32_t>(r), static_cast<int32_t>(T)};
    const TpSlice tp2{2, static_cast<int32_t>(r), static_cast<int32_t>(T)};
    auto [off, rows] = TorchChunks(I, T)[r];
    testing::AddTensor(&rank, "w13_weight", {E, 2 * rows, H}, dtype, tp13);
    testing::AddTensor(&rank, "w2_weight", {E, H, rows}, dtype, tp2);
    const int64_t o = off, n = rows, inter = I;
    expect->push_back([o, n, inter](const std::vector<int64_t>& l) {
      const bool up = l[1] >= n;
      return std::make_pair(std::string("experts.gate_up_proj"),
                            std::vector<int64_t>{l[0], (up ? inter : 0) + o + (up ? l[1] - n : l[1]), l[2]});
    });
    expect->push_back([o](const std::vector<int64_t>& l) {
      return std::make_pair(std::string("experts.down_proj"), std::vector<int64_t>{l[0], l[1], l[2] + o});
    });
    spec.ranks.push_back(std::move(rank));
  }
  return spec;
}

// Expert parallel: rank r holds experts `ranges[r]` of both tensors whole.
InferenceSpec EpEngine(int64_t I, int64_t H, const std::vector<ExpertRange>& ranges, DType dtype,
                       std::vector<Expect>* expect) {
  InferenceSpec spec;
  for (size_t r = 0; r < ranges.size(); ++r) {
    InferenceRank rank;
    rank.rank = static_cast<int32_t>(r);
    rank.host = "infer-0";
    rank.gpu = rank.nic = static_cast<int32_t>(r);
    const int64_t n = ranges[r].end - ranges[r].start, s = ranges[r].start;
    testing::AddTensor(&rank, "w13_weight", {n, 2 * I, H}, dtype, std::nullopt, ranges[r]);
    testing::AddTensor(&rank, "w2_weight", {n, H, I}, dtype, std::nullopt, ranges[r]);
    for (const char* name : {"experts.gate_up_proj", "experts.down_proj"}) {
      const std::string src = name;
      expect->push_back([src, s](const std::vector<int64_t>& l) {
        return std::make_pair(src, std::vector<int64_t>{l[0] + s, l[1], l[2]});
      });
    }
    spec.ranks.push_back(std::move(rank));
  }
  return spec;
}

struct OpView {
  std::vector<int64_t> offset, size;
  uint64_t dst_offset, bytes;
  uint32_t planes = 1;  // a strided op: planes along plane_dim, plane_stride apart
  int32_t plane_dim = -1;
  uint64_t plane_stride = 0;
  bool operator==(const OpView&) const = default;
};
std::ostream& operator<<(std::ostream& os, const OpView& v) {
  os << "off[";
  for (auto x : v.offset) os << x << ",";
  os << "] size[";
  for (auto x : v.size) os << x << ",";
  os << "] @" << v.dst_offset << " +" << v.bytes;
  if (v.planes > 1) os << " x" << v.planes << " planes (dim " << v.plane_dim << ", stride " << v.plane_stride << ")";
  return os;
}

std::vector<OpView> Ops(const RoutingTable& t, int32_t rank, const std::string& name, WriteKind kind) {
  std::vector<OpView> out;
  for (const WriteOp& op : t.ops) {
    const DestTensor& d = t.destinations[op.dst];
    if (d.rank != rank || d.name != name || op.kind != kind) continue;
    OpView v{{}, {}, op.dst_offset, op.bytes, op.planes, op.plane_dim, op.plane_stride};
    for (int i = 0; i < op.src_box.ndim; ++i) {
      v.offset.push_back(op.src_box.offset[i]);
      v.size.push_back(op.src_box.size[i]);
    }
    out.push_back(v);
  }
  std::sort(out.begin(), out.end(), [](const OpView& a, const OpView& b) { return a.dst_offset < b.dst_offset; });
  return out;
}

TEST(ChunkPartTest, FusedGateUpUnderTpLandsAsGateChunkThenUpChunkPerExpert) {
  const int64_t E = 4, I = 6, H = 5;
  for (int64_t T : {1, 2, 3}) {
    SCOPED_TRACE("tp " + std::to_string(T));
    std::vector<Expect> expect;
    InferenceSpec engine = TpEngine(E, I, H, T, DType::kBF16, &expect);
    PlanAndCompare(FusedTrainer(E, I, H), engine, FusedMapping(), expect);
  }
}

TEST(ChunkPartTest, TpRankOneGetsRowsThreeToSixOfEachHalfPerExpert) {
  // I = 6 over TP 2: rank 1 holds gate rows [3, 6) and up rows [6+3, 6+6)
  // of every expert; each (expert, half) is one 3x5 bf16 run of 30 bytes,
  // and the exchange cuts at the trainer's FSDP shard edge (experts [0, 2)
  // and [2, 4)): per shard and half, one strided op of a plane per expert,
  // 60 bytes apart (an expert's 6 rows of 5 at the destination).
  const int64_t E = 4, I = 6, H = 5;
  std::vector<Expect> expect;
  InferenceSpec engine = TpEngine(E, I, H, 2, DType::kBF16, &expect);
  RoutingTable table;
  PlanAndCompare(FusedTrainer(E, I, H), engine, FusedMapping(), expect, &table);
  EXPECT_EQ(Ops(table, 1, "w13_weight", WriteKind::kWeight),
            (std::vector<OpView>{{{0, 3, 0}, {2, 3, 5}, 0, 60, 2, 0, 60},
                                 {{0, 9, 0}, {2, 3, 5}, 30, 60, 2, 0, 60},
                                 {{2, 3, 0}, {2, 3, 5}, 120, 60, 2, 0, 60},
                                 {{2, 9, 0}, {2, 3, 5}, 150, 60, 2, 0, 60}}));
  // The full_tensor plan keeps a plain write per run.
  PlanAndCompare(FusedTrainer(E, I, H), engine, FusedMapping(), expect, &table, /*exchange=*/false);
  std::vector<OpView> want;
  for (int64_t e = 0; e < E; ++e) {
    want.push_back({{e, 3, 0}, {1, 3, 5}, static_cast<uint64_t>(e * 60), 30});
    want.push_back({{e, 9, 0}, {1, 3, 5}, static_cast<uint64_t>(e * 60 + 30), 30});
  }
  EXPECT_EQ(Ops(table, 1, "w13_weight", WriteKind::kWeight), want);
}

TEST(ChunkPartTest, FusedGateUpUnderEpGoesWholeOneWritePerExpertRangeAndHolder) {
  const int64_t E = 4, I = 6, H = 5;
  std::vector<Expect> expect;
  // Rank 0: experts [0, 2) (one trainer holder); rank 1: [1, 4) spans both
  // EP slices of the trainer (experts [0, 2) and [2, 4)).
  InferenceSpec engine = EpEngine(I, H, {{0, 2}, {1, 4}}, DType::kBF16, &expect);
  RoutingTable table;
  // The full_tensor plan's writes (the planned exchange cuts at FSDP shard
  // edges as well; see PlannerGoldenTest's exchange cases).
  PlanAndCompare(FusedTrainer(E, I, H), engine, FusedMapping(), expect, &table, /*exchange=*/false);
  EXPECT_EQ(Ops(table, 0, "w13_weight", WriteKind::kWeight),
            (std::vector<OpView>{{{0, 0, 0}, {2, 12, 5}, 0, 2 * 12 * 5 * 2}}));
  EXPECT_EQ(Ops(table, 1, "w13_weight", WriteKind::kWeight),
            (std::vector<OpView>{{{1, 0, 0}, {1, 12, 5}, 0, 12 * 5 * 2},
                                 {{2, 0, 0}, {2, 12, 5}, 12 * 5 * 2, 2 * 12 * 5 * 2}}));
}

TEST(ChunkPartTest, Fp8ScalesOfEachHalfComeFromTheFusedSourcesBlockGrid) {
  // I = 256, TP 2: rank 1 holds gate rows [128, 256) = block row 1 and up
  // rows [384, 512) = block row 3 of the source's [E, 4, 1] grid; its own
  // grid is [E, 2, 1].
  const int64_t E = 2, I = 256, H = 128;
  for (bool ep : {false, true}) {
    SCOPED_TRACE(ep ? "ep" : "tp");
    std::vector<Expect> expect;
    InferenceSpec engine = ep ? EpEngine(I, H, {{0, 1}, {1, 2}}, DType::kFP8E4M3, &expect)
                              : TpEngine(E, I, H, 2, DType::kFP8E4M3, &expect);
    RoutingTable table;
    PlanAndCompare(FusedTrainer(E, I, H), engine, FusedMapping(), expect, &table, /*exchange=*/false);
    if (ep) {
      EXPECT_EQ(Ops(table, 1, "w13_weight", WriteKind::kScale),
                (std::vector<OpView>{{{1, 0, 0}, {1, 4, 1}, 0, 16}}));
    } else {
      std::vector<OpView> want;
      for (int64_t e = 0; e < E; ++e) {
        want.push_back({{e, 1, 0}, {1, 1, 1}, static_cast<uint64_t>(e * 8), 4});
        want.push_back({{e, 3, 0}, {1, 1, 1}, static_cast<uint64_t>(e * 8 + 4), 4});
      }
      EXPECT_EQ(Ops(table, 1, "w13_weight", WriteKind::kScale), want);
    }
  }
}

Status PlanStatus(const TrainerSpec& t, const InferenceSpec& i, const MappingSpec& m) {
  PlanOptions opt;
  opt.inference_source = "inference.json";
  opt.mapping_source = "mapping.json";
  auto table = Plan(t, i, m, opt);
  return table.ok() ? Status::Ok() : table.status();
}

void ExpectOneLineWith(const Status& s, std::initializer_list<const char*> fragments) {
  ASSERT_FALSE(s.ok());
  for (const char* f : fragments) EXPECT_NE(s.message().find(f), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
}

TEST(ChunkPartTest, ChunkThatDoesNotDivideItsDimIsOneErrorLine) {
  const int64_t E = 4, I = 6, H = 5;
  std::vector<Expect> expect;
  InferenceSpec engine = EpEngine(I, H, {{0, 4}}, DType::kBF16, &expect);
  MappingSpec m = FusedMapping();
  m.rules[0].parts[0].chunk->count = 5;  // 12 rows into 5 pieces
  m.rules[0].parts[1].chunk->count = 5;
  ExpectOneLineWith(PlanStatus(FusedTrainer(E, I, H), engine, m),
                    {"inference.json: rank 0: tensor 'w13_weight'", "source 'experts.gate_up_proj' [4, 12, 5]",
                     "chunk {dim 1, index 0, count 5}", "dim 1 (12) does not divide into 5 equal pieces",
                     "rule 'w13_weight' of mapping.json"});
}

TEST(ChunkPartTest, ChunkOnADimTheSourceLacksIsOneErrorLine) {
  std::vector<Expect> expect;
  InferenceSpec engine = EpEngine(6, 5, {{0, 4}}, DType::kBF16, &expect);
  MappingSpec m = FusedMapping();
  m.rules[0].parts[0].chunk->dim = 3;
  ExpectOneLineWith(PlanStatus(FusedTrainer(4, 6, 5), engine, m),
                    {"tensor 'w13_weight'", "chunk {dim 3, index 0, count 2} names a dim the source does not have"});
}

TEST(ChunkPartTest, TpCutInsideAnFp8BlockOfAHalfIsOneErrorLine) {
  // I = 128 over TP 2 cuts each half at row 64: inside a 128-row block.
  std::vector<Expect> expect;
  InferenceSpec engine = TpEngine(2, 128, 128, 2, DType::kFP8E4M3, &expect);
  ExpectOneLineWith(PlanStatus(FusedTrainer(2, 128, 128), engine, FusedMapping()),
                    {"tensor 'w13_weight'", "fp8 block boundary", "multiple of 128"});
}

TEST(ChunkPartTest, JsonChunkParsesRoundTripsAndRejectsBadRanges) {
  const nlohmann::json good = nlohmann::json::parse(R"({
    "schema": "wsync.mapping/v1", "name": "m",
    "rules": [
      {"engine": "w13_weight", "stack_experts": {"dim": 0, "parts": [
         {"source": "gu", "expert_dim": 0, "chunk": {"dim": 1, "index": 0, "count": 2}},
         {"source": "gu", "expert_dim": 0, "chunk": {"dim": 1, "index": 1, "count": 2}}]}},
      {"engine": "q", "source": "qkv", "chunk": {"dim": 0, "index": 0, "count": 3}}]})");
  auto m = ParseMappingSpec(good, "m.json");
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_TRUE(m->rules[0].parts[1].chunk.has_value());
  EXPECT_EQ(m->rules[0].parts[1].chunk->index, 1);
  EXPECT_EQ(m->rules[0].parts[1].chunk->count, 2);
  EXPECT_EQ(m->rules[1].parts[0].chunk->count, 3);
  auto again = ParseMappingSpec(ToJson(*m), "m.json");
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(ToJson(*again), ToJson(*m));

  auto with = [&](const char* chunk) {
    nlohmann::json j = good;
    j["rules"][0]["stack_experts"]["parts"][0]["chunk"] = nlohmann::json::parse(chunk);
    auto r = ParseMappingSpec(j, "m.json");
    return r.ok() ? Status::Ok() : r.status();
  };
  ExpectOneLineWith(with(R"({"dim": 1, "index": 2, "count": 2})"),
                    {"m.json: rules[0] 'w13_weight'", "chunk index 2 of count 2"});
  ExpectOneLineWith(with(R"({"dim": 1, "index": 0, "count": 0})"), {"chunk index 0 of count 0"});
  ExpectOneLineWith(with(R"({"dim": 1, "index": 0})"), {"chunk", "missing key 'count'"});
  ExpectOneLineWith(with(R"({"dim": 1, "index": 0, "count": 2, "step": 1})"), {"chunk", "unknown key 'step'"});
}

// --------------------------------------------------- rope_interleaved_heads --

// torchtitan's Llama3StateDictAdapter._permute, written out: HF row order is
// w.view(heads, hd/2, 2, cols).transpose(1, 2).reshape(rows, cols) of the
// torchtitan weight; returns, per HF row, the torchtitan row.
std::vector<int64_t> HfRowsFromTorchtitan(int64_t heads, int64_t hd) {
  std::vector<int64_t> tt(heads * hd);
  std::iota(tt.begin(), tt.end(), 0);  // tt[h][i][j] at h*hd + 2i + j
  std::vector<int64_t> hf;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < 2; ++j)          // transposed: [h][j][i]
      for (int64_t i = 0; i < hd / 2; ++i) hf.push_back(tt[h * hd + i * 2 + j]);
  return hf;
}

TEST(RopeRowsTest, TorchtitanWqWkRowsLandInHfOrderPerTpRank) {
  // 4 q heads and 2 kv heads of 4 rows, 3 columns; TP 1, 2 and 4 (at 4 the
  // kv heads are replicated: shards 2).
  const int64_t heads = 4, kv = 2, hd = 4, C = 3;
  TrainerSpec trainer = testing::BuildTrainer(
      {{"m", {2}, {"fsdp"}}}, {{"g", "m", {"fsdp"}}},
      {{"wq", {heads * hd, C}, DType::kBF16, "g", {Placement::Shard(0)}},
       {"wk", {kv * hd, C}, DType::kBF16, "g", {Placement::Shard(0)}},
       {"wv", {kv * hd, C}, DType::kBF16, "g", {Placement::Shard(0)}}});
  MappingSpec m;
  MappingPart q{"wq", std::nullopt, std::nullopt}, k{"wk", std::nullopt, kv}, v{"wv", std::nullopt, kv};
  q.rope_interleaved_heads = heads;
  k.rope_interleaved_heads = kv;
  m.rules.push_back({MappingRule::Kind::kConcat, "qkv", {q, k, v}, 0});
  const std::vector<int64_t> q_rows = HfRowsFromTorchtitan(heads, hd), k_rows = HfRowsFromTorchtitan(kv, hd);
  for (int64_t T : {1, 2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(T));
    InferenceSpec engine;
    std::vector<Expect> expect;
    for (int64_t r = 0; r < T; ++r) {
      InferenceRank rank;
      rank.rank = static_cast<int32_t>(r);
      rank.host = "infer-0";
      const int64_t qn = heads * hd / T, kv_piece = r * kv / T;  // replicated below kv
      const int64_t kn = T <= kv ? kv * hd / T : hd, ko = T <= kv ? r * kn : kv_piece * hd;
      testing::AddTensor(&rank, "qkv", {qn + 2 * kn, C}, DType::kBF16,
                         TpSlice{0, static_cast<int32_t>(r), static_cast<int32_t>(T)});
      const int64_t qo = r * qn;
      expect.push_back([=](const std::vector<int64_t>& l) {
        if (l[0] < qn) return std::make_pair(std::string("wq"), std::vector<int64_t>{q_rows[qo + l[0]], l[1]});
        if (l[0] < qn + kn)
          return std::make_pair(std::string("wk"), std::vector<int64_t>{k_rows[ko + l[0] - qn], l[1]});
        return std::make_pair(std::string("wv"), std::vector<int64_t>{ko + l[0] - qn - kn, l[1]});
      });
      engine.ranks.push_back(std::move(rank));
    }
    PlanAndCompare(trainer, engine, m, expect);
  }
}

TEST(RopeRowsTest, Fp8DestinationAndATpCutInsideAHeadAreOneErrorLineEach) {
  TrainerSpec trainer = testing::BuildTrainer({{"m", {1}, {"fsdp"}}}, {{"g", "m", {"fsdp"}}},
                                              {{"wq", {256, 128}, DType::kBF16, "g", {Placement::Shard(0)}}});
  MappingSpec m;
  MappingPart q{"wq", std::nullopt, std::nullopt};
  q.rope_interleaved_heads = 2;
  m.rules.push_back({MappingRule::Kind::kDirect, "q", {q}, 0});
  m.quant.push_back(QuantRule{});
  InferenceSpec fp8;
  fp8.ranks.resize(1);
  fp8.ranks[0].rank = 0;
  fp8.ranks[0].host = "infer-0";
  testing::AddTensor(&fp8.ranks[0], "q", {256, 128}, DType::kFP8E4M3);
  ExpectOneLineWith(PlanStatus(trainer, fp8, m),
                    {"tensor 'q'", "source 'wq': rope_interleaved_heads 2", "one write per row", "bf16 engine"});
  InferenceSpec tp4;  // 2 heads of 128 rows over TP 4: 64-row pieces
  for (int32_t r = 0; r < 4; ++r) {
    InferenceRank rank;
    rank.rank = r;
    rank.host = "infer-0";
    testing::AddTensor(&rank, "q", {64, 128}, DType::kBF16, TpSlice{0, r, 4});
    tp4.ranks.push_back(std::move(rank));
  }
  ExpectOneLineWith(PlanStatus(trainer, tp4, m),
                    {"rank 0: tensor 'q'", "rows [0, 64) cut a head of 128 rows"});
}

}  // namespace
}  // namespace wsync
