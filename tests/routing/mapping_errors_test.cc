// Cross-document errors the planner reports: one line naming the file, rank
// and tensor, and what was expected.
#include <gtest/gtest.h>

#include "routing/json_reader.h"
#include "routing/planner.h"
#include "routing/spec_io.h"

namespace wsync {
namespace {

std::string Data(const std::string& f) { return std::string(WSYNC_ROUTING_TEST_DATA) + "/" + f; }

class MappingErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto config = ReadJsonFile(Data("tiny_config.json"));
    trainer_ = *ParseTrainerSpecFromFile(Data("tiny_trainer.json"));
    inference_ = *ParseInferenceSpecFromFile(Data("tiny_inference.json"));
    mapping_ = *ParseMappingSpecFromFile(Data("tiny_mapping.json"), &*config);
    opt_.trainer_source = "trainer.json";
    opt_.inference_source = "inference.json";
    opt_.mapping_source = "mapping.json";
  }
  Status PlanStatus() {
    auto t = Plan(trainer_, inference_, mapping_, opt_);
    return t.ok() ? Status::Ok() : t.status();
  }
  void ExpectError(std::initializer_list<const char*> fragments) {
    Status s = PlanStatus();
    ASSERT_FALSE(s.ok());
    for (const char* f : fragments) EXPECT_NE(s.message().find(f), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
  }
  InferenceTensor& Tensor(int rank, const std::string& name) {
    for (InferenceTensor& t : inference_.ranks[rank].tensors)
      if (t.name == name) return t;
    ADD_FAILURE() << name;
    return inference_.ranks[rank].tensors[0];
  }
  TrainerSpec trainer_;
  InferenceSpec inference_;
  MappingSpec mapping_;
  PlanOptions opt_;
};

TEST_F(MappingErrorsTest, EngineNameMatchingNoRule) {
  mapping_.rules.pop_back();  // drop the {*} identity rule
  ExpectError({"inference.json: rank 0: tensor 'model.embed_tokens.weight'", "no rule of mapping mapping.json"});
}

TEST_F(MappingErrorsTest, RuleSourceThatIsNotATrainerTensor) {
  mapping_.rules[2].parts[0].source = "model.embed_tokens.weights";
  ExpectError({"inference.json: rank 0: tensor 'lm_head.weight'",
               "source 'model.embed_tokens.weights'", "is not a trainer tensor"});
}

TEST_F(MappingErrorsTest, ShapeThatDoesNotTile) {
  Tensor(1, "model.layers.1.self_attn.qkv_proj.weight").shape = {320, 256};
  ExpectError({"inference.json: rank 1: tensor 'model.layers.1.self_attn.qkv_proj.weight'",
               "shape [320, 256] but its sources imply [384, 256]", "tp {dim 0, rank 1, size 2}"});
}

TEST_F(MappingErrorsTest, Fp8BoundaryNotOnABlockMultiple) {
  // 1003 vocab rows over TP 2 put the boundary at row 502: inside a block.
  InferenceTensor& e = Tensor(0, "model.embed_tokens.weight");
  e.dtype = DType::kFP8E4M3;
  e.scale = ScaleTensor{"model.embed_tokens.weight_scale_inv", {4, 2}, DType::kFP32, {"weights", 0}};
  opt_.validate = false;  // the scale overlaps the weight bytes here; only the mapping matters
  ExpectError({"inference.json: rank 0: tensor 'model.embed_tokens.weight'", "fp8 block boundary",
               "multiple of 128"});
}

TEST_F(MappingErrorsTest, DtypeWithNoRule) {
  mapping_.quant.clear();
  ExpectError({"inference.json: rank 0: tensor 'model.layers.0.mlp.down_proj.weight'",
               "dtype fp8_e4m3 but source", "no quantize rule"});
}

TEST_F(MappingErrorsTest, FloatCastsAreImplicit) {
  Tensor(0, "model.norm.weight").dtype = DType::kFP32;
  inference_.ranks[0].regions[0].size += 1024;
  Tensor(0, "model.norm.weight").where.offset = inference_.ranks[0].regions[0].size - 1024;
  EXPECT_TRUE(PlanStatus().ok()) << PlanStatus().message();
}

TEST_F(MappingErrorsTest, TrainerTensorNeitherUsedNorSkipped) {
  mapping_.rules.erase(mapping_.rules.begin() + 3);  // the rotary skip
  ExpectError({"trainer.json: rank 0: tensor 'model.layers.0.self_attn.rotary_emb.inv_freq'",
               "used by no engine tensor and not skipped"});
}

TEST_F(MappingErrorsTest, UncoveredEngineBytes) {
  // A destination larger than its source leaves bytes nobody writes.
  InferenceTensor& n = Tensor(1, "model.norm.weight");
  n.shape = {300};
  inference_.ranks[1].regions[0].size += 1024;
  n.where.offset = inference_.ranks[1].regions[0].size - 1024;
  ExpectError({"inference.json: rank 1: tensor 'model.norm.weight'", "shape [300] but its sources imply [256]"});
}

TEST_F(MappingErrorsTest, OverlappingDestinations) {
  Tensor(1, "model.norm.weight").where.offset = 0;
  ExpectError({"inference.json: rank 1", "overlaps tensor"});
}

// Found by fuzz/mapping_spec_fuzz.cc (UBSan): the block grid was computed
// as (n + block - 1) / block, which overflows for a block near 2^63.
TEST_F(MappingErrorsTest, HugeQuantizeBlockIsAScaleShapeErrorNotAnOverflow) {
  mapping_.quant[0].block_rows = INT64_MAX;
  ExpectError({"inference.json: rank 0: tensor 'model.layers.0.mlp.down_proj.weight'",
               "scale shape [2, 2], expected block grid [1, 2] for 9223372036854775807x128 blocks"});
}

}  // namespace
}  // namespace wsync
