// JSON loaders: fixtures load, round trip, and user mistakes give one line
// that names the file and the tensor.
#include "routing/spec_io.h"

#include <fstream>

#include <gtest/gtest.h>

#include "routing/json_reader.h"
#include "routing/plan_io.h"
#include "routing/planner.h"
#include "routing/rank_plan.h"

namespace wsync {
namespace {

using nlohmann::json;

std::string Data(const std::string& f) { return std::string(WSYNC_ROUTING_TEST_DATA) + "/" + f; }

json Load(const std::string& f) {
  auto j = ReadJsonFile(Data(f));
  EXPECT_TRUE(j.ok()) << j.status().message();
  return *j;
}

void ExpectOneLine(const Status& s) { EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message(); }

TEST(SpecIoTest, FixturesLoadAndRoundTrip) {
  auto trainer = ParseTrainerSpecFromFile(Data("tiny_trainer.json"));
  ASSERT_TRUE(trainer.ok()) << trainer.status().message();
  auto inference = ParseInferenceSpecFromFile(Data("tiny_inference.json"));
  ASSERT_TRUE(inference.ok()) << inference.status().message();
  json config = Load("tiny_config.json");
  auto mapping = ParseMappingSpecFromFile(Data("tiny_mapping.json"), &config);
  ASSERT_TRUE(mapping.ok()) << mapping.status().message();
  EXPECT_EQ(trainer->ranks.size(), 4u);
  EXPECT_EQ(inference->ranks.size(), 2u);
  EXPECT_EQ(*mapping->rules[0].parts[1].shards, 1);  // "{num_key_value_heads}"

  auto t2 = ParseTrainerSpec(ToJson(*trainer), "rt");
  ASSERT_TRUE(t2.ok()) << t2.status().message();
  EXPECT_EQ(ToJson(*t2), ToJson(*trainer));
  auto i2 = ParseInferenceSpec(ToJson(*inference), "rt");
  ASSERT_TRUE(i2.ok()) << i2.status().message();
  EXPECT_EQ(ToJson(*i2), ToJson(*inference));
  auto m2 = ParseMappingSpec(ToJson(*mapping), "rt");
  ASSERT_TRUE(m2.ok()) << m2.status().message();
  EXPECT_EQ(ToJson(*m2), ToJson(*mapping));
}

// The controller writes worlds as text (ToJsonText); it must be the tree's
// own dump, byte for byte, with every optional field and escaped names.
TEST(SpecIoTest, SpecTextIsTheTreesDumpByteForByte) {
  auto trainer = ParseTrainerSpecFromFile(Data("tiny_trainer.json"));
  auto inference = ParseInferenceSpecFromFile(Data("tiny_inference.json"));
  ASSERT_TRUE(trainer.ok() && inference.ok());
  EXPECT_EQ(ToJsonText(*trainer), ToJson(*trainer).dump());
  EXPECT_EQ(ToJsonText(*inference), ToJson(*inference).dump());

  TrainerSpec t = *trainer;
  t.ranks.at(0).host = "h\u00e9\"";
  t.ranks.at(0).params.at(0).name = "p\\\t";
  t.mesh_groups.at(0).gather_dims.push_back("e\"p");
  EXPECT_EQ(ToJsonText(t), ToJson(t).dump());

  InferenceSpec in = *inference;
  InferenceTensor& x = in.ranks.at(0).tensors.at(0);
  x.name = "t\"\u00e9";
  x.tp = TpSlice{1, 0, 2};
  x.experts = ExpertRange{4, 8};
  x.scale = ScaleTensor{};
  x.scale->name = "t_scale";
  x.scale->shape = {3, 5};
  x.scale->dtype = DType::kFP32;
  x.scale->where = {"r\u00e9", 4096};
  in.ranks.at(0).tensors.at(1).tp.reset();
  in.ranks.at(0).tensors.at(1).scale.reset();
  in.ranks.at(0).regions.at(0).descriptor = "d\x01\"";
  EXPECT_EQ(ToJsonText(in), ToJson(in).dump());

  // A rank that brings its own mapping (wsync.vllm) keeps it through the text.
  const nlohmann::json config = nlohmann::json::parse(std::ifstream(Data("tiny_config.json")));
  auto mapping = ParseMappingSpecFromFile(Data("tiny_mapping.json"), &config);
  ASSERT_TRUE(mapping.ok()) << mapping.status().ToString();
  InferenceSpec with = *inference;
  with.ranks.at(0).mapping = *mapping;
  with.ranks.at(0).pacing = Pacing::kLive;
  EXPECT_EQ(ToJsonText(with), ToJson(with).dump());
  auto back = ParseInferenceSpec(nlohmann::json::parse(ToJsonText(with)), "text");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_TRUE(back->ranks.at(0).mapping.has_value());
  EXPECT_EQ(ToJson(*back->ranks.at(0).mapping), ToJson(*mapping));
  EXPECT_FALSE(back->ranks.size() > 1 && back->ranks.at(1).mapping.has_value());
}

TEST(SpecIoTest, MalformedJsonNamesFileAndPosition) {
  const std::string path = ::testing::TempDir() + "/broken_trainer.json";
  std::ofstream(path) << "{\"schema\": \"wsync.trainer/v1\",\n \"ranks\": [1, 2,]}";
  auto r = ParseTrainerSpecFromFile(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("line 2"), std::string::npos) << r.status().message();
  ExpectOneLine(r.status());
}

// Found by fuzz/trainer_spec_fuzz.cc: nlohmann throws out_of_range, not
// parse_error, for a number too large for a double, and that escaped
// ReadJsonFile and ended `wsync plan` with std::terminate.
TEST(SpecIoTest, NumberOutOfRangeIsMalformedJsonNotACrash) {
  const std::string path = ::testing::TempDir() + "/huge_number_trainer.json";
  std::ofstream(path) << "{\"schema\": \"wsync.trainer/v1\", \"mesh_groups\": [], \"ranks\": [{\"rank\": 1e999}]}";
  auto r = ParseTrainerSpecFromFile(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), path + ": malformed JSON: number overflow parsing '1e999'");
}

// Copying or printing a value recurses per level: a few MB of brackets
// would exhaust the stack, so such documents are refused up front.
TEST(SpecIoTest, DeeplyNestedJsonIsRefusedNamingTheDepth) {
  const std::string deep = "{\"ranks\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  auto r = ParseJsonText(deep, "trainer.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "trainer.json: malformed JSON: nested deeper than 64 levels at byte 73");
  EXPECT_TRUE(ParseJsonText("{\"a\": \"[[[[[[\"}", "x").ok()) << "brackets inside strings do not count";
}

TEST(SpecIoTest, MissingFileIsNotFound) {
  auto r = ParseInferenceSpecFromFile("/nonexistent/inference.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/inference.json"), std::string::npos);
}

TEST(SpecIoTest, UnknownKeyInAParamIsAnErrorNamingRankAndTensor) {
  json j = Load("tiny_trainer.json");
  j["ranks"][2]["params"][3]["placement"] = {"Shard(0)"};  // typo of "placements"
  auto r = ParseTrainerSpec(j, "t.json");
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("t.json: rank 2: tensor 'model.layers.0.self_attn.v_proj.weight'"), std::string::npos) << m;
  EXPECT_NE(m.find("unknown key 'placement'"), std::string::npos) << m;
  ExpectOneLine(r.status());
}

TEST(SpecIoTest, BadDtypeAndPlacementSpellings) {
  json j = Load("tiny_trainer.json");
  j["ranks"][0]["params"][0]["dtype"] = "bfloat17";
  auto r = ParseTrainerSpec(j, "t.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unknown dtype 'bfloat17'"), std::string::npos);
  j = Load("tiny_trainer.json");
  j["ranks"][0]["params"][0]["placements"] = {"Shard(x)"};
  r = ParseTrainerSpec(j, "t.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("Shard(x)"), std::string::npos);
  // torch spellings are accepted
  j = Load("tiny_trainer.json");
  for (auto& rank : j["ranks"]) rank["params"][0]["dtype"] = "torch.bfloat16";
  EXPECT_TRUE(ParseTrainerSpec(j, "t.json").ok());
}

TEST(SpecIoTest, InferenceUnknownKeyInsideTp) {
  json j = Load("tiny_inference.json");
  j["ranks"][1]["tensors"][0]["tp"]["sizee"] = 2;
  auto r = ParseInferenceSpec(j, "i.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("i.json: rank 1: tensor 'model.embed_tokens.weight': tp"),
            std::string::npos) << r.status().message();
}

// Names travel into plans, logs and replies: one with a NUL or a control
// character, empty, or of 100 KB is refused, named by its place (#29).
TEST(SpecIoTest, ATensorNameIsPrintableAndBounded) {
  const std::string cases[] = {std::string("model.a\0b", 9), "model.\x07" "bell", "", std::string(100 << 10, 'x')};
  for (const std::string& bad : cases) {
    json j = Load("tiny_inference.json");
    j["ranks"][1]["tensors"][0]["name"] = bad;
    auto r = ParseInferenceSpec(j, "i.json");
    ASSERT_FALSE(r.ok()) << "accepted a name of " << bad.size() << " bytes";
    EXPECT_NE(r.status().message().find("'name' must be 1 to 1024 bytes without control characters"),
              std::string::npos) << r.status().message();
    EXPECT_LT(r.status().message().size(), 600u) << "the message quotes the name whole";
    json t = Load("tiny_trainer.json");
    t["ranks"][0]["params"][0]["name"] = bad;
    EXPECT_FALSE(ParseTrainerSpec(t, "t.json").ok());
  }
}

TEST(SpecIoTest, ShardsPlaceholderNeedsAConfig) {
  json j = Load("tiny_mapping.json");
  auto r = ParseMappingSpec(j, "m.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("{num_key_value_heads}"), std::string::npos);
  json config = {{"hidden_size", 8}};
  r = ParseMappingSpec(j, "m.json", &config);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no integer 'num_key_value_heads'"), std::string::npos);
}

TEST(SpecIoTest, MappingRuleWithTwoKindsOrBadPatternIsRejected) {
  json j = {{"rules", json::array({{{"engine", "a"}, {"source", "b"}, {"tied", "c"}}})}};
  auto r = ParseMappingSpec(j, "m.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("m.json: rules[0]"), std::string::npos);
  j = {{"rules", json::array({{{"engine", "layers.{L.w"}, {"source", "x.{L}"}}})}};
  r = ParseMappingSpec(j, "m.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unbalanced"), std::string::npos);
  j = {{"rules", json::array({{{"engine", "layers.w"}, {"source", "x.{L}"}}})}};
  r = ParseMappingSpec(j, "m.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("does not bind"), std::string::npos);
}

TEST(SpecIoTest, PlanJsonRoundTripsAndWritesAtomically) {
  auto trainer = ParseTrainerSpecFromFile(Data("tiny_trainer.json"));
  auto inference = ParseInferenceSpecFromFile(Data("tiny_inference.json"));
  json config = Load("tiny_config.json");
  auto mapping = ParseMappingSpecFromFile(Data("tiny_mapping.json"), &config);
  ASSERT_TRUE(trainer.ok() && inference.ok() && mapping.ok());
  auto table = Plan(*trainer, *inference, *mapping);
  ASSERT_TRUE(table.ok()) << table.status().message();
  json j = PlanToJson(*table);
  // The streamed text (what the controller digests and persists) is the
  // tree's own dump, byte for byte.
  EXPECT_EQ(PlanToText(*table), j.dump());
  EXPECT_EQ(j["schema"], "wsync.plan/v1");
  EXPECT_EQ(j["ops"].size(), table->ops.size());
  auto back = PlanFromJson(j, "plan.json");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(PlanToJson(*back), j);

  const std::string path = ::testing::TempDir() + "/plan.json";
  ASSERT_TRUE(WritePlanFile(*table, path).ok());
  auto read = ReadJsonFile(path);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, j);
  std::ifstream tmp(path + ".tmp");
  EXPECT_FALSE(tmp.good()) << "temp file left behind";
  // A directory that does not exist: error, nothing written.
  EXPECT_FALSE(WritePlanFile(*table, "/nonexistent-dir/plan.json").ok());
}

}  // namespace
// Found by fuzz/plan_slice_fuzz.cc (ASan: heap-buffer-overflow): a slice's
// "block" and write arrays were indexed without checking their length, and
// const json::operator[] does not check bounds.
TEST(SpecIoTest, TrainerSliceWithShortArraysIsAnError) {
  auto trainer = ParseTrainerSpecFromFile(Data("tiny_trainer.json"));
  auto inference = ParseInferenceSpecFromFile(Data("tiny_inference.json"));
  json config = Load("tiny_config.json");
  auto mapping = ParseMappingSpecFromFile(Data("tiny_mapping.json"), &config);
  ASSERT_TRUE(trainer.ok() && inference.ok() && mapping.ok());
  auto table = Plan(*trainer, *inference, *mapping);
  ASSERT_TRUE(table.ok()) << table.status().message();
  auto slice = ExtractTrainerRankPlan(*table, *trainer, *inference, 0);
  ASSERT_TRUE(slice.ok()) << slice.status().message();
  const json good = ToJson(*slice);
  ASSERT_TRUE(ParseTrainerRankPlan(good).ok());
  const std::string name = good["groups"][0]["sources"][0]["name"];
  json bad = good;
  bad["groups"][0]["sources"][0]["block"] = json::array();
  auto r = ParseTrainerRankPlan(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "rank plan: source '" + name + "': 'block' must be [rows, cols]");
  bad = good;
  for (json& s : bad["groups"][0]["sources"])
    for (json& w : s["writes"]) w = json::array({w[0], w[1]});
  r = ParseTrainerRankPlan(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("a write must be [dst_rank, kind, dtype"), std::string::npos)
      << r.status().message();
  bad = good;
  bad["groups"][0]["sources"][0]["dtype"] = "bf61";
  r = ParseTrainerRankPlan(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "rank plan: unknown dtype \"bf61\"");
}

// A trainer plan with sources over two all-gather groups (one of them used
// twice) and one that gathers nothing.
TrainerRankPlan PlanWithGatherGroups() {
  TrainerRankPlan plan;
  plan.rank = 2;
  plan.world = 4;
  const std::vector<std::vector<int32_t>> gathers = {{0, 1, 2, 3}, {}, {2, 0}, {0, 1, 2, 3}};
  for (int g = 0; g < 2; ++g) {
    RankMeshGroup group;
    group.name = "group" + std::to_string(g);
    group.ranks = {0, 1, 2, 3};
    for (int k = 0; k < 2; ++k) {
      RankSource s;
      s.name = "t" + std::to_string(2 * g + k);
      s.global_shape = {8, 4};
      s.local.ndim = s.held.ndim = 2;
      s.local.size = {2, 4};
      s.held.size = {8, 4};
      s.gather_ranks = gathers[2 * g + k];
      s.gather_dim = s.gather_ranks.empty() ? -1 : 0;
      group.sources.push_back(std::move(s));
    }
    plan.groups.push_back(std::move(group));
  }
  return plan;
}

// Each distinct all-gather group is written once per slice and named by
// index in every source; parsing gives every source its whole group back.
TEST(SpecIoTest, TrainerSliceListsEachGatherGroupOnce) {
  const TrainerRankPlan plan = PlanWithGatherGroups();
  const std::string text = ToJsonText(plan);
  EXPECT_EQ(text, ToJson(plan).dump());
  EXPECT_NE(text.find("\"gather_sets\":[[0,1,2,3],[2,0]]"), std::string::npos) << text;
  EXPECT_EQ(text.find("gather_ranks"), std::string::npos) << text;
  auto back = ParseTrainerRankPlan(json::parse(text));
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->groups.size(), plan.groups.size());
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    ASSERT_EQ(back->groups[g].sources.size(), plan.groups[g].sources.size());
    for (size_t k = 0; k < plan.groups[g].sources.size(); ++k)
      EXPECT_EQ(back->groups[g].sources[k].gather_ranks, plan.groups[g].sources[k].gather_ranks)
          << plan.groups[g].sources[k].name;
  }
  EXPECT_EQ(ToJsonText(*back), text);
}

TEST(SpecIoTest, TrainerSliceWithABadGatherSetNamesTheSource) {
  const json good = ToJson(PlanWithGatherGroups());
  ASSERT_EQ(good["groups"][1]["sources"][0]["name"], "t2");
  ASSERT_EQ(good["groups"][1]["sources"][0]["gather_set"], 1);
  for (const json& bad_index : {json(2), json(-2), json(1.5), json("1")}) {
    json bad = good;
    bad["groups"][1]["sources"][0]["gather_set"] = bad_index;
    auto r = ParseTrainerRankPlan(bad);
    ASSERT_FALSE(r.ok()) << bad_index.dump();
    EXPECT_EQ(r.status().message(),
              "rank plan: source 't2': 'gather_set' must be -1 (no all-gather) or an index into the slice's 2 "
              "'gather_sets', got " + bad_index.dump());
    ExpectOneLine(r.status());
  }
  json bad = good;
  bad["gather_sets"][1] = {0, "x"};
  auto r = ParseTrainerRankPlan(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "rank plan: 'gather_sets' must be an integer in range, got \"x\"");
  bad = good;
  bad["schema"] = "wsync.trainer_rank_plan/v1";  // each source listed its gather_ranks
  r = ParseTrainerRankPlan(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("expected schema wsync.trainer_rank_plan/v4"), std::string::npos)
      << r.status().message();
}

// Found by fuzz/plan_slice_fuzz.cc (UBSan): get<uint64_t>() of 4.4e44
// (a float) is undefined; 1.5 became 1 and an unknown dtype bf16, silently.
TEST(SpecIoTest, SliceNumbersMustBeIntegersAndDtypesKnown) {
  json slice = {{"schema", "wsync.inference_rank_plan/v1"}, {"rank", 1},
                {"writes", {{"w", 0, 512, "a"}, {"w", 512, 4.4e44, "b"}}}, {"bytes", 512}};
  auto r = ParseInferenceRankPlan(slice);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "rank plan: 'write bytes' must be an integer in range, got 4.4e+44");
  slice["writes"] = json::array({json::array({"w", 0})});
  r = ParseInferenceRankPlan(slice);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "rank plan: a write must be [region, offset, bytes, tensor] or that and [planes, plane_stride], got "
            "[\"w\",0]");
  slice["writes"] = json::array({json::array({"w", 0, 512, "a"})});
  slice["rank"] = 1.5;
  r = ParseInferenceRankPlan(slice);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "rank plan: 'rank' must be an integer in range, got 1.5");
  slice["rank"] = int64_t{1} << 40;
  EXPECT_FALSE(ParseInferenceRankPlan(slice).ok());
  slice["rank"] = 1;
  EXPECT_TRUE(ParseInferenceRankPlan(slice).ok());
}

}  // namespace wsync
