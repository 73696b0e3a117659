// The control plane's HTTP/JSON front end (docs/CONTROL_PLANE.md) over
// cpp-httplib: binds each route to its handler (http_handlers.h, which
// decodes the request and calls the Controller) and maps Status codes onto
// HTTP status codes.
//
// Used by `wsync controller` (cli/controller_command.cc) and by tests, which
// run it in-process on port 0. Owns a listener thread, httplib's worker pool
// (long polls hold a worker each, so the pool is sized for every agent
// waiting at once) and a ticker thread that drives deadlines.
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

#include "common/status.h"
#include "controller/auth.h"
#include "controller/controller.h"

namespace httplib {
class Server;
}

namespace wsync::controller {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;          // 0: pick a free port; port() tells which
  int threads = 64;      // worker threads; at least one per concurrent long poll
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
  // Time to receive one request's headers and body, and to send an answer
  // (long polls wait on top of it); a client slower than this is dropped.
  double request_timeout_s = 10;
};

// The largest body each route accepts (413 beyond it, refused before it is
// read): a registration gets 16 MiB (a Kimi-K2 rank's is about 0.2 MB),
// rendezvous values and version reports 1 MiB, everything else 64 KiB.
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

  int port() const { return port_; }
  std::string address() const { return options_.host + ":" + std::to_string(port_); }
  bool tls() const { return !options_.tls_cert_file.empty(); }

 private:
  void InstallRoutes();
  // Refusals are logged once per (client address, reason), counted always.
  void Refused(const std::string& remote, const std::string& reason, const std::string& line);
  std::string SecurityMetrics();

  Controller* const controller_;
  const ServerOptions options_;
  std::unique_ptr<httplib::Server> server_;
  int port_ = -1;
  int listen_fd_ = -1;  // the listening socket, set while binding
  std::thread listener_;
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
