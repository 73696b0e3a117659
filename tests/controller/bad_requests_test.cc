// Requests and state files no agent would send, found by the fuzz targets
// (fuzz/controller_requests_fuzz.cc, fuzz/state_store_fuzz.cc): each must be
// one clear 4xx line, never a 500, a thrown exception or a dead controller.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <fstream>

#include "controller/http_handlers.h"
#include <filesystem>
#include <fstream>
#include <iterator>

#include "controller_fixture.h"

namespace wsync::controller::testing {
namespace {

// One raw HTTP/1.1 exchange: the exact bytes of the request line matter
// here (a client library would percent-encode them).
std::string RawRequest(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "connect failed";
  }
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string reply;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) reply.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return reply;
}

// Found by controller_requests: the 404 for a path holding bytes that are
// not UTF-8 threw from json::dump() inside httplib's error handler, which
// nothing catches: one `curl localhost:PORT/%FF` ended the controller.
TEST_F(ControllerTest, PathThatIsNotUtf8IsA404NotADeadController) {
  StartServer();
  const std::string reply =
      RawRequest(server_->port(), "GET /v1/nope%FF HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(reply.rfind("HTTP/1.1 404", 0), 0u) << reply;
  EXPECT_NE(reply.find("GET /v1/nope\xEF\xBF\xBD: no such route"), std::string::npos) << reply;
  const std::string kv = RawRequest(
      server_->port(), "POST /v1/kv/%FF/add HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n[]");
  EXPECT_EQ(kv.rfind("HTTP/1.1 400", 0), 0u) << kv;
  EXPECT_TRUE(client_->Healthy());
}

class HandlerTest : public ControllerTest {
 protected:
  void SetUp() override {
    ControllerTest::SetUp();
    ControllerOptions o = Options();
    o.state_dir = "";
    StatusOr<std::unique_ptr<Controller>> c = Controller::Create(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    c_ = std::move(c).value();
  }
  void ExpectInvalid(const StatusOr<json>& r, const std::string& message) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
    EXPECT_EQ(r.status().message(), message);
  }
  std::unique_ptr<Controller> c_;
};

// Found by controller_requests: json::value("role", string) threw
// type_error for a number, answered as a 500 "internal error".
TEST_F(HandlerTest, NonStringRoleIsA400) {
  ExpectInvalid(HandleHeartbeat(*c_, "/v1/heartbeat", R"({"role": 5, "rank": 0})"),
                "heartbeat: 'role' must be a string");
  ExpectInvalid(HandleVersionReport(*c_, "1", "fail", "/v1/versions/1/fail", R"({"role": [], "rank": 0})"),
                "fail: 'role' must be a string");
}

// A rank past int32 used to wrap onto a real rank (2^32 reported as rank 0).
TEST_F(HandlerTest, RankOutsideInt32IsRefusedNotWrapped) {
  ExpectInvalid(HandleVersionReport(*c_, "1", "start", "/v1/versions/1/start", R"({"rank": 4294967296})"),
                "/v1/versions/1/start: 'rank' 4294967296 is not a rank");
  ExpectInvalid(HandleHeartbeat(*c_, "/v1/heartbeat", R"({"role": "trainer", "rank": -4294967296})"),
                "/v1/heartbeat: 'rank' -4294967296 is not a rank");
  ExpectInvalid(HandlePlan(*c_, "trainer", "4294967296", std::chrono::milliseconds(0)),
                "/v1/plan needs ?role=trainer|inference&rank=R");
}

// "-1" was read as 2^64-1 and accepted: one signed inference_done for it
// completed that version, and every real version after it was refused as
// "not above the latest complete version", across restarts (#29).
TEST_F(HandlerTest, AVersionNumberIsDigitsOnlyAndAboveZero) {
  for (const char* bad : {"-1", "+1", " 1", "0", "1x", "", "18446744073709551616", "0x10"}) {
    const std::string path = std::string("/v1/versions/") + bad + "/inference_done";
    StatusOr<json> r = HandleVersionReport(*c_, bad, "inference_done", path, R"({"rank": 0})");
    ASSERT_FALSE(r.ok()) << "'" << bad << "' was accepted";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("is not a version number"), std::string::npos) << r.status().message();
    EXPECT_EQ(HandleGetVersion(*c_, bad, std::chrono::milliseconds(0)).status().code(), StatusCode::kInvalidArgument);
  }
}

// Copying a json value recurses per level: a deeply nested registration
// overflowed the worker thread's stack (ASan: stack-overflow).
TEST_F(HandlerTest, DeeplyNestedBodyIsA400) {
  const std::string body = R"({"rank": 0, "mesh_groups": )" + std::string(100000, '[') + std::string(100000, ']') + "}";
  StatusOr<json> r = HandleRegister(*c_, Role::kTrainer, "/v1/register/trainer", body);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("/v1/register/trainer: request body: malformed JSON: nested deeper than 64"),
            std::string::npos)
      << r.status().message();
}

// Found by controller_requests (UBSan): the counter's add overflowed int64.
TEST_F(HandlerTest, KvCounterOverflowIsRefusedAndKeepsTheValue) {
  ASSERT_TRUE(HandleKvAdd(*c_, "n", "/v1/kv/n/add", R"({"delta": 9223372036854775807})").ok());
  ExpectInvalid(HandleKvAdd(*c_, "n", "/v1/kv/n/add", R"({"delta": 1})"),
                "key 'n': adding 1 overflows the 64-bit counter");
  EXPECT_EQ(*c_->KvGet("n", std::chrono::milliseconds(0)), "9223372036854775807");
  ExpectInvalid(HandleKvAdd(*c_, "n", "/v1/kv/n/add", R"({"delta": 18446744073709551615})"),
                "kv add: body needs an integer 'delta' (64-bit signed)");
}

// Found by state_store: a world.json or versions.json with a wrong type in
// a field threw type_error out of Controller::Create (std::terminate in
// `wsync controller --state-dir`).
TEST_F(ControllerTest, StateDirWithWrongTypesIsRefusedInOneLine) {
  StartServer();
  RegisterAll();
  StopServer();
  const std::string world_path = (state_dir_ / "world.json").string();
  json world = ReadJson(world_path);
  const json good = world;
  world["world"]["trainers"] = std::to_string(world_.trainers());
  std::ofstream(world_path) << world.dump();
  StatusOr<std::unique_ptr<Controller>> c = Controller::Create(Options());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            world_path + ": not a wsync.controller_state/v1 document; start with a fresh --state-dir");

  std::ofstream(world_path) << good.dump();
  const std::string versions_path = (state_dir_ / "versions.json").string();
  std::ofstream(versions_path) << R"({"schema": "wsync.controller_versions/v1", "has_complete": 1})";
  c = Controller::Create(Options());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            versions_path + ": not a wsync.controller_versions/v1 document; start with a fresh --state-dir");
}

// Issue #29, item 6: every file of the state dir is checked on restart.
TEST_F(ControllerTest, EveryStateFileIsCheckedOnRestart) {
  StartServer();
  RegisterAll();
  ASSERT_TRUE(client_->StartVersion(1, 0).ok());
  ASSERT_TRUE(client_->ReportInferenceDone(1, 0, Status::Ok()).ok());
  ASSERT_TRUE(client_->ReportInferenceDone(1, 1, Status::Ok())->complete());
  StopServer();
  const std::filesystem::path plan = state_dir_ / "plan.json", versions = state_dir_ / "versions.json",
                              world = state_dir_ / "world.json";
  auto read = [](const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string plan_text = read(plan), versions_text = read(versions), world_text = read(world);

  // plan.json deleted, then edited: written again from world.json, and said so.
  for (const std::string& damage : {std::string(), plan_text.substr(0, plan_text.size() / 2) + "\n"}) {
    if (damage.empty()) std::filesystem::remove(plan);
    else std::ofstream(plan, std::ios::binary) << damage;
    {
      std::lock_guard<std::mutex> lock(log_mu_);
      log_.clear();
    }
    StatusOr<std::unique_ptr<Controller>> c = Controller::Create(Options());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(read(plan), plan_text);
    std::lock_guard<std::mutex> lock(log_mu_);
    bool said = false;
    for (const std::string& line : log_) said |= line.find("plan.json was") != std::string::npos;
    EXPECT_TRUE(said) << "the repair of plan.json was not logged";
  }

  // versions.json deleted: the latest complete version (1) would be
  // forgotten and version 1 accepted again. Refused instead.
  std::filesystem::remove(versions);
  StatusOr<std::unique_ptr<Controller>> c = Controller::Create(Options());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("versions.json is missing"), std::string::npos) << c.status().message();
  std::ofstream(versions, std::ios::binary) << versions_text;

  // A state file that is not a regular file is never read (a link to
  // /dev/zero grew the controller to 5 GB).
  std::filesystem::remove(world);
  std::filesystem::create_symlink("/dev/zero", world);
  c = Controller::Create(Options());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("not a regular file"), std::string::npos) << c.status().message();
  std::filesystem::remove(world);

  // An epoch at the edge of wrapping is refused, not incremented to 0.
  json w = json::parse(world_text);
  w["epoch"] = UINT64_MAX;
  std::ofstream(world, std::ios::binary) << w.dump();
  c = Controller::Create(Options());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("'epoch' must be an integer from 1 to 2^62"), std::string::npos)
      << c.status().message();

  // Put back whole, it is served again with version 1 remembered.
  std::ofstream(world, std::ios::binary) << world_text;
  StartServer();
  EXPECT_EQ(Status()["latest_complete_version"], 1);
}

}  // namespace
}  // namespace wsync::controller::testing
