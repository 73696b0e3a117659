// `wsync bench signing`: what signing every control request costs (issue
// #10). Two controllers in this process, one open and one with a job
// secret, answer the same sequence of requests over loopback HTTP, one at a
// time: a status read, a heartbeat, and a rendezvous-store write of 4 KiB
// and of 512 KiB (the body is hashed into the signature). Prints each
// request's mean time signed beside unsigned, the difference and the ratio.
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "controller/auth.h"
#include "controller/client.h"
#include "controller/controller.h"
#include "controller/http_server.h"

namespace wsync::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchSigningOptions {
  int requests = 2000;
  std::string format = "text";
};

struct Server {
  std::unique_ptr<controller::Controller> controller;
  std::unique_ptr<controller::HttpServer> http;
  std::unique_ptr<controller::ControllerClient> client;
};

StatusOr<Server> StartServer(const std::optional<controller::JobSecret>& secret) {
  controller::ControllerOptions co;
  co.trainers = 1;
  co.inference = 1;
  WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<controller::Controller> c, controller::Controller::Create(co));
  controller::ServerOptions so;
  so.secret = secret;
  auto http = std::make_unique<controller::HttpServer>(c.get(), so);
  WSYNC_RETURN_IF_ERROR(http->Start());
  controller::ClientOptions client;
  client.secret = secret;
  auto cl = std::make_unique<controller::ControllerClient>("127.0.0.1", http->port(), client);
  return Server{std::move(c), std::move(http), std::move(cl)};
}

// Mean seconds of `n` sequential calls of `call`, after a few to warm up.
StatusOr<double> Time(int n, const std::function<Status()>& call) {
  for (int i = 0; i < 20; ++i) WSYNC_RETURN_IF_ERROR(call());
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) WSYNC_RETURN_IF_ERROR(call());
  return std::chrono::duration<double>(Clock::now() - t0).count() / n;
}

int RunBenchSigning(const BenchSigningOptions& opt) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "wsync bench signing: error: %s\n", s.message().c_str());
    return 1;
  };
  StatusOr<controller::JobSecret> secret = controller::JobSecret::FromBytes(std::string(32, 's'), "bench secret");
  if (!secret.ok()) return fail(secret.status());
  StatusOr<Server> open = StartServer(std::nullopt);
  if (!open.ok()) return fail(open.status());
  StatusOr<Server> signed_server = StartServer(*secret);
  if (!signed_server.ok()) return fail(signed_server.status());

  const std::string small(4 << 10, 'k'), large(512 << 10, 'K');
  struct Case {
    std::string name;
    int n;
    std::function<Status(controller::ControllerClient&)> call;
  };
  const std::vector<Case> cases = {
      {"GET /v1/status", opt.requests,
       [](controller::ControllerClient& c) { return c.GetStatus().status(); }},
      {"POST /v1/heartbeat", opt.requests,
       [](controller::ControllerClient& c) { return c.Heartbeat(controller::Role::kTrainer, 0); }},
      {"PUT /v1/kv (4 KiB)", opt.requests,
       [&small](controller::ControllerClient& c) { return c.KvSet("bench/small", small); }},
      {"PUT /v1/kv (512 KiB)", std::max(1, opt.requests / 20),
       [&large](controller::ControllerClient& c) { return c.KvSet("bench/large", large); }},
  };
  nlohmann::json rows = nlohmann::json::array();
  if (opt.format == "text") {
    std::printf("bench signing: one request at a time over loopback HTTP, the same controller code with and "
                "without a job secret\n%-22s %12s %12s %12s %8s\n",
                "request", "unsigned us", "signed us", "cost us", "ratio");
  }
  for (const Case& c : cases) {
    auto call_on = [&c](Server& s) { return [&c, &s] { return c.call(*s.client); }; };
    StatusOr<double> plain = Time(c.n, call_on(*open));
    if (!plain.ok()) return fail(plain.status().WithContext(c.name + " unsigned"));
    StatusOr<double> with = Time(c.n, call_on(*signed_server));
    if (!with.ok()) return fail(with.status().WithContext(c.name + " signed"));
    rows.push_back({{"request", c.name}, {"requests", c.n}, {"unsigned_seconds", *plain}, {"signed_seconds", *with},
                    {"ratio", *with / *plain}});
    if (opt.format == "text") {
      std::printf("%-22s %12.1f %12.1f %12.1f %8.3f\n", c.name.c_str(), *plain * 1e6, *with * 1e6,
                  (*with - *plain) * 1e6, *with / *plain);
    }
  }
  if (opt.format == "json") std::printf("%s\n", nlohmann::json{{"signing", rows}}.dump().c_str());
  signed_server->http->Stop();
  open->http->Stop();
  return 0;
}

}  // namespace

void AddBenchSigning(CLI::App& bench) {
  auto opt = std::make_shared<BenchSigningOptions>();
  CLI::App* cmd = bench.add_subcommand("signing", "what signing control requests costs: each request signed "
                                                  "beside unsigned, against the same controller code");
  cmd->add_option("--requests", opt->requests, "requests per kind (the 512 KiB one: a twentieth)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--format", opt->format, "output format")->check(CLI::IsMember({"text", "json"}))->capture_default_str();
  cmd->callback([opt] {
    const int rc = RunBenchSigning(*opt);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace wsync::cli
