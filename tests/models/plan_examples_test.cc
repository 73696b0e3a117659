// Every example folder must plan: the generated specs pass routing's
// validation and the planner finds a writer for every destination byte.
// The Kimi-K2 reference time (generate + plan) is printed, not asserted.
#include <chrono>
#include <cstdio>

#include <gtest/gtest.h>

#include "models/generate.h"
#include "routing/planner.h"
#include "tests/models/test_paths.h"

namespace wsync {
namespace {

class PlanExample : public ::testing::TestWithParam<const char*> {};

TEST_P(PlanExample, GeneratesAndPlans) {
  const auto t0 = std::chrono::steady_clock::now();
  auto specs = GenerateFromClusterFile(test::ExampleCluster(GetParam()));
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  const auto t1 = std::chrono::steady_clock::now();
  auto table = Plan(specs->trainer, specs->inference, specs->mapping);
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  const auto t2 = std::chrono::steady_clock::now();
  EXPECT_FALSE(table->ops.empty());
  EXPECT_EQ(table->mesh_groups.size(), specs->trainer.mesh_groups.size());
  std::printf("%s: generate %.3f s + plan %.3f s, %zu write ops\n", GetParam(),
              std::chrono::duration<double>(t1 - t0).count(),
              std::chrono::duration<double>(t2 - t1).count(), table->ops.size());
}

INSTANTIATE_TEST_SUITE_P(Examples, PlanExample,
                         ::testing::Values("tiny-moe-4x2", "demo-moe-4x2", "small-moe-hf-fp8-4x2",
                                           "small-moe-hf-fp8-4x2-ep", "llama3-8b-16x8",
                                           "qwen3-235b-64x32", "deepseek-v3-128x64",
                                           "kimi-k2-256x128"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) {
                             if (c == '-') c = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace wsync
