// `wsync controller`: runs the control plane (docs/CONTROL_PLANE.md) until
// SIGINT/SIGTERM. The first stdout line is the bound address (HOST:PORT),
// flushed, so scripts and tests can start it with port 0 and read it back;
// events go to stderr, one line each.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "controller/client.h"
#include "controller/controller.h"
#include "controller/http_server.h"
#include "routing/spec_io.h"

namespace wsync::cli {

namespace {

struct ControllerCommandOptions {
  std::string listen = "127.0.0.1:0";
  std::string state_dir;
  int trainers = 0;
  int inference = 0;
  std::string mapping;
  std::string model_config;
  double world_timeout_s = 300;
  double version_timeout_s = 300;
  double heartbeat_timeout_s = 10;
  bool exchange = true;
  uint64_t min_shard_piece_bytes = PlanOptions{}.min_shard_piece_bytes;
  uint32_t full_every = controller::ControllerOptions{}.full_every;
  int threads = 0;
  size_t max_connections = controller::ServerOptions{}.max_connections;
  size_t max_connections_per_address = controller::ServerOptions{}.max_connections_per_address;
  std::string secret_file;
  std::string tls_cert;
  std::string tls_key;
};

void LogLine(const std::string& line) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%SZ", &tm);
  std::fprintf(stderr, "%s wsync controller: %s\n", stamp, line.c_str());
}

int Fail(const Status& s) {
  std::fprintf(stderr, "wsync controller: error: %s\n", s.message().c_str());
  return 1;
}

int RunController(const ControllerCommandOptions& opt) {
  StatusOr<std::pair<std::string, int>> listen = controller::ParseHostPort(opt.listen);
  if (!listen.ok()) return Fail(listen.status());

  controller::ControllerOptions options;
  options.trainers = opt.trainers;
  options.inference = opt.inference;
  options.state_dir = opt.state_dir;
  options.world_timeout_s = opt.world_timeout_s;
  options.version_timeout_s = opt.version_timeout_s;
  options.heartbeat_timeout_s = opt.heartbeat_timeout_s;
  options.exchange = opt.exchange;
  options.min_shard_piece_bytes = opt.min_shard_piece_bytes;
  options.full_every = opt.full_every;
  options.log = LogLine;
  if (!opt.mapping.empty()) {
    nlohmann::json config;
    if (!opt.model_config.empty()) {
      std::ifstream in(opt.model_config);
      try {
        config = nlohmann::json::parse(in);
      } catch (const std::exception& e) {
        return Fail(InvalidArgument(opt.model_config + ": not a JSON model config: " + e.what()));
      }
    }
    StatusOr<MappingSpec> mapping =
        ParseMappingSpecFromFile(opt.mapping, opt.model_config.empty() ? nullptr : &config);
    if (!mapping.ok()) return Fail(mapping.status());
    options.mapping = *mapping;
  }

  // Block the stop signals before any thread starts, so every thread
  // inherits the mask and only sigwait below sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  StatusOr<std::unique_ptr<controller::Controller>> ctl = controller::Controller::Create(std::move(options));
  if (!ctl.ok()) return Fail(ctl.status());
  controller::ServerOptions server_options;
  StatusOr<std::optional<controller::JobSecret>> secret = controller::LoadJobSecret(opt.secret_file);
  if (!secret.ok()) return Fail(secret.status());
  server_options.secret = std::move(secret).value();
  server_options.tls_cert_file = opt.tls_cert;
  server_options.tls_key_file = opt.tls_key;
  server_options.host = listen->first;
  server_options.port = listen->second;
  // Every agent may hold a long poll at once (plan, KV, version waits).
  server_options.threads =
      opt.threads > 0 ? opt.threads : std::max(64, 2 * (opt.trainers + opt.inference) + 16);
  server_options.max_connections = opt.max_connections;
  server_options.max_connections_per_address = opt.max_connections_per_address;
  controller::HttpServer server(ctl->get(), server_options);
  Status started = server.Start();
  if (!started.ok()) return Fail(started);

  std::printf("%s\n", server.address().c_str());
  std::fflush(stdout);
  LogLine("listening on " + server.address() + " for " + std::to_string(opt.trainers) + " trainer + " +
          std::to_string(opt.inference) + " inference ranks" +
          (opt.state_dir.empty() ? std::string(" (no state dir: nothing persists)")
                                 : "; state dir " + opt.state_dir) +
          (server_options.secret ? "; requests must be signed with " + server_options.secret->source()
                                 : std::string("; OPEN: no job secret")) +
          (server.tls() ? "; TLS with " + opt.tls_cert : std::string("; plain HTTP (no --tls-cert)")));

  int sig = 0;
  sigwait(&stop_signals, &sig);
  LogLine(std::string("stopping on ") + (sig == SIGINT ? "SIGINT" : "SIGTERM"));
  server.Stop();
  return 0;
}

}  // namespace

void AddControllerCommand(CLI::App& app) {
  auto opt = std::make_shared<ControllerCommandOptions>();
  CLI::App* cmd = app.add_subcommand(
      "controller", "Run the control plane: registrations, plan, Gloo rendezvous, update versions (HTTP/JSON)");
  cmd->add_option("--listen", opt->listen, "HOST:PORT to serve on; port 0 picks a free one (printed first on stdout)")
      ->capture_default_str();
  cmd->add_option("--state-dir", opt->state_dir,
                  "Where the plan and the latest complete version persist; a restart on it serves the same plan")
      ->required();
  cmd->add_option("--trainers", opt->trainers, "Trainer ranks in the world")->required()->check(CLI::PositiveNumber);
  cmd->add_option("--inference", opt->inference, "Inference ranks in the world")
      ->required()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--mapping", opt->mapping, "wsync.mapping/v1 file (default: identity names)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--model-config", opt->model_config,
                  "HF config.json that resolves the mapping's \"{name}\" shard counts (e.g. num_key_value_heads)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--world-timeout", opt->world_timeout_s,
                  "Seconds to wait for every rank before reporting who is missing")
      ->capture_default_str();
  cmd->add_option("--version-timeout", opt->version_timeout_s,
                  "Seconds a version may take before it is marked failed")
      ->capture_default_str();
  cmd->add_option("--heartbeat-timeout", opt->heartbeat_timeout_s,
                  "Seconds of silence after which a rank that sends heartbeats is lost (0: off)")
      ->capture_default_str();
  cmd->add_flag("--exchange,!--full-tensor", opt->exchange,
                "unshard by the planned exchange (the default: each trainer rank receives from its FSDP peers "
                "only the rows it writes) or all-gather whole tensors (--full-tensor); every agent must be "
                "restarted when this changes");
  cmd->add_option("--min-shard-piece", opt->min_shard_piece_bytes,
                  "with --exchange: cut a piece at trainer shard edges only where each part keeps this many bytes")
      ->capture_default_str();
  cmd->add_option("--full-every", opt->full_every,
                  "delta versions (inference agents with --delta, trainers with --delta): every K-th version goes "
                  "whole, the others carry only what changed since the latest complete version (1: no deltas)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--secret-file", opt->secret_file,
                  "job secret (mode 0600; `wsync secret PATH` makes one): every request must be signed with it "
                  "(default: $WSYNC_SECRET_FILE; none: open, loopback only)");
  cmd->add_option("--tls-cert", opt->tls_cert,
                  "TLS: this controller's certificate chain (PEM); clients then need --tls-ca (or $WSYNC_TLS_CA_FILE)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--tls-key", opt->tls_key, "TLS: the private key of --tls-cert (PEM)")->check(CLI::ExistingFile);
  cmd->add_option("--threads", opt->threads, "HTTP worker threads (default: enough for every agent to long-poll)");
  cmd->add_option("--max-connections", opt->max_connections,
                  "open connections in all; one more is answered 503 with Retry-After (agents retry)")
      ->capture_default_str();
  cmd->add_option("--max-connections-per-address", opt->max_connections_per_address,
                  "open connections from one source address (one host's agents and commands)")
      ->capture_default_str();
  cmd->callback([cmd, opt] {
    // Given but empty (an unset variable in a script, say): refuse, rather
    // than serve unsigned with only a warning.
    if (cmd->count("--secret-file") > 0 && opt->secret_file.empty())
      throw CLI::ValidationError("--secret-file", "is empty; give the job secret's path (`wsync secret PATH` makes "
                                                  "one), or leave the flag out to serve loopback only");
    std::exit(RunController(*opt));
  });
}

}  // namespace wsync::cli
