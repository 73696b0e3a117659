// Inference ranks that bring their own mapping (wsync.vllm derives it from
// the model vLLM built): the controller, started without --mapping, plans
// with theirs; ranks that disagree, or a --mapping that says otherwise, are
// one error naming them, and nothing is planned.
#include "controller_fixture.h"

namespace wsync::controller::testing {
namespace {

class EngineMappingTest : public ControllerTest {
 protected:
  // Registers every rank; inference rank r brings `mappings[r]` (null: none).
  // Returns the last registration's reply, which completes the world.
  StatusOr<json> RegisterWith(const std::vector<json>& mappings) {
    for (int r = 0; r < world_.trainers(); ++r) EXPECT_TRUE(client_->RegisterTrainerJson(world_.TrainerBody(r)).ok());
    StatusOr<json> reply = Aborted("no inference rank");
    for (int r = 0; r < world_.inference_ranks(); ++r) {
      json body = world_.InferenceBody(r);
      if (!mappings[r].is_null()) body["mapping"] = mappings[r];
      reply = client_->RegisterInferenceJson(body);
    }
    return reply;
  }
  ControllerOptions WithoutMapping() {
    ControllerOptions o = Options();
    o.mapping = MappingSpec();  // as `wsync controller` without --mapping
    return o;
  }
  json Mapping() const { return ReadJson(DataPath("mapping.json")); }
};

TEST_F(EngineMappingTest, TheRanksMappingIsPlannedWithAsIfGivenToTheController) {
  // The reference: the same mapping given to the controller.
  StartServer();
  RegisterAll();
  const json given = Status()["plan"];
  StopServer();
  std::filesystem::remove_all(state_dir_);

  StartServer(WithoutMapping());
  StatusOr<json> last = RegisterWith({Mapping(), Mapping()});
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  json s = Status();
  ASSERT_EQ(s["phase"], "planned") << s.dump();
  EXPECT_EQ(s["plan"]["ops"], given["ops"]);
  EXPECT_EQ(s["plan"]["wire_bytes"], given["wire_bytes"]);
  EXPECT_EQ(s["plan"]["plan_id"], given["plan_id"]);
  // Without the mapping, the fused qkv_proj has no source: the mapping made the plan.
  StopServer();
  std::filesystem::remove_all(state_dir_);
  StartServer(WithoutMapping());
  RegisterWith({json(), json()});
  s = Status();
  EXPECT_NE(s["phase"], "planned");
  ASSERT_FALSE(s["errors"].empty()) << s.dump();
  EXPECT_NE(s["errors"].back()["error"].get<std::string>().find("qkv_proj"), std::string::npos) << s.dump();
}

TEST_F(EngineMappingTest, ARestartedControllerReplansWithTheRanksMapping) {
  StartServer(WithoutMapping());
  ASSERT_TRUE(RegisterWith({Mapping(), Mapping()}).ok());
  const json before = Status()["plan"];
  StopServer();
  StartServer(WithoutMapping());  // same state dir: restored from world.json
  json s = Status();
  ASSERT_EQ(s["phase"], "planned") << s.dump();
  EXPECT_EQ(s["plan"]["plan_id"], before["plan_id"]);
}

TEST_F(EngineMappingTest, RanksThatDisagreeAreNamedAndNothingIsPlanned) {
  StartServer(WithoutMapping());
  json other = Mapping();
  other["name"] = "other";
  StatusOr<json> last = RegisterWith({Mapping(), other});
  ASSERT_FALSE(last.ok());
  EXPECT_NE(last.status().message().find("rank 1's mapping 'other' differs from rank 0's ('tiny')"),
            std::string::npos)
      << last.status().message();
  EXPECT_NE(Status()["phase"], "planned");
}

TEST_F(EngineMappingTest, ARankWithoutTheMappingIsNamed) {
  StartServer(WithoutMapping());
  StatusOr<json> last = RegisterWith({Mapping(), json()});
  ASSERT_FALSE(last.ok());
  EXPECT_NE(last.status().message().find("rank 1 brings no mapping, but rank 0 brings 'tiny'"), std::string::npos)
      << last.status().message();
}

TEST_F(EngineMappingTest, AControllerMappingThatSaysOtherwiseIsRefused) {
  ControllerOptions o = Options();
  o.mapping.name = "operator's";
  StartServer(o);
  json theirs = Mapping();
  theirs["rules"].erase(theirs["rules"].begin() + 1);  // no tied lm_head rule
  StatusOr<json> last = RegisterWith({theirs, theirs});
  ASSERT_FALSE(last.ok());
  EXPECT_NE(last.status().message().find("differs from the controller's --mapping 'operator's'"), std::string::npos)
      << last.status().message();
}

TEST_F(EngineMappingTest, AMalformedMappingIsRefusedAtRegistrationNamingTheRank) {
  StartServer(WithoutMapping());
  json body = world_.InferenceBody(0);
  body["mapping"] = Mapping();
  body["mapping"]["rules"][0]["concat"]["dim"] = "zero";
  StatusOr<json> reply = client_->RegisterInferenceJson(body);
  ASSERT_FALSE(reply.ok());
  EXPECT_NE(reply.status().message().find("rank 0: mapping"), std::string::npos) << reply.status().message();
}

}  // namespace
}  // namespace wsync::controller::testing
