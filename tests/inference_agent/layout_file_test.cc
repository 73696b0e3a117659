// `wsync inference-agent --layout`: a wsync.inference/v1 file of every rank,
// or an engine's file of its own rank only (what wsync.export_cuda_ipc
// writes beside the IPC handles).
#include <unistd.h>

#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "inference_agent/agent_command.h"

namespace wsync::inference {
namespace {

nlohmann::json Entry(int rank, uint64_t region_bytes = 4096) {
  return {{"rank", rank}, {"host", "infer-0"}, {"gpu", rank}, {"nic", 0}, {"instance", 0},
          {"regions", {{{"id", "w"}, {"size", region_bytes}, {"descriptor", ""}}}},
          {"tensors", {{{"name", "model.a.weight"}, {"dtype", "bf16"}, {"shape", {32, 64}}, {"region", "w"},
                        {"offset", 0}}}}};
}

class LayoutFileTest : public ::testing::Test {
 protected:
  StatusOr<InferenceRank> Load(const nlohmann::json& ranks, int32_t rank) {
    std::ofstream(path_) << nlohmann::json{{"schema", "wsync.inference/v1"}, {"ranks", ranks}}.dump();
    InferenceAgentFlags flags;
    flags.layout = path_;
    flags.rank = rank;
    return LoadInferenceRank(flags);
  }
  void TearDown() override { unlink(path_.c_str()); }
  std::string path_ = "/tmp/wsync-layout-file-test-" + std::to_string(getpid()) + ".json";
};

TEST_F(LayoutFileTest, AFileOfEveryRankGivesTheAskedOne) {
  StatusOr<InferenceRank> r = Load(nlohmann::json::array({Entry(0), Entry(1, 8192)}), 1);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->rank, 1);
  EXPECT_EQ(r->regions.at(0).size, 8192u);
}

TEST_F(LayoutFileTest, AnEngineFileOfItsOwnRankOnlyLoadsWithItsNumber) {
  StatusOr<InferenceRank> r = Load(nlohmann::json::array({Entry(3, 8192)}), 3);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->rank, 3);
  ASSERT_EQ(r->tensors.size(), 1u);
  EXPECT_EQ(r->tensors[0].name, "model.a.weight");
  EXPECT_EQ(r->regions.at(0).size, 8192u);
}

TEST_F(LayoutFileTest, AnotherRanksFileIsRefused) {
  StatusOr<InferenceRank> r = Load(nlohmann::json::array({Entry(3)}), 2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path_), std::string::npos) << r.status().message();
}

TEST_F(LayoutFileTest, AnEngineFilesErrorsNameItsRank) {
  nlohmann::json bad = Entry(3, /*region_bytes=*/1024);  // a 4 KiB tensor in a 1 KiB region
  StatusOr<InferenceRank> r = Load(nlohmann::json::array({bad}), 3);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path_ + ": rank 3"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("model.a.weight"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace wsync::inference
