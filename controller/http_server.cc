#include "controller/http_server.h"

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

void SendJson(HttpResponse& res, int code, const json& body) {
  res.status = code;
  res.content_type = "application/json";
  res.body = ReplyText(body);
}

void SendError(HttpResponse& res, const Status& s) {
  SendJson(res, HttpCode(s.code()), {{"error", Excerpt(s.message())}});
}

void Send(HttpResponse& res, const StatusOr<json>& r) {
  if (r.ok()) SendJson(res, 200, *r);
  else SendError(res, r.status());
}

// The two lanes: what must never wait behind long polls, and the rest.
constexpr size_t kControlLane = 0;
constexpr size_t kGeneralLane = 1;

// Route patterns (no std::regex: nothing to compile per server, no locale
// in the path of every request). "{}" matches one non-empty path segment;
// "{+}", at most once, one or more characters that may hold '/' (a KV key);
// everything else literally. Captures come out in order.
bool MatchPath(const std::string& pattern, const std::string& path, std::vector<std::string>* captures) {
  const size_t rest = pattern.find("{+}");
  if (rest != std::string::npos) {
    const std::string prefix = pattern.substr(0, rest), suffix = pattern.substr(rest + 3);
    if (path.size() <= prefix.size() + suffix.size() || path.compare(0, prefix.size(), prefix) != 0 ||
        path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0)
      return false;
    captures->push_back(path.substr(prefix.size(), path.size() - prefix.size() - suffix.size()));
    return true;
  }
  size_t p = 0, q = 0;
  while (p < pattern.size()) {
    if (pattern.compare(p, 2, "{}") == 0) {
      const size_t end = std::min(path.find('/', q), path.size());
      if (end == q) return false;  // an empty segment
      captures->push_back(path.substr(q, end - q));
      p += 2;
      q = end;
    } else {
      if (q >= path.size() || path[q] != pattern[p]) return false;
      ++p;
      ++q;
    }
  }
  return q == path.size();
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
  out += "# HELP wsync_http_connections Connections open to the control plane now.\n"
         "# TYPE wsync_http_connections gauge\n"
         "wsync_http_connections " + std::to_string(open_connections()) + "\n"
         "# HELP wsync_http_workers_busy Workers running a handler now, by lane (long polls count).\n"
         "# TYPE wsync_http_workers_busy gauge\n"
         "wsync_http_workers_busy{lane=\"control\"} " + std::to_string(busy_control_workers()) + "\n"
         "wsync_http_workers_busy{lane=\"general\"} " + std::to_string(busy_general_workers()) + "\n";
  std::lock_guard<std::mutex> lock(refused_mu_);
  for (const auto& [reason, n] : refused_total_)
    out += "wsync_requests_refused_total{reason=\"" + reason + "\"} " + std::to_string(n) + "\n";
  return out;
}

struct HttpServer::Route {
  std::string method;
  std::string pattern;  // the whole (decoded) path; see MatchPath
  bool guarded;        // signed requests only, when there is a secret
  size_t lane;
  std::function<void(const HttpRequest&, HttpResponse&)> handle;
};

HttpServer::HttpServer(Controller* controller, ServerOptions options)
    : controller_(controller), options_(std::move(options)) {}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::InstallRoutes() {
  Controller* c = controller_;
  auto add = [this](std::string method, const char* pattern, bool guarded, size_t lane,
                    std::function<void(const HttpRequest&, HttpResponse&)> handle) {
    routes_.push_back(Route{std::move(method), pattern, guarded, lane, std::move(handle)});
  };
  // Every route but /healthz and /metrics is guarded: with a job secret, an
  // unsigned, forged, altered, stale or replayed request is refused (401)
  // before its handler sees it -- and, but for an altered body, before its
  // body is read.
  add("GET", "/healthz", false, kControlLane, [](const HttpRequest&, HttpResponse& res) {
    res.content_type = "text/plain";
    res.body = "ok\n";
  });
  // Counts and gauges only: no descriptor, key or plan leaves through here.
  add("GET", "/metrics", false, kControlLane, [this, c](const HttpRequest&, HttpResponse& res) {
    res.content_type = "text/plain; version=0.0.4";
    res.body = c->MetricsText() + SecurityMetrics();
  });

  add("POST", "/v1/register/trainer", true, kGeneralLane, [c](const HttpRequest& req, HttpResponse& res) {
    Send(res, HandleRegister(*c, Role::kTrainer, req.path, req.body));
  });
  add("POST", "/v1/register/inference", true, kGeneralLane, [c](const HttpRequest& req, HttpResponse& res) {
    Send(res, HandleRegister(*c, Role::kInference, req.path, req.body));
  });

  add("GET", "/v1/plan", true, kGeneralLane, [c](const HttpRequest& req, HttpResponse& res) {
    StatusOr<std::shared_ptr<const std::string>> slice =
        HandlePlanText(*c, req.Param("role").value_or(""), req.Param("rank").value_or(""),
                       WaitParam(req.Param("wait_ms"), 0));
    if (slice.ok()) {
      // The cached text itself, neither re-encoded nor copied (215 MB and as
      // many large copies for Kimi-K2's 384 slices).
      res.shared_body = std::move(slice).value();
      return;
    }
    if (slice.status().code() != StatusCode::kFailedPrecondition) return SendError(res, slice.status());
    json body = c->WorldSummary();
    body["error"] = slice.status().message();
    SendJson(res, 409, body);
  });

  add("POST", "/v1/heartbeat", true, kControlLane, [c](const HttpRequest& req, HttpResponse& res) {
    Send(res, HandleHeartbeat(*c, req.path, req.body));
  });

  // Gloo rendezvous store: raw values, long-polled reads, counters.
  add("POST", "/v1/kv/{+}/add", true, kGeneralLane, [c](const HttpRequest& req, HttpResponse& res) {
    Send(res, HandleKvAdd(*c, req.matches[1], req.path, req.body));
  });
  add("PUT", "/v1/kv/{+}", true, kGeneralLane, [c](const HttpRequest& req, HttpResponse& res) {
    c->KvSet(req.matches[1], req.body);
    SendJson(res, 200, json::object());
  });
  add("GET", "/v1/kv/{+}", true, kGeneralLane, [c](const HttpRequest& req, HttpResponse& res) {
    StatusOr<std::string> value = c->KvGet(req.matches[1], WaitParam(req.Param("wait_ms"), kDefaultWaitMs));
    if (!value.ok()) return SendError(res, value.status());
    res.content_type = "application/octet-stream";
    res.body = std::move(value).value();
  });

  add("POST", "/v1/versions/{}/{}", true,
      kControlLane, [c](const HttpRequest& req, HttpResponse& res) {
        Send(res, HandleVersionReport(*c, req.matches[1], req.matches[2], req.path, req.body));
      });
  add("GET", "/v1/versions/{}/checksums", true, kGeneralLane, [c](const HttpRequest& req, HttpResponse& res) {
    Send(res, HandleGetChecksums(*c, req.matches[1], req.Param("rank").value_or(""),
                                 WaitParam(req.Param("wait_ms"), 0)));
  });
  add("GET", "/v1/versions/{}", true, kGeneralLane, [c](const HttpRequest& req, HttpResponse& res) {
    Send(res, HandleGetVersion(*c, req.matches[1], WaitParam(req.Param("wait_ms"), 0),
                               req.Param("until").value_or("")));
  });

  add("POST", "/v1/gate", true, kControlLane, [c](const HttpRequest& req, HttpResponse& res) {
    Send(res, HandleGate(*c, req.path, req.body));
  });

  add("GET", "/v1/status", true, kGeneralLane, [c](const HttpRequest& req, HttpResponse& res) {
    SendJson(res, 200, c->StatusJson(req.Param("since").value_or(""), WaitParam(req.Param("wait_ms"), 0)));
  });
}

Admission HttpServer::Admit(HttpRequest& head) {
  Admission a;
  auto refuse = [&a](const Status& s) {
    a.refuse.emplace();
    SendError(*a.refuse, s);
    return a;
  };
  const Route* route = nullptr;
  for (const Route& r : routes_) {
    std::vector<std::string> captures;
    if (r.method == head.method && MatchPath(r.pattern, head.path, &captures)) {
      head.matches = {head.path};
      head.matches.insert(head.matches.end(), captures.begin(), captures.end());
      route = &r;
      break;
    }
  }
  if (route == nullptr) {
    // ReplyText: the path may hold bytes that are not UTF-8 (GET /%FF).
    return refuse(NotFound(head.method + " " + Excerpt(head.path, 256) + ": no such route (see docs/CONTROL_PLANE.md)"));
  }
  // The declared length first: a body over the route's limit is refused
  // the same way, signed or not, and never read.
  a.body_limit = BodyLimit(head.method, head.path);
  const std::string& length = head.Header("content-length");
  if (!length.empty() && std::strtoull(length.c_str(), nullptr, 10) > a.body_limit) {
    const Status st = ResourceExhausted(head.method + " " + head.path + ": a body of " + length +
                                        " bytes is over this route's limit of " + std::to_string(a.body_limit) +
                                        " bytes");
    Refused(head.remote_addr, "body too large", st.message());
    return refuse(st);
  }
  const bool check = route->guarded && verifier_ != nullptr;
  RequestSignature sig;
  if (check) {
    sig = RequestSignature{head.Header(kTimestampHeader), head.Header(kNonceHeader), head.Header(kSignatureHeader),
                           head.Header(kContentHashHeader)};
    const Status st = verifier_->VerifyHead(head.method, head.target, sig);
    if (!st.ok()) {
      Refused(head.remote_addr, ReasonOf(st.message()), head.method + " " + head.path + ": " + st.message());
      return refuse(st.WithContext(head.method + " " + head.path));
    }
  }
  a.lane = route->lane;
  a.handler = [this, route, check, sig = std::move(sig)](HttpRequest& req, HttpResponse& res) {
    if (check) {
      const Status st = RequestVerifier::VerifyBody(req.body, sig);
      if (!st.ok()) {
        Refused(req.remote_addr, ReasonOf(st.message()), req.method + " " + req.path + ": " + st.message());
        return SendError(res, st.WithContext(req.method + " " + req.path));
      }
    }
    route->handle(req, res);
  };
  return a;
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
  if (options_.secret.has_value()) {
    verifier_ = std::make_unique<RequestVerifier>(*options_.secret, options_.max_clock_skew_s);
  } else {
    std::fprintf(stderr,
                 "wsync controller: WARNING: no job secret: the control plane on %s is open to every local user "
                 "(any of them can register, read plans with their keys, and fail versions); serving loopback "
                 "only. Pass --secret-file (or $%s) to require signed requests.\n",
                 options_.host.c_str(), kSecretFileEnv);
  }
  InstallRoutes();
  ReactorOptions ro;
  ro.host = options_.host;
  ro.port = options_.port;
  ro.lane_threads = {static_cast<size_t>(std::max(options_.control_threads, 2)),
                     static_cast<size_t>(std::max(options_.threads, 4))};
  ro.request_timeout_s = options_.request_timeout_s;
  ro.keep_alive_s = options_.keep_alive_s;
  ro.max_connections = options_.max_connections;
  ro.max_connections_per_address = options_.max_connections_per_address;
  ro.max_body_bytes_in_flight = options_.max_body_bytes_in_flight;
  ro.tls_cert_file = options_.tls_cert_file;
  ro.tls_key_file = options_.tls_key_file;
  reactor_ = std::make_unique<HttpReactor>(
      ro, [this](HttpRequest& head) { return Admit(head); },
      [this](const std::string& remote, const std::string& reason, const std::string& what) {
        Refused(remote, reason, what);
      });
  Status started = reactor_->Start();
  if (!started.ok()) {
    reactor_.reset();
    return started;
  }
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
  if (reactor_) reactor_->Stop();
}

}  // namespace wsync::controller
