// Registration epochs: an inference rank that registers again after the plan
// exists, with the same layout in new memory (its agent restarted), moves the
// controller to a new epoch. Trainers holding the old descriptors are
// refused until they fetch their slice again; versions running on the old
// memory fail naming the rank; a restarted controller keeps the epoch.
#include "tests/controller/controller_fixture.h"

namespace wsync::controller::testing {
namespace {

class EpochTest : public ControllerTest {
 protected:
  void SetUp() override {
    ControllerTest::SetUp();
    for (int r = 0; r < world_.inference_ranks(); ++r)
      world_.inference["ranks"][r]["regions"][0]["descriptor"] = "0a0b0c0" + std::to_string(r);
  }
  json NewMemory(int rank) {
    json body = world_.InferenceBody(rank);
    body["regions"][0]["descriptor"] = "ffee0" + std::to_string(rank);
    return body;
  }
  json TrainerSlice(int rank) {
    StatusOr<TrainerPlanSlice> s = client_->FetchTrainerPlan(rank, In(5));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? s->raw : json();
  }
};

TEST_F(EpochTest, SameLayoutInNewMemoryBumpsTheEpochAndHandsTrainersTheNewDescriptors) {
  StartServer();
  RegisterAll();
  json before = TrainerSlice(0);
  EXPECT_EQ(before["epoch"], 1);
  const std::string old_text = before.dump();
  ASSERT_NE(old_text.find("0a0b0c01"), std::string::npos) << "the slice names rank 1's region";

  StatusOr<json> reply = client_->RegisterInferenceJson(NewMemory(1));
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();

  json after = TrainerSlice(0);
  EXPECT_EQ(after["epoch"], 2);
  EXPECT_EQ(after["plan_id"], before["plan_id"]) << "the routing did not change";
  const std::string text = after.dump();
  EXPECT_EQ(text.find("0a0b0c01"), std::string::npos) << "the old descriptor is still handed out";
  EXPECT_NE(text.find("ffee01"), std::string::npos);
  EXPECT_NE(text.find("0a0b0c00"), std::string::npos) << "rank 0 did not move";
}

TEST_F(EpochTest, TrainerOnTheOldEpochIsRefusedUntilItFetchesItsSliceAgain) {
  StartServer();
  RegisterAll();
  ASSERT_TRUE(client_->RegisterInferenceJson(NewMemory(0)).ok());
  StatusOr<VersionStatus> stale = client_->StartVersion(1, 0, /*epoch=*/1);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(stale.status().message().rfind(kStaleEpochPrefix, 0), 0u) << stale.status().ToString();
  EXPECT_NE(stale.status().message().find("fetch the plan slice again"), std::string::npos);
  EXPECT_EQ(client_->GetVersion(1).status().code(), StatusCode::kNotFound) << "a refused start starts nothing";

  const uint64_t epoch = TrainerSlice(0)["epoch"].get<uint64_t>();
  ASSERT_TRUE(client_->StartVersion(1, 0, epoch).ok());
  ASSERT_TRUE(client_->StartVersion(1, 1, epoch).ok());
  for (int t = 0; t < 2; ++t) ASSERT_TRUE(client_->ReportTrainerDone(1, t, Status::Ok()).ok());
  ASSERT_TRUE(client_->ReportInferenceDone(1, 0, Status::Ok()).ok());
  EXPECT_TRUE(client_->ReportInferenceDone(1, 1, Status::Ok())->complete());
}

TEST_F(EpochTest, VersionRunningOnTheOldMemoryFailsNamingTheRank) {
  StartServer();
  RegisterAll();
  ASSERT_TRUE(client_->StartVersion(1, 0, 1).ok());
  ASSERT_TRUE(client_->ReportInferenceDone(1, 0, Status::Ok()).ok());
  ASSERT_TRUE(client_->RegisterInferenceJson(NewMemory(1)).ok());
  StatusOr<VersionStatus> v = client_->GetVersion(1);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->failed()) << "a version whose writes aimed at memory that is gone must never complete";
  ASSERT_FALSE(v->failures.empty());
  EXPECT_EQ(v->failures[0].role, "inference");
  EXPECT_EQ(v->failures[0].rank, 1);
  EXPECT_NE(v->failures[0].error.find("registered again with new memory"), std::string::npos) << v->failures[0].error;
}

TEST_F(EpochTest, ADifferentLayoutAfterThePlanIsStillRefused) {
  StartServer();
  RegisterAll();
  json body = NewMemory(1);
  body["regions"][0]["size"] = body["regions"][0]["size"].get<uint64_t>() + 4096;
  StatusOr<json> reply = client_->RegisterInferenceJson(body);
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(reply.status().message().find("differs from the plan"), std::string::npos) << reply.status().ToString();
  EXPECT_EQ(TrainerSlice(0)["epoch"], 1);
}

TEST_F(EpochTest, RestartedControllerServesTheNewEpochAndDescriptors) {
  StartServer();
  RegisterAll();
  ASSERT_TRUE(client_->RegisterInferenceJson(NewMemory(1)).ok());
  StopServer();
  StartServer();
  json slice = TrainerSlice(0);
  EXPECT_EQ(slice["epoch"], 2);
  EXPECT_NE(slice.dump().find("ffee01"), std::string::npos);
  EXPECT_FALSE(client_->StartVersion(1, 0, 1).ok());
  EXPECT_TRUE(client_->StartVersion(1, 0, 2).ok());
}

}  // namespace
}  // namespace wsync::controller::testing
