// The controller's server under clients that misbehave (issue #29): raw
// sockets against the real HttpServer on loopback, with small limits so that
// each case takes moments. Each asserts what an operator would notice: who
// is refused and how, and that signed agents are served all the while.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "controller/auth.h"
#include "controller_fixture.h"

namespace wsync::controller::testing {
namespace {

using Clock = std::chrono::steady_clock;

// A client socket that says exactly the bytes it is told to.
class RawConn {
 public:
  RawConn(int port, const std::string& from = "127.0.0.1") {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    ::inet_pton(AF_INET, from.c_str(), &a.sin_addr);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << from;
    a.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  }
  ~RawConn() { ::close(fd_); }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;

  bool Send(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
  }
  // What arrives within `guard_s` (a bound for a broken server, not a
  // measurement), until `until` is seen or the server closes.
  std::string Read(double guard_s, const std::string& until = "") {
    const auto give_up = Clock::now() + std::chrono::duration<double>(guard_s);
    while (Clock::now() < give_up && (until.empty() || got_.find(until) == std::string::npos)) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      got_.append(buf, static_cast<size_t>(n));
    }
    return got_;
  }
  bool closed() const { return closed_; }

 private:
  int fd_ = -1;
  std::string got_;
  bool closed_ = false;
};

std::string SignedHead(const JobSecret& secret, const std::string& method, const std::string& target,
                       const std::string& body, const std::string& extra = "") {
  const RequestSignature s = SignRequest(secret, method, target, body);
  return method + " " + target + " HTTP/1.1\r\nHost: controller\r\n" + kTimestampHeader + ": " + s.timestamp +
         "\r\n" + kNonceHeader + ": " + s.nonce + "\r\n" + kSignatureHeader + ": " + s.signature + "\r\n" +
         kContentHashHeader + ": " + s.content_sha256 + "\r\n" + extra;
}

class BoundedServingTest : public ControllerTest {
 protected:
  static JobSecret Secret() { return JobSecret::FromBytes("0123456789abcdef0123456789abcdef").value(); }

  void Serve(ServerOptions so) {
    StatusOr<std::unique_ptr<Controller>> c = Controller::Create(Options());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    controller_ = std::move(c).value();
    so.secret = Secret();
    server_ = std::make_unique<HttpServer>(controller_.get(), so);
    ASSERT_TRUE(server_->Start().ok());
    ClientOptions co;
    co.retry_for_s = 5;
    co.secret = Secret();
    client_ = std::make_unique<ControllerClient>("127.0.0.1", server_->port(), co);
  }
  int port() const { return server_->port(); }
};

TEST_F(BoundedServingTest, OneAddressGetsItsCapOfConnectionsAndAgentsElsewhereAreServed) {
  ServerOptions so;
  so.max_connections_per_address = 8;
  Serve(so);
  std::vector<std::unique_ptr<RawConn>> idle;
  for (int i = 0; i < 8; ++i) idle.push_back(std::make_unique<RawConn>(port(), "127.0.0.2"));
  RawConn ninth(port(), "127.0.0.2");
  const std::string answer = ninth.Read(5);
  EXPECT_NE(answer.find("HTTP/1.1 503"), std::string::npos) << answer;
  EXPECT_NE(answer.find("Retry-After: 1"), std::string::npos) << answer;
  EXPECT_NE(answer.find("too many connections from 127.0.0.2 (8 open)"), std::string::npos) << answer;
  EXPECT_TRUE(ninth.closed());
  // The agents on 127.0.0.1 are not held to 127.0.0.2's count.
  EXPECT_TRUE(client_->GetStatus().ok());
  RawConn m(port());
  ASSERT_TRUE(m.Send("GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n"));
  const std::string metrics = m.Read(5);
  EXPECT_NE(metrics.find("wsync_requests_refused_total{reason=\"connection limit per address\"} 1"),
            std::string::npos)
      << metrics;
}

TEST_F(BoundedServingTest, ARequestTricklingInIsCutAtItsWholeDeadlineNotPerRead) {
  ServerOptions so;
  so.request_timeout_s = 1;
  Serve(so);
  RawConn slow(port(), "127.0.0.3");
  ASSERT_TRUE(slow.Send("GET /v1/status HTTP/1.1\r\n"));
  // One byte every 100 ms: never quiet for long, so no per-read timeout
  // would ever fire. The deadline for the whole request does.
  int sent = 0;
  for (; sent < 100 && !slow.closed(); ++sent) {
    if (!slow.Send("X")) break;
    if (slow.Read(0.1).find("408") != std::string::npos) break;
  }
  const std::string answer = slow.Read(5);
  EXPECT_NE(answer.find("HTTP/1.1 408"), std::string::npos) << answer;
  EXPECT_NE(answer.find("'GET /v1/status HTTP/1.1' did not arrive whole within 1 s"), std::string::npos) << answer;
  EXPECT_LT(sent, 100) << "still being read after 100 trickled bytes";
  EXPECT_TRUE(client_->GetStatus().ok());
}

TEST_F(BoundedServingTest, AnIdleKeepAliveConnectionIsClosed) {
  ServerOptions so;
  so.keep_alive_s = 0.3;
  Serve(so);
  RawConn c(port());
  ASSERT_TRUE(c.Send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_NE(c.Read(5, "ok\n").find("ok\n"), std::string::npos);
  c.Read(10);  // until the server closes (the guard is far past keep_alive_s)
  EXPECT_TRUE(c.closed()) << "an idle connection was kept open";
}

TEST_F(BoundedServingTest, UnsignedOrForgedBodiesAreRefusedBeforeAByteOfThemIsSent) {
  Serve(ServerOptions{});
  // 16 MiB declared, not one byte sent: the answer comes anyway.
  RawConn unsigned_conn(port(), "127.0.0.4");
  ASSERT_TRUE(unsigned_conn.Send("POST /v1/register/inference HTTP/1.1\r\nContent-Length: 16777216\r\n\r\n"));
  std::string answer = unsigned_conn.Read(5, "}");
  EXPECT_NE(answer.find("HTTP/1.1 401"), std::string::npos) << answer;
  EXPECT_NE(answer.find("unsigned request"), std::string::npos) << answer;

  const JobSecret wrong = JobSecret::FromBytes("not the job secret, same length!").value();
  RawConn forged(port(), "127.0.0.4");
  ASSERT_TRUE(forged.Send(SignedHead(wrong, "POST", "/v1/register/inference", std::string(1000, 'x'),
                                     "Content-Length: 16777216\r\n\r\n")));
  answer = forged.Read(5, "}");
  EXPECT_NE(answer.find("HTTP/1.1 401"), std::string::npos) << answer;
  EXPECT_NE(answer.find("bad signature"), std::string::npos) << answer;

  // A signed head that asks first is told to go on; its body must be the
  // one it signed.
  const std::string body = world_.InferenceBody(0).dump();
  RawConn asks(port());
  ASSERT_TRUE(asks.Send(SignedHead(Secret(), "POST", "/v1/register/inference", body,
                                   "Expect: 100-continue\r\nContent-Length: " + std::to_string(body.size()) +
                                       "\r\n\r\n")));
  EXPECT_NE(asks.Read(5, "\r\n\r\n").find("HTTP/1.1 100 Continue"), std::string::npos);
  std::string altered = body;
  altered[altered.size() / 2] ^= 1;
  ASSERT_TRUE(asks.Send(altered));
  answer = asks.Read(5, "}");
  EXPECT_NE(answer.find("401"), std::string::npos) << answer;
  EXPECT_NE(answer.find("not the one that was signed"), std::string::npos) << answer;
  EXPECT_TRUE(Status()["registered"]["inference"].empty());
}

TEST_F(BoundedServingTest, AChunkedBodyIsHeldToItsRoutesLimit) {
  Serve(ServerOptions{});
  auto chunked = [](const std::string& body) {
    std::string out;
    for (size_t at = 0; at < body.size(); at += 65536) {
      const size_t n = std::min<size_t>(65536, body.size() - at);
      char size[32];
      std::snprintf(size, sizeof(size), "%zx\r\n", n);
      out += size + body.substr(at, n) + "\r\n";
    }
    return out + "0\r\n\r\n";
  };
  // 2 MiB into a 1 MiB value: refused, and nothing stored.
  const std::string big(2 << 20, 'v');
  RawConn c(port());
  ASSERT_TRUE(c.Send(SignedHead(Secret(), "PUT", "/v1/kv/big", big, "Transfer-Encoding: chunked\r\n\r\n")));
  c.Send(chunked(big));  // the server may stop reading part way
  const std::string answer = c.Read(5, "}");
  EXPECT_NE(answer.find("HTTP/1.1 413"), std::string::npos) << answer;
  EXPECT_NE(answer.find("limit of 1048576 bytes"), std::string::npos) << answer;
  EXPECT_EQ(client_->KvGet("big", std::chrono::milliseconds(0)).status().code(), StatusCode::kNotFound);

  // A chunked value within the limit is stored whole.
  const std::string value(300000, 'w');
  RawConn ok(port());
  ASSERT_TRUE(ok.Send(SignedHead(Secret(), "PUT", "/v1/kv/fits", value, "Transfer-Encoding: chunked\r\n\r\n") +
                      chunked(value)));
  EXPECT_NE(ok.Read(5, "{}").find("HTTP/1.1 200"), std::string::npos);
  StatusOr<std::string> stored = client_->KvGet("fits", std::chrono::milliseconds(0));
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  EXPECT_EQ(*stored, value);
}

TEST_F(BoundedServingTest, HeartbeatsAreAnsweredWhileLongPollsHoldEveryGeneralWorker) {
  ServerOptions so;
  so.threads = 4;
  so.control_threads = 2;
  Serve(so);
  RegisterAll();
  std::atomic<int> returned{0};
  std::vector<std::thread> polls;
  for (int i = 0; i < 4; ++i) {
    polls.emplace_back([&] {
      (void)client_->KvGet("never-set", std::chrono::milliseconds(60000));
      ++returned;
    });
  }
  // Every general worker waits in a long poll.
  for (int i = 0; i < 500 && server_->busy_general_workers() < 4; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(server_->busy_general_workers(), 4u);
  EXPECT_TRUE(client_->Heartbeat(Role::kTrainer, 0).ok());
  EXPECT_TRUE(client_->Heartbeat(Role::kInference, 1).ok());
  EXPECT_EQ(returned.load(), 0) << "the heartbeats were answered only after a long poll ended";
  controller_->KvSet("never-set", "now");  // in process: the general lane is full
  for (std::thread& t : polls) t.join();
  EXPECT_EQ(returned.load(), 4);
}

}  // namespace
}  // namespace wsync::controller::testing
