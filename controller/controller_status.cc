// Controller's read-only views: /v1/status JSON and /metrics text.
#include <cstdint>
#include <cstdio>

#include "controller/controller.h"

namespace wsync::controller {

using nlohmann::json;

namespace {

// One Prometheus metric family: # HELP, # TYPE and its samples.
class MetricsWriter {
 public:
  void Family(const char* name, const char* type, const char* help) {
    out_ += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void Sample(const char* name, const std::string& labels, double value) {
    char buf[64];
    // Counts and byte totals print exactly; times with 9 significant digits.
    if (value == static_cast<double>(static_cast<int64_t>(value)) && value < 9.0e15 && value > -9.0e15)
      std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(value));
    else
      std::snprintf(buf, sizeof(buf), "%.9g", value);
    out_ += name;
    if (!labels.empty()) out_ += "{" + labels + "}";
    out_ += std::string(" ") + buf + "\n";
  }
  void Gauge(const char* name, const char* help, double value) {
    Family(name, "gauge", help);
    Sample(name, "", value);
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

}  // namespace

std::string Controller::VersionsFingerprintLocked() const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over (version, state, admitted)
  for (const auto& [v, r] : versions_.records()) {
    h = (h ^ (v * 8 + static_cast<uint64_t>(r.state) * 2 + r.admitted)) * 1099511628211ull;
  }
  char text[40];
  std::snprintf(text, sizeof text, "%016llx-%zu", static_cast<unsigned long long>(h), versions_.records().size());
  return text;
}

json Controller::StatusJson(const std::string& since, Clock::duration wait) {
  std::unique_lock<std::mutex> lock(mu_);
  Clock::time_point now = Clock::now();
  TickLocked(now);
  if (!since.empty()) {
    const Clock::time_point until = now + wait;
    // Deadlines expire in TickLocked, not by a notification: look again
    // at least every 200 ms.
    while (!shutdown_ && VersionsFingerprintLocked() == since && now < until) {
      cv_.wait_until(lock, std::min(until, now + std::chrono::milliseconds(200)));
      now = Clock::now();
      TickLocked(now);
    }
  }
  std::vector<int32_t> reg_trainers, reg_inference;
  for (int32_t r = 0; r < options_.trainers; ++r)
    if (planned_ || trainers_.ranks().count(r)) reg_trainers.push_back(r);
  for (int32_t r = 0; r < options_.inference; ++r)
    if (planned_ || inference_ranks_.count(r)) reg_inference.push_back(r);

  json plan = nullptr;
  if (planned_) {
    plan = {{"plan_id", plan_->plan_id},
            {"mesh_groups", plan_->table.mesh_groups.size()},
            {"sources", plan_->table.sources.size()},
            {"destinations", plan_->table.destinations.size()},
            {"ops", plan_->table.ops.size()},  // strided ones once
            {"writes", WriteCount(plan_->table.ops)},
            {"wire_bytes", plan_->summary.wire_bytes},
            {"dest_bytes", plan_->summary.dest_bytes},
            {"predicted_seconds", plan_->summary.predicted_seconds},
            // How trainer ranks unshard: "exchange" (only the rows each
            // writes) or "full_tensor"; the bytes they receive to do it.
            {"unshard", options_.exchange ? "exchange" : "full_tensor"},
            {"exchange_bytes", plan_->summary.exchange_bytes},
            {"full_tensor_bytes", plan_->summary.full_tensor_bytes},
            {"epoch", epoch_},
            // The planning pass (without the lock): assemble + plan + persist.
            // 0 for a plan restored from the state dir.
            {"plan_seconds", plan_seconds_},
            {"assemble_seconds", assemble_seconds_},
            {"persist_seconds", persist_seconds_}};
  }
  json versions = json::array();
  for (const auto& [v, r] : versions_.records()) versions.push_back(r.ToJson(now));
  json errors = json::array();
  for (const ErrorRecord& e : errors_)
    errors.push_back({{"unix", e.unix}, {"role", RoleName(e.role)}, {"rank", e.rank}, {"error", e.error}});
  json lost = json::array();
  for (const auto& [who, since] : lost_)
    lost.push_back({{"role", RoleName(who.first)}, {"rank", who.second}, {"since_unix", since},
                    {"error", LostReason()}});
  return {{"phase", PhaseLocked()},
          {"lost", std::move(lost)},
          {"world", {{"trainers", options_.trainers}, {"inference", options_.inference}}},
          {"registered", {{"trainer", reg_trainers}, {"inference", reg_inference}}},
          {"missing",
           {{"trainer", MissingLocked(Role::kTrainer)}, {"inference", MissingLocked(Role::kInference)}}},
          {"assembly_error", assembly_error_},
          {"plan", plan},
          {"latest_complete_version",
           versions_.has_complete() ? json(versions_.latest_complete()) : json(nullptr)},
          {"last_update_seconds", versions_.has_complete() ? json(versions_.last_update_seconds()) : json(nullptr)},
          {"versions", std::move(versions)},
          {"versions_fingerprint", VersionsFingerprintLocked()},
          {"errors", std::move(errors)}};
}

std::string Controller::MetricsText() {
  std::lock_guard<std::mutex> lock(mu_);
  TickLocked(Clock::now());
  MetricsWriter m;
  m.Family("wsync_world_ranks", "gauge", "Ranks the controller waits for, by role.");
  m.Sample("wsync_world_ranks", "role=\"trainer\"", options_.trainers);
  m.Sample("wsync_world_ranks", "role=\"inference\"", options_.inference);
  m.Family("wsync_registered_ranks", "gauge", "Ranks registered (all of them once planned), by role.");
  m.Sample("wsync_registered_ranks", "role=\"trainer\"",
           planned_ ? options_.trainers : static_cast<double>(trainers_.ranks().size()));
  m.Sample("wsync_registered_ranks", "role=\"inference\"",
           planned_ ? options_.inference : static_cast<double>(inference_ranks_.size()));
  m.Gauge("wsync_plan_ready", "1 once the routing plan exists.", planned_ ? 1 : 0);
  m.Gauge("wsync_world_assembly_failed", "1 if the world timeout passed without a full world.",
          !planned_ && world_timed_out_ ? 1 : 0);
  m.Gauge("wsync_plan_seconds", "Seconds the planning pass took (assemble, plan, persist; 0 if restored).",
          plan_seconds_);
  m.Gauge("wsync_plan_wire_bytes", "Bytes written over the network per update.",
          planned_ ? static_cast<double>(plan_->summary.wire_bytes) : 0);
  m.Gauge("wsync_plan_writes", "Write operations per update.",
          planned_ ? static_cast<double>(WriteCount(plan_->table.ops)) : 0);
  m.Family("wsync_versions_total", "counter", "Update versions that reached each state.");
  m.Sample("wsync_versions_total", "state=\"started\"", static_cast<double>(versions_.started_total()));
  m.Sample("wsync_versions_total", "state=\"complete\"", static_cast<double>(versions_.complete_total()));
  m.Sample("wsync_versions_total", "state=\"failed\"", static_cast<double>(versions_.failed_total()));
  m.Gauge("wsync_versions_in_progress", "Versions started and not yet complete or failed.",
          versions_.in_progress());
  m.Gauge("wsync_latest_complete_version", "Latest version every inference rank holds (-1: none).",
          versions_.has_complete() ? static_cast<double>(versions_.latest_complete()) : -1);
  m.Gauge("wsync_update_seconds", "Start-to-complete time of the latest complete version.",
          versions_.last_update_seconds());
  m.Family("wsync_registration_errors_total", "counter", "Registrations rejected.");
  m.Sample("wsync_registration_errors_total", "", static_cast<double>(registration_errors_));
  double lost_trainers = 0, lost_inference = 0;
  for (const auto& [who, since] : lost_) (who.first == Role::kTrainer ? lost_trainers : lost_inference) += 1;
  m.Family("wsync_lost_ranks", "gauge", "Ranks whose heartbeats stopped, by role.");
  m.Sample("wsync_lost_ranks", "role=\"trainer\"", lost_trainers);
  m.Sample("wsync_lost_ranks", "role=\"inference\"", lost_inference);
  m.Gauge("wsync_kv_keys", "Keys in the rendezvous store.", static_cast<double>(kv_.size()));
  return m.Take();
}

}  // namespace wsync::controller
