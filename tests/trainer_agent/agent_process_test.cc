// Trainer agents as real processes (this binary re-executed in the
// AgentProcessRole.Run role, which runs the `wsync trainer-agent` command
// code on a trainer.json): a full update lands bit for bit; an agent killed
// before an update makes that version fail at the controller (never
// complete) with its peers' errors naming them, and releases their trainers;
// after a restart of the killed agent the next update succeeds everywhere.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <thread>

#include "controller/client.h"
#include "controller/controller.h"
#include "controller/http_server.h"
#include "routing/spec_io.h"
#include "tests/sanitizer_slowdown.h"
#include "tests/trainer_agent/update_fixture.h"
#include "trainer_agent/agent_command.h"
#include "trainer_agent/shard_export.h"

namespace wsync::trainer_agent {
namespace {

using std::chrono::milliseconds;
using testing::kInference;
using testing::kTrainers;
using Clock = std::chrono::steady_clock;

// The child side. Skipped unless started by the test below.
TEST(AgentProcessRole, Run) {
  const char* role = std::getenv("WSYNC_TA_ROLE");
  if (role == nullptr) GTEST_SKIP() << "only runs as a child of AgentProcessTest";
  TrainerAgentFlags flags;
  flags.controller = std::getenv("WSYNC_TA_CONTROLLER");
  flags.rank = std::atoi(std::getenv("WSYNC_TA_RANK"));
  flags.layout = std::getenv("WSYNC_TA_LAYOUT");
  flags.shm_name = std::getenv("WSYNC_TA_SHM");
  flags.watermark = 4 << 20;
  flags.gloo_timeout_s = 3 * testing::kSanitizerSlowdown;
  flags.plan_timeout_s = 60;
  flags.shm_timeout_s = 60;
  EXPECT_EQ(RunTrainerAgentCommand(flags), 0);
}

class AgentProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto f = testing::MakeUpdateFixture("shm");
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    fixture_ = std::move(f).value();
    dir_ = std::filesystem::temp_directory_path() / ("wsync-ta-proc-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    layout_ = (dir_ / "trainer.json").string();
    ASSERT_TRUE(WriteJsonFile(ToJson(testing::MakeTestTrainerSpec()), layout_).ok());

    controller::ControllerOptions co;
    co.trainers = kTrainers;
    co.inference = kInference;
    co.mapping = fixture_->mapping;
    co.version_timeout_s = 60;
    auto c = controller::Controller::Create(co);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    controller_ = std::move(c).value();
    server_ = std::make_unique<controller::HttpServer>(controller_.get(), controller::ServerOptions{});
    ASSERT_TRUE(server_->Start().ok());
    client_ = std::make_unique<controller::ControllerClient>("127.0.0.1", server_->port());
    for (const InferenceRank& r : fixture_->inference.ranks) ASSERT_TRUE(client_->RegisterInference(r).ok());
    for (int r = 0; r < kTrainers; ++r) {
      names_.push_back("/wsync-test-proc-" + std::to_string(getpid()) + "-" + std::to_string(r));
      auto e = ShardExport::Create(names_[r], fixture_->trainer.ranks[r]);
      ASSERT_TRUE(e.ok()) << e.status().ToString();
      exports_.push_back(std::move(e).value());
    }
    pids_.assign(kTrainers, -1);
  }

  void TearDown() override {
    for (pid_t pid : pids_) {
      if (pid > 0) kill(pid, SIGKILL);
    }
    for (pid_t pid : pids_) {
      if (pid > 0) waitpid(pid, nullptr, 0);
    }
    server_.reset();
    controller_.reset();
    fixture_.reset();
    std::filesystem::remove_all(dir_);
  }

  // The parent runs the controller's and the engines' threads, so the child
  // may only make async-signal-safe calls until exec: another thread may
  // hold the allocator's or the environment's lock at fork, and setenv or
  // malloc in the child would then wait forever (seen under ASan: rank 0's
  // agent never started). Argument and environment arrays are built here.
  void Spawn(int r) {
    const std::string controller = "127.0.0.1:" + std::to_string(server_->port());
    std::vector<std::string> env = {"WSYNC_TA_ROLE=agent", "WSYNC_TA_CONTROLLER=" + controller,
                                    "WSYNC_TA_RANK=" + std::to_string(r), "WSYNC_TA_LAYOUT=" + layout_,
                                    "WSYNC_TA_SHM=" + names_[r]};
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "WSYNC_TA_", 9) != 0) env.push_back(*e);
    }
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string program = "trainer_agent_test", filter = "--gtest_filter=AgentProcessRole.Run";
    char* argv[] = {program.data(), filter.data(), nullptr};
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      execve("/proc/self/exe", argv, envp.data());
      _exit(127);
    }
    pids_[r] = pid;
  }

  // Stops agent r with SIGTERM and returns its exit status (-1 if killed).
  int Stop(int r) {
    kill(pids_[r], SIGTERM);
    int status = 0;
    waitpid(pids_[r], &status, 0);
    pids_[r] = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  std::vector<std::future<Status>> Expect(uint64_t v) {
    std::vector<std::future<Status>> landed;
    for (int i = 0; i < kInference; ++i) {
      std::fill(fixture_->targets[i].memory.begin(), fixture_->targets[i].memory.end(), testing::kFill);
      auto promise = std::make_shared<std::promise<Status>>();
      landed.push_back(promise->get_future());
      EXPECT_TRUE(fixture_->targets[i]
                      .engine
                      ->Expect(static_cast<uint32_t>(v), fixture_->expected_arrivals[i],
                               [promise](const Status& s) { promise->set_value(s); }, Clock::now() + milliseconds(60000))
                      .ok());
    }
    return landed;
  }

  void Publish(uint64_t v, const testing::FullWeights& full, const std::vector<int>& ranks) {
    for (int r : ranks) {
      for (const TrainerParam& p : fixture_->trainer.ranks[r].params) {
        std::vector<uint8_t> shard = testing::LocalShard(p, full);
        std::memcpy(exports_[r]->Tensor(p.name)->data, shard.data(), shard.size());
      }
      ASSERT_TRUE(exports_[r]->Publish(v).ok());
    }
  }

  // A full update on all ranks that must complete, bit for bit.
  void UpdateAndVerify(uint64_t v) {
    const testing::FullWeights full = testing::MakeFullWeights(v);
    auto landed = Expect(v);
    Publish(v, full, {0, 1, 2, 3});
    for (int r = 0; r < kTrainers; ++r) {
      ASSERT_TRUE(exports_[r]->WaitReadsDone(v, milliseconds(60000)).ok()) << "rank " << r;
      EXPECT_LT(exports_[r]->failed_version(), v) << "rank " << r;
    }
    for (int i = 0; i < kInference; ++i) {
      Status s = landed[i].get();
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_TRUE(fixture_->targets[i].memory == testing::ExpectedRegion(i, full, fixture_->region_bytes))
          << "inference rank " << i << " version " << v;
      ASSERT_TRUE(client_->ReportInferenceDone(v, i, Status::Ok()).ok());
    }
    auto status = client_->WaitVersion(v, Clock::now() + milliseconds(20000));
    ASSERT_TRUE(status.ok()) << status.status().ToString();
    EXPECT_TRUE(status->complete()) << status->raw.dump();
  }

  std::unique_ptr<testing::UpdateFixture> fixture_;
  std::filesystem::path dir_;
  std::string layout_;
  std::unique_ptr<controller::Controller> controller_;
  std::unique_ptr<controller::HttpServer> server_;
  std::unique_ptr<controller::ControllerClient> client_;
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<ShardExport>> exports_;
  std::vector<pid_t> pids_;
};

TEST_F(AgentProcessTest, KilledAgentFailsItsVersionAndARestartRecovers) {
  for (int r = 0; r < kTrainers; ++r) Spawn(r);
  UpdateAndVerify(1);

  // Rank 3's agent dies; the trainers publish version 2 anyway.
  kill(pids_[3], SIGKILL);
  waitpid(pids_[3], nullptr, 0);
  pids_[3] = -1;
  auto landed = Expect(2);
  const auto t0 = Clock::now();
  Publish(2, testing::MakeFullWeights(2), {0, 1, 2, 3});
  for (int r = 0; r < 3; ++r) {
    // The survivors fail within their Gloo timeout and release their trainers.
    ASSERT_TRUE(exports_[r]->WaitReadsDone(2, milliseconds(30000)).ok()) << "rank " << r;
    EXPECT_EQ(exports_[r]->failed_version(), 2u) << "rank " << r;
  }
  EXPECT_LT(Clock::now() - t0, milliseconds(15000));
  auto v2 = client_->WaitVersion(2, Clock::now() + milliseconds(30000));
  ASSERT_TRUE(v2.ok()) << v2.status().ToString();
  EXPECT_TRUE(v2->failed()) << v2->raw.dump();
  ASSERT_FALSE(v2->failures.empty());
  for (const controller::VersionFailure& f : v2->failures) {
    EXPECT_EQ(f.role, "trainer");
    EXPECT_NE(f.error.find("trainer rank " + std::to_string(f.rank)), std::string::npos) << f.error;
  }
  EXPECT_EQ(std::find(v2->trainer_done.begin(), v2->trainer_done.end(), 3), v2->trainer_done.end());

  // The restarted agent skips the failed version 2 and joins version 3.
  Spawn(3);
  ASSERT_TRUE(exports_[3]->WaitReadsDone(2, milliseconds(30000)).ok());
  EXPECT_EQ(exports_[3]->failed_version(), 2u);
  UpdateAndVerify(3);

  for (int r = 0; r < kTrainers; ++r) EXPECT_EQ(Stop(r), 0) << "rank " << r;
}

}  // namespace
}  // namespace wsync::trainer_agent
