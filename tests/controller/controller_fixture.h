// Shared setup for the controller tests: the tiny world of tests/cli/data/good
// (2 trainer ranks, FSDP over 2) with two inference replicas (rank 1 is a
// copy of rank 0 in instance 1), a controller + HTTP server in-process on a
// loopback port, and a client talking to it over real HTTP.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "controller/client.h"
#include "controller/controller.h"
#include "controller/http_server.h"
#include "routing/spec_io.h"

namespace wsync::controller::testing {

using nlohmann::json;

inline json ReadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

inline std::string DataPath(const std::string& name) { return std::string(WSYNC_CLI_DATA) + "/good/" + name; }

// The fixture documents, split per rank the way agents send them.
struct TinyWorld {
  json trainer = ReadJson(DataPath("trainer.json"));
  json inference = ReadJson(DataPath("inference.json"));
  MappingSpec mapping;

  TinyWorld() {
    StatusOr<MappingSpec> m = ParseMappingSpecFromFile(DataPath("mapping.json"));
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (m.ok()) mapping = *m;
    json replica = inference["ranks"][0];
    replica["rank"] = 1;
    replica["instance"] = 1;
    replica["host"] = "infer-1";
    inference["ranks"].push_back(replica);
  }
  int trainers() const { return static_cast<int>(trainer["ranks"].size()); }
  int inference_ranks() const { return static_cast<int>(inference["ranks"].size()); }

  json TrainerBody(int rank) const {
    json body = trainer["ranks"][rank];
    body["mesh_groups"] = trainer["mesh_groups"];
    return body;
  }
  json InferenceBody(int rank) const { return inference["ranks"][rank]; }
};

class ControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = std::filesystem::temp_directory_path() /
                 ("wsync_controller_test_" + std::to_string(::getpid()) + "_" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(state_dir_);
  }
  void TearDown() override {
    StopServer();
    std::filesystem::remove_all(state_dir_);
  }

  ControllerOptions Options() {
    ControllerOptions o;
    o.trainers = world_.trainers();
    o.inference = world_.inference_ranks();
    o.mapping = world_.mapping;
    o.state_dir = state_dir_.string();
    o.world_timeout_s = 60;
    o.version_timeout_s = 60;
    o.log = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(log_mu_);
      log_.push_back(line);
    };
    return o;
  }

  void StartServer(ControllerOptions options) {
    StatusOr<std::unique_ptr<Controller>> c = Controller::Create(std::move(options));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    controller_ = std::move(c).value();
    server_ = std::make_unique<HttpServer>(controller_.get(), ServerOptions{});
    ASSERT_TRUE(server_->Start().ok());
    ClientOptions co;
    co.retry_for_s = 2;
    client_ = std::make_unique<ControllerClient>("127.0.0.1", server_->port(), co);
  }
  void StartServer() { StartServer(Options()); }

  void StopServer() {
    if (server_) server_->Stop();
    server_.reset();
    controller_.reset();
  }

  void RegisterAll() {
    for (int r = 0; r < world_.trainers(); ++r) {
      StatusOr<json> reply = client_->RegisterTrainerJson(world_.TrainerBody(r));
      ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    }
    for (int r = 0; r < world_.inference_ranks(); ++r) {
      StatusOr<json> reply = client_->RegisterInferenceJson(world_.InferenceBody(r));
      ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    }
  }

  json Status() {
    StatusOr<json> s = client_->GetStatus();
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? *s : json();
  }

  static ControllerClient::Clock::time_point In(double seconds) {
    return ControllerClient::Clock::now() +
           std::chrono::duration_cast<ControllerClient::Clock::duration>(std::chrono::duration<double>(seconds));
  }

  TinyWorld world_;
  std::filesystem::path state_dir_;
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<ControllerClient> client_;
  std::mutex log_mu_;
  std::vector<std::string> log_;
};

}  // namespace wsync::controller::testing
