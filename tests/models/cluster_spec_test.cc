// Cluster spec loading and the one-line errors a user gets for a bad one.
#include <gtest/gtest.h>

#include "models/generate.h"
#include "tests/models/test_paths.h"

namespace wsync {
namespace {

nlohmann::json TinyCluster() {
  return nlohmann::json::parse(R"({
    "schema": "wsync.cluster/v1", "name": "t",
    "model": "configs/models/tiny-moe.json", "mapping": "configs/mappings/qwen3_moe.json",
    "trainer": {"gpus": 4, "gpus_per_node": 4, "nics_per_node": 2, "fsdp": 2, "pp": 1,
                "ep": 2, "dtype": "bf16", "expert_layout": "stacked"},
    "inference": {"gpus": 2, "gpus_per_node": 4, "nics_per_node": 2,
                  "gpus_per_instance": 2, "tp": 2, "ep": 1, "dtype": "bf16"}})");
}

TEST(ClusterSpec, LoadsReferenceExampleWithPathsRelativeToItsFolder) {
  auto c = LoadClusterSpec(test::ExampleCluster("kimi-k2-256x128"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->trainer.gpus, 256);
  EXPECT_EQ(c->trainer.fsdp, 16);
  EXPECT_EQ(c->trainer.pp, 2);
  EXPECT_EQ(c->trainer.ep, 8);
  EXPECT_EQ(c->inference.dtype, DType::kFP8E4M3);
  EXPECT_EQ(c->inference.gpus_per_instance, 16);
  EXPECT_EQ(c->model_path, test::SourcePath("configs/models/kimi-k2.json"));
  EXPECT_EQ(c->mapping_path, test::SourcePath("configs/mappings/deepseek_v3.json"));
}

TEST(ClusterSpec, RoundTripsThroughJson) {
  auto c = ParseClusterSpec(TinyCluster(), "", "c.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto again = ParseClusterSpec(ClusterSpecToJson(*c), "", "c.json");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(ClusterSpecToJson(*again), ClusterSpecToJson(*c));
}

TEST(ClusterSpec, TypoInKeyIsAnError) {
  nlohmann::json j = TinyCluster();
  j["trainer"]["fsdb"] = 2;
  auto c = ParseClusterSpec(j, "", "c.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "c.json: trainer: unknown key \"fsdb\"");
}

TEST(ClusterSpec, BadDtypeNamesTheChoices) {
  nlohmann::json j = TinyCluster();
  j["inference"]["dtype"] = "int4";
  auto c = ParseClusterSpec(j, "", "c.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("use bf16, fp16, fp32 or fp8_e4m3"), std::string::npos);
}

StatusOr<GeneratedSpecs> GenerateTiny(const nlohmann::json& j) {
  auto c = ParseClusterSpec(j, WSYNC_SOURCE_DIR, "c.json");
  if (!c.ok()) return c.status();
  auto config = nlohmann::json::parse(R"({"architectures": ["Qwen3MoeForCausalLM"],
      "head_dim": 16, "hidden_size": 64, "intermediate_size": 128, "model_type": "qwen3_moe",
      "moe_intermediate_size": 48, "num_attention_heads": 4, "num_experts": 6,
      "num_hidden_layers": 3, "num_key_value_heads": 1, "vocab_size": 250})");
  return GenerateSpecs(config, *c);
}

TEST(ClusterSpec, GpuCountMustMatchParallelism) {
  nlohmann::json j = TinyCluster();
  j["trainer"]["gpus"] = 8;
  auto s = GenerateTiny(j);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(),
            "cluster 't': trainer: gpus (8) must equal fsdp*pp*ep (4)");
}

TEST(ClusterSpec, InstanceMustBeOneTpGroup) {
  nlohmann::json j = TinyCluster();
  j["inference"]["tp"] = 1;
  auto s = GenerateTiny(j);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("tp (1) must equal gpus_per_instance (2)"),
            std::string::npos);
}

TEST(ClusterSpec, UnsupportedArchitectureIsNamed) {
  auto c = ParseClusterSpec(TinyCluster(), WSYNC_SOURCE_DIR, "c.json");
  ASSERT_TRUE(c.ok());
  auto s = GenerateSpecs(nlohmann::json{{"architectures", {"MistralForCausalLM"}}}, *c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("unsupported architecture 'MistralForCausalLM'"),
            std::string::npos);
}

}  // namespace
}  // namespace wsync
