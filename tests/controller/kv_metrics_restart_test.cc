// The Gloo rendezvous store, /metrics, and a controller restart on the same
// state dir.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <regex>
#include <sstream>
#include <thread>

#include "controller_fixture.h"

namespace wsync::controller::testing {
namespace {

TEST_F(ControllerTest, KvGetWaitsForTheKey) {
  StartServer();
  StatusOr<std::string> got = Internal("not run");
  const auto t0 = std::chrono::steady_clock::now();
  std::thread reader([&] { got = client_->KvGet("gloo/dense/rank_1", std::chrono::milliseconds(5000)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const std::string value("addr\0with\0nuls", 14);
  ASSERT_TRUE(client_->KvSet("gloo/dense/rank_1", value).ok());
  reader.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, value);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(150));

  StatusOr<std::string> missing = client_->KvGet("never set", std::chrono::milliseconds(200));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);  // HTTP 404
  EXPECT_NE(missing.status().message().find("never set"), std::string::npos) << missing.status().message();

  EXPECT_EQ(client_->KvAdd("barrier", 1).value(), 1);
  EXPECT_EQ(client_->KvAdd("barrier", 2).value(), 3);
}

TEST_F(ControllerTest, MetricsAreValidPrometheusText) {
  StartServer();
  RegisterAll();
  ASSERT_TRUE(client_->StartVersion(1, 0).ok());
  ASSERT_TRUE(client_->ReportInferenceDone(1, 0, Status::Ok()).ok());
  ASSERT_TRUE(client_->ReportInferenceDone(1, 1, Status::Ok()).ok());
  StatusOr<std::string> text = client_->GetMetrics();
  ASSERT_TRUE(text.ok()) << text.status().ToString();

  const std::regex sample(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*")*\})? (-?[0-9.eE+-]+|NaN|[+-]Inf)$)");
  const std::regex comment(R"(^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+$)");
  std::map<std::string, double> values;
  std::istringstream in(*text);
  std::string line;
  int samples = 0;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, comment)) continue;
    ASSERT_TRUE(std::regex_match(line, m, sample)) << "not Prometheus text: '" << line << "'";
    values[line.substr(0, line.rfind(' '))] = std::stod(m[4]);
    ++samples;
  }
  EXPECT_GT(samples, 10);
  EXPECT_EQ(values["wsync_registered_ranks{role=\"trainer\"}"], 2);
  EXPECT_EQ(values["wsync_registered_ranks{role=\"inference\"}"], 2);
  EXPECT_EQ(values["wsync_plan_ready"], 1);
  EXPECT_GT(values["wsync_plan_wire_bytes"], 0);
  EXPECT_EQ(values["wsync_versions_total{state=\"complete\"}"], 1);
  EXPECT_EQ(values["wsync_latest_complete_version"], 1);
  EXPECT_GT(values["wsync_update_seconds"], 0);
}

TEST_F(ControllerTest, RestartServesTheSamePlanAndRemembersTheLatestVersion) {
  StartServer();
  RegisterAll();
  const json status_before = Status();
  StatusOr<json> slice_before = client_->FetchPlan(Role::kTrainer, 1, In(5));
  ASSERT_TRUE(slice_before.ok());
  ASSERT_TRUE(client_->StartVersion(3, 0).ok());
  ASSERT_TRUE(client_->ReportInferenceDone(3, 0, Status::Ok()).ok());
  ASSERT_TRUE(client_->ReportInferenceDone(3, 1, Status::Ok())->complete());
  const int old_port = server_->port();
  StopServer();

  StartServer();  // same state dir, new port, no registrations
  EXPECT_NE(server_->port(), 0);
  (void)old_port;
  json s = Status();
  EXPECT_EQ(s["phase"], "planned");
  EXPECT_EQ(s["plan"]["plan_id"], status_before["plan"]["plan_id"]);
  EXPECT_EQ(s["latest_complete_version"], 3);
  StatusOr<json> slice_after = client_->FetchPlan(Role::kTrainer, 1, In(5));
  ASSERT_TRUE(slice_after.ok());
  EXPECT_EQ(*slice_after, *slice_before);

  // Agents that restart with the same metadata are welcome; a changed
  // layout cannot change a static plan (new memory for the same layout is
  // a new epoch: epochs_test.cc).
  EXPECT_TRUE(client_->RegisterTrainerJson(world_.TrainerBody(0)).ok());
  json changed = world_.InferenceBody(1);
  changed["regions"][0]["size"] = changed["regions"][0]["size"].get<uint64_t>() + 4096;
  StatusOr<json> refused = client_->RegisterInferenceJson(changed);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("inference rank 1"), std::string::npos);

  // Old version numbers stay refused; the next one works.
  EXPECT_FALSE(client_->StartVersion(3, 0).ok());
  ASSERT_TRUE(client_->StartVersion(4, 0).ok());
  ASSERT_TRUE(client_->ReportInferenceDone(4, 0, Status::Ok()).ok());
  EXPECT_TRUE(client_->ReportInferenceDone(4, 1, Status::Ok())->complete());
}

// A report never starts a version (issue #29), so the version in flight at a
// controller restart is persisted when it starts and runs on after it: its
// ranks' reports still count.
TEST_F(ControllerTest, TheVersionRunningAtARestartRunsOnAndItsReportsCount) {
  StartServer();
  RegisterAll();
  ASSERT_TRUE(client_->StartVersion(5, 0).ok());
  ASSERT_TRUE(client_->ReportInferenceDone(5, 0, Status::Ok()).ok());  // lost with the restart
  StopServer();
  StartServer();
  StatusOr<VersionStatus> v = client_->ReportInferenceDone(5, 1, Status::Ok());
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->state, "started");
  v = client_->ReportInferenceDone(5, 0, Status::Ok());
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(v->complete());
  // Finished, it is not running any more after the next restart.
  StopServer();
  StartServer();
  EXPECT_EQ(Status()["latest_complete_version"], 5);
  EXPECT_EQ(client_->ReportInferenceDone(6, 0, Status::Ok()).status().code(), StatusCode::kNotFound);
}

TEST_F(ControllerTest, StateDirOfAnotherWorldIsRefused) {
  StartServer();
  RegisterAll();
  StopServer();
  ControllerOptions o = Options();
  o.trainers = 4;
  StatusOr<std::unique_ptr<Controller>> c = Controller::Create(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("fresh --state-dir"), std::string::npos) << c.status().message();
}

// With the exchange on, trainer ranks are served slices that exchange rows
// instead of all-gathering, /v1/status says so with the bytes it saves, and
// a restart with the other kind of plan refuses the state dir rather than
// serve slices its agents do not hold.
TEST_F(ControllerTest, ExchangeIsPlannedServedAndKeptAcrossRestarts) {
  ControllerOptions o = Options();
  o.exchange = true;
  o.min_shard_piece_bytes = 0;
  StartServer(o);
  RegisterAll();
  const json s = Status();
  ASSERT_EQ(s["phase"], "planned");
  EXPECT_EQ(s["plan"]["unshard"], "exchange");
  EXPECT_LT(s["plan"]["exchange_bytes"].get<uint64_t>(), s["plan"]["full_tensor_bytes"].get<uint64_t>());
  // Each rank either exchanges rows or writes straight from its shard; no
  // source is all-gathered as full_tensor would.
  size_t exchanged = 0, gathered = 0;
  for (int r = 0; r < world_.trainers(); ++r) {
    StatusOr<json> slice = client_->FetchPlan(Role::kTrainer, r, In(5));
    ASSERT_TRUE(slice.ok()) << slice.status().ToString();
    for (const json& g : (*slice)["plan"]["groups"])
      for (const json& src : g["sources"]) {
        if (src["gather_dim"].get<int>() < 0 || src.contains("recv_rows")) {
          ++exchanged;
        } else {
          ++gathered;
        }
      }
  }
  EXPECT_GT(exchanged, 0u);
  EXPECT_EQ(gathered, 0u);
  StopServer();

  StartServer(o);  // same kind: the same plan
  EXPECT_EQ(Status()["plan"]["plan_id"], s["plan"]["plan_id"]);
  StopServer();

  ControllerOptions full = Options();  // the same world, full_tensor
  StatusOr<std::unique_ptr<Controller>> c = Controller::Create(full);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("fresh --state-dir"), std::string::npos) << c.status().message();
}

TEST_F(ControllerTest, ClientRetriesUntilTheControllerIsUp) {
  // Find a free port, then start the controller on it a little later.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  ::close(fd);

  StatusOr<std::unique_ptr<Controller>> c = Controller::Create(Options());
  ASSERT_TRUE(c.ok());
  ServerOptions so;
  so.port = port;
  HttpServer server(c->get(), so);
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    EXPECT_TRUE(server.Start().ok());
  });
  ClientOptions co;
  co.retry_for_s = 10;
  ControllerClient client("127.0.0.1", port, co);
  StatusOr<json> reply = client.RegisterTrainerJson(world_.TrainerBody(0));
  later.join();
  EXPECT_TRUE(reply.ok()) << reply.status().ToString();
  server.Stop();
}

}  // namespace
}  // namespace wsync::controller::testing
