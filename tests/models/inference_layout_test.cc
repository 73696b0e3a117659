// Inference layouts: vLLM's fused, TP-split and expert-split shapes, fp8
// scales, and the packed region of each rank.
#include <algorithm>
#include <map>

#include <gtest/gtest.h>

#include "models/generate.h"
#include "models/mapping_file.h"
#include "tests/models/test_paths.h"

namespace wsync {
namespace {

const InferenceTensor* Find(const InferenceRank& r, const std::string& name) {
  for (const InferenceTensor& t : r.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

TEST(InferenceLayout, TinyTpShapes) {
  auto specs = GenerateFromClusterFile(test::ExampleCluster("tiny-moe-4x2"));
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  const auto& ranks = specs->inference.ranks;
  ASSERT_EQ(ranks.size(), 2u);
  for (const InferenceRank& r : ranks) {
    SCOPED_TRACE("rank " + std::to_string(r.rank));
    EXPECT_EQ(r.instance, 0);
    // q: 4 heads x 16 -> 32 per rank; the single k and v head (16 rows
    // each) is replicated on both ranks.
    const InferenceTensor* qkv = Find(r, "model.layers.1.self_attn.qkv_proj.weight");
    ASSERT_NE(qkv, nullptr);
    EXPECT_EQ(qkv->shape, (Shape{32 + 16 + 16, 64}));
    ASSERT_TRUE(qkv->tp.has_value());
    EXPECT_EQ(qkv->tp->rank, r.rank);
    EXPECT_EQ(qkv->tp->size, 2);
    // Experts without EP: intermediate (48) split per gate/up half.
    const InferenceTensor* w13 = Find(r, "model.layers.0.mlp.experts.w13_weight");
    ASSERT_NE(w13, nullptr);
    EXPECT_EQ(w13->shape, (Shape{6, 24 + 24, 64}));
    EXPECT_EQ(w13->tp->dim, 1);
    EXPECT_FALSE(w13->experts.has_value());
    const InferenceTensor* w2 = Find(r, "model.layers.0.mlp.experts.w2_weight");
    ASSERT_NE(w2, nullptr);
    EXPECT_EQ(w2->shape, (Shape{6, 64, 24}));
    EXPECT_EQ(w2->tp->dim, 2);
    EXPECT_EQ(Find(r, "model.embed_tokens.weight")->shape, (Shape{125, 64}));
    const InferenceTensor* norm = Find(r, "model.layers.0.self_attn.k_norm.weight");
    ASSERT_NE(norm, nullptr);
    EXPECT_FALSE(norm->tp.has_value());
    EXPECT_EQ(norm->dtype, DType::kBF16);
    EXPECT_FALSE(norm->scale.has_value());
  }
}

// Tensors (and scales) lie inside the one region, 256-byte aligned, in
// increasing order without overlap.
void ExpectPacked(const InferenceRank& r) {
  ASSERT_EQ(r.regions.size(), 1u);
  const MemoryRegion& region = r.regions[0];
  EXPECT_EQ(region.descriptor, "");
  uint64_t end = 0;
  auto place = [&](const RegionRef& w, const Shape& shape, DType dtype, const std::string& name) {
    int64_t n = 1;
    for (int64_t v : shape) n *= v;
    EXPECT_EQ(w.region, region.id) << name;
    EXPECT_EQ(w.offset % 256, 0u) << name;
    EXPECT_GE(w.offset, end) << name;
    end = w.offset + static_cast<uint64_t>(n * DTypeSize(dtype));
  };
  for (const InferenceTensor& t : r.tensors) {
    place(t.where, t.shape, t.dtype, t.name);
    EXPECT_EQ(t.dtype == DType::kFP8E4M3, t.scale.has_value()) << t.name;
    if (t.scale) place(t.scale->where, t.scale->shape, t.scale->dtype, t.scale->name);
  }
  EXPECT_LE(end, region.size);
}

TEST(InferenceLayout, KimiReferenceFp8AndExperts) {
  auto specs = GenerateFromClusterFile(test::ExampleCluster("kimi-k2-256x128"));
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  const auto& ranks = specs->inference.ranks;
  ASSERT_EQ(ranks.size(), 128u);
  const InferenceRank& r = ranks[21];  // instance 1, TP/EP rank 5, node 2
  EXPECT_EQ(r.instance, 1);
  EXPECT_EQ(r.host, "infer-2");
  EXPECT_EQ(r.gpu, 5);
  ExpectPacked(r);

  const InferenceTensor* w13 = Find(r, "model.layers.1.mlp.experts.w13_weight");
  ASSERT_NE(w13, nullptr);
  EXPECT_EQ(w13->shape, (Shape{24, 4096, 7168}));  // 384 / 16 experts each
  ASSERT_TRUE(w13->experts.has_value());
  EXPECT_EQ(w13->experts->start, 120);
  EXPECT_EQ(w13->experts->end, 144);
  EXPECT_FALSE(w13->tp.has_value());
  EXPECT_EQ(w13->dtype, DType::kFP8E4M3);
  ASSERT_TRUE(w13->scale.has_value());
  EXPECT_EQ(w13->scale->name, "model.layers.1.mlp.experts.w13_weight_scale_inv");
  EXPECT_EQ(w13->scale->shape, (Shape{24, 32, 56}));

  // q_a (1536) + kv_a (512 + 64) fused, replicated: 12 + 5 scale blocks.
  const InferenceTensor* qkv_a = Find(r, "model.layers.7.self_attn.fused_qkv_a_proj.weight");
  ASSERT_NE(qkv_a, nullptr);
  EXPECT_EQ(qkv_a->shape, (Shape{2112, 7168}));
  EXPECT_FALSE(qkv_a->tp.has_value());
  EXPECT_EQ(qkv_a->scale->shape, (Shape{17, 56}));
  const InferenceTensor* q_b = Find(r, "model.layers.7.self_attn.q_b_proj.weight");
  ASSERT_NE(q_b, nullptr);
  EXPECT_EQ(q_b->shape, (Shape{64 * 192 / 16, 1536}));
  const InferenceTensor* o = Find(r, "model.layers.7.self_attn.o_proj.weight");
  EXPECT_EQ(o->shape, (Shape{7168, 64 * 128 / 16}));
  EXPECT_EQ(o->tp->dim, 1);
  // Not quantized in the published fp8 checkpoint: embeddings, lm_head,
  // norms, the router; the router bias stays fp32.
  EXPECT_EQ(Find(r, "model.embed_tokens.weight")->dtype, DType::kBF16);
  EXPECT_EQ(Find(r, "lm_head.weight")->dtype, DType::kBF16);
  EXPECT_EQ(Find(r, "model.layers.3.mlp.gate.weight")->dtype, DType::kBF16);
  EXPECT_EQ(Find(r, "model.layers.3.mlp.gate.e_score_correction_bias")->dtype, DType::kFP32);
  EXPECT_EQ(Find(r, "model.layers.3.self_attn.kv_a_layernorm.weight")->dtype, DType::kBF16);
  EXPECT_EQ(Find(r, "model.layers.0.mlp.gate_up_proj.weight")->shape,
            (Shape{2 * 18432 / 16, 7168}));
  EXPECT_EQ(Find(r, "model.layers.0.mlp.experts.w13_weight"), nullptr);  // dense layer

  // Each instance holds every expert exactly once.
  std::map<int32_t, int64_t> experts_per_instance;
  for (const InferenceRank& rank : ranks) {
    const InferenceTensor* t = Find(rank, "model.layers.60.mlp.experts.w2_weight");
    ASSERT_NE(t, nullptr);
    experts_per_instance[rank.instance] += t->experts->end - t->experts->start;
  }
  EXPECT_EQ(experts_per_instance.size(), 8u);
  for (const auto& [inst, n] : experts_per_instance) EXPECT_EQ(n, 384) << "instance " << inst;
}

TEST(InferenceLayout, KimiRankFitsAnH100ClassGpu) {
  // Why 16 GPUs per instance: ~1 TB of fp8 over 16 ranks is ~64 GB each.
  auto specs = GenerateFromClusterFile(test::ExampleCluster("kimi-k2-256x128"));
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  const uint64_t bytes = specs->inference.ranks[0].regions[0].size;
  EXPECT_GT(bytes, 60ull << 30);  // 65.5 GB
  EXPECT_LT(bytes, 72ull << 30);
}

TEST(InferenceLayout, GqaHeadsReplicatedWhenTpExceedsKvHeads) {
  // Qwen3-235B: 4 KV heads over TP 8: ranks 2r and 2r+1 share KV head r.
  auto specs = GenerateFromClusterFile(test::ExampleCluster("qwen3-235b-64x32"));
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  const InferenceRank& r = specs->inference.ranks[3];
  ExpectPacked(r);
  const InferenceTensor* qkv = Find(r, "model.layers.5.self_attn.qkv_proj.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->shape, (Shape{64 * 128 / 8 + 128 + 128, 4096}));
  EXPECT_EQ(qkv->scale->shape, (Shape{8 + 1 + 1, 32}));
  EXPECT_EQ(Find(r, "model.layers.5.mlp.experts.w2_weight")->shape, (Shape{16, 4096, 1536}));
}

TEST(InferenceLayout, EveryExamplePacksEveryRank) {
  for (const char* ex : {"tiny-moe-4x2", "demo-moe-4x2", "llama3-8b-16x8",
                         "qwen3-235b-64x32", "deepseek-v3-128x64"}) {
    SCOPED_TRACE(ex);
    auto specs = GenerateFromClusterFile(test::ExampleCluster(ex));
    ASSERT_TRUE(specs.ok()) << specs.status().ToString();
    for (const InferenceRank& r : specs->inference.ranks) ExpectPacked(r);
  }
}

TEST(InferenceLayout, Fp8CutOffBlockBoundaryIsAnError) {
  // The tiny model's q rows (64) split over TP 2 give 32-row pieces: a real
  // block-fp8 engine cannot hold them, so generation says so up front.
  auto cluster = LoadClusterSpec(test::ExampleCluster("tiny-moe-4x2"));
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  cluster->inference.dtype = DType::kFP8E4M3;
  auto config = ReadJsonDocument(cluster->model_path);
  ASSERT_TRUE(config.ok());
  auto specs = GenerateSpecs(*config, *cluster);
  ASSERT_FALSE(specs.ok());
  EXPECT_NE(specs.status().message().find(
                "fp8 tensor 'model.layers.0.self_attn.qkv_proj.weight' on TP rank 0"),
            std::string::npos)
      << specs.status().message();
}

TEST(InferenceLayout, DemoFp8ScalesCoverBlocks) {
  auto specs = GenerateFromClusterFile(test::ExampleCluster("demo-moe-4x2"));
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  for (const InferenceRank& r : specs->inference.ranks) {
    for (const InferenceTensor& t : r.tensors) {
      if (!t.scale) continue;
      const size_t n = t.shape.size();
      EXPECT_EQ(t.scale->shape[n - 2], (t.shape[n - 2] + 127) / 128) << t.name;
      EXPECT_EQ(t.scale->shape[n - 1], (t.shape[n - 1] + 127) / 128) << t.name;
    }
  }
}

}  // namespace
}  // namespace wsync
