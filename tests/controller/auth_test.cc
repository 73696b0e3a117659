// The authenticated control plane: with a job secret, every route but
// /healthz and /metrics refuses unsigned, forged, altered, stale and
// replayed requests; bodies over a route's limit are refused before they are
// read; a controller without a secret serves loopback only.
#include <httplib.h>
#include <sys/stat.h>

#include <fstream>

#include "controller/auth.h"
#include "controller_fixture.h"

namespace wsync::controller::testing {
namespace {

JobSecret Secret(const std::string& bytes = "0123456789abcdef0123456789abcdef") {
  StatusOr<JobSecret> s = JobSecret::FromBytes(bytes);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return *s;
}

// ------------------------------------------------------- signing itself --

TEST(RequestVerifierTest, AcceptsASignedRequestOnceAndRefusesEveryAlteration) {
  RequestVerifier v(Secret(), /*max_skew_s=*/60);
  const double now = 1.8e9;
  const RequestSignature sig =
      SignRequestAt(Secret(), "POST", "/v1/versions/3/start", R"({"rank":0})", 1800000000, "00112233445566778899aabbccddeeff");
  EXPECT_TRUE(v.Verify("POST", "/v1/versions/3/start", R"({"rank":0})", sig, now).ok());

  auto refused = [&](const Status& s, const std::string& why) {
    EXPECT_EQ(s.code(), StatusCode::kUnauthenticated) << s.ToString();
    EXPECT_NE(s.message().find(why), std::string::npos) << s.message();
  };
  refused(v.Verify("POST", "/v1/versions/3/start", R"({"rank":0})", sig, now), "replayed");
  RequestSignature fresh = SignRequestAt(Secret(), "POST", "/v1/versions/3/start", R"({"rank":0})", 1800000000,
                                         "ffeeddccbbaa99887766554433221100");
  refused(v.Verify("POST", "/v1/versions/3/start", R"({"rank":1})", fresh, now), "bad signature");   // body
  refused(v.Verify("POST", "/v1/versions/4/start", R"({"rank":0})", fresh, now), "bad signature");   // path
  refused(v.Verify("PUT", "/v1/versions/3/start", R"({"rank":0})", fresh, now), "bad signature");    // method
  RequestSignature other_ts = fresh;
  other_ts.timestamp = "1800000001";
  refused(v.Verify("POST", "/v1/versions/3/start", R"({"rank":0})", other_ts, now), "bad signature");
  const RequestSignature forged = SignRequestAt(Secret("another secret of the right length"), "POST",
                                                "/v1/versions/3/start", R"({"rank":0})", 1800000000,
                                                "0123456789abcdef0123456789abcdef");
  refused(v.Verify("POST", "/v1/versions/3/start", R"({"rank":0})", forged, now), "bad signature");
  refused(v.Verify("POST", "/v1/versions/3/start", R"({"rank":0})", RequestSignature{}, now), "unsigned");
  // Within the skew the untouched fresh one still passes; outside it, stale.
  EXPECT_TRUE(v.Verify("POST", "/v1/versions/3/start", R"({"rank":0})", fresh, now + 59).ok());
  const RequestSignature old = SignRequestAt(Secret(), "GET", "/v1/status", "", 1800000000,
                                             "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
  refused(v.Verify("GET", "/v1/status", "", old, now + 61), "stale");
  refused(v.Verify("GET", "/v1/status", "", old, now - 61), "stale");
}

TEST(JobSecretTest, FileMustBeTheOwnersAloneAndLongEnough) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/wsync_auth_test_secret";
  std::remove(path.c_str());
  ASSERT_TRUE(WriteNewSecret(path).ok());
  EXPECT_FALSE(WriteNewSecret(path).ok()) << "an existing secret is never overwritten";
  StatusOr<JobSecret> s = JobSecret::FromFile(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();

  ::chmod(path.c_str(), 0644);
  s = JobSecret::FromFile(path);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("chmod 600 " + path), std::string::npos) << s.status().message();

  std::remove(path.c_str());
  { std::ofstream(path) << "short\n"; }
  ::chmod(path.c_str(), 0600);
  s = JobSecret::FromFile(path);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("at least 16 bytes"), std::string::npos) << s.status().message();
  std::remove(path.c_str());

  s = JobSecret::FromFile(path);
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
  // A named file that cannot be used is an error, never "no secret".
  EXPECT_FALSE(LoadJobSecret(path).ok());
}

// ------------------------------------------------------- over HTTP -------

class AuthServerTest : public ControllerTest {
 protected:
  void StartSigned() {
    StatusOr<std::unique_ptr<Controller>> c = Controller::Create(Options());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    controller_ = std::move(c).value();
    ServerOptions so;
    so.secret = Secret();
    server_ = std::make_unique<HttpServer>(controller_.get(), so);
    ASSERT_TRUE(server_->Start().ok());
    ClientOptions co;
    co.retry_for_s = 2;
    co.secret = Secret();
    client_ = std::make_unique<ControllerClient>("127.0.0.1", server_->port(), co);
  }

  httplib::Result Raw(const std::string& method, const std::string& target, const std::string& body,
                      const httplib::Headers& headers = {}) {
    httplib::Client cli("127.0.0.1", server_->port());
    cli.set_read_timeout(std::chrono::seconds(5));
    if (method == "GET") return cli.Get(target, headers);
    if (method == "PUT") return cli.Put(target, headers, body, "application/json");
    return cli.Post(target, headers, body, "application/json");
  }

  static httplib::Headers Headers(const RequestSignature& s) {
    return {{kTimestampHeader, s.timestamp},
            {kNonceHeader, s.nonce},
            {kSignatureHeader, s.signature},
            {kContentHashHeader, s.content_sha256}};
  }

  uint64_t Refused(const std::string& reason) {
    httplib::Result r = Raw("GET", "/metrics", "");
    EXPECT_TRUE(r);
    if (!r) return 0;
    const std::string needle = "wsync_requests_refused_total{reason=\"" + reason + "\"} ";
    const size_t at = r->body.find(needle);
    return at == std::string::npos ? 0 : std::stoull(r->body.substr(at + needle.size()));
  }
};

struct Route {
  std::string method, target, body;
};

// Every route the controller serves behind the guard, with a body it would
// accept from a signed agent.
std::vector<Route> GuardedRoutes(const TinyWorld& w) {
  return {
      {"POST", "/v1/register/trainer", w.TrainerBody(0).dump()},
      {"POST", "/v1/register/inference", w.InferenceBody(0).dump()},
      {"GET", "/v1/plan?role=trainer&rank=0", ""},
      {"POST", "/v1/heartbeat", R"({"role":"trainer","rank":0})"},
      {"PUT", "/v1/kv/some/key", "value"},
      {"GET", "/v1/kv/some/key?wait_ms=0", ""},
      {"POST", "/v1/kv/counter/add", R"({"delta":1})"},
      {"POST", "/v1/versions/1/start", R"({"rank":0})"},
      {"POST", "/v1/versions/1/trainer_done", R"({"rank":0})"},
      {"POST", "/v1/versions/1/inference_done", R"({"rank":0})"},
      {"POST", "/v1/versions/1/fail", R"({"rank":0,"role":"inference","error":"x"})"},
      {"GET", "/v1/versions/1", ""},
      {"GET", "/v1/status", ""},
  };
}

TEST_F(AuthServerTest, EveryRouteRefusesMissingWrongAndReplayedSignatures) {
  StartSigned();
  const JobSecret wrong = Secret("not the job secret, same length!");
  for (const Route& r : GuardedRoutes(world_)) {
    SCOPED_TRACE(r.method + " " + r.target);
    httplib::Result res = Raw(r.method, r.target, r.body);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 401) << res->body;
    EXPECT_NE(res->body.find("unsigned request"), std::string::npos) << res->body;

    res = Raw(r.method, r.target, r.body, Headers(SignRequest(wrong, r.method, r.target, r.body)));
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 401) << res->body;
    EXPECT_NE(res->body.find("bad signature"), std::string::npos) << res->body;

    // The same signed request twice: the second is a replay, whatever the
    // first one's own answer was.
    const httplib::Headers signed_once = Headers(SignRequest(Secret(), r.method, r.target, r.body));
    res = Raw(r.method, r.target, r.body, signed_once);
    ASSERT_TRUE(res);
    EXPECT_NE(res->status, 401) << res->body;
    res = Raw(r.method, r.target, r.body, signed_once);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 401) << res->body;
    EXPECT_NE(res->body.find("replayed"), std::string::npos) << res->body;
  }
  const size_t n = GuardedRoutes(world_).size();
  EXPECT_EQ(Refused("unsigned request"), n);
  EXPECT_EQ(Refused("bad signature"), n);
  EXPECT_EQ(Refused("replayed request"), n);
  // Refusals are logged once per client and reason, not once per request.
}

TEST_F(AuthServerTest, HealthAndMetricsAnswerUnsignedAndLeakNoDescriptor) {
  StartSigned();
  RegisterAll();  // the signed client works end to end
  StatusOr<TrainerPlanSlice> slice = client_->FetchTrainerPlan(0, In(10));
  ASSERT_TRUE(slice.ok()) << slice.status().ToString();
  httplib::Result h = Raw("GET", "/healthz", "");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  httplib::Result m = Raw("GET", "/metrics", "");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  for (const json& r : world_.inference["ranks"]) {
    for (const json& region : r["regions"]) {
      const std::string d = region.value("descriptor", std::string());
      if (!d.empty()) EXPECT_EQ(m->body.find(d), std::string::npos) << "metrics leak a descriptor";
    }
  }
  EXPECT_EQ(m->body.find("descriptor"), std::string::npos);
}

TEST_F(AuthServerTest, RogueInferenceRegistrationIsRefusedAndChangesNothing) {
  StartSigned();
  // Someone on the network without the secret tries to register as inference
  // rank 0 (to be sent the trainers' writes, or to learn their plan).
  const Route r{"POST", "/v1/register/inference", world_.InferenceBody(0).dump()};
  httplib::Result res = Raw(r.method, r.target, r.body);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);
  json s = Status();
  EXPECT_TRUE(s["registered"]["inference"].empty()) << s.dump();
  // The real agent then registers normally.
  RegisterAll();
}

TEST_F(AuthServerTest, ClientWithoutTheSecretGetsOneClearError) {
  StartSigned();
  ControllerClient unsigned_client("127.0.0.1", server_->port());
  StatusOr<json> s = unsigned_client.GetStatus();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kUnauthenticated);
  EXPECT_NE(s.status().message().find("--secret-file"), std::string::npos) << s.status().message();
}

TEST_F(AuthServerTest, BodiesOverTheRouteLimitAreRefusedBeforeTheyAreRead) {
  StartSigned();
  const std::string big(BodyLimit("POST", "/v1/heartbeat") + 1, ' ');
  httplib::Result res = Raw("POST", "/v1/heartbeat", big);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 413);
  EXPECT_NE(res->body.find("over this route's limit of 65536 bytes"), std::string::npos) << res->body;
  // Registration takes a Kimi-K2 rank's body (0.2 MB) but not 17 MiB.
  EXPECT_GE(BodyLimit("POST", "/v1/register/inference"), size_t{16} << 20);
  const std::string huge((size_t{17} << 20), ' ');
  res = Raw("POST", "/v1/register/inference", huge);
  if (res) EXPECT_EQ(res->status, 413) << res->body;  // or the connection is cut mid-upload
  EXPECT_GE(Refused("body too large"), 1u);
  // The server still serves.
  EXPECT_TRUE(client_->GetStatus().ok());
}

TEST(OpenServerTest, WithoutASecretOnlyLoopbackIsServed) {
  ControllerOptions o;
  o.trainers = 1;
  o.inference = 1;
  StatusOr<std::unique_ptr<Controller>> c = Controller::Create(o);
  ASSERT_TRUE(c.ok());
  ServerOptions so;
  so.host = "0.0.0.0";
  HttpServer open(c->get(), so);
  Status s = open.Start();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("without a job secret"), std::string::npos) << s.message();
  so.secret = Secret();
  HttpServer guarded(c->get(), so);
  EXPECT_TRUE(guarded.Start().ok());
}

}  // namespace
}  // namespace wsync::controller::testing
