// Update versions: complete only when every inference rank has its bytes;
// failures name the rank; deadlines fail a version, never complete it.
#include <future>
#include <thread>

#include "common/checksum.h"
#include "controller/version_tracker.h"
#include "controller_fixture.h"

namespace wsync::controller::testing {
namespace {

TEST_F(ControllerTest, VersionCompletesOnlyWhenEveryInferenceRankIsDone) {
  StartServer();
  RegisterAll();
  StatusOr<VersionStatus> v = client_->StartVersion(1, 0);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->state, "started");
  ASSERT_TRUE(client_->StartVersion(1, 1).ok());  // every trainer may call start

  ASSERT_TRUE(client_->ReportTrainerDone(1, 0, Status::Ok()).ok());
  ASSERT_TRUE(client_->ReportTrainerDone(1, 1, Status::Ok()).ok());
  v = client_->ReportInferenceDone(1, 0, Status::Ok());
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->state, "started") << "trainers done and one of two replicas done is not complete";

  std::thread waiter_done;
  StatusOr<VersionStatus> waited = Internal("not waited");
  waiter_done = std::thread([&] { waited = client_->WaitVersion(1, In(10)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  v = client_->ReportInferenceDone(1, 1, Status::Ok());
  waiter_done.join();
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->state, "complete");
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  EXPECT_TRUE(waited->complete());

  json s = Status();
  EXPECT_EQ(s["latest_complete_version"], 1);
  // Starting a finished version again is refused.
  StatusOr<VersionStatus> again = client_->StartVersion(1, 0);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(ControllerTest, FailureNamesTheRankAndIsFinal) {
  StartServer();
  RegisterAll();
  ASSERT_TRUE(client_->StartVersion(2, 0).ok());
  ASSERT_TRUE(client_->ReportTrainerDone(2, 0, Status::Ok()).ok());
  StatusOr<VersionStatus> v = client_->ReportTrainerDone(2, 1, Internal("trainer agent killed"));
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->failed());
  ASSERT_EQ(v->failures.size(), 1u);
  EXPECT_EQ(v->failures[0].role, "trainer");
  EXPECT_EQ(v->failures[0].rank, 1);
  EXPECT_NE(v->failures[0].error.find("killed"), std::string::npos);

  // Late success reports change nothing: a failed version is never complete.
  ASSERT_TRUE(client_->ReportInferenceDone(2, 0, Status::Ok()).ok());
  v = client_->ReportInferenceDone(2, 1, Status::Ok());
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->failed());
  EXPECT_TRUE(Status()["latest_complete_version"].is_null());

  // A trainer rank that starts the failed version late learns why, not only
  // that (its peers may be stuck waiting for it in a collective).
  StatusOr<VersionStatus> late = client_->StartVersion(2, 1);
  ASSERT_FALSE(late.ok());
  EXPECT_NE(late.status().message().find("already failed (trainer rank 1: trainer agent killed)"), std::string::npos)
      << late.status().ToString();

  // An inference-side failure, through the fail endpoint.
  ASSERT_TRUE(client_->StartVersion(3, 0).ok());
  v = client_->ReportFailure(3, Role::kInference, 1, "immediate count short by 2");
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->failed());
  EXPECT_EQ(v->failures[0].role, "inference");
  EXPECT_EQ(v->failures[0].rank, 1);

  // The next version after failures still completes.
  ASSERT_TRUE(client_->StartVersion(4, 0).ok());
  ASSERT_TRUE(client_->ReportInferenceDone(4, 0, Status::Ok()).ok());
  EXPECT_TRUE(client_->ReportInferenceDone(4, 1, Status::Ok())->complete());
}

// One version in flight: while version 1 still lands somewhere, version 2
// does not start (its writes would meet version 1's last ones in the same
// memory); every rank of version 1 may still call start for it, and once
// it finished, complete or failed, version 2 starts.
TEST_F(ControllerTest, NextVersionStartsOnlyOnceThePreviousFinished) {
  StartServer();
  RegisterAll();
  ASSERT_TRUE(client_->StartVersion(1, 0).ok());
  ASSERT_TRUE(client_->ReportTrainerDone(1, 0, Status::Ok()).ok());
  StatusOr<VersionStatus> early = client_->StartVersion(2, 0);  // rank 0 is through version 1 first
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(early.status().message().find(kOlderRunningPrefix), std::string::npos) << early.status().ToString();
  EXPECT_NE(early.status().message().find("version 1 has not finished"), std::string::npos) << early.status().ToString();
  EXPECT_EQ(client_->GetVersion(2).status().code(), StatusCode::kNotFound) << "a refused start starts nothing";
  ASSERT_TRUE(client_->StartVersion(1, 1).ok()) << "a rank late into the running version is not held back";

  ASSERT_TRUE(client_->ReportTrainerDone(1, 1, Status::Ok()).ok());
  ASSERT_TRUE(client_->ReportInferenceDone(1, 0, Status::Ok()).ok());
  ASSERT_TRUE(client_->ReportInferenceDone(1, 1, Status::Ok())->complete());
  StatusOr<VersionStatus> v2 = client_->StartVersion(2, 0);
  ASSERT_TRUE(v2.ok()) << v2.status().ToString();
  EXPECT_EQ(v2->state, "started");

  // A failed version releases the next as well.
  ASSERT_FALSE(client_->StartVersion(3, 0).ok());
  ASSERT_TRUE(client_->ReportFailure(2, Role::kInference, 1, "immediate count short by 2").ok());
  EXPECT_TRUE(client_->StartVersion(3, 0).ok());
}

// Start 10, then start 3: both used to be accepted, and 3's writes would
// land under the running 10 (#29). One version in flight, in order.
TEST_F(ControllerTest, AnOlderVersionThanARunningOneIsRefused) {
  StartServer();
  RegisterAll();
  ASSERT_TRUE(client_->StartVersion(10, 0).ok());
  StatusOr<VersionStatus> older = client_->StartVersion(3, 1);
  ASSERT_FALSE(older.ok());
  EXPECT_EQ(older.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(older.status().message().find("older than version 10, which is running"), std::string::npos)
      << older.status().message();
  EXPECT_EQ(client_->GetVersion(3).status().code(), StatusCode::kNotFound) << "a refused start starts nothing";
  EXPECT_TRUE(client_->StartVersion(10, 1).ok()) << "the running one may still be started by every trainer";
}

TEST_F(ControllerTest, VersionPastItsDeadlineFailsAndNeverCompletes) {
  ControllerOptions o = Options();
  o.version_timeout_s = 1.0;  // long enough for the first report on a loaded machine
  StartServer(o);
  RegisterAll();
  ASSERT_TRUE(client_->StartVersion(5, 0).ok());
  ASSERT_TRUE(client_->ReportInferenceDone(5, 0, Status::Ok()).ok());
  StatusOr<VersionStatus> v = client_->WaitVersion(5, In(5));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(v->failed());
  ASSERT_FALSE(v->failures.empty());
  EXPECT_NE(v->failures[0].error.find("deadline"), std::string::npos) << v->failures[0].error;
  EXPECT_NE(v->failures[0].error.find("inference ranks not done [1]"), std::string::npos) << v->failures[0].error;
  v = client_->ReportInferenceDone(5, 1, Status::Ok());
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->failed());
  StatusOr<std::string> metrics = client_->GetMetrics();
  ASSERT_TRUE(metrics.ok());
  EXPECT_NE(metrics->find("wsync_versions_total{state=\"failed\"} 1\n"), std::string::npos) << *metrics;
  EXPECT_NE(metrics->find("wsync_versions_total{state=\"complete\"} 0\n"), std::string::npos) << *metrics;
}

TEST_F(ControllerTest, ReportsBeforeThePlanOrFromUnknownRanksAreRefused) {
  StartServer();
  StatusOr<VersionStatus> v = client_->StartVersion(1, 0);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kFailedPrecondition);
  RegisterAll();
  v = client_->ReportInferenceDone(1, 9, Status::Ok());
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(v.status().message().find("inference rank 9"), std::string::npos);
}

TEST_F(ControllerTest, SilentRankIsLostAndItsRunningVersionFailsNamingIt) {
  ControllerOptions o = Options();
  o.heartbeat_timeout_s = 1.0;
  StartServer(o);
  RegisterAll();
  ASSERT_TRUE(client_->StartVersion(1, 0).ok());
  ASSERT_TRUE(client_->ReportTrainerDone(1, 0, Status::Ok()).ok());
  {
    // Trainer rank 1 beats for a while, then its agent "dies" mid-update.
    HeartbeatSender beats(*client_, Role::kTrainer, 1, std::chrono::milliseconds(100));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(client_->GetVersion(1)->state, "started");
  }
  StatusOr<VersionStatus> v = client_->WaitVersion(1, In(5));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(v->failed());
  ASSERT_FALSE(v->failures.empty());
  EXPECT_EQ(v->failures[0].role, "trainer");
  EXPECT_EQ(v->failures[0].rank, 1);
  EXPECT_NE(v->failures[0].error.find("no heartbeat"), std::string::npos) << v->failures[0].error;
  json s = Status();
  ASSERT_EQ(s["lost"].size(), 1u);
  EXPECT_EQ(s["lost"][0]["rank"], 1);

  // While it is lost, a new version fails at once; once it is back (its
  // agent restarted and registered again), the next version completes.
  StatusOr<VersionStatus> doomed = client_->StartVersion(2, 0);
  ASSERT_TRUE(doomed.ok());
  EXPECT_TRUE(doomed->failed());
  ASSERT_TRUE(client_->RegisterTrainerJson(world_.TrainerBody(1)).ok());
  EXPECT_EQ(Status()["lost"], json::array());
  ASSERT_TRUE(client_->StartVersion(3, 0).ok());
  ASSERT_TRUE(client_->ReportInferenceDone(3, 0, Status::Ok()).ok());
  EXPECT_TRUE(client_->ReportInferenceDone(3, 1, Status::Ok())->complete());
}

TEST_F(ControllerTest, RanksThatNeverBeatAreNotDeclaredLost) {
  ControllerOptions o = Options();
  o.heartbeat_timeout_s = 0.2;
  StartServer(o);
  RegisterAll();
  ASSERT_TRUE(client_->StartVersion(1, 0).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_TRUE(client_->ReportInferenceDone(1, 0, Status::Ok()).ok());
  EXPECT_TRUE(client_->ReportInferenceDone(1, 1, Status::Ok())->complete());
}

// The tracker on its own, with a clock the test controls.
TEST(VersionTrackerTest, DeadlineIsCheckedEvenWhenTheLastReportArrivesLate) {
  VersionTracker t(/*trainers=*/1, /*inference=*/2, /*timeout_s=*/1.0);
  const auto t0 = VersionTracker::Clock::now();
  ASSERT_TRUE(t.Start(7, t0).ok());
  ASSERT_TRUE(t.InferenceDone(7, 0, true, "", t0).ok());
  StatusOr<const VersionRecord*> r = t.InferenceDone(7, 1, true, "", t0 + std::chrono::seconds(2));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->state, VersionState::kFailed);
  EXPECT_FALSE(t.has_complete());
  EXPECT_EQ(t.failed_total(), 1u);
}

TEST(VersionTrackerTest, OldVersionNumbersAreRefusedAfterACompleteOne) {
  VersionTracker t(1, 1, 10.0);
  const auto t0 = VersionTracker::Clock::now();
  ASSERT_TRUE(t.Start(10, t0).ok());
  ASSERT_TRUE(t.InferenceDone(10, 0, true, "", t0).ok());
  EXPECT_TRUE(t.has_complete());
  EXPECT_EQ(t.latest_complete(), 10u);
  EXPECT_FALSE(t.Start(9, t0).ok());
  EXPECT_TRUE(t.Start(11, t0).ok());
}

// Issue #29: a report of a version nobody started (2^64-1 from a "-1" in a
// path, a stray or hostile client) used to start it and, once done, stand as
// the latest complete version that refused every real one after it.
TEST(VersionTrackerTest, AReportNeverStartsAVersion) {
  VersionTracker t(1, 1, 10.0);
  const auto t0 = VersionTracker::Clock::now();
  const uint64_t huge = UINT64_MAX;
  for (auto report : {+[](VersionTracker& t, uint64_t v, VersionTracker::Clock::time_point now) {
                        return t.InferenceDone(v, 0, true, "", now).status();
                      },
                      +[](VersionTracker& t, uint64_t v, VersionTracker::Clock::time_point now) {
                        return t.TrainerDone(v, 0, true, "", now, nlohmann::json()).status();
                      },
                      +[](VersionTracker& t, uint64_t v, VersionTracker::Clock::time_point now) {
                        return t.Fail(v, "inference", 0, "x", now).status();
                      }}) {
    const wsync::Status s = report(t, huge, t0);
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
    EXPECT_NE(s.message().find("was never started"), std::string::npos) << s.message();
  }
  EXPECT_FALSE(t.has_complete());
  EXPECT_TRUE(t.records().empty());
  ASSERT_TRUE(t.Start(1, t0).ok());  // real versions still start
  ASSERT_TRUE(t.InferenceDone(1, 0, true, "", t0).ok());
  EXPECT_EQ(t.latest_complete(), 1u);
}

// The inference agents' long poll: GET /v1/status with the fingerprint of
// an earlier answer waits for a version to start or finish, and answers
// with it. A start while the poll is waiting is in its answer; with
// nothing changing, the same fingerprint comes back when the wait ends.
TEST_F(ControllerTest, StatusLongPollAnswersWithAVersionThatStartsMeanwhile) {
  StartServer();
  RegisterAll();
  const json before = Status();
  const std::string since = before.value("versions_fingerprint", std::string());
  ASSERT_FALSE(since.empty()) << before.dump();

  StatusOr<json> quiet = client_->GetStatus(since, std::chrono::milliseconds(50));
  ASSERT_TRUE(quiet.ok()) << quiet.status().ToString();
  EXPECT_EQ((*quiet)["versions_fingerprint"], since);
  EXPECT_TRUE((*quiet)["versions"].empty());

  std::promise<void> polling;
  std::thread starter([&] {
    polling.get_future().wait();
    // Most likely after the poll reached the controller; if not, the poll
    // answers at once with the version, which the checks below accept too.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_TRUE(client_->StartVersion(1, 0).ok());
  });
  polling.set_value();
  StatusOr<json> woke = client_->GetStatus(since, std::chrono::milliseconds(20000));
  starter.join();
  ASSERT_TRUE(woke.ok()) << woke.status().ToString();
  EXPECT_NE((*woke)["versions_fingerprint"], since);
  ASSERT_EQ((*woke)["versions"].size(), 1u) << woke->dump();
  EXPECT_EQ((*woke)["versions"][0]["version"], 1);
  EXPECT_EQ((*woke)["versions"][0]["state"], "started");

  // A version that finishes changes it again.
  const std::string started = (*woke)["versions_fingerprint"];
  ASSERT_TRUE(client_->ReportFailure(1, Role::kTrainer, 0, "test").ok());
  StatusOr<json> failed = client_->GetStatus(started, std::chrono::milliseconds(20000));
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ((*failed)["versions"][0]["state"], "failed");
}

// Integrity checksums (issue #10): what the trainers hashed of each write
// travels with their trainer_done and is served per inference rank, merged
// over every trainer, once all of them reported; not before, not for a
// failed version, not when a trainer sent none.
TEST_F(ControllerTest, ChecksumsAreServedPerInferenceRankOnceEveryTrainerReported) {
  StartServer();
  RegisterAll();
  const int trainers = world_.trainers();
  ASSERT_GE(trainers, 2);
  auto sums = [](int t) {
    const std::string h = ChecksumText(0x1000u + static_cast<uint64_t>(t));
    return json{{"checksums", {{"0", {{"w", {{t * 64, 64, h}}}}}, {"1", {{"w", {{t * 64, 64, h}}}}}}}};
  };
  ASSERT_TRUE(client_->StartVersion(1, 0).ok());
  ASSERT_TRUE(client_->ReportTrainerDone(1, 0, Status::Ok(), sums(0)).ok());
  StatusOr<std::vector<WriteChecksum>> early = client_->FetchChecksums(1, 0, In(0.2));
  ASSERT_EQ(early.status().code(), StatusCode::kDeadlineExceeded) << early.status().ToString();
  EXPECT_NE(early.status().message().find("trainer ranks [1"), std::string::npos) << early.status().message();

  for (int t = 1; t < trainers; ++t) ASSERT_TRUE(client_->ReportTrainerDone(1, t, Status::Ok(), sums(t)).ok());
  StatusOr<std::vector<WriteChecksum>> got = client_->FetchChecksums(1, 1, In(5));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), static_cast<size_t>(trainers));
  for (int t = 0; t < trainers; ++t) {
    const WriteChecksum& c = (*got)[static_cast<size_t>(t)];
    EXPECT_EQ(c.dst_rank, 1);
    EXPECT_EQ(c.region, "w");
    EXPECT_EQ(c.offset, static_cast<uint64_t>(t) * 64);
    EXPECT_EQ(c.bytes, 64u);
    EXPECT_EQ(c.hash, 0x1000u + static_cast<uint64_t>(t));
  }
  // The version object says who sent checksums but does not carry them.
  StatusOr<json> v1 = controller_->GetVersion(1, std::chrono::milliseconds(0));
  ASSERT_TRUE(v1.ok());
  EXPECT_EQ((*v1)["checksums_from"].size(), static_cast<size_t>(trainers)) << v1->dump();
  EXPECT_FALSE((*v1)["trainer_stats"]["0"].contains("checksums")) << v1->dump();

  // A trainer without checksums: named.
  for (int i = 0; i < world_.inference_ranks(); ++i) ASSERT_TRUE(client_->ReportInferenceDone(1, i, Status::Ok()).ok());
  ASSERT_TRUE(client_->StartVersion(2, 0).ok());
  for (int t = 0; t < trainers; ++t)
    ASSERT_TRUE(client_->ReportTrainerDone(2, t, Status::Ok(), t == 1 ? json{{"writes", 1}} : sums(t)).ok());
  StatusOr<std::vector<WriteChecksum>> none = client_->FetchChecksums(2, 0, In(5));
  EXPECT_EQ(none.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(none.status().message().find("trainer ranks [1] sent none"), std::string::npos) << none.status().message();

  // Malformed checksums are refused with the report; a failed version has none.
  for (int i = 0; i < world_.inference_ranks(); ++i) ASSERT_TRUE(client_->ReportInferenceDone(2, i, Status::Ok()).ok());
  ASSERT_TRUE(client_->StartVersion(3, 0).ok());
  StatusOr<VersionStatus> bad =
      client_->ReportTrainerDone(3, 0, Status::Ok(), json{{"checksums", {{"9", {{"w", {{0, 64, "x"}}}}}}}});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'9' is not an inference rank"), std::string::npos) << bad.status().message();
  ASSERT_TRUE(client_->ReportFailure(3, Role::kTrainer, 1, "diverged").ok());
  StatusOr<std::vector<WriteChecksum>> failed = client_->FetchChecksums(3, 0, In(5));
  EXPECT_EQ(failed.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(failed.status().message().find("the version failed: trainer rank 1: diverged"), std::string::npos)
      << failed.status().message();
  EXPECT_EQ(client_->FetchChecksums(1, 7, In(1)).status().code(), StatusCode::kInvalidArgument);
}

// Shadow mode's two phases: once every inference rank is done the version
// has landed, but it is complete only when every shadow rank has copied it
// into its engine (committed); until then it runs, and holds the next one.
TEST_F(ControllerTest, AShadowVersionIsCompleteOnceEveryShadowRankCommittedIt) {
  StartServer();
  RegisterAll();
  ASSERT_EQ(world_.inference_ranks(), 2);
  ASSERT_TRUE(client_->StartVersion(1, 0).ok());
  for (int t = 0; t < world_.trainers(); ++t) ASSERT_TRUE(client_->ReportTrainerDone(1, t, Status::Ok()).ok());
  ASSERT_TRUE(client_->ReportInferenceDone(1, 0, Status::Ok(), /*commit=*/true).ok());
  EXPECT_EQ(client_->ReportCommitted(1, 0).status().code(), StatusCode::kFailedPrecondition)
      << "committed before the version landed everywhere";
  StatusOr<VersionStatus> done = client_->ReportInferenceDone(1, 1, Status::Ok(), /*commit=*/true);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->state, "started");
  EXPECT_TRUE(done->landed);
  StatusOr<VersionStatus> landed = client_->WaitVersionLanded(1, In(1));
  ASSERT_TRUE(landed.ok() && landed->landed) << landed.status().ToString();

  StatusOr<VersionStatus> early = client_->StartVersion(2, 0);
  ASSERT_EQ(early.status().code(), StatusCode::kUnavailable) << early.status().ToString();
  EXPECT_NE(early.status().message().find("shadow inference ranks are copying it out"), std::string::npos)
      << early.status().message();
  StatusOr<VersionStatus> one = client_->ReportCommitted(1, 0);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->state, "started");
  StatusOr<VersionStatus> both = client_->ReportCommitted(1, 1);
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ(both->state, "complete");
  ASSERT_TRUE(client_->StartVersion(2, 0).ok());

  // A version that fails while landed is not committed.
  for (int t = 0; t < world_.trainers(); ++t) ASSERT_TRUE(client_->ReportTrainerDone(2, t, Status::Ok()).ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(client_->ReportInferenceDone(2, i, Status::Ok(), true).ok());
  ASSERT_TRUE(client_->ReportFailure(2, Role::kInference, 0, "copy failed").ok());
  EXPECT_EQ(client_->ReportCommitted(2, 1).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(client_->StartVersion(3, 0).ok());
}

// A controller killed while shadow ranks copy a landed version out comes
// back with it still landed: it holds the next version back, and the
// ranks' commits complete it (the chaos run found the hang without this).
TEST_F(ControllerTest, ALandedShadowVersionSurvivesAControllerRestart) {
  StartServer();
  RegisterAll();
  ASSERT_TRUE(client_->StartVersion(1, 0).ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(client_->ReportInferenceDone(1, i, Status::Ok(), /*commit=*/true).ok());
  ASSERT_TRUE(client_->ReportCommitted(1, 0).ok());
  StopServer();
  StartServer();
  StatusOr<VersionStatus> back = client_->WaitVersionLanded(1, In(2));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->state, "started");
  EXPECT_TRUE(back->landed);
  EXPECT_EQ(client_->StartVersion(2, 0).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(client_->ReportCommitted(1, 0).status().code(), StatusCode::kFailedPrecondition)
      << "rank 0 had committed before the restart";
  StatusOr<VersionStatus> done = client_->ReportCommitted(1, 1);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->state, "complete");
  // Once complete it is the latest complete one across another restart.
  StopServer();
  StartServer();
  EXPECT_EQ(Status()["latest_complete_version"], 1) << Status().dump();
  EXPECT_EQ(client_->WaitVersionLanded(7, In(1)).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(client_->StartVersion(2, 0).ok());
}

}  // namespace
}  // namespace wsync::controller::testing
