// Runs the real `wsync plan` binary on a small valid spec trio and on
// variants with one defect each, and checks what a user sees: the exit code,
// one error line naming the file and the tensor, and no output file written.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/cli/run_wsync.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json Load(const std::string& name) {
  std::ifstream f(fs::path(WSYNC_CLI_DATA) / "good" / name);
  return json::parse(f);
}

class PlanCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("wsync_plan_cli_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    trainer_ = Load("trainer.json");
    inference_ = Load("inference.json");
    mapping_ = Load("mapping.json");
  }
  void TearDown() override { fs::remove_all(dir_); }

  void WriteSpecs() {
    std::ofstream(dir_ / "trainer.json") << trainer_.dump(1);
    std::ofstream(dir_ / "inference.json") << inference_.dump(1);
    std::ofstream(dir_ / "mapping.json") << mapping_.dump(1);
  }

  RunResult Plan(const std::string& extra = "") {
    WriteSpecs();
    return RunWsync("plan -q " + dir_.string() + " --out " + (dir_ / "plan.json").string() +
                        " --heatmap " + (dir_ / "heat.svg").string() + " " + extra,
                    dir_);
  }

  // One defect: non-zero exit, exactly one stderr line that names `file` and
  // `what`, and neither output file exists.
  void ExpectOneLineError(const RunResult& r, const std::string& file, const std::string& what) {
    EXPECT_NE(r.exit_code, 0);
    ASSERT_FALSE(r.err.empty());
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find("wsync plan: error:"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(file), std::string::npos) << "error should name " << file << ": " << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << "error should name " << what << ": " << r.err;
    EXPECT_FALSE(fs::exists(dir_ / "plan.json"));
    EXPECT_FALSE(fs::exists(dir_ / "heat.svg"));
  }

  fs::path dir_;
  json trainer_, inference_, mapping_;
};

TEST_F(PlanCliTest, ValidSpecsPlanAndReportBytesComputedIndependently) {
  // Tiny tensors: --min-shard-piece 0 cuts them at shard edges as large ones would be.
  RunResult r = Plan("--format json --exchange --min-shard-piece 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json s = json::parse(r.out);
  // Stored: embed 32x8 + q 8x8 + k 4x8 + v 4x8 + norm 8, bf16.
  EXPECT_EQ(s["total_bytes"].get<uint64_t>(), (256 + 64 + 32 + 32 + 8) * 2u);
  // Wire: every inference tensor once: embed, qkv 16x8, norm, tied lm_head.
  EXPECT_EQ(s["wire_bytes"].get<uint64_t>(), (256 + 128 + 8 + 256) * 2u);
  EXPECT_GE(s["writes"].get<uint64_t>(), 4u);
  for (const char* key : {"max_sender_bytes", "mean_sender_bytes", "predicted_seconds", "receive_bound_seconds",
                          "predicted_reads_done_seconds"}) {
    EXPECT_TRUE(s.contains(key)) << key;
  }
  EXPECT_GT(s["predicted_seconds"].get<double>(), 0.0);
  EXPECT_GE(s["predicted_seconds"].get<double>(), s["receive_bound_seconds"].get<double>());
  // The trainers may go on before the last write lands, never before they start.
  EXPECT_GT(s["predicted_reads_done_seconds"].get<double>(), 0.0);
  EXPECT_LT(s["predicted_reads_done_seconds"].get<double>(), s["predicted_seconds"].get<double>());
  // Unshard: full_tensor would bring each of the 2 FSDP ranks the other's
  // half of every tensor, the stored bytes in all; with the planned exchange
  // every piece is cut at the shard edge and written by its holder: nothing.
  EXPECT_TRUE(s["unshard_from_rank_plans"].get<bool>());
  EXPECT_EQ(s["full_tensor_bytes"].get<uint64_t>(), (256 + 64 + 32 + 32 + 8) * 2u);
  EXPECT_EQ(s["exchange_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(s["unshard_pairs"]["none"].get<uint64_t>(), 2u * 5);
  // The full table and the heatmap were written and are well-formed.
  std::ifstream plan(dir_ / "plan.json");
  json table = json::parse(plan);
  EXPECT_EQ(table["schema"], "wsync.plan/v1");
  uint64_t op_bytes = 0;
  for (const auto& op : table["ops"]) op_bytes += op[9].get<uint64_t>();
  EXPECT_EQ(op_bytes, s["wire_bytes"].get<uint64_t>());
  std::ifstream svg(dir_ / "heat.svg");
  std::string svg_text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  EXPECT_NE(svg_text.find("<svg"), std::string::npos);
  EXPECT_NE(svg_text.find("</svg>"), std::string::npos);
}

TEST_F(PlanCliTest, WithoutTheExchangeRanksReceiveWhatFullTensorMoves) {
  // full_tensor, modeled from the rank plans peer by peer, must equal the
  // box arithmetic: each of the 2 ranks receives the other's half.
  RunResult r = Plan("--format json --full-tensor");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json s = json::parse(r.out);
  EXPECT_EQ(s["full_tensor_bytes"].get<uint64_t>(), (256 + 64 + 32 + 32 + 8) * 2u);
  EXPECT_EQ(s["exchange_bytes"].get<uint64_t>(), s["full_tensor_bytes"].get<uint64_t>());
  EXPECT_EQ(s["unshard_pairs"]["all_gather"].get<uint64_t>(), 2u * 5);
}

TEST_F(PlanCliTest, TextSummaryStatesTheLinkModel) {
  RunResult r = Plan("--nic-gbps 100");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("predicted update time"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("NIC 100 Gbit/s"), std::string::npos) << r.out;
}

TEST_F(PlanCliTest, MalformedJsonNamesTheFile) {
  WriteSpecs();
  std::ofstream(dir_ / "inference.json") << "{\"schema\": \"wsync.inference/v1\", \"ranks\": [";
  RunResult r = RunWsync("plan -q " + dir_.string() + " --out " + (dir_ / "plan.json").string(), dir_);
  ExpectOneLineError(r, "inference.json", "inference.json");
}

TEST_F(PlanCliTest, UnknownTensorIsNamed) {
  inference_["ranks"][0]["tensors"].push_back(
      {{"name", "model.layers.0.mlp.mystery.weight"}, {"shape", {8, 8}}, {"dtype", "bf16"},
       {"region", "weights"}, {"offset", 1600}});
  ExpectOneLineError(Plan(), "inference.json", "model.layers.0.mlp.mystery.weight");
}

TEST_F(PlanCliTest, ShapesThatDoNotTileAreNamed) {
  inference_["ranks"][0]["tensors"][1]["shape"] = {17, 8};
  ExpectOneLineError(Plan(), "inference.json", "model.layers.0.self_attn.qkv_proj.weight");
}

TEST_F(PlanCliTest, DtypeWithNoRuleIsNamed) {
  json& embed = inference_["ranks"][0]["tensors"][0];
  embed["dtype"] = "fp8_e4m3";
  embed["scale"] = {{"name", "model.embed_tokens.weight_scale_inv"}, {"shape", {1, 1}},
                    {"dtype", "fp32"}, {"region", "weights"}, {"offset", 1800}};
  ExpectOneLineError(Plan(), "model.embed_tokens.weight", "fp8_e4m3");
}

TEST_F(PlanCliTest, OverlappingDestinationBytesAreNamed) {
  inference_["ranks"][0]["tensors"][2]["offset"] = 700;  // norm lands inside qkv [512, 768)
  ExpectOneLineError(Plan(), "inference.json", "model.norm.weight");
}

TEST_F(PlanCliTest, UncoveredSourceBytesAreNamed) {
  // Rank 1 stops reporting its shard of k_proj: rows 2..3 are held by nobody.
  json& params = trainer_["ranks"][1]["params"];
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i]["name"] == "model.layers.0.self_attn.k_proj.weight") {
      params.erase(i);
      break;
    }
  }
  ExpectOneLineError(Plan(), "trainer.json", "model.layers.0.self_attn.k_proj.weight");
}

TEST_F(PlanCliTest, InconsistentMeshesAreNamed) {
  trainer_["ranks"][1]["meshes"][0]["shape"] = {3};
  ExpectOneLineError(Plan(), "trainer.json", "dense");
}

TEST_F(PlanCliTest, ShardThatBreaksTorchChunkIsNamed) {
  // embed is 32 rows over 2 ranks: torch.chunk gives 16 + 16, not 15.
  trainer_["ranks"][1]["params"][0]["local_shape"] = {15, 8};
  ExpectOneLineError(Plan(), "trainer.json", "model.embed_tokens.weight");
}

TEST_F(PlanCliTest, MissingFolderSaysWhatItExpects) {
  RunResult r = RunWsync("plan -q " + (dir_ / "nope").string(), dir_);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("nope"), std::string::npos) << r.err;
}

}  // namespace
