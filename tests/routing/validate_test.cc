// Validation: each user mistake is one line naming file, rank and tensor and
// saying what was expected.
#include "routing/validate.h"

#include <gtest/gtest.h>

#include "routing/spec_io.h"

namespace wsync {
namespace {

std::string Data(const std::string& f) { return std::string(WSYNC_ROUTING_TEST_DATA) + "/" + f; }

class ValidateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = ParseTrainerSpecFromFile(Data("tiny_trainer.json"));
    ASSERT_TRUE(t.ok()) << t.status().message();
    trainer_ = *t;
    auto i = ParseInferenceSpecFromFile(Data("tiny_inference.json"));
    ASSERT_TRUE(i.ok()) << i.status().message();
    inference_ = *i;
  }
  // Expects an error whose message contains every fragment, on one line.
  void ExpectTrainerError(std::initializer_list<const char*> fragments) {
    Status s = ValidateTrainerSpec(trainer_, "trainer.json");
    ASSERT_FALSE(s.ok());
    for (const char* f : fragments) EXPECT_NE(s.message().find(f), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos);
  }
  void ExpectInferenceError(std::initializer_list<const char*> fragments) {
    Status s = ValidateInferenceSpec(inference_, "inference.json");
    ASSERT_FALSE(s.ok());
    for (const char* f : fragments) EXPECT_NE(s.message().find(f), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos);
  }
  TrainerParam& Param(int rank, const std::string& name) {
    for (TrainerParam& p : trainer_.ranks[rank].params)
      if (p.name == name) return p;
    ADD_FAILURE() << name;
    return trainer_.ranks[rank].params[0];
  }
  InferenceTensor& Tensor(int rank, const std::string& name) {
    for (InferenceTensor& t : inference_.ranks[rank].tensors)
      if (t.name == name) return t;
    ADD_FAILURE() << name;
    return inference_.ranks[rank].tensors[0];
  }
  TrainerSpec trainer_;
  InferenceSpec inference_;
};

const char kQ[] = "model.layers.0.self_attn.q_proj.weight";
const char kEmbed[] = "model.embed_tokens.weight";
const char kDown[] = "model.layers.1.mlp.down_proj.weight";

TEST_F(ValidateTest, FixturesAreValid) {
  EXPECT_TRUE(ValidateTrainerSpec(trainer_, "t").ok());
  EXPECT_TRUE(ValidateInferenceSpec(inference_, "i").ok());
}

TEST_F(ValidateTest, RanksMustBeZeroToNOnce) {
  trainer_.ranks[2].rank = 1;
  ExpectTrainerError({"trainer.json: rank 1 listed twice"});
  SetUp();
  trainer_.ranks.pop_back();
  trainer_.ranks.erase(trainer_.ranks.begin() + 1);
  ExpectTrainerError({"rank 1 missing"});
}

TEST_F(ValidateTest, MeshWithDifferentShapeOnAnotherRank) {
  trainer_.ranks[3].meshes[0].shape = {2, 2};
  trainer_.ranks[3].meshes[0].dim_names = {"fsdp", "tp"};
  trainer_.ranks[3].meshes[0].coord = {1, 1};
  ExpectTrainerError({"trainer.json: rank 3", "mesh 'dense' has shape [2, 2]", "rank 0 reports shape [4]"});
}

TEST_F(ValidateTest, DuplicateAndMissingMeshCoordinates) {
  trainer_.ranks[3].meshes[0].coord = {2};
  ExpectTrainerError({"rank 3", "coord [2] is also reported by rank 2"});
}

TEST_F(ValidateTest, ParamOnAMeshTheRankDoesNotReport) {
  Param(1, kQ).mesh = "experts";
  ExpectTrainerError({"rank 1", kQ, "mesh 'experts' is not one of this rank's meshes"});
}

TEST_F(ValidateTest, PlacementCountMustMatchMeshDims) {
  Param(0, kQ).placements.push_back(Placement::Replicate());
  ExpectTrainerError({"rank 0", kQ, "2 placements", "expected one per mesh dim"});
}

TEST_F(ValidateTest, LocalShapeMustBeTorchChunk) {
  // embed has 1003 rows over 4 ranks: 251, 251, 251, 250.
  Param(3, kEmbed).local_shape = {251, 256};
  ExpectTrainerError({"trainer.json: rank 3: tensor 'model.embed_tokens.weight'",
                      "expected local_shape [250, 256] local_offset [753, 0]"});
}

TEST_F(ValidateTest, SameParamMustAgreeOnEveryRank) {
  Param(2, kQ).dtype = DType::kFP32;
  ExpectTrainerError({"rank 2", kQ, "dtype fp32 vs bf16"});
}

TEST_F(ValidateTest, ParamMissingOnOneRankOfItsMesh) {
  auto& ps = trainer_.ranks[2].params;
  ps.erase(ps.begin());
  ExpectTrainerError({"rank 2", kEmbed, "reported by 3 of the 4 ranks"});
}

TEST_F(ValidateTest, TensorOutsideItsRegion) {
  inference_.ranks[1].regions[0].size -= 1;
  ExpectInferenceError({"inference.json: rank 1: tensor", "leaves region 'weights'"});
}

TEST_F(ValidateTest, OverlappingTensors) {
  Tensor(0, "lm_head.weight").where.offset = 100;
  ExpectInferenceError({"inference.json: rank 0", "overlaps tensor"});
}

TEST_F(ValidateTest, Fp8NeedsScaleWithBlockGrid) {
  Tensor(1, kDown).scale->shape = {2, 1};
  ExpectInferenceError({"rank 1: tensor 'model.layers.1.mlp.down_proj.weight'", "expected block grid [2, 2]"});
  SetUp();
  Tensor(0, kDown).scale.reset();
  ExpectInferenceError({"rank 0", kDown, "has no scale"});
}

TEST_F(ValidateTest, TpAndExpertSlicesMustFitTheShape) {
  Tensor(0, kEmbed).tp->rank = 2;
  ExpectInferenceError({"rank 0", kEmbed, "tp rank 2 of size 2"});
  SetUp();
  Tensor(0, kEmbed).experts = ExpertRange{0, 4};
  ExpectInferenceError({"rank 0", kEmbed, "does not hold experts [0, 4)"});
}

TEST_F(ValidateTest, UnknownRegion) {
  Tensor(1, "model.norm.weight").where.region = "kv";
  ExpectInferenceError({"rank 1: tensor 'model.norm.weight'", "region 'kv'"});
}

}  // namespace
}  // namespace wsync

namespace wsync {
namespace {

TEST_F(ValidateTest, SameSliceTwiceInOneInstance) {
  for (InferenceTensor& t : inference_.ranks[1].tensors)
    if (t.tp) t.tp->rank = 0;
  ExpectInferenceError({"inference.json: rank 1: tensor 'model.embed_tokens.weight'",
                        "holds the same slice (tp rank 0) as rank 0 of instance 0"});
  // In another replica the same slice is expected.
  inference_.ranks[1].instance = 1;
  EXPECT_TRUE(ValidateInferenceSpec(inference_, "inference.json").ok());
}

TEST_F(ValidateTest, TpSplitMustAgreeWithinAnInstance) {
  Tensor(1, "lm_head.weight").tp->size = 4;
  ExpectInferenceError({"rank 1: tensor 'lm_head.weight'", "tp {dim 0, size 4} but rank 0 of instance 0 has tp {dim 0, size 2}"});
}

// Found by fuzz/trainer_spec_fuzz.cc (UBSan): the mesh size was multiplied
// before it was bounded, so [2^32, 2^32] overflowed int64.
TEST_F(ValidateTest, HugeMeshIsRefusedBeforeItsSizeOverflows) {
  MeshCoord& m = trainer_.ranks[0].meshes[0];
  m.shape = {int64_t{1} << 32, int64_t{1} << 32};
  m.dim_names = {"a", "b"};
  m.coord = {0, 0};
  ExpectTrainerError({"rank 0", "too large (over 2^24 ranks)"});
}

// Found by fuzz/inference_spec_fuzz.cc: a byte size that wrapped around
// passed the region bounds check, and the fp8 block grid overflowed (UBSan).
TEST_F(ValidateTest, TensorsTooLargeToCountAreRefused) {
  Tensor(0, kEmbed).shape = {int64_t{1} << 32, int64_t{1} << 32, 4};
  ExpectInferenceError({"rank 0", kEmbed, "is too large (over 2^63 bytes)"});
  SetUp();
  Tensor(0, kDown).shape = {INT64_MAX, 0};
  ExpectInferenceError({"rank 0", kDown, "expected block grid [72057594037927936, 0]"});
  SetUp();
  Param(0, kQ).global_shape = {int64_t{1} << 62, 4};
  ExpectTrainerError({"rank 0", kQ, "is too large (over 2^63 bytes)"});
}

}  // namespace
}  // namespace wsync
