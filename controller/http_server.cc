#include "controller/http_server.h"

#include <httplib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>

#include "controller/http_handlers.h"

namespace wsync::controller {

using nlohmann::json;

namespace {

constexpr int64_t kDefaultWaitMs = 10000;

int HttpCode(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return 200;
    case StatusCode::kInvalidArgument: return 400;
    case StatusCode::kOutOfRange: return 400;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kFailedPrecondition: return 409;
    case StatusCode::kDeadlineExceeded: return 504;
    case StatusCode::kUnavailable: return 503;
    case StatusCode::kAborted: return 503;
    case StatusCode::kInternal: return 500;
    case StatusCode::kUnauthenticated: return 401;
    case StatusCode::kResourceExhausted: return 413;
    case StatusCode::kDataLoss: return 500;
    case StatusCode::kUnimplemented: return 501;
  }
  return 500;
}

using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// "bad signature (forged ...)" -> "bad signature": the refusal's kind, for
// metrics and the log-once rule.
std::string ReasonOf(const std::string& message) {
  const size_t cut = message.find_first_of("(:");
  std::string r = message.substr(0, cut);
  while (!r.empty() && r.back() == ' ') r.pop_back();
  return r;
}

void SendJson(httplib::Response& res, int code, const json& body) {
  res.status = code;
  res.set_content(ReplyText(body), "application/json");
}

void SendError(httplib::Response& res, const Status& s) {
  SendJson(res, HttpCode(s.code()), {{"error", Excerpt(s.message())}});
}

void Send(httplib::Response& res, const StatusOr<json>& r) {
  if (r.ok()) SendJson(res, 200, *r);
  else SendError(res, r.status());
}

std::optional<std::string> Param(const httplib::Request& req, const char* name) {
  if (!req.has_param(name)) return std::nullopt;
  return req.get_param_value(name);
}

}  // namespace

size_t BodyLimit(const std::string& method, const std::string& path) {
  constexpr size_t kKiB = 1024, kMiB = 1024 * 1024;
  if (path.rfind("/v1/register/", 0) == 0) return 16 * kMiB;
  if (method == "PUT" && path.rfind("/v1/kv/", 0) == 0) return 1 * kMiB;
  if (path.rfind("/v1/versions/", 0) == 0) {
    // A trainer rank's checksums ride on its trainer_done: ~60 bytes per
    // write it posts (a Kimi-K2 rank posts some thousands).
    const std::string done = "/trainer_done";
    const bool trainer_done = path.size() > done.size() && path.compare(path.size() - done.size(), done.size(), done) == 0;
    return trainer_done ? 16 * kMiB : 1 * kMiB;
  }
  return 64 * kKiB;
}

void HttpServer::Refused(const std::string& remote, const std::string& reason, const std::string& line) {
  constexpr std::chrono::seconds kRefusedLogEvery(10);
  bool log = false;
  {
    std::lock_guard<std::mutex> lock(refused_mu_);
    ++refused_total_[reason];
    const auto now = std::chrono::steady_clock::now();
    auto [it, fresh] = refused_logged_.try_emplace(reason, now);
    if (fresh || now - it->second >= kRefusedLogEvery) {
      it->second = now;
      log = true;
    }
  }
  if (log) {
    std::fprintf(stderr, "wsync controller: refused a request from %s: %s (more like it within 10 s are counted "
                 "in /metrics, not logged)\n", remote.c_str(), Excerpt(line, 512).c_str());
  }
}

std::string HttpServer::SecurityMetrics() {
  std::string out =
      "# HELP wsync_requests_refused_total Control requests refused before any handler ran, by reason.\n"
      "# TYPE wsync_requests_refused_total counter\n";
  std::lock_guard<std::mutex> lock(refused_mu_);
  for (const auto& [reason, n] : refused_total_)
    out += "wsync_requests_refused_total{reason=\"" + reason + "\"} " + std::to_string(n) + "\n";
  return out;
}

HttpServer::HttpServer(Controller* controller, ServerOptions options)
    : controller_(controller), options_(std::move(options)) {
  if (tls()) {
    server_ = std::make_unique<httplib::SSLServer>(options_.tls_cert_file.c_str(), options_.tls_key_file.c_str());
  } else {
    server_ = std::make_unique<httplib::Server>();
  }
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::InstallRoutes() {
  // Every route but /healthz and /metrics goes through `guard`: with a job
  // secret, an unsigned, forged, altered, stale or replayed request is
  // refused (401) before its handler sees it.
  struct GuardedServer {
    HttpServer* self;
    httplib::Server& s;
    Handler Guard(Handler h) {
      return [self = self, h = std::move(h)](const httplib::Request& req, httplib::Response& res) {
        if (self->verifier_ != nullptr) {
          const RequestSignature sig{req.get_header_value(kTimestampHeader), req.get_header_value(kNonceHeader),
                                     req.get_header_value(kSignatureHeader)};
          Status st = self->verifier_->Verify(req.method, req.target, req.body, sig);
          if (!st.ok()) {
            self->Refused(req.remote_addr, ReasonOf(st.message()), req.method + " " + req.path + ": " + st.message());
            return SendError(res, st.WithContext(req.method + " " + req.path));
          }
        }
        h(req, res);
      };
    }
    void Get(const std::string& pattern, Handler h) { s.Get(pattern, Guard(std::move(h))); }
    void Post(const std::string& pattern, Handler h) { s.Post(pattern, Guard(std::move(h))); }
    void Put(const std::string& pattern, Handler h) { s.Put(pattern, Guard(std::move(h))); }
  };
  httplib::Server& open = *server_;
  GuardedServer s{this, *server_};
  Controller* c = controller_;

  open.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });

  s.Post("/v1/register/trainer", [c](const httplib::Request& req, httplib::Response& res) {
    Send(res, HandleRegister(*c, Role::kTrainer, req.path, req.body));
  });
  s.Post("/v1/register/inference", [c](const httplib::Request& req, httplib::Response& res) {
    Send(res, HandleRegister(*c, Role::kInference, req.path, req.body));
  });

  s.Get("/v1/plan", [c](const httplib::Request& req, httplib::Response& res) {
    StatusOr<std::shared_ptr<const std::string>> slice =
        HandlePlanText(*c, req.get_param_value("role"), req.get_param_value("rank"),
                       WaitParam(Param(req, "wait_ms"), 0));
    if (slice.ok()) {
      // The cached text itself, neither re-encoded nor copied into the
      // response (set_content copies: 215 MB and as many large mallocs and
      // frees for Kimi-K2's 384 slices); the provider keeps it alive.
      res.status = 200;
      std::shared_ptr<const std::string> text = std::move(slice).value();
      const size_t size = text->size();
      return res.set_content_provider(size, "application/json",
                                      [text = std::move(text)](size_t offset, size_t length, httplib::DataSink& sink) {
                                        return sink.write(text->data() + offset, length);
                                      });
    }
    if (slice.status().code() != StatusCode::kFailedPrecondition) return SendError(res, slice.status());
    json body = c->WorldSummary();
    body["error"] = slice.status().message();
    SendJson(res, 409, body);
  });

  s.Post("/v1/heartbeat", [c](const httplib::Request& req, httplib::Response& res) {
    Send(res, HandleHeartbeat(*c, req.path, req.body));
  });

  // Gloo rendezvous store: raw values, long-polled reads, counters.
  s.Put(R"(/v1/kv/(.+))", [c](const httplib::Request& req, httplib::Response& res) {
    c->KvSet(req.matches[1], req.body);
    SendJson(res, 200, json::object());
  });
  s.Get(R"(/v1/kv/(.+))", [c](const httplib::Request& req, httplib::Response& res) {
    StatusOr<std::string> value = c->KvGet(req.matches[1], WaitParam(Param(req, "wait_ms"), kDefaultWaitMs));
    if (!value.ok()) return SendError(res, value.status());
    res.set_content(*value, "application/octet-stream");
  });
  s.Post(R"(/v1/kv/(.+)/add)", [c](const httplib::Request& req, httplib::Response& res) {
    Send(res, HandleKvAdd(*c, req.matches[1], req.path, req.body));
  });

  s.Post(R"(/v1/versions/([^/]+)/(start|trainer_done|inference_done|inference_committed|fail))",
         [c](const httplib::Request& req, httplib::Response& res) {
           Send(res, HandleVersionReport(*c, req.matches[1], req.matches[2], req.path, req.body));
         });
  s.Get(R"(/v1/versions/([^/]+)/checksums)", [c](const httplib::Request& req, httplib::Response& res) {
    Send(res, HandleGetChecksums(*c, req.matches[1], req.get_param_value("rank"),
                                 WaitParam(Param(req, "wait_ms"), 0)));
  });
  s.Get(R"(/v1/versions/([^/]+))", [c](const httplib::Request& req, httplib::Response& res) {
    Send(res, HandleGetVersion(*c, req.matches[1], WaitParam(Param(req, "wait_ms"), 0), req.get_param_value("until")));
  });

  s.Post("/v1/gate", [c](const httplib::Request& req, httplib::Response& res) {
    Send(res, HandleGate(*c, req.path, req.body));
  });

  s.Get("/v1/status", [c](const httplib::Request& req, httplib::Response& res) {
    SendJson(res, 200, c->StatusJson(Param(req, "since").value_or(""), WaitParam(Param(req, "wait_ms"), 0)));
  });
  // Counts and gauges only: no descriptor, key or plan leaves through here.
  open.Get("/metrics", [this, c](const httplib::Request&, httplib::Response& res) {
    res.set_content(c->MetricsText() + SecurityMetrics(), "text/plain; version=0.0.4");
  });

  // Bodies over their route's limit are refused from the Content-Length
  // header, before a byte of them is read.
  open.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!req.has_header("Content-Length")) return httplib::Server::HandlerResponse::Unhandled;
    const std::string text = req.get_header_value("Content-Length");
    char* end = nullptr;
    const unsigned long long length = std::strtoull(text.c_str(), &end, 10);
    const size_t limit = BodyLimit(req.method, req.path);
    if (*end == '\0' && length <= limit) return httplib::Server::HandlerResponse::Unhandled;
    const Status st = ResourceExhausted(req.method + " " + req.path + ": a body of " + text +
                                        " bytes is over this route's limit of " + std::to_string(limit) + " bytes");
    Refused(req.remote_addr, "body too large", st.message());
    SendError(res, st);
    res.set_header("Connection", "close");
    return httplib::Server::HandlerResponse::Handled;
  });

  // A handler that throws (a bug) answers 500 naming what was thrown, so the
  // agent's log says more than "HTTP 500".
  open.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    res.status = 500;
    res.set_content(json{{"error", req.method + " " + req.path + ": internal error: " + what}}.dump(
                        -1, ' ', false, json::error_handler_t::replace),
                    "application/json");
  });

  // Unknown routes and httplib's own errors still answer {"error": ...}.
  open.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string what = res.status == 404 ? "no such route" : "HTTP " + std::to_string(res.status);
    // ReplyText: the path may hold bytes that are not UTF-8 (GET /%FF).
    res.set_content(ReplyText({{"error", req.method + " " + req.path + ": " + what + " (see docs/CONTROL_PLANE.md)"}}),
                    "application/json");
  });
}

Status HttpServer::Start() {
  if (!options_.secret.has_value() && !IsLoopback(options_.host)) {
    return InvalidArgument("refusing to serve " + options_.host +
                           " without a job secret: anyone who can reach it could write into inference memory; "
                           "pass --secret-file (or $" + kSecretFileEnv + "), or listen on 127.0.0.1");
  }
  if (tls() != !options_.tls_key_file.empty()) {
    return InvalidArgument("TLS needs both a certificate (--tls-cert) and its private key (--tls-key)");
  }
  if (tls() && !server_->is_valid()) {
    return InvalidArgument("TLS: cannot use certificate '" + options_.tls_cert_file + "' with key '" +
                           options_.tls_key_file + "' (unreadable, not PEM, or the key does not match)");
  }
  if (options_.secret.has_value()) {
    verifier_ = std::make_unique<RequestVerifier>(*options_.secret, options_.max_clock_skew_s);
  } else {
    std::fprintf(stderr,
                 "wsync controller: WARNING: no job secret: the control plane on %s is open to every local user "
                 "(any of them can register, read plans with their keys, and fail versions); serving loopback "
                 "only. Pass --secret-file (or $%s) to require signed requests.\n",
                 options_.host.c_str(), kSecretFileEnv);
  }
  server_->set_payload_max_length(BodyLimit("POST", "/v1/register/") + 1);
  server_->set_read_timeout(std::chrono::duration<double>(options_.request_timeout_s));
  server_->set_write_timeout(std::chrono::duration<double>(options_.request_timeout_s));
  const size_t threads = static_cast<size_t>(std::max(options_.threads, 4));
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_->set_keep_alive_timeout(2);
  // httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled
  // into Debian's libcpp-httplib). Hundreds of agents connecting at once
  // overflow it, and the connections the kernel then drops reach the agents
  // as read errors. Remember the listening socket and widen its backlog.
  server_->set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd_ = sock;
  });
  InstallRoutes();
  port_ = options_.port == 0 ? server_->bind_to_any_port(options_.host)
                             : (server_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  if (port_ < 0)
    return Unavailable("cannot listen on " + options_.host + ":" + std::to_string(options_.port) +
                       " (address in use, or not an address of this host)");
  if (listen_fd_ >= 0 && ::listen(listen_fd_, SOMAXCONN) != 0)
    return Unavailable("cannot widen the listen backlog on " + address() + ": " + std::strerror(errno));
  listener_ = std::thread([this] { server_->listen_after_bind(); });
  // Connections queue in the backlog from bind on; waiting for the loop
  // only makes Start() mean "serving" for callers that check is_running.
  for (int i = 0; i < 2000 && !server_->is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ticker_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(tick_mu_);
    const auto period = std::chrono::duration<double>(options_.tick_s);
    while (!stopping_) {
      tick_cv_.wait_for(lock, period);
      if (stopping_) break;
      lock.unlock();
      controller_->Tick();
      lock.lock();
    }
  });
  return Status::Ok();
}

void HttpServer::Stop() {
  {
    std::lock_guard<std::mutex> lock(tick_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  tick_cv_.notify_all();
  if (ticker_.joinable()) ticker_.join();
  controller_->Shutdown();
  server_->stop();
  if (listener_.joinable()) listener_.join();
}

}  // namespace wsync::controller
