// Total parameter counts generated from each published config must match the
// published totals; they are summed from the generated global shapes, so a
// missing or mis-shaped tensor anywhere in the generator shows up here.
#include <chrono>
#include <cstdio>
#include <map>

#include <gtest/gtest.h>

#include "models/generate.h"
#include "tests/models/test_paths.h"

namespace wsync {
namespace {

int64_t Elements(const Shape& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}

// Sum of global sizes over distinct trainer parameters.
int64_t TotalParams(const TrainerSpec& spec) {
  std::map<std::string, int64_t> seen;
  for (const TrainerRank& r : spec.ranks) {
    for (const TrainerParam& p : r.params) seen.emplace(p.name, Elements(p.global_shape));
  }
  int64_t total = 0;
  for (const auto& [name, n] : seen) total += n;
  return total;
}

int64_t GeneratedTotal(const std::string& example) {
  auto specs = GenerateFromClusterFile(test::ExampleCluster(example));
  EXPECT_TRUE(specs.ok()) << specs.status().ToString();
  if (!specs.ok()) return -1;
  return TotalParams(specs->trainer);
}

TEST(ParamCount, Llama3_8B) {
  // Meta: "8B"; the HF checkpoint (meta-llama/Meta-Llama-3-8B) holds
  // 8,030,261,248 parameters.
  EXPECT_EQ(GeneratedTotal("llama3-8b-16x8"), 8'030'261'248);
}

TEST(ParamCount, Qwen3_235B_A22B) {
  // Qwen3 model card: 235B total (the checkpoint holds 235,093,634,560).
  const int64_t n = GeneratedTotal("qwen3-235b-64x32");
  EXPECT_EQ(n, 235'093'634'560);
  EXPECT_NEAR(static_cast<double>(n) / 1e9, 235.0, 0.5);
}

TEST(ParamCount, DeepSeekV3WithoutMtp) {
  // DeepSeek-V3 README: 671B main model + 14B MTP module = 685B on HF. The
  // main model (DeepseekV3ForCausalLM without the MTP layer) has
  // 671,026,419,200 parameters.
  const int64_t n = GeneratedTotal("deepseek-v3-128x64");
  EXPECT_EQ(n, 671'026'419'200);
  EXPECT_NEAR(static_cast<double>(n) / 1e9, 671.0, 0.5);
}

TEST(ParamCount, KimiK2) {
  // moonshotai/Kimi-K2-Instruct checkpoint: 1,026,470,731,056 stored
  // elements, of which 62,495,192 are fp32 weight_scale_inv blocks and 3,416
  // are rotary inv_freq buffers (61 x 56): 1,026,408,232,448 parameters.
  // Moonshot reports "1T total" (1.04T in the tech report).
  const int64_t n = GeneratedTotal("kimi-k2-256x128");
  EXPECT_EQ(n, 1'026'470'731'056 - 62'495'192 - 3'416);
  EXPECT_NEAR(static_cast<double>(n) / 1e12, 1.03, 0.01);
}

TEST(ParamCount, KimiK2GenerationTimePrinted) {
  // Not asserted: the figure goes to the log for the reader.
  const auto t0 = std::chrono::steady_clock::now();
  auto specs = GenerateFromClusterFile(test::ExampleCluster("kimi-k2-256x128"));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  size_t params = 0, tensors = 0;
  for (const TrainerRank& r : specs->trainer.ranks) params += r.params.size();
  for (const InferenceRank& r : specs->inference.ranks) tensors += r.tensors.size();
  std::printf("kimi-k2-256x128: generated %zu trainer param entries, %zu inference tensors "
              "in %.3f s\n", params, tensors, s);
}

}  // namespace
}  // namespace wsync
