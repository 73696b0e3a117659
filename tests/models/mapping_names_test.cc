// The mapping files in configs/mappings/ are the real ones the generator's
// names must satisfy: every engine tensor is built by a rule from trainer
// tensors that exist, and every trainer tensor is used.
#include <optional>
#include <set>

#include <gtest/gtest.h>

#include "models/generate.h"
#include "models/mapping_file.h"
#include "tests/models/test_paths.h"

namespace wsync {
namespace {

// Matches `name` against a pattern with at most one {L} (decimal digits) or
// a whole-name {*}; returns the bound text ("" if none) or nullopt.
std::optional<std::string> Match(const std::string& pattern, const std::string& name) {
  if (pattern == "{*}") return name;
  const size_t at = pattern.find("{L}");
  if (at == std::string::npos) {
    return pattern == name ? std::optional<std::string>("") : std::nullopt;
  }
  const std::string head = pattern.substr(0, at), tail = pattern.substr(at + 3);
  if (name.size() <= head.size() + tail.size() || name.compare(0, head.size(), head) != 0 ||
      name.compare(name.size() - tail.size(), tail.size(), tail) != 0) {
    return std::nullopt;
  }
  std::string digits = name.substr(head.size(), name.size() - head.size() - tail.size());
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  return digits;
}

std::string Bind(const std::string& pattern, const std::string& bound) {
  if (pattern == "{*}") return bound;
  std::string out = pattern;
  const size_t at = out.find("{L}");
  if (at != std::string::npos) out.replace(at, 3, bound);
  return out;
}

void CheckExample(const std::string& example) {
  SCOPED_TRACE(example);
  auto specs = GenerateFromClusterFile(test::ExampleCluster(example));
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  std::set<std::string> trainer, used, engine;
  for (const TrainerRank& r : specs->trainer.ranks) {
    for (const TrainerParam& p : r.params) trainer.insert(p.name);
  }
  for (const InferenceRank& r : specs->inference.ranks) {
    for (const InferenceTensor& t : r.tensors) engine.insert(t.name);
  }
  for (const std::string& name : engine) {
    const MappingRule* rule = nullptr;
    std::string bound;
    for (const MappingRule& candidate : specs->mapping.rules) {
      if (candidate.kind == MappingRule::Kind::kSkip) continue;
      if (auto b = Match(candidate.engine, name)) {
        rule = &candidate;
        bound = *b;
        break;
      }
    }
    ASSERT_NE(rule, nullptr) << "no rule for engine tensor " << name;
    for (const MappingPart& part : rule->parts) {
      const std::string source = Bind(part.source, bound);
      EXPECT_TRUE(trainer.count(source)) << name << " needs missing trainer tensor " << source;
      EXPECT_EQ(part.expert_dim.has_value(), rule->kind == MappingRule::Kind::kStackExperts)
          << name;
      used.insert(source);
    }
  }
  for (const std::string& name : trainer) {
    EXPECT_TRUE(used.count(name)) << "trainer tensor " << name << " reaches no engine tensor";
  }
}

TEST(MappingNames, Llama) { CheckExample("llama3-8b-16x8"); }
TEST(MappingNames, Qwen3Moe) { CheckExample("qwen3-235b-64x32"); }
TEST(MappingNames, TinyMoe) { CheckExample("tiny-moe-4x2"); }
TEST(MappingNames, DemoMoe) { CheckExample("demo-moe-4x2"); }
TEST(MappingNames, SmallMoeHfFusedExperts) { CheckExample("small-moe-hf-fp8-4x2"); }
TEST(MappingNames, DeepseekV3) { CheckExample("deepseek-v3-128x64"); }
TEST(MappingNames, KimiK2) { CheckExample("kimi-k2-256x128"); }

TEST(MappingFile, ResolvesShardsFromModelConfig) {
  auto m = LoadMappingFile(test::SourcePath("configs/mappings/llama.json"),
                           nlohmann::json{{"num_key_value_heads", 8}});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->rules[0].kind, MappingRule::Kind::kConcat);
  EXPECT_EQ(m->rules[0].parts[1].shards, 8);
  EXPECT_FALSE(m->rules[0].parts[0].shards.has_value());
  ASSERT_EQ(m->quant.size(), 1u);
  EXPECT_EQ(m->quant[0].dtype, DType::kFP8E4M3);
}

TEST(MappingFile, ShardPlaceholderMissingFromConfigIsAnError) {
  auto m = LoadMappingFile(test::SourcePath("configs/mappings/qwen3_moe.json"),
                           nlohmann::json::object());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("num_key_value_heads"), std::string::npos)
      << m.status().message();
}

}  // namespace
}  // namespace wsync
