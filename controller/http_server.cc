#include "controller/http_server.h"

#include <httplib.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
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
  }
  return 500;
}

void SendJson(httplib::Response& res, int code, const json& body) {
  res.status = code;
  res.set_content(ReplyText(body), "application/json");
}

void SendError(httplib::Response& res, const Status& s) {
  SendJson(res, HttpCode(s.code()), {{"error", s.message()}});
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

HttpServer::HttpServer(Controller* controller, ServerOptions options)
    : controller_(controller), options_(std::move(options)), server_(std::make_unique<httplib::Server>()) {}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::InstallRoutes() {
  httplib::Server& s = *server_;
  Controller* c = controller_;

  s.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });

  s.Post("/v1/register/trainer", [c](const httplib::Request& req, httplib::Response& res) {
    Send(res, HandleRegister(*c, Role::kTrainer, req.path, req.body));
  });
  s.Post("/v1/register/inference", [c](const httplib::Request& req, httplib::Response& res) {
    Send(res, HandleRegister(*c, Role::kInference, req.path, req.body));
  });

  s.Get("/v1/plan", [c](const httplib::Request& req, httplib::Response& res) {
    StatusOr<json> slice = HandlePlan(*c, req.get_param_value("role"), req.get_param_value("rank"),
                                      WaitParam(Param(req, "wait_ms"), 0));
    if (slice.ok() || slice.status().code() != StatusCode::kFailedPrecondition) return Send(res, slice);
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

  s.Post(R"(/v1/versions/([^/]+)/(start|trainer_done|inference_done|fail))",
         [c](const httplib::Request& req, httplib::Response& res) {
           Send(res, HandleVersionReport(*c, req.matches[1], req.matches[2], req.path, req.body));
         });
  s.Get(R"(/v1/versions/([^/]+))", [c](const httplib::Request& req, httplib::Response& res) {
    Send(res, HandleGetVersion(*c, req.matches[1], WaitParam(Param(req, "wait_ms"), 0)));
  });

  s.Get("/v1/status", [c](const httplib::Request&, httplib::Response& res) {
    SendJson(res, 200, c->StatusJson());
  });
  s.Get("/metrics", [c](const httplib::Request&, httplib::Response& res) {
    res.set_content(c->MetricsText(), "text/plain; version=0.0.4");
  });

  // A handler that throws (a bug) answers 500 naming what was thrown, so the
  // agent's log says more than "HTTP 500".
  s.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
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
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string what = res.status == 404 ? "no such route" : "HTTP " + std::to_string(res.status);
    // ReplyText: the path may hold bytes that are not UTF-8 (GET /%FF).
    res.set_content(ReplyText({{"error", req.method + " " + req.path + ": " + what + " (see docs/CONTROL_PLANE.md)"}}),
                    "application/json");
  });
}

Status HttpServer::Start() {
  const size_t threads = static_cast<size_t>(std::max(options_.threads, 4));
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_->set_keep_alive_timeout(2);
  InstallRoutes();
  port_ = options_.port == 0 ? server_->bind_to_any_port(options_.host)
                             : (server_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  if (port_ < 0)
    return Unavailable("cannot listen on " + options_.host + ":" + std::to_string(options_.port) +
                       " (address in use, or not an address of this host)");
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
