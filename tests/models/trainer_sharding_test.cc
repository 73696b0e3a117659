// Trainer shards: every rank's local shapes and offsets must be what FSDP2 /
// DTensor would give it (torch.chunk), written out here independently.
#include <map>
#include <vector>

#include <gtest/gtest.h>

#include "models/generate.h"
#include "models/mapping_file.h"
#include "tests/models/test_paths.h"

namespace wsync {
namespace {

int64_t Elements(const Shape& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}

// torch.chunk(x, k) along a length-n dim, as torch does it: pieces of
// ceil(n/k) taken from the front until nothing is left; fewer than k pieces
// come out, so the missing ones are empty.
std::vector<std::pair<int64_t, int64_t>> TorchChunkPieces(int64_t n, int64_t k) {
  std::vector<std::pair<int64_t, int64_t>> pieces;  // (offset, size)
  const int64_t step = n / k + (n % k ? 1 : 0);
  for (int64_t at = 0; at < n; at += step) pieces.push_back({at, std::min(step, n - at)});
  while (static_cast<int64_t>(pieces.size()) < k) pieces.push_back({n, 0});
  return pieces;
}

StatusOr<GeneratedSpecs> Generate(const std::string& example, int fsdp, int pp, int ep) {
  auto cluster = LoadClusterSpec(test::ExampleCluster(example));
  if (!cluster.ok()) return cluster.status();
  cluster->trainer.fsdp = fsdp;
  cluster->trainer.pp = pp;
  cluster->trainer.ep = ep;
  cluster->trainer.gpus = fsdp * pp * ep;
  auto config = ReadJsonDocument(cluster->model_path);
  if (!config.ok()) return config.status();
  return GenerateSpecs(*config, *cluster);
}

TEST(TrainerSharding, TinyMatchesTorchChunkOnEveryRank) {
  auto specs = GenerateFromClusterFile(test::ExampleCluster("tiny-moe-4x2"));
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  const TrainerSpec& t = specs->trainer;
  ASSERT_EQ(t.ranks.size(), 4u);
  for (const TrainerRank& r : t.ranks) {
    const int64_t f = r.rank / 2, e = r.rank % 2;  // fsdp 2 x ep 2, ep inner
    for (const TrainerParam& p : r.params) {
      SCOPED_TRACE(p.name + " on rank " + std::to_string(r.rank));
      Shape want_shape = p.global_shape, want_off(p.global_shape.size(), 0);
      if (p.mesh == "pp0/experts") {
        auto by_ep = TorchChunkPieces(p.global_shape[0], 2)[e];
        auto by_fsdp = TorchChunkPieces(p.global_shape[1], 2)[f];
        want_off[0] = by_ep.first;
        want_shape[0] = by_ep.second;
        want_off[1] = by_fsdp.first;
        want_shape[1] = by_fsdp.second;
      } else {
        ASSERT_EQ(p.mesh, "pp0/dense");
        auto piece = TorchChunkPieces(p.global_shape[0], 4)[r.rank];
        want_off[0] = piece.first;
        want_shape[0] = piece.second;
      }
      EXPECT_EQ(p.local_shape, want_shape);
      EXPECT_EQ(p.local_offset, want_off);
    }
  }
  // A few by hand: vocab 250 over 4 ranks is 63, 63, 63, 61.
  auto find = [&](int rank, const std::string& name) -> const TrainerParam* {
    for (const TrainerParam& p : t.ranks[rank].params) {
      if (p.name == name) return &p;
    }
    return nullptr;
  };
  const TrainerParam* emb3 = find(3, "model.embed_tokens.weight");
  ASSERT_NE(emb3, nullptr);
  EXPECT_EQ(emb3->local_shape, (Shape{61, 64}));
  EXPECT_EQ(emb3->local_offset, (Shape{189, 0}));
  // Experts [6, 48, 64]: rank 3 is fsdp 1, ep 1 -> experts 3..5, rows 24..47.
  const TrainerParam* up3 = find(3, "model.layers.2.mlp.experts.up_proj");
  ASSERT_NE(up3, nullptr);
  EXPECT_EQ(up3->local_shape, (Shape{3, 24, 64}));
  EXPECT_EQ(up3->local_offset, (Shape{3, 24, 0}));
  EXPECT_EQ(up3->placements, (std::vector<Placement>{Placement::Shard(1), Placement::Shard(0)}));
}

TEST(TrainerSharding, TrailingChunksAreEmpty) {
  // 7 ranks over a 16-wide q_norm: chunks of 3, the sixth gets 1, the
  // seventh nothing (torch.chunk returns only 6 pieces).
  auto specs = Generate("tiny-moe-4x2", /*fsdp=*/7, /*pp=*/1, /*ep=*/1);
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  const auto& ranks = specs->trainer.ranks;
  ASSERT_EQ(ranks.size(), 7u);
  std::vector<int64_t> sizes;
  for (const TrainerRank& r : ranks) {
    for (const TrainerParam& p : r.params) {
      if (p.name == "model.layers.0.self_attn.q_norm.weight") sizes.push_back(p.local_shape[0]);
    }
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{3, 3, 3, 3, 3, 1, 0}));
}

TEST(TrainerSharding, PipelineStagesSplitLayersContiguously) {
  auto specs = Generate("tiny-moe-4x2", 2, /*pp=*/2, 2);
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  const TrainerSpec& t = specs->trainer;
  ASSERT_EQ(t.ranks.size(), 8u);
  std::vector<std::string> groups;
  for (const MeshGroupSpec& g : t.mesh_groups) groups.push_back(g.name);
  EXPECT_EQ(groups, (std::vector<std::string>{"pp0/dense", "pp0/experts", "pp1/dense",
                                              "pp1/experts"}));
  EXPECT_EQ(t.mesh_groups[1].gather_dims, (std::vector<std::string>{"fsdp"}));
  EXPECT_EQ(t.mesh_groups[0].gather_dims, (std::vector<std::string>{"dp_shard"}));
  // 3 layers over 2 stages: layers 0-1 + embedding on ranks 0-3, layer 2 +
  // final norm + lm_head on ranks 4-7.
  auto has = [&](int rank, const std::string& name) {
    for (const TrainerParam& p : t.ranks[rank].params) {
      if (p.name == name) return true;
    }
    return false;
  };
  EXPECT_TRUE(has(0, "model.embed_tokens.weight"));
  EXPECT_TRUE(has(3, "model.layers.1.mlp.experts.down_proj"));
  EXPECT_FALSE(has(3, "model.layers.2.input_layernorm.weight"));
  EXPECT_TRUE(has(4, "model.layers.2.input_layernorm.weight"));
  EXPECT_TRUE(has(7, "lm_head.weight"));
  EXPECT_FALSE(has(4, "model.embed_tokens.weight"));
  EXPECT_EQ(t.ranks[5].meshes[1].mesh, "pp1/experts");
  EXPECT_EQ(t.ranks[5].meshes[1].coord, (std::vector<int64_t>{0, 1}));
}

// Summed over the ranks of its mesh, each parameter's shards cover it once.
void ExpectShardsCoverEachParamOnce(const TrainerSpec& t) {
  std::map<std::string, std::pair<int64_t, int64_t>> held;  // name -> (global, sum local)
  for (const TrainerRank& r : t.ranks) {
    for (const TrainerParam& p : r.params) {
      auto& h = held[p.name];
      h.first = Elements(p.global_shape);
      h.second += Elements(p.local_shape);
    }
  }
  for (const auto& [name, h] : held) EXPECT_EQ(h.second, h.first) << name;
}

// Each rank's share, recomputed from its mesh coordinates with the
// independent torch.chunk pieces above: the elements it holds must add up.
void ExpectEveryRankHoldsItsShare(const TrainerSpec& t) {
  for (const TrainerRank& r : t.ranks) {
    std::map<std::string, const MeshCoord*> meshes;
    for (const MeshCoord& m : r.meshes) meshes[m.mesh] = &m;
    int64_t held = 0, expected = 0;
    for (const TrainerParam& p : r.params) {
      held += Elements(p.local_shape);
      const MeshCoord* m = meshes.at(p.mesh);
      Shape box = p.global_shape;
      for (size_t d = 0; d < p.placements.size(); ++d) {
        if (p.placements[d].kind != Placement::Kind::kShard) continue;
        const int32_t dim = p.placements[d].dim;
        box[dim] = TorchChunkPieces(box[dim], m->shape[d])[m->coord[d]].second;
      }
      expected += Elements(box);
    }
    EXPECT_EQ(held, expected) << "rank " << r.rank;
  }
}

TEST(TrainerSharding, EveryExampleCoversEachParamOnceAndEachRankHoldsItsShare) {
  for (const char* ex : {"tiny-moe-4x2", "demo-moe-4x2", "llama3-8b-16x8",
                         "qwen3-235b-64x32", "deepseek-v3-128x64", "kimi-k2-256x128"}) {
    SCOPED_TRACE(ex);
    auto specs = GenerateFromClusterFile(test::ExampleCluster(ex));
    ASSERT_TRUE(specs.ok()) << specs.status().ToString();
    ExpectShardsCoverEachParamOnce(specs->trainer);
    ExpectEveryRankHoldsItsShare(specs->trainer);
  }
}

TEST(TrainerSharding, HfFusedExpertsAreOneGateUpPerLayerShardedLikeStacked) {
  // transformers 5.x: experts.gate_up_proj [E, 2I, H] (gate rows, then up
  // rows) and experts.down_proj [E, H, I], on the same [fsdp, ep] mesh with
  // Shard(1), Shard(0) as the stacked layout.
  auto cluster = LoadClusterSpec(test::ExampleCluster("tiny-moe-4x2"));
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  cluster->trainer.expert_layout = "hf_fused";
  auto config = ReadJsonDocument(cluster->model_path);
  ASSERT_TRUE(config.ok());
  auto specs = GenerateSpecs(*config, *cluster);
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  ExpectShardsCoverEachParamOnce(specs->trainer);
  ExpectEveryRankHoldsItsShare(specs->trainer);
  const TrainerRank& r3 = specs->trainer.ranks[3];  // fsdp 1, ep 1
  int fused = 0;
  for (const TrainerParam& p : r3.params) {
    EXPECT_EQ(p.name.find("experts.gate_proj"), std::string::npos) << p.name;
    EXPECT_EQ(p.name.find("experts.up_proj"), std::string::npos) << p.name;
    if (p.name != "model.layers.2.mlp.experts.gate_up_proj") continue;
    ++fused;
    // [6, 96, 64]: experts 3..5 (ep 1), rows 48..95 (fsdp 1: the up half).
    EXPECT_EQ(p.global_shape, (Shape{6, 96, 64}));
    EXPECT_EQ(p.local_shape, (Shape{3, 48, 64}));
    EXPECT_EQ(p.local_offset, (Shape{3, 48, 0}));
    EXPECT_EQ(p.mesh, "pp0/experts");
    EXPECT_EQ(p.placements, (std::vector<Placement>{Placement::Shard(1), Placement::Shard(0)}));
  }
  EXPECT_EQ(fused, 1);
}

TEST(TrainerSharding, UnknownExpertLayoutNamesTheChoices) {
  auto cluster = LoadClusterSpec(test::ExampleCluster("tiny-moe-4x2"));
  ASSERT_TRUE(cluster.ok());
  cluster->trainer.expert_layout = "fused";
  auto config = ReadJsonDocument(cluster->model_path);
  ASSERT_TRUE(config.ok());
  auto specs = GenerateSpecs(*config, *cluster);
  ASSERT_FALSE(specs.ok());
  EXPECT_NE(specs.status().message().find("\"stacked\", \"hf_fused\""), std::string::npos)
      << specs.status().message();
}

TEST(TrainerSharding, KimiReferenceLayout) {
  auto specs = GenerateFromClusterFile(test::ExampleCluster("kimi-k2-256x128"));
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  const TrainerSpec& t = specs->trainer;
  ASSERT_EQ(t.ranks.size(), 256u);
  // Rank 131: stage 1, local 3 -> fsdp 0, ep 3; node 16, GPU 3, NIC 3.
  const TrainerRank& r = t.ranks[131];
  EXPECT_EQ(r.host, "trainer-16");
  EXPECT_EQ(r.gpu, 3);
  EXPECT_EQ(r.nic, 3);
  ASSERT_EQ(r.meshes.size(), 2u);
  EXPECT_EQ(r.meshes[0].shape, (Shape{128}));
  EXPECT_EQ(r.meshes[1].shape, (Shape{16, 8}));
  EXPECT_EQ(r.meshes[1].coord, (std::vector<int64_t>{0, 3}));
  // Stage 1 holds layers 31..60: expert w1 of layer 40 is [384, 2048, 7168]
  // -> 48 experts (ep 3: 144..191) x 128 rows (fsdp 0).
  bool found = false;
  for (const TrainerParam& p : r.params) {
    if (p.name != "model.layers.40.mlp.experts.gate_proj") continue;
    found = true;
    EXPECT_EQ(p.global_shape, (Shape{384, 2048, 7168}));
    EXPECT_EQ(p.local_shape, (Shape{48, 128, 7168}));
    EXPECT_EQ(p.local_offset, (Shape{144, 0, 0}));
    EXPECT_EQ(p.mesh_group, "pp1/experts");
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace wsync
