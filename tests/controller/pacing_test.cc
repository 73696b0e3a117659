// Engine-paced inference ranks: trainers write a version only once every
// paced rank's gate lets it in; a gate never closes under writes already
// let in; a version never let in fails at its deadline naming the ranks
// that kept it out, and says their weights are untouched.
#include <thread>

#include "controller/version_tracker.h"
#include "controller_fixture.h"

namespace wsync::controller::testing {
namespace {

using Clock = VersionTracker::Clock;

TEST(PacingTest, WithoutPacedRanksAVersionIsAdmittedWhenItStarts) {
  VersionTracker t(1, 2, 10.0);
  StatusOr<const VersionRecord*> r = t.Start(1, Clock::now());
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE((*r)->admitted);
  EXPECT_TRUE(t.Gate(0, GateMove::kOpen, 0).status().code() == StatusCode::kFailedPrecondition)
      << "a rank that does not pace has no gate";
}

TEST(PacingTest, ALiveRankLetsAVersionInOnlyFromInsideUpdate) {
  VersionTracker t(1, 2, 10.0);
  t.SetPacing(1, Pacing::kLive);
  const auto t0 = Clock::now();
  ASSERT_TRUE(t.Start(1, t0).ok());
  EXPECT_FALSE(t.Find(1)->admitted) << "the engine is not inside update(): trainers must not write";

  // update() with no version: up to the newest running one.
  StatusOr<GateState> g = t.Gate(1, GateMove::kNewest, 0);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->upto, 1u);
  EXPECT_EQ(g->admitted, 1u);
  EXPECT_TRUE(g->admitted_running);
  EXPECT_TRUE(t.Find(1)->admitted);

  ASSERT_TRUE(t.InferenceDone(1, 0, true, "", t0).ok());
  ASSERT_TRUE(t.InferenceDone(1, 1, true, "", t0).ok());
  EXPECT_EQ(t.Find(1)->state, VersionState::kComplete);

  // The engine left update() with its gate at 1: version 2 waits for the next call.
  ASSERT_TRUE(t.Start(2, t0).ok());
  EXPECT_FALSE(t.Find(2)->admitted);
  g = t.Gate(1, GateMove::kUpto, 2);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(t.Find(2)->admitted);
}

TEST(PacingTest, AGateClosesOnlyAboveWhatIsAlreadyLetIn) {
  VersionTracker t(1, 1, 10.0);
  t.SetPacing(0, Pacing::kShadow);
  const auto t0 = Clock::now();
  ASSERT_TRUE(t.Start(3, t0).ok());
  EXPECT_TRUE(t.Find(3)->admitted) << "a shadow rank's gate is open between update() calls";
  StatusOr<GateState> g = t.Gate(0, GateMove::kClose, 0);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->admitted, 3u) << "the close says which version's writes may still be landing";
  EXPECT_TRUE(g->admitted_running);
  ASSERT_TRUE(t.InferenceDone(3, 0, true, "", t0).ok());
  ASSERT_TRUE(t.Start(4, t0).ok());
  EXPECT_FALSE(t.Find(4)->admitted) << "nothing new gets in while the shadow is copied out";
  ASSERT_TRUE(t.Gate(0, GateMove::kOpen, 0).ok());
  EXPECT_TRUE(t.Find(4)->admitted);
}

TEST(PacingTest, EveryPacedRankMustLetAVersionIn) {
  VersionTracker t(1, 3, 10.0);
  t.SetPacing(0, Pacing::kLive);
  t.SetPacing(2, Pacing::kShadow);
  ASSERT_TRUE(t.Start(1, Clock::now()).ok());
  EXPECT_FALSE(t.Find(1)->admitted);
  ASSERT_TRUE(t.Gate(0, GateMove::kUpto, 1).ok());
  EXPECT_TRUE(t.Find(1)->admitted);
  t.SetPacing(2, Pacing::kLive);  // registered again, now live: its gate starts closed
  ASSERT_TRUE(t.Start(2, Clock::now()).ok());
  ASSERT_TRUE(t.Gate(0, GateMove::kUpto, 5).ok());
  EXPECT_FALSE(t.Find(2)->admitted) << "rank 2 has not let it in";
}

TEST(PacingTest, AVersionNeverLetInFailsAtItsDeadlineNamingTheRanksAndSaysNothingWasWritten) {
  VersionTracker t(1, 2, 1.0);
  t.SetPacing(1, Pacing::kLive);
  const auto t0 = Clock::now();
  ASSERT_TRUE(t.Start(1, t0).ok());
  std::vector<const VersionRecord*> expired = t.ExpireOverdue(t0 + std::chrono::seconds(2));
  ASSERT_EQ(expired.size(), 1u);
  ASSERT_EQ(expired[0]->failures.size(), 1u);
  const std::string& why = expired[0]->failures[0].error;
  EXPECT_NE(why.find("ranks [1]"), std::string::npos) << why;
  EXPECT_NE(why.find("did not call update()"), std::string::npos) << why;
  EXPECT_NE(why.find("untouched"), std::string::npos) << why;
  // The next version is not held behind the failed one.
  ASSERT_TRUE(t.Start(2, t0 + std::chrono::seconds(2)).ok());
  ASSERT_TRUE(t.Gate(1, GateMove::kNewest, 0).ok());
  EXPECT_TRUE(t.Find(2)->admitted);
}

// Over HTTP, as the agents drive it: a paced rank registers with "pacing",
// the trainer's long poll answers once the engine's gate lets the version in.
TEST_F(ControllerTest, ATrainersWaitForAdmissionEndsWhenThePacedEngineLetsTheVersionIn) {
  StartServer();
  for (int r = 0; r < world_.trainers(); ++r) ASSERT_TRUE(client_->RegisterTrainerJson(world_.TrainerBody(r)).ok());
  for (int r = 0; r < world_.inference_ranks(); ++r) {
    json body = world_.InferenceBody(r);
    if (r == 0) body["pacing"] = "live";
    StatusOr<json> reply = client_->RegisterInferenceJson(body);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  }
  StatusOr<VersionStatus> v = client_->StartVersion(1, 0);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_FALSE(v->admitted);
  StatusOr<VersionStatus> waited = client_->WaitVersionAdmitted(1, In(0.2));
  EXPECT_EQ(waited.status().code(), StatusCode::kDeadlineExceeded) << "nothing lets it in yet";

  std::thread engine([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    StatusOr<json> g = client_->Gate(0, "newest");
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    if (g.ok()) EXPECT_EQ(g->value("admitted", 0), 1);
  });
  waited = client_->WaitVersionAdmitted(1, In(10));
  engine.join();
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  EXPECT_TRUE(waited->admitted);

  StatusOr<json> bad = client_->Gate(1, "open");
  EXPECT_EQ(bad.status().code(), StatusCode::kFailedPrecondition) << "rank 1 registered without pacing";
  EXPECT_NE(bad.status().message().find("not engine-paced"), std::string::npos);
  StatusOr<json> unknown = client_->Gate(0, "sideways");
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  StatusOr<json> zero = client_->Gate(0, "upto", 0);
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(ControllerTest, AnUnknownPacingIsRefusedAtRegistrationNamingIt) {
  StartServer();
  json body = world_.InferenceBody(0);
  body["pacing"] = "sometimes";
  StatusOr<json> reply = client_->RegisterInferenceJson(body);
  ASSERT_FALSE(reply.ok());
  EXPECT_NE(reply.status().message().find("'pacing' is 'sometimes'"), std::string::npos) << reply.status().message();
}

}  // namespace
}  // namespace wsync::controller::testing
