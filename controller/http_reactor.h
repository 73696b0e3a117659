// The control plane's connection handling: one thread that owns every
// socket (epoll), reads requests into RequestParser, and hands complete
// requests to worker pools ("lanes"); what a request means is the owner's
// (http_server.cc). Built so that a client can cost only itself
// (docs/CONTROL_PLANE.md, "Bounded serving"):
//
//  - connections are capped in total and per source address; one past a cap
//    is answered 503 with Retry-After and closed;
//  - a request (head and body) must arrive within one deadline counted from
//    its first byte, or from the accept for a new connection; an idle
//    keep-alive connection is closed;
//  - the owner sees each head before its body is read (Admit) and may refuse
//    it there; bodies are held to the limit it sets, chunked or not, and to
//    a budget of body bytes over all connections;
//  - no socket read or write ever blocks a worker, and the reactor never
//    runs a handler: a lane of its own keeps heartbeats and version reports
//    answered while long polls hold the other.
//
// TLS (OpenSSL) runs on the same non-blocking sockets.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "controller/http_request.h"

namespace wsync::controller {

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  // Sent instead of `body` when set: a large cached text, never copied.
  std::shared_ptr<const std::string> shared_body;
  std::vector<std::pair<std::string, std::string>> headers;
  bool close = false;  // close the connection after this answer
};

// What the owner decides once a request's head is in (on the reactor thread:
// it must not block).
struct Admission {
  std::optional<HttpResponse> refuse;  // answered at once; no body is read; the connection closes
  size_t body_limit = 0;
  size_t lane = 0;
  // Runs on the lane with the whole request.
  std::function<void(HttpRequest&, HttpResponse&)> handler;
};

struct ReactorOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  std::vector<size_t> lane_threads = {16};
  double request_timeout_s = 10;
  double keep_alive_s = 5;
  size_t max_connections = 4096;  // and no more than the fd limit allows
  size_t max_connections_per_address = 256;
  size_t max_body_bytes_in_flight = size_t{512} << 20;
  std::string tls_cert_file;  // PEM; both set: serve TLS only
  std::string tls_key_file;
};

// Why a connection or request was refused (503, 408, 400, 413, ...), for the
// owner's log and metrics. `reason` is short and fixed, `what` a sentence.
using RefusedFn = std::function<void(const std::string& remote, const std::string& reason, const std::string& what)>;
using AdmitFn = std::function<Admission(HttpRequest& head)>;

class HttpReactor {
 public:
  HttpReactor(ReactorOptions options, AdmitFn admit, RefusedFn refused);
  ~HttpReactor();  // Stop()
  HttpReactor(const HttpReactor&) = delete;
  HttpReactor& operator=(const HttpReactor&) = delete;

  // Binds, listens and starts the threads; connections are accepted on return.
  Status Start();
  // Stops accepting, joins the lanes (handlers must be able to return:
  // wake long polls first) and closes every connection. Idempotent.
  void Stop();

  int port() const;
  size_t open_connections() const;
  // Workers of a lane running a handler now (a long poll counts while it waits).
  size_t busy_workers(size_t lane) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace wsync::controller
