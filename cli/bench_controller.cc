// `wsync bench controller`: the control plane at the reference scale (issue
// #11). Starts a real `wsync controller` process (signed requests, a state
// dir), then 384 agents (threads of this process, one signed client each)
// register Kimi-K2 256 -> 128 at once and each long-polls for its plan
// slice, as the agents do. Prints the time until every rank holds its slice
// beside the 5 s limit. What each agent does on its own host (serializing
// its registration, parsing its slice) runs here outside that window, since
// 384 agents on this machine's cores would otherwise bill the controller for
// 384 hosts' work; those times are printed apart. Also printed: the
// controller's planning pass (which runs outside its lock) and the
// controller process's peak RSS (VmHWM).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/plan_inputs.h"
#include "controller/auth.h"
#include "controller/client.h"
#include "demo/process.h"
#include "routing/spec_io.h"

namespace wsync::cli {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr double kLimitSeconds = 5.0;  // issue #11: every slice served within 5 s

struct BenchControllerOptions {
  PlanSource source;
  std::string format = "text";
  std::string work_dir;
  int descriptor_bytes = 160;
  bool exchange = true;
};

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A field of /proc/<pid>/status in bytes ("VmHWM:  123 kB"); -1 if absent.
double ProcStatusBytes(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, field.size() + 1, field + ":") != 0) continue;
    return std::stod(line.substr(field.size() + 1)) * 1024.0;
  }
  return -1;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "wsync bench controller: error: %s\n", what.c_str());
  return 1;
}

int RunBenchController(const BenchControllerOptions& opt) {
  namespace fs = std::filesystem;
  PlanSource source = opt.source;
  if (source.dir.empty() && source.cluster.empty() && source.trainer.empty()) source.dir = "examples/kimi-k2-256x128";
  const Progress quiet(/*quiet=*/true);
  StatusOr<PlanInputs> inputs = LoadPlanInputs(source, quiet);
  if (!inputs.ok()) return Fail(inputs.status().message());
  // Descriptors as long as real ones, unique per (rank, region).
  for (InferenceRank& r : inputs->inference.ranks)
    for (MemoryRegion& m : r.regions) {
      m.descriptor = "bench:" + std::to_string(r.rank) + ":" + m.id + ":";
      m.descriptor.resize(std::max<size_t>(m.descriptor.size(), opt.descriptor_bytes), 'f');
    }
  const int32_t trainers = static_cast<int32_t>(inputs->trainer.ranks.size());
  const int32_t inference = static_cast<int32_t>(inputs->inference.ranks.size());
  const int32_t n = trainers + inference;

  const std::string work = opt.work_dir.empty()
                               ? (fs::temp_directory_path() / ("wsync-bench-controller-" + std::to_string(::getpid())))
                                     .string()
                               : opt.work_dir;
  std::error_code ec;
  fs::remove_all(work, ec);
  fs::create_directories(work, ec);
  if (ec) return Fail("cannot create work dir '" + work + "': " + ec.message());
  const std::string secret_path = work + "/job.secret", mapping_path = work + "/mapping.json";
  if (Status s = controller::WriteNewSecret(secret_path); !s.ok()) return Fail(s.message());
  if (Status s = WriteJsonFile(ToJson(inputs->mapping), mapping_path); !s.ok()) return Fail(s.message());
  StatusOr<controller::JobSecret> secret = controller::JobSecret::FromFile(secret_path);
  if (!secret.ok()) return Fail(secret.status().message());

  std::vector<std::string> argv = {
      demo::SelfExecutable(), "controller", "--listen", "127.0.0.1:0", "--state-dir", work + "/state",
      "--trainers", std::to_string(trainers), "--inference", std::to_string(inference), "--mapping",
      mapping_path, "--secret-file", secret_path, "--world-timeout", "600",
      // 384 agents on one loopback address stand for 48 hosts of 8.
      "--max-connections-per-address", "1024"};
  argv.push_back(opt.exchange ? "--exchange" : "--full-tensor");
  StatusOr<demo::ChildProcess> child = demo::ChildProcess::Spawn("controller", argv, work + "/controller.log");
  if (!child.ok()) return Fail(child.status().message());
  StatusOr<std::string> address = child->ReadLine(std::chrono::seconds(30));
  if (!address.ok()) return Fail(address.status().message());
  const pid_t controller_pid = child->pid();
  const double rss_idle = ProcStatusBytes(controller_pid, "VmRSS");

  controller::ClientOptions co;
  co.secret = *secret;
  co.retry_for_s = 60;
  co.request_timeout_s = 120;
  std::vector<std::string> errors(n);
  std::vector<char> failed_registering(n, 0);  // the cause; the others then wait for the world in vain
  std::vector<double> registered_at(n, 0), served_at(n, 0), prepare_s(n, 0);
  std::vector<std::string> slices(n);
  std::atomic<int> ready{0};
  std::promise<void> go;
  std::shared_future<void> started = go.get_future().share();
  Clock::time_point t0;
  std::vector<std::thread> agents;
  agents.reserve(n);
  for (int32_t i = 0; i < n; ++i) {
    agents.emplace_back([&, i] {
      const bool trainer = i < trainers;
      const int32_t rank = trainer ? i : i - trainers;
      // Each agent serializes its registration on its own host before it
      // calls: done before the clock starts, timed apart.
      const Clock::time_point p0 = Clock::now();
      const std::string body =
          trainer ? controller::TrainerRegistrationText(inputs->trainer.ranks[rank], inputs->trainer.mesh_groups)
                  : controller::InferenceRegistrationText(inputs->inference.ranks[rank]);
      prepare_s[i] = Since(p0);
      StatusOr<controller::ControllerClient> client = controller::ControllerClient::FromAddress(*address, co);
      ready.fetch_add(1);
      started.wait();
      if (!client.ok()) {
        errors[i] = client.status().message();
        return;
      }
      const Clock::time_point deadline = Clock::now() + std::chrono::seconds(300);
      const controller::Role role = trainer ? controller::Role::kTrainer : controller::Role::kInference;
      StatusOr<json> reg = client->RegisterText(role, body);
      registered_at[i] = Since(t0);
      if (!reg.ok()) {
        errors[i] = reg.status().message();
        failed_registering[i] = 1;
        return;
      }
      // The slice's bytes as the agent receives them; parsed (the agent's
      // own work, on its own host) after the clock stops.
      StatusOr<std::string> text = client->FetchPlanText(role, rank, deadline);
      served_at[i] = Since(t0);
      if (!text.ok()) errors[i] = text.status().message();
      else slices[i] = std::move(text).value();
    });
  }
  while (ready.load() < n) std::this_thread::yield();
  t0 = Clock::now();
  go.set_value();
  for (std::thread& t : agents) t.join();
  const double all_served = Since(t0);
  const double rss_peak = ProcStatusBytes(controller_pid, "VmHWM");
  const double rss_now = ProcStatusBytes(controller_pid, "VmRSS");
  StatusOr<controller::ControllerClient> client = controller::ControllerClient::FromAddress(*address, co);
  StatusOr<json> status = client.ok() ? client->GetStatus() : StatusOr<json>(client.status());
  child->Stop();

  // Every slice parsed and checked as its agent would: its own rank.
  std::vector<double> parse_s(n, 0);
  for (int32_t i = 0; i < n; ++i) {
    if (!errors[i].empty()) continue;
    const bool trainer = i < trainers;
    const int32_t rank = trainer ? i : i - trainers;
    const Clock::time_point p0 = Clock::now();
    int32_t got = -1;
    if (trainer) {
      StatusOr<controller::TrainerPlanSlice> s = controller::ParseTrainerPlanSlice(slices[i]);
      if (!s.ok()) errors[i] = s.status().message();
      else got = s->plan.rank;
    } else {
      StatusOr<controller::InferencePlanSlice> s = controller::ParseInferencePlanSlice(slices[i]);
      if (!s.ok()) errors[i] = s.status().message();
      else got = s->plan.rank;
    }
    parse_s[i] = Since(p0);
    if (errors[i].empty() && got != rank)
      errors[i] = "got the slice of rank " + std::to_string(got) + ", not its own " + std::to_string(rank);
  }

  // Registration failures first: one missing rank makes every other agent
  // fail waiting for the world, and those errors would hide it.
  int failed = 0, shown = 0;
  for (const bool registering : {true, false})
    for (int32_t i = 0; i < n; ++i) {
      if (errors[i].empty() || (failed_registering[i] != 0) != registering) continue;
      ++failed;
      if (shown < 5 || (registering && shown < 20)) {
        ++shown;
        std::fprintf(stderr, "wsync bench controller: %s rank %d: %s%s\n", i < trainers ? "trainer" : "inference",
                     i < trainers ? i : i - trainers, registering ? "registering: " : "", errors[i].c_str());
      }
    }
  if (!status.ok()) return Fail("status: " + status.status().message());
  const json plan = (*status)["plan"];
  if (failed > 0 || !plan.is_object())
    return Fail(std::to_string(failed) + " of " + std::to_string(n) + " agents did not get their slice (log: " +
                work + "/controller.log)");
  const double last_registered = *std::max_element(registered_at.begin(), registered_at.end());
  const double first_served = *std::min_element(served_at.begin(), served_at.end());
  const double max_prepare = *std::max_element(prepare_s.begin(), prepare_s.end());
  const double max_parse = *std::max_element(parse_s.begin(), parse_s.end());
  size_t slice_bytes = 0;
  for (const std::string& t : slices) slice_bytes += t.size();
  const double plan_s = plan.value("plan_seconds", 0.0), assemble_s = plan.value("assemble_seconds", 0.0),
               persist_s = plan.value("persist_seconds", 0.0);
  if (opt.work_dir.empty()) fs::remove_all(work, ec);

  if (opt.format == "json") {
    json j = {{"case", inputs->description},
              {"agents", n},
              {"all_slices_served_seconds", all_served},
              {"limit_seconds", kLimitSeconds},
              {"ratio", all_served / kLimitSeconds},
              {"last_registration_answered_seconds", last_registered},
              {"first_slice_served_seconds", first_served},
              {"plan_seconds", plan_s},
              {"assemble_seconds", assemble_s},
              {"persist_seconds", persist_s},
              {"controller_peak_rss_bytes", rss_peak},
              {"controller_rss_after_bytes", rss_now},
              {"controller_rss_idle_bytes", rss_idle},
              {"writes", plan.value("writes", 0)},
              {"ops", plan.value("ops", 0)},
              {"agent_max_prepare_seconds", max_prepare},
              {"agent_max_parse_seconds", max_parse},
              {"slice_bytes", slice_bytes}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("bench controller: %s, %d agents (%d trainer + %d inference; threads, one signed client each) "
              "against `wsync controller` (pid %d) on %s\n",
              inputs->description.c_str(), n, trainers, inference, static_cast<int>(controller_pid),
              address->c_str());
  std::printf("  all slices served  %.3f s after the first registration   limit %.1f s   ratio %.2f\n", all_served,
              kLimitSeconds, all_served / kLimitSeconds);
  std::printf("  registrations      every one answered by %.3f s; first slice at %.3f s\n", last_registered,
              first_served);
  std::printf("  planning pass      %.3f s outside the lock (assemble %.3f s, plan %.3f s, persist %.3f s); "
              "%lld writes in %lld ops\n",
              plan_s, assemble_s, plan_s - assemble_s - persist_s, persist_s,
              static_cast<long long>(plan.value("writes", 0)), static_cast<long long>(plan.value("ops", 0)));
  std::printf("  each agent's own   at most %.3f s to serialize its registration, %.3f s to parse its slice "
              "(on its own host; here outside the clock); %.1f MB of slices\n",
              max_prepare, max_parse, slice_bytes / 1e6);
  std::printf("  controller memory  peak RSS %.0f MiB (VmHWM), %.0f MiB after serving, %.0f MiB idle before\n",
              rss_peak / (1 << 20), rss_now / (1 << 20), rss_idle / (1 << 20));
  return 0;
}

}  // namespace

void AddBenchController(CLI::App& bench) {
  auto opt = std::make_shared<BenchControllerOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "controller", "384 agents register Kimi-K2 256->128 at once against a real controller: time to every slice");
  AddPlanSourceOptions(*cmd, &opt->source);
  cmd->add_option("--format", opt->format, "output format")->check(CLI::IsMember({"text", "json"}));
  cmd->add_flag("--exchange,!--full-tensor", opt->exchange,
                "the controller plans the exchange (the default) or full_tensor (wsync controller --full-tensor)");
  cmd->add_option("--work-dir", opt->work_dir, "keep the secret, mapping, state dir and controller.log here");
  cmd->add_option("--descriptor-bytes", opt->descriptor_bytes, "length of each region's (fake) descriptor")
      ->capture_default_str();
  cmd->callback([opt] { std::exit(RunBenchController(*opt)); });
}

}  // namespace wsync::cli
