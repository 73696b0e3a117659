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
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/status.h"
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
};

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

 private:
  void InstallRoutes();

  Controller* const controller_;
  const ServerOptions options_;
  std::unique_ptr<httplib::Server> server_;
  int port_ = -1;
  std::thread listener_;
  std::thread ticker_;
  std::mutex tick_mu_;
  std::condition_variable tick_cv_;
  bool stopping_ = false;  // guarded by tick_mu_
};

}  // namespace wsync::controller
