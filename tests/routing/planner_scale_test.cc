// The reference case of issue 2: Kimi-K2 (1 T params, 61 layers, 60 MoE x
// 384 experts, MLA attention) from 256 trainer ranks (PP 2 x FSDP 16 x EP 8,
// BF16) to 128 inference ranks (16 replicas x TP 8 attention / EP 8 experts,
// FP8 with block scales). Built as structs, like the model generator does.
// Prints the planning time (no timed assertion: `wsync bench plan` is the
// benchmark); asserts the plan covers every destination byte.
#include <chrono>
#include <cstdio>
#include <ctime>

#include <gtest/gtest.h>

#include "routing/chunking.h"
#include "routing/planner.h"
#include "tests/routing/test_specs.h"

namespace wsync {
namespace {

constexpr int64_t kHidden = 7168, kExperts = 384, kMoeInter = 2048, kDenseInter = 18432;
constexpr int64_t kVocab = 163840, kLayers = 61;

struct P {
  std::string name;
  Shape shape;
  DType dtype;
  bool expert;
};

std::vector<P> LayerParams(int64_t l) {
  const std::string a = "model.layers." + std::to_string(l) + ".";
  std::vector<P> p = {
      {a + "self_attn.q_a_proj.weight", {1536, kHidden}, DType::kBF16, false},
      {a + "self_attn.q_a_layernorm.weight", {1536}, DType::kBF16, false},
      {a + "self_attn.q_b_proj.weight", {64 * 192, 1536}, DType::kBF16, false},
      {a + "self_attn.kv_a_proj_with_mqa.weight", {576, kHidden}, DType::kBF16, false},
      {a + "self_attn.kv_a_layernorm.weight", {512}, DType::kBF16, false},
      {a + "self_attn.kv_b_proj.weight", {64 * 256, 512}, DType::kBF16, false},
      {a + "self_attn.o_proj.weight", {kHidden, 64 * 128}, DType::kBF16, false},
      {a + "input_layernorm.weight", {kHidden}, DType::kBF16, false},
      {a + "post_attention_layernorm.weight", {kHidden}, DType::kBF16, false}};
  if (l == 0) {
    p.push_back({a + "mlp.gate_proj.weight", {kDenseInter, kHidden}, DType::kBF16, false});
    p.push_back({a + "mlp.up_proj.weight", {kDenseInter, kHidden}, DType::kBF16, false});
    p.push_back({a + "mlp.down_proj.weight", {kHidden, kDenseInter}, DType::kBF16, false});
  } else {
    p.push_back({a + "mlp.gate.weight", {kExperts, kHidden}, DType::kBF16, false});
    p.push_back({a + "mlp.gate.e_score_correction_bias", {kExperts}, DType::kFP32, false});
    p.push_back({a + "mlp.shared_experts.gate_proj.weight", {kMoeInter, kHidden}, DType::kBF16, false});
    p.push_back({a + "mlp.shared_experts.up_proj.weight", {kMoeInter, kHidden}, DType::kBF16, false});
    p.push_back({a + "mlp.shared_experts.down_proj.weight", {kHidden, kMoeInter}, DType::kBF16, false});
    p.push_back({a + "mlp.experts.w1", {kExperts, kMoeInter, kHidden}, DType::kBF16, true});
    p.push_back({a + "mlp.experts.w3", {kExperts, kMoeInter, kHidden}, DType::kBF16, true});
    p.push_back({a + "mlp.experts.w2", {kExperts, kHidden, kMoeInter}, DType::kBF16, true});
  }
  return p;
}

TrainerSpec KimiTrainer() {
  TrainerSpec spec;
  for (int pp = 0; pp < 2; ++pp) {
    const std::string s = "pp" + std::to_string(pp);
    spec.mesh_groups.push_back({s + "/dense", s + "/dense", {"fsdp"}});
    spec.mesh_groups.push_back({s + "/experts", s + "/experts", {"fsdp"}});
  }
  std::vector<std::vector<P>> stage(2);
  for (int64_t l = 0; l < kLayers; ++l)
    for (P& p : LayerParams(l)) stage[l <= 30 ? 0 : 1].push_back(p);
  stage[0].insert(stage[0].begin(), {"model.embed_tokens.weight", {kVocab, kHidden}, DType::kBF16, false});
  stage[1].push_back({"model.norm.weight", {kHidden}, DType::kBF16, false});
  stage[1].push_back({"lm_head.weight", {kVocab, kHidden}, DType::kBF16, false});
  std::vector<Range> ranges;
  for (int32_t r = 0; r < 256; ++r) {
    const int pp = r / 128, local = r % 128;
    const std::string s = "pp" + std::to_string(pp);
    TrainerRank rank;
    rank.rank = r;
    rank.host = "trainer-" + std::to_string(r / 8);
    rank.gpu = r % 8;
    rank.nic = r % 8;
    MeshCoord dense{s + "/dense", {128}, {"fsdp"}, {local}};
    MeshCoord experts{s + "/experts", {16, 8}, {"fsdp", "ep"}, {local / 8, local % 8}};
    for (const P& p : stage[pp]) {
      const MeshCoord& m = p.expert ? experts : dense;
      TrainerParam tp;
      tp.name = p.name;
      tp.global_shape = p.shape;
      tp.dtype = p.dtype;
      tp.mesh = m.mesh;
      tp.mesh_group = m.mesh;
      tp.placements = p.expert ? std::vector<Placement>{Placement::Shard(1), Placement::Shard(0)}
                               : std::vector<Placement>{Placement::Shard(0)};
      LocalShard(p.shape, m.shape, m.coord, tp.placements, &ranges);
      for (const Range& x : ranges) {
        tp.local_shape.push_back(x.size);
        tp.local_offset.push_back(x.size ? x.offset : 0);
      }
      rank.params.push_back(std::move(tp));
    }
    rank.meshes = {dense, experts};
    spec.ranks.push_back(std::move(rank));
  }
  return spec;
}

InferenceSpec KimiInference() {
  InferenceSpec spec;
  const DType f8 = DType::kFP8E4M3, bf = DType::kBF16;
  for (int32_t r = 0; r < 128; ++r) {
    InferenceRank rank;
    rank.rank = r;
    rank.instance = r / 8;
    rank.host = "infer-" + std::to_string(r / 8);
    rank.gpu = r % 8;
    rank.nic = r % 8;
    const int32_t t = r % 8;
    auto tp = [t](int dim) { return std::optional<TpSlice>(TpSlice{dim, t, 8}); };
    const ExpertRange ep{48 * t, 48 * t + 48};
    testing::AddTensor(&rank, "model.embed_tokens.weight", {kVocab / 8, kHidden}, bf, tp(0));
    for (int64_t l = 0; l < kLayers; ++l) {
      const std::string a = "model.layers." + std::to_string(l) + ".";
      testing::AddTensor(&rank, a + "self_attn.fused_qkv_a_proj.weight", {1536 + 576, kHidden}, f8);
      testing::AddTensor(&rank, a + "self_attn.q_a_layernorm.weight", {1536}, bf);
      testing::AddTensor(&rank, a + "self_attn.q_b_proj.weight", {64 * 192 / 8, 1536}, f8, tp(0));
      testing::AddTensor(&rank, a + "self_attn.kv_a_layernorm.weight", {512}, bf);
      testing::AddTensor(&rank, a + "self_attn.kv_b_proj.weight", {64 * 256 / 8, 512}, f8, tp(0));
      testing::AddTensor(&rank, a + "self_attn.o_proj.weight", {kHidden, 64 * 128 / 8}, f8, tp(1));
      testing::AddTensor(&rank, a + "input_layernorm.weight", {kHidden}, bf);
      testing::AddTensor(&rank, a + "post_attention_layernorm.weight", {kHidden}, bf);
      if (l == 0) {
        testing::AddTensor(&rank, a + "mlp.gate_up_proj.weight", {2 * kDenseInter / 8, kHidden}, f8, tp(0));
        testing::AddTensor(&rank, a + "mlp.down_proj.weight", {kHidden, kDenseInter / 8}, f8, tp(1));
        continue;
      }
      testing::AddTensor(&rank, a + "mlp.gate.weight", {kExperts, kHidden}, bf);
      testing::AddTensor(&rank, a + "mlp.gate.e_score_correction_bias", {kExperts}, DType::kFP32);
      testing::AddTensor(&rank, a + "mlp.shared_experts.gate_up_proj.weight", {2 * kMoeInter / 8, kHidden}, f8, tp(0));
      testing::AddTensor(&rank, a + "mlp.shared_experts.down_proj.weight", {kHidden, kMoeInter / 8}, f8, tp(1));
      testing::AddTensor(&rank, a + "mlp.experts.w13_weight", {48, 2 * kMoeInter, kHidden}, f8, std::nullopt, ep);
      testing::AddTensor(&rank, a + "mlp.experts.w2_weight", {48, kHidden, kMoeInter}, f8, std::nullopt, ep);
    }
    testing::AddTensor(&rank, "model.norm.weight", {kHidden}, bf);
    testing::AddTensor(&rank, "lm_head.weight", {kVocab / 8, kHidden}, bf, tp(0));
    spec.ranks.push_back(std::move(rank));
  }
  return spec;
}

MappingSpec KimiMapping() {
  using K = MappingRule::Kind;
  auto part = [](std::string s, std::optional<int32_t> ed = std::nullopt) {
    return MappingPart{std::move(s), ed, std::nullopt};
  };
  const std::string L = "model.layers.{L}.";
  MappingSpec m;
  m.name = "kimi-k2";
  m.rules = {
      {K::kConcat, L + "self_attn.fused_qkv_a_proj.weight",
       {part(L + "self_attn.q_a_proj.weight"), part(L + "self_attn.kv_a_proj_with_mqa.weight")}, 0},
      {K::kConcat, L + "mlp.gate_up_proj.weight", {part(L + "mlp.gate_proj.weight"), part(L + "mlp.up_proj.weight")}, 0},
      {K::kConcat, L + "mlp.shared_experts.gate_up_proj.weight",
       {part(L + "mlp.shared_experts.gate_proj.weight"), part(L + "mlp.shared_experts.up_proj.weight")}, 0},
      {K::kStackExperts, L + "mlp.experts.w13_weight", {part(L + "mlp.experts.w1", 0), part(L + "mlp.experts.w3", 0)}, 0},
      {K::kStackExperts, L + "mlp.experts.w2_weight", {part(L + "mlp.experts.w2", 0)}, 0},
      {K::kDirect, "{*}", {part("{*}")}, 0}};
  m.quant.push_back(QuantRule{});
  return m;
}

TEST(PlannerScaleTest, KimiK2ReferenceCasePlansAndCoversEveryByte) {
  const TrainerSpec trainer = KimiTrainer();
  const InferenceSpec inference = KimiInference();
  const MappingSpec mapping = KimiMapping();
  size_t params = 0, tensors = 0;
  for (const TrainerRank& r : trainer.ranks) params += r.params.size();
  for (const InferenceRank& r : inference.ranks) tensors += r.tensors.size();
  const auto t0 = std::chrono::steady_clock::now();
  const std::clock_t c0 = std::clock();
  auto table = Plan(trainer, inference, mapping);
  const double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(table.ok()) << table.status().message();
  uint64_t want = 0, got = 0;
  for (const DestTensor& d : table->destinations) want += d.bytes + d.scale_bytes;
  std::vector<uint64_t> per_rank(trainer.ranks.size(), 0);
  for (const WriteOp& op : table->ops) {
    got += op.bytes;
    per_rank[op.src_rank] += op.bytes;
  }
  EXPECT_EQ(got, want);
  uint64_t max_rank = 0;
  for (uint64_t b : per_rank) max_rank = std::max(max_rank, b);
  std::printf("kimi-k2: %zu trainer params, %zu inference tensors -> %zu sources, %zu destinations, "
              "%zu ops, %.1f GB; plan %.3f s wall, %.3f s cpu (validation included); busiest sender %.2f GB vs mean %.2f GB\n",
              params, tensors, table->sources.size(), table->destinations.size(), table->ops.size(),
              got / 1e9, s, cpu, max_rank / 1e9, got / 1e9 / per_rank.size());
}

}  // namespace
}  // namespace wsync
