// Every mapping file in configs/mappings/ for a real trainer's names
// (transformers 5.x fused experts, torchtitan v0.2.2, the engine's own
// names) loads and plans a generated small model, and the plan passes the
// independent checker of tests/routing (every destination byte written once
// by a rank that holds it). Both engine expert layouts are covered: TP split
// of the fused gate_up (ep 1) and whole expert ranges (ep = tp).
#include <set>

#include <gtest/gtest.h>

#include "models/generate.h"
#include "models/mapping_file.h"
#include "routing/planner.h"
#include "tests/models/test_paths.h"
#include "tests/routing/test_specs.h"

namespace wsync {
namespace {

// Small DeepSeek-V3 (MLA with q_lora_rank, one dense layer, a shared expert,
// noaux_tc router bias) whose every fp8 cut at TP 2 falls on 128.
nlohmann::json SmallDeepseek() {
  return nlohmann::json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 256,
    "num_hidden_layers": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 128,
    "kv_lora_rank": 128, "qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "v_head_dim": 64,
    "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "topk_method": "noaux_tc", "vocab_size": 1024, "tie_word_embeddings": false})");
}

nlohmann::json SmallLlama(int64_t head_dim) {
  nlohmann::json c = nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 512, "tie_word_embeddings": false})");
  c["hidden_size"] = 4 * head_dim;
  c["head_dim"] = head_dim;
  c["intermediate_size"] = 8 * head_dim;
  return c;
}

nlohmann::json ConfigFile(const std::string& name) {
  auto c = ReadJsonDocument(test::SourcePath("configs/models/" + name));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : nlohmann::json::object();
}

struct Case {
  const char* mapping;
  std::string expert_layout = "stacked";
  std::string param_names = "hf";
  int32_t tp = 2;
  int32_t ep = 1;
  DType dtype = DType::kBF16;
};

ClusterSpec Cluster(const Case& c) {
  ClusterSpec s;
  s.name = c.mapping;
  s.mapping_path = test::SourcePath(std::string("configs/mappings/") + c.mapping + ".json");
  s.trainer.gpus = 4;
  s.trainer.gpus_per_node = 4;
  s.trainer.nics_per_node = 4;
  s.trainer.fsdp = 2;
  s.trainer.ep = 2;
  s.trainer.expert_layout = c.expert_layout;
  s.trainer.param_names = c.param_names;
  s.inference.gpus = 2 * c.tp;
  s.inference.gpus_per_node = 2 * c.tp;
  s.inference.nics_per_node = 2;
  s.inference.gpus_per_instance = c.tp;
  s.inference.tp = c.tp;
  s.inference.ep = c.ep;
  s.inference.dtype = c.dtype;
  return s;
}

// Dense models have no experts: one FSDP dimension of 4.
ClusterSpec DenseCluster(const Case& c) {
  ClusterSpec s = Cluster(c);
  s.trainer.fsdp = 4;
  s.trainer.ep = 1;
  return s;
}

void GenerateAndPlan(const nlohmann::json& config, const ClusterSpec& cluster,
                     RoutingTable* out = nullptr, GeneratedSpecs* specs_out = nullptr) {
  auto specs = GenerateSpecs(config, cluster);
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  EXPECT_EQ(specs->mapping.name, cluster.name);
  auto table = Plan(specs->trainer, specs->inference, specs->mapping);
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  EXPECT_EQ(testing::CheckPlan(specs->trainer, specs->inference, *table).error, "");
  if (out) *out = std::move(table).value();
  if (specs_out) *specs_out = std::move(specs).value();
}

std::set<std::string> TrainerNames(const GeneratedSpecs& s) {
  std::set<std::string> names;
  for (const TrainerParam& p : s.trainer.ranks[0].params) names.insert(p.name);
  return names;
}

TEST(MappingFiles, HfQwen3MoeFusedExpertsIntoVllmFp8BothExpertLayouts) {
  for (int32_t ep : {1, 2}) {
    SCOPED_TRACE("ep " + std::to_string(ep));
    Case c{"hf_qwen3_moe", "hf_fused"};
    c.ep = ep;
    c.dtype = DType::kFP8E4M3;
    GeneratedSpecs specs;
    GenerateAndPlan(ConfigFile("small-moe.json"), Cluster(c), nullptr, &specs);
    EXPECT_TRUE(TrainerNames(specs).count("model.layers.0.mlp.experts.gate_up_proj"));
  }
  // Replicated kv head (1 kv head, TP 2) and a bf16 engine.
  GenerateAndPlan(ConfigFile("tiny-moe.json"), Cluster({"hf_qwen3_moe", "hf_fused"}));
}

TEST(MappingFiles, HfDeepseekV3FusedExpertsSharedExpertsAndFusedQkvA) {
  for (int32_t ep : {1, 2}) {
    SCOPED_TRACE("ep " + std::to_string(ep));
    Case c{"hf_deepseek_v3", "hf_fused"};
    c.ep = ep;
    c.dtype = DType::kFP8E4M3;
    GenerateAndPlan(SmallDeepseek(), Cluster(c));
  }
  // q_lora_rank null: plain q_proj and kv_a_proj_with_mqa, no fused_qkv_a.
  nlohmann::json no_lora = SmallDeepseek();
  no_lora["q_lora_rank"] = nullptr;
  GenerateAndPlan(no_lora, Cluster({"hf_deepseek_v3", "hf_fused"}));
}

TEST(MappingFiles, HfDeepseekV3RouterIsFp32AndItsBiasAReplicatedBuffer) {
  GeneratedSpecs specs;
  GenerateAndPlan(SmallDeepseek(), Cluster({"hf_deepseek_v3", "hf_fused"}), nullptr, &specs);
  for (const TrainerRank& r : specs.trainer.ranks) {
    for (const TrainerParam& p : r.params) {
      if (p.name == "model.layers.1.mlp.gate.e_score_correction_bias") {
        EXPECT_EQ(p.dtype, DType::kFP32);
        EXPECT_EQ(p.placements, (std::vector<Placement>{Placement::Replicate()}));
        EXPECT_EQ(p.local_shape, p.global_shape);
      }
      if (p.name == "model.layers.1.mlp.gate.weight") {
        EXPECT_EQ(p.dtype, DType::kFP32);
      }
      if (p.name == "model.layers.1.mlp.experts.gate_up_proj") {
        EXPECT_EQ(p.dtype, DType::kBF16);
      }
    }
  }
}

TEST(MappingFiles, TorchtitanQwen3StackedExpertsBothExpertLayouts) {
  for (int32_t ep : {1, 2}) {
    SCOPED_TRACE("ep " + std::to_string(ep));
    Case c{"torchtitan_qwen3"};
    c.param_names = "torchtitan";
    c.ep = ep;
    c.dtype = DType::kFP8E4M3;
    GeneratedSpecs specs;
    GenerateAndPlan(ConfigFile("small-moe.json"), Cluster(c), nullptr, &specs);
    const std::set<std::string> names = TrainerNames(specs);
    for (const char* n : {"tok_embeddings.weight", "layers.0.attention.wq.weight", "layers.1.moe.experts.w1",
                          "layers.1.moe.router.gate.weight", "layers.0.attention_norm.weight", "output.weight",
                          "layers.0.moe.expert_bias"})
      EXPECT_TRUE(names.count(n)) << n;
  }
}

TEST(MappingFiles, TorchtitanDeepseekV3WithAndWithoutQLora) {
  Case c{"torchtitan_deepseek_v3"};
  c.param_names = "torchtitan";
  c.ep = 2;
  c.dtype = DType::kFP8E4M3;
  GenerateAndPlan(SmallDeepseek(), Cluster(c));
  nlohmann::json no_lora = SmallDeepseek();
  no_lora["q_lora_rank"] = nullptr;
  c.ep = 1;
  c.dtype = DType::kBF16;
  GenerateAndPlan(no_lora, Cluster(c));
}

TEST(MappingFiles, TorchtitanLlama3IntoABf16Engine) {
  Case c{"torchtitan_llama3"};
  c.param_names = "torchtitan";
  RoutingTable table;
  GenerateAndPlan(SmallLlama(16), DenseCluster(c), &table);
  // wq and wk are written a row at a time (RoPE order differs); the rest
  // are whole boxes.
  int64_t q_rows = 0;
  for (const WriteOp& op : table.ops)
    if (table.sources[op.src].name == "layers.0.attention.wq.weight" && op.dst_rank == 0) q_rows += op.src_box.size[0];
  EXPECT_EQ(q_rows, 64 / 2);
}

TEST(MappingFiles, TorchtitanLlama3IntoAnFp8EngineIsRefusedInOneLine) {
  Case c{"torchtitan_llama3"};
  c.param_names = "torchtitan";
  c.dtype = DType::kFP8E4M3;
  auto specs = GenerateSpecs(SmallLlama(128), DenseCluster(c));
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  auto table = Plan(specs->trainer, specs->inference, specs->mapping);
  ASSERT_FALSE(table.ok());
  EXPECT_NE(table.status().message().find("rope_interleaved_heads"), std::string::npos) << table.status().message();
  EXPECT_EQ(table.status().message().find('\n'), std::string::npos);
}

// The engine keeps the trainer's own names: one engine tensor per trainer
// tensor, whole on one instance's ranks or TP-split on dim 0 on the other.
TEST(MappingFiles, IdentityPlansAnEngineWithTheTrainersNames) {
  auto specs = GenerateSpecs(ConfigFile("tiny-moe.json"), Cluster({"identity", "hf_fused"}));
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  InferenceSpec engine;
  for (int32_t r = 0; r < 3; ++r) {
    InferenceRank rank;
    rank.rank = r;
    rank.instance = r == 0 ? 0 : 1;
    rank.host = "infer-0";
    rank.gpu = rank.nic = r;
    for (const TrainerParam& p : specs->trainer.ranks[0].params) {
      Shape s = p.global_shape;
      std::optional<TpSlice> tp;
      if (r > 0 && s.size() >= 2 && s[0] % 2 == 0) {
        tp = TpSlice{0, r - 1, 2};
        s[0] /= 2;
      }
      testing::AddTensor(&rank, p.name, s, p.dtype, tp);
    }
    engine.ranks.push_back(std::move(rank));
  }
  auto table = Plan(specs->trainer, engine, specs->mapping);
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  EXPECT_EQ(testing::CheckPlan(specs->trainer, engine, *table).error, "");
}

TEST(MappingFiles, LlamaJsonIsAlreadyTheHfNames) {
  // No hf_llama.json: llama.json's sources are transformers' LlamaForCausalLM
  // names (q_proj/k_proj/v_proj, gate_proj/up_proj, the rest passed through).
  Case c{"llama"};
  GenerateAndPlan(SmallLlama(16), DenseCluster(c));
}

TEST(MappingFiles, TorchtitanNamesWithFusedExpertsIsOneErrorLine) {
  Case c{"torchtitan_qwen3", "hf_fused", "torchtitan"};
  auto specs = GenerateSpecs(ConfigFile("tiny-moe.json"), Cluster(c));
  ASSERT_FALSE(specs.ok());
  EXPECT_NE(specs.status().message().find("set expert_layout to \"stacked\""), std::string::npos)
      << specs.status().message();
}

}  // namespace
}  // namespace wsync
