// The control plane's HTTP/JSON front end (docs/CONTROL_PLANE.md): binds
// each route to its handler (http_handlers.h, which decodes the request and
// calls the Controller), checks signatures before a body is read, and maps
// Status codes onto HTTP status codes. Connections, deadlines and the
// worker lanes are http_reactor.h's.
//
// Used by `wsync controller` (cli/controller_command.cc) and by tests, which
// run it in-process on port 0. Owns the reactor (its thread and two lanes:
// heartbeats, version reports and gates on one, everything else, long polls
// included, on the other) and a ticker thread that drives deadlines.
#pragma once

#include <atomic>
#include <condition_variable>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "controller/auth.h"
#include "controller/controller.h"
#include "controller/http_reactor.h"

namespace wsync::controller {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;          // 0: pick a free port; port() tells which
  int threads = 64;      // workers of the general lane; at least one per concurrent long poll
  int control_threads = 8;  // workers of the lane of heartbeats, version reports and gates
  double tick_s = 0.2;   // how often deadlines are checked without a request
  // Every route but /healthz and /metrics then needs a request signed with
  // it (controller/auth.h). Without one the server is open and Start()
  // refuses any host but loopback.
  std::optional<JobSecret> secret;
  double max_clock_skew_s = 60;
  // TLS (optional, OpenSSL): the server's certificate chain and private key,
  // PEM files. Clients then connect with the CA that signed the certificate
  // (ClientOptions::tls_ca_file); plain HTTP is not served beside it.
  std::string tls_cert_file;
  std::string tls_key_file;
  // Time to receive one whole request (head and body, from its first byte
  // or from the connection's accept), and to send an answer (long polls
  // wait on top of it); a client slower than this is answered 408 and
  // dropped.
  double request_timeout_s = 10;
  // An idle connection between requests is closed after this.
  double keep_alive_s = 5;
  // Open connections, in total and from one source address; past either,
  // a new connection is answered 503 with Retry-After and closed.
  size_t max_connections = 4096;
  size_t max_connections_per_address = 256;
  // Request bodies being read at once, over all connections (503 past it).
  size_t max_body_bytes_in_flight = size_t{512} << 20;
};

// The largest body each route accepts (413 beyond it, refused before it is
// read, or as soon as a chunked body crosses it): a registration gets
// 16 MiB (a Kimi-K2 rank's is about 0.2 MB), rendezvous values and version
// reports 1 MiB, a trainer_done with its checksums 16 MiB, everything else
// 64 KiB.
size_t BodyLimit(const std::string& method, const std::string& path);

class HttpServer {
 public:
  // `controller` must outlive the server.
  HttpServer(Controller* controller, ServerOptions options);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and starts serving; returns once requests are accepted.
  Status Start();
  // Shuts the controller down (waking its long polls), then the server.
  // Idempotent.
  void Stop();

  int port() const { return reactor_ ? reactor_->port() : -1; }
  size_t open_connections() const { return reactor_ ? reactor_->open_connections() : 0; }
  // Workers running a handler now: the control lane (heartbeats, version
  // reports, gates) and the general one (everything else, long polls too).
  size_t busy_control_workers() const { return reactor_ ? reactor_->busy_workers(0) : 0; }
  size_t busy_general_workers() const { return reactor_ ? reactor_->busy_workers(1) : 0; }
  std::string address() const { return options_.host + ":" + std::to_string(port()); }
  bool tls() const { return !options_.tls_cert_file.empty(); }

 private:
  struct Route;
  void InstallRoutes();
  // The reactor's question once a head is in: which route, may it be read.
  Admission Admit(HttpRequest& head);
  // Refusals are logged once per (client address, reason), counted always.
  void Refused(const std::string& remote, const std::string& reason, const std::string& line);
  std::string SecurityMetrics();

  Controller* const controller_;
  const ServerOptions options_;
  std::vector<Route> routes_;
  std::unique_ptr<HttpReactor> reactor_;
  std::thread ticker_;
  std::mutex tick_mu_;
  std::condition_variable tick_cv_;
  bool stopping_ = false;  // guarded by tick_mu_
  std::unique_ptr<RequestVerifier> verifier_;  // null: open control plane
  std::mutex refused_mu_;
  // When a refusal of each reason was last logged: one line per reason per
  // kRefusedLogEvery at most, whatever the number of source addresses.
  std::map<std::string, std::chrono::steady_clock::time_point> refused_logged_;  // guarded by refused_mu_
  std::map<std::string, uint64_t> refused_total_;                  // reason -> count; guarded by refused_mu_
};

}  // namespace wsync::controller
