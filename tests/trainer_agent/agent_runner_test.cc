// The trainer agent loop against a real controller (in-process HTTP server):
// 4 agents (threads) register, get their plans from the controller, meet
// over the controller's Gloo store, and run every version the trainers
// publish in shared memory; the controller sees each trainer's report and
// the receivers' bytes match the hand-built reference. A trainer whose
// export does not match its metadata is one clear error.
#include "trainer_agent/agent_runner.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <mutex>
#include <thread>

#include "controller/controller.h"
#include "controller/http_server.h"
#include "tests/trainer_agent/update_fixture.h"
#include "trainer_agent/agent_command.h"
#include "trainer_agent/shard_export.h"
#include "transport/libfabric/libfabric_engine.h"

namespace wsync::trainer_agent {
namespace {

using std::chrono::milliseconds;
using testing::kInference;
using testing::kTrainers;
using Clock = std::chrono::steady_clock;

class AgentRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto f = testing::MakeUpdateFixture("shm");
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    fixture_ = std::move(f).value();
    state_dir_ = std::filesystem::temp_directory_path() / ("wsync-ta-state-" + std::to_string(getpid()));
    std::filesystem::remove_all(state_dir_);
    std::filesystem::create_directories(state_dir_);
    StartController(0);
    client_ = std::make_unique<controller::ControllerClient>("127.0.0.1", server_->port());
    for (const InferenceRank& r : fixture_->inference.ranks) {
      auto reg = client_->RegisterInference(r);
      ASSERT_TRUE(reg.ok()) << reg.status().ToString();
    }
    for (int r = 0; r < kTrainers; ++r) {
      const std::string name = "/wsync-test-agent-" + std::to_string(getpid()) + "-" + std::to_string(r);
      names_.push_back(name);
      auto e = ShardExport::Create(name, fixture_->trainer.ranks[r]);
      ASSERT_TRUE(e.ok()) << e.status().ToString();
      exports_.push_back(std::move(e).value());
      transport::fabric::LibfabricOptions o;
      o.provider = "shm";
      o.op_timeout = milliseconds(5000);
      auto engine = transport::fabric::CreateLibfabricEngine(o);
      ASSERT_TRUE(engine.ok()) << engine.status().ToString();
      engines_.push_back(std::move(engine).value());
    }
  }

  void TearDown() override {
    stop_.store(true);
    for (auto& t : agents_) t.join();
    agents_.clear();
    engines_.clear();
    server_.reset();
    controller_.reset();
    fixture_.reset();
    std::filesystem::remove_all(state_dir_);
  }

  // A controller persisting to state_dir_, on `port` (0: any free one).
  void StartController(int port) {
    controller::ControllerOptions co;
    co.trainers = kTrainers;
    co.inference = kInference;
    co.mapping = fixture_->mapping;
    co.version_timeout_s = 60;
    co.state_dir = state_dir_.string();
    auto c = controller::Controller::Create(co);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    controller_ = std::move(c).value();
    controller::ServerOptions so;
    so.port = port;
    server_ = std::make_unique<controller::HttpServer>(controller_.get(), so);
    ASSERT_TRUE(server_->Start().ok());
  }

  // One update on all agents that must complete and land bit for bit.
  void UpdateAndVerify(uint64_t v) {
    const testing::FullWeights full = testing::MakeFullWeights(v);
    std::vector<std::future<Status>> landed;
    for (int i = 0; i < kInference; ++i) {
      std::fill(fixture_->targets[i].memory.begin(), fixture_->targets[i].memory.end(), testing::kFill);
      auto promise = std::make_shared<std::promise<Status>>();
      landed.push_back(promise->get_future());
      ASSERT_TRUE(fixture_->targets[i]
                      .engine
                      ->Expect(static_cast<uint32_t>(v), fixture_->expected_arrivals[i],
                               [promise](const Status& s) { promise->set_value(s); }, Clock::now() + milliseconds(60000))
                      .ok());
    }
    Publish(v, full);
    // The trainer side: wait until the agent no longer reads this version.
    for (int r = 0; r < kTrainers; ++r) {
      Status s = exports_[r]->WaitReadsDone(v, milliseconds(60000));
      ASSERT_TRUE(s.ok()) << "rank " << r << ": " << s.ToString();
      EXPECT_LT(exports_[r]->failed_version(), v);
    }
    for (int i = 0; i < kInference; ++i) {
      Status s = landed[i].get();
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_TRUE(fixture_->targets[i].memory == testing::ExpectedRegion(i, full, fixture_->region_bytes))
          << "inference rank " << i << " version " << v;
      ASSERT_TRUE(client_->ReportInferenceDone(v, i, Status::Ok()).ok());
    }
    const auto deadline = Clock::now() + milliseconds(30000);
    while (ResultsFor(v) < kTrainers && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(20));
    ASSERT_EQ(ResultsFor(v), static_cast<size_t>(kTrainers));
    StatusOr<controller::VersionStatus> status = client_->WaitVersion(v, Clock::now() + milliseconds(10000));
    ASSERT_TRUE(status.ok()) << status.status().ToString();
    EXPECT_TRUE(status->complete()) << status->raw.dump();
    EXPECT_EQ(status->trainer_done, (std::vector<int32_t>{0, 1, 2, 3}));
  }

  TrainerAgentOptions Options(int r) {
    TrainerAgentOptions o;
    o.executor.watermark_bytes = 8 << 20;
    o.executor.rendezvous_prefix = "agent-test";
    o.gloo.timeout = milliseconds(10000);
    o.plan_timeout = milliseconds(30000);
    o.shm_timeout = milliseconds(5000);
    o.log = [r](const std::string& line) { std::fprintf(stderr, "[agent %d] %s\n", r, line.c_str()); };
    o.on_version = [this, r](uint64_t v, const StatusOr<VersionReport>& result) {
      std::lock_guard<std::mutex> lock(mu_);
      results_.emplace_back(r, v, result.ok() ? std::string() : result.status().ToString());
    };
    return o;
  }

  void StartAgent(int r, const std::string& shm_name) {
    agents_.emplace_back([this, r, shm_name] {
      const TrainerRank& rank = fixture_->trainer.ranks[r];
      Status s = RunTrainerAgent(rank, fixture_->trainer.mesh_groups, shm_name, engines_[r], *client_, Options(r),
                                 stop_);
      std::lock_guard<std::mutex> lock(mu_);
      exits_.emplace_back(r, s);
    });
  }

  // Versions finished by the agents so far: (rank, version, error or "").
  size_t ResultsFor(uint64_t v) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (const auto& [r, ver, err] : results_) n += ver == v ? 1 : 0;
    return n;
  }

  void Publish(uint64_t v, const testing::FullWeights& full) {
    for (int r = 0; r < kTrainers; ++r) {
      for (const TrainerParam& p : fixture_->trainer.ranks[r].params) {
        std::vector<uint8_t> shard = testing::LocalShard(p, full);
        std::memcpy(exports_[r]->Tensor(p.name)->data, shard.data(), shard.size());
      }
      ASSERT_TRUE(exports_[r]->Publish(v).ok());
    }
  }

  std::unique_ptr<testing::UpdateFixture> fixture_;
  std::unique_ptr<controller::Controller> controller_;
  std::unique_ptr<controller::HttpServer> server_;
  std::unique_ptr<controller::ControllerClient> client_;
  std::filesystem::path state_dir_;
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<ShardExport>> exports_;
  std::vector<std::unique_ptr<transport::Engine>> engines_;
  std::vector<std::thread> agents_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::tuple<int, uint64_t, std::string>> results_;
  std::vector<std::pair<int, Status>> exits_;
};

// A write to a dead peer gives up in time for the rank to reach its peers'
// next rendezvous: never later than half the Gloo timeout.
TEST(WriteTimeoutTest, AWriteGivesUpBeforeThePeersRendezvousDoes) {
  using std::chrono::milliseconds;
  using std::chrono::seconds;
  EXPECT_EQ(WriteTimeoutWithin(seconds(30), seconds(20)), seconds(10));  // the chaos harness
  EXPECT_EQ(WriteTimeoutWithin(seconds(30), seconds(60)), seconds(30));  // the default: unchanged
  EXPECT_EQ(WriteTimeoutWithin(seconds(30), milliseconds(0)), milliseconds(1));
}

TEST_F(AgentRunnerTest, PublishedVersionsReachTheReceiversAndTheController) {
  for (int r = 0; r < kTrainers; ++r) StartAgent(r, names_[r]);
  for (uint64_t v = 1; v <= 2; ++v) UpdateAndVerify(v);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [r, v, err] : results_) EXPECT_EQ(err, "") << "rank " << r << " version " << v;
}

// The controller restarts from its state dir between updates (same port):
// the agents keep their plan and Gloo groups, and the next update completes.
TEST_F(AgentRunnerTest, ControllerRestartBetweenUpdates) {
  for (int r = 0; r < kTrainers; ++r) StartAgent(r, names_[r]);
  UpdateAndVerify(1);
  const int port = server_->port();
  server_.reset();
  controller_.reset();
  StartController(port);
  UpdateAndVerify(2);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [r, v, err] : results_) EXPECT_EQ(err, "") << "rank " << r << " version " << v;
}

TEST_F(AgentRunnerTest, ExportOfAnotherLayoutIsOneClearError) {
  // Rank 0's agent is pointed at rank 1's export.
  agents_.emplace_back([this] {
    TrainerAgentOptions o = Options(0);
    Status s = RunTrainerAgent(fixture_->trainer.ranks[0], fixture_->trainer.mesh_groups, names_[1], engines_[0],
                               *client_, o, stop_);
    std::lock_guard<std::mutex> lock(mu_);
    exits_.emplace_back(0, s);
  });
  // The plan only exists once every trainer registered.
  for (int r = 1; r < kTrainers; ++r) {
    ASSERT_TRUE(client_->RegisterTrainer(fixture_->trainer.ranks[r], fixture_->trainer.mesh_groups).ok());
  }
  agents_.back().join();
  agents_.clear();
  ASSERT_EQ(exits_.size(), 1u);
  const Status& s = exits_[0].second;
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("trainer rank 0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(names_[1]), std::string::npos) << s.message();
}

}  // namespace
}  // namespace wsync::trainer_agent
