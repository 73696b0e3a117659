// `wsync inference-agent` as a real process against a real controller
// (in-process HTTP server on a loopback port): it registers its layout with
// transport descriptors, gets its plan, notices the versions a trainer
// starts, and reports them; the controller calls a version complete only
// after the agent saw every write, and failed (naming inference rank 0 and
// how many writes arrived) when one is missing. A writer process plays the
// trainer, executing the trainer plan slice the controller hands out.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "controller/client.h"
#include "controller/controller.h"
#include "controller/http_server.h"
#include "inference_agent/weight_store_format.h"
#include "routing/spec_io.h"
#include "tests/inference_agent/child_process.h"

namespace wsync::inference::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
constexpr uint64_t kSeed = 77;

struct TensorDef {
  const char* name;
  Shape shape;
  uint64_t offset;
};
const std::vector<TensorDef> kTensors = {{"model.embed_tokens.weight", {256, 128}, 0},
                                         {"model.layers.0.mlp.down_proj.weight", {128, 256}, 65536},
                                         {"model.norm.weight", {128}, 131072}};

InferenceSpec Layout() {
  InferenceRank r;
  r.rank = 0;
  r.host = "infer-0";
  r.regions = {{"weights", 256 << 10, ""}};
  for (const TensorDef& d : kTensors) {
    InferenceTensor t;
    t.name = d.name;
    t.shape = d.shape;
    t.dtype = DType::kBF16;
    t.where = {"weights", d.offset};
    r.tensors.push_back(t);
  }
  return InferenceSpec{{r}};
}

// One trainer rank holding everything (a mesh of one).
TrainerSpec Trainer() {
  TrainerSpec spec;
  spec.mesh_groups = {{"dense", "dense", {"fsdp"}}};
  TrainerRank r;
  r.rank = 0;
  r.host = "trainer-0";
  r.meshes = {{"dense", {1}, {"fsdp"}, {0}}};
  for (const TensorDef& d : kTensors) {
    TrainerParam p;
    p.name = d.name;
    p.global_shape = d.shape;
    p.mesh = "dense";
    p.placements = {Placement::Shard(0)};
    p.local_shape = d.shape;
    p.local_offset = Shape(d.shape.size(), 0);
    p.mesh_group = "dense";
    r.params.push_back(p);
  }
  spec.ranks = {r};
  return spec;
}

class AgentWithControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/wsync-infer-agent-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    shm_name_ = "/wsync-test-cli-" + std::to_string(getpid());
    ASSERT_TRUE(WriteJsonFile(ToJson(Layout()), dir_ + "/inference.json").ok());

    StartController(0);
    client_ = std::make_unique<controller::ControllerClient>("127.0.0.1", server_->port());

    agent_ = std::make_unique<ChildProcess>(std::vector<std::string>{
        "agent", "controller=" + server_->address(), "rank=0", "layout=" + dir_ + "/inference.json",
        "provider=shm", "nics=1", "shm=" + shm_name_, "version_timeout=30"});
    ASSERT_EQ(agent_->ReadLine(seconds(30)), "ready");

    // The trainer registers last, completing the world; then plays its plan.
    const TrainerSpec trainer = Trainer();
    auto reg = client_->RegisterTrainer(trainer.ranks[0], trainer.mesh_groups);
    ASSERT_TRUE(reg.ok()) << reg.status().ToString();
    auto slice = client_->FetchTrainerPlan(0, controller::ControllerClient::Clock::now() + seconds(10));
    ASSERT_TRUE(slice.ok()) << slice.status().ToString();
    ASSERT_EQ(slice->plan.peers.size(), 1u);
    const std::string desc = slice->plan.peers[0].region_descriptors.at("weights");
    std::string plan_line = "plan";
    for (const RankMeshGroup& g : slice->plan.groups) {
      for (const RankSource& s : g.sources) {
        for (const RankWrite& w : s.writes) {
          ASSERT_EQ(w.dst_rank, 0);
          plan_line += " " + std::to_string(w.region_offset) + ":" + std::to_string(w.bytes);
          ++writes_;
        }
      }
    }
    ASSERT_GE(writes_, kTensors.size());
    writer_ = std::make_unique<ChildProcess>(std::vector<std::string>{"writer", "shm", "1", "-", "4194304"});
    ASSERT_EQ(writer_->ReadLine(), "ready");
    ASSERT_TRUE(writer_->Send("desc " + desc));
    ASSERT_EQ(writer_->ReadLine(), "ok");
    ASSERT_TRUE(writer_->Send(plan_line));
    ASSERT_EQ(writer_->ReadLine(), "ok");
  }

  void StartController(int port) {
    controller::ControllerOptions co;
    co.trainers = 1;
    co.inference = 1;
    co.mapping = controller::IdentityMapping();
    co.version_timeout_s = 3;
    co.state_dir = dir_ + "/state";
    co.log = [](const std::string& line) { fprintf(stderr, "controller: %s\n", line.c_str()); };
    auto c = controller::Controller::Create(co);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    controller_ = std::move(c).value();
    controller::ServerOptions so;
    so.port = port;
    server_ = std::make_unique<controller::HttpServer>(controller_.get(), so);
    ASSERT_TRUE(server_->Start().ok());
  }

  void TearDown() override {
    writer_.reset();
    if (agent_ != nullptr) {
      agent_->Signal(SIGTERM);  // lets it remove its weight store
      agent_->Wait(seconds(10));
    }
    agent_.reset();
    shm_unlink(shm_name_.c_str());  // in case it could not
    server_.reset();
    controller_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::string Write(uint64_t v, size_t first, size_t last) {
    std::string list;
    for (size_t i = first; i < last; ++i) {
      if (!list.empty()) list += ',';
      list += std::to_string(i);
    }
    writer_->Send("write " + std::to_string(v) + " " + std::to_string(kSeed) + " " + list);
    return writer_->ReadLine();
  }

  StatusOr<controller::VersionStatus> Wait(uint64_t v) {
    return client_->WaitVersion(v, controller::ControllerClient::Clock::now() + seconds(20));
  }

  std::string EngineReads(uint64_t v) {
    std::vector<std::string> args = {"engine", shm_name_, std::to_string(v), std::to_string(kSeed), "10000"};
    for (const TensorDef& d : kTensors) {
      uint64_t bytes = 2;
      for (int64_t x : d.shape) bytes *= static_cast<uint64_t>(x);
      args.push_back(std::string(d.name) + ":" + std::to_string(d.offset) + ":" + std::to_string(bytes));
    }
    ChildProcess engine(args);
    return engine.ReadLine(seconds(20));
  }

  std::string Peek() {
    ChildProcess peek({"peek", shm_name_});
    return peek.ReadLine(seconds(10));
  }

  std::string dir_, shm_name_;
  std::unique_ptr<controller::Controller> controller_;
  std::unique_ptr<controller::HttpServer> server_;
  std::unique_ptr<controller::ControllerClient> client_;
  std::unique_ptr<ChildProcess> agent_;
  std::unique_ptr<ChildProcess> writer_;
  size_t writes_ = 0;
};

TEST_F(AgentWithControllerTest, UpdatesCompleteFailAndRecoverThroughTheController) {
  // Version 1: every write lands -> complete at the controller and for the engine.
  ASSERT_TRUE(client_->StartVersion(1, 0).ok());
  ASSERT_EQ(Write(1, 0, writes_), "done");
  auto v1 = Wait(1);
  ASSERT_TRUE(v1.ok()) << v1.status().ToString();
  EXPECT_TRUE(v1->complete()) << v1->raw.dump();
  EXPECT_EQ(v1->inference_done, std::vector<int32_t>{0});
  EXPECT_EQ(EngineReads(1), "ok");

  // Version 2 loses a write: failed, and inference rank 0 says how.
  ASSERT_TRUE(client_->StartVersion(2, 0).ok());
  ASSERT_EQ(Write(2, 0, writes_ - 1), "done");
  std::this_thread::sleep_for(milliseconds(500));
  EXPECT_EQ(Peek(), "complete 1 failed " + std::to_string(kNoVersion)) << "announced before every write landed";
  auto v2 = Wait(2);
  ASSERT_TRUE(v2.ok()) << v2.status().ToString();
  EXPECT_TRUE(v2->failed()) << v2->raw.dump();
  bool agent_said = false;
  for (int i = 0; i < 100 && !agent_said; ++i) {
    auto now = client_->GetVersion(2);
    ASSERT_TRUE(now.ok());
    for (const auto& f : now->failures) {
      if (f.role == "inference" && f.rank == 0) {
        agent_said = true;
        EXPECT_NE(f.error.find("saw " + std::to_string(writes_ - 1) + " of " + std::to_string(writes_)),
                  std::string::npos)
            << f.error;
      }
    }
    if (!agent_said) std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_TRUE(agent_said) << "inference rank 0 never reported version 2 failed";
  EXPECT_FALSE(client_->GetVersion(2)->complete());
  EXPECT_EQ(Peek(), "complete 1 failed 2");

  // The next update succeeds.
  ASSERT_TRUE(client_->StartVersion(3, 0).ok());
  ASSERT_EQ(Write(3, 0, writes_), "done");
  auto v3 = Wait(3);
  ASSERT_TRUE(v3.ok()) << v3.status().ToString();
  EXPECT_TRUE(v3->complete()) << v3->raw.dump();
  EXPECT_EQ(EngineReads(3), "ok");

  // A trainer fails a version while its writes are in flight (v4: after the
  // agent began expecting it; v5: before the agent even noticed it
  // started). When every write lands anyway, it is still never announced.
  for (uint64_t v : {4, 5}) {
    ASSERT_TRUE(client_->StartVersion(v, 0).ok());
    if (v == 4) {
      ASSERT_EQ(Write(v, 0, writes_ - 1), "done");
      std::this_thread::sleep_for(milliseconds(500));  // > the agent's poll interval
    }
    ASSERT_TRUE(client_->ReportFailure(v, controller::Role::kTrainer, 0, "trainer rank 0 killed").ok());
    const std::string failed = "complete 3 failed " + std::to_string(v);
    std::string words;
    for (int i = 0; i < 100 && words != failed; ++i) {
      std::this_thread::sleep_for(milliseconds(50));
      words = Peek();
    }
    EXPECT_EQ(words, failed) << "the agent did not hear that version " << v << " failed";
    ASSERT_EQ(Write(v, v == 4 ? writes_ - 1 : 0, writes_), "done");
    std::this_thread::sleep_for(milliseconds(500));
    EXPECT_EQ(Peek(), failed);
    EXPECT_TRUE(client_->GetVersion(v)->failed());
  }

  // SIGTERM ends the agent cleanly.
  agent_->Signal(SIGTERM);
  EXPECT_EQ(agent_->Wait(seconds(10)), 0);
}

TEST_F(AgentWithControllerTest, AgentCarriesOnAcrossAControllerRestart) {
  ASSERT_TRUE(client_->StartVersion(1, 0).ok());
  ASSERT_EQ(Write(1, 0, writes_), "done");
  auto v1 = Wait(1);
  ASSERT_TRUE(v1.ok() && v1->complete()) << (v1.ok() ? v1->raw.dump() : v1.status().ToString());

  // Down for a while (the agent's polls are refused), then back on the same
  // port from its state dir, serving the same plan.
  const int port = server_->port();
  server_.reset();
  controller_.reset();
  std::this_thread::sleep_for(seconds(1));
  StartController(port);

  ASSERT_TRUE(client_->StartVersion(2, 0).ok());
  ASSERT_EQ(Write(2, 0, writes_), "done");
  auto v2 = Wait(2);
  ASSERT_TRUE(v2.ok()) << v2.status().ToString();
  EXPECT_TRUE(v2->complete()) << v2->raw.dump();
  EXPECT_EQ(EngineReads(2), "ok");
}

TEST(InferenceAgentCommandTest, LayoutWithoutTheRankEndsTheAgentBeforeAnythingIsCreated) {
  char tmpl[] = "/tmp/wsync-infer-agent-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ASSERT_TRUE(WriteJsonFile(ToJson(Layout()), dir + "/inference.json").ok());
  const std::string shm = "/wsync-test-cli-bad-" + std::to_string(getpid());
  ChildProcess bad({"agent", "controller=127.0.0.1:1", "rank=5", "layout=" + dir + "/inference.json",
                    "provider=shm", "shm=" + shm});
  EXPECT_EQ(bad.Wait(seconds(10)), 1);
  EXPECT_EQ(shm_open(shm.c_str(), O_RDONLY, 0), -1) << "left a weight store behind";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace wsync::inference::testing
