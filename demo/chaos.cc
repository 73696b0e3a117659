#include "demo/chaos.h"

#include <signal.h>

#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "inference_agent/engine_view.h"

namespace wsync::demo {
namespace {

using Clock = std::chrono::steady_clock;

enum class Kind { kTrainerAgent, kInferenceAgent, kController };
const char* KindName(Kind k) {
  switch (k) {
    case Kind::kTrainerAgent: return "trainer_agent";
    case Kind::kInferenceAgent: return "inference_agent";
    case Kind::kController: return "controller";
  }
  return "?";
}

// The inference ranks whose version word says `version` is complete.
std::vector<int32_t> EnginesClaiming(LocalSync& s, uint64_t version) {
  std::vector<int32_t> ranks;
  for (const InferenceRank& r : s.specs().inference.ranks) {
    StatusOr<inference::EngineView> view = inference::EngineView::Open(s.InferenceShmName(r.rank));
    if (view.ok() && view->complete_version() == version) ranks.push_back(r.rank);
  }
  return ranks;
}

class Run {
 public:
  Run(const ChaosOptions& o, LocalSync& s) : o_(o), s_(s), rng_(o.seed) {}

  void Log(const std::string& line) const {
    if (o_.log) o_.log(line);
  }

  // Publishes `v`, kills `kind` after `delay`, brings it back, then judges v.
  Status Fault(uint64_t v, Kind kind, int32_t rank, std::chrono::milliseconds delay, ChaosResult* out) {
    WSYNC_RETURN_IF_ERROR(s_.FillShards(v));
    WSYNC_RETURN_IF_ERROR(s_.Publish(v));
    ++out->attempted;
    std::this_thread::sleep_for(delay);
    ++out->faults;
    out->by_kind[KindName(kind)] = out->by_kind.value(KindName(kind), 0) + 1;
    Status back;
    switch (kind) {
      case Kind::kTrainerAgent:
        s_.KillTrainerAgent(rank, SIGKILL);
        back = s_.StartTrainerAgent(rank);
        if (back.ok()) back = s_.trainer_agent(rank).WaitForLine("ready", std::chrono::seconds(90));
        break;
      case Kind::kInferenceAgent:
        s_.KillInferenceAgent(rank, SIGKILL);
        back = s_.StartInferenceAgent(rank, /*attach=*/true);
        if (back.ok()) back = s_.inference_agent(rank).WaitForLine("ready", std::chrono::seconds(90));
        break;
      case Kind::kController:
        s_.StopController();  // SIGKILL-equivalent for its state: nothing is flushed on the way out
        back = s_.StartController();
        break;
    }
    if (!back.ok()) {
      ++out->hangs;
      return back.WithContext(std::string(KindName(kind)) + " did not come back");
    }
    Judge(v, kind == Kind::kController, out);
    return Status::Ok();
  }

  // Classifies version `v` once it has finished (or should have).
  void Judge(uint64_t v, bool controller_restarted, ChaosResult* out) {
    const double wait = o_.sync.version_timeout_s + 30;
    StatusOr<controller::VersionStatus> st = s_.WaitVersion(v, wait);
    if (st.ok() && st->complete()) {
      Status ok = s_.Verify(v, nullptr);
      if (ok.ok()) {
        ++out->completed;
      } else {
        ++out->silently_wrong;
        Log("version " + std::to_string(v) + ": SILENTLY WRONG: complete, but " + ok.message());
      }
      return;
    }
    const bool unknown = !st.ok() && controller_restarted && st.status().code() == StatusCode::kNotFound;
    const bool failed = st.ok() && st->failed();
    if (!failed && !unknown) {
      ++out->hangs;
      Log("version " + std::to_string(v) + ": HANG: " + (st.ok() ? "still " + st->state : st.status().message()));
      return;
    }
    // Not complete at the controller. An engine may still hold every byte
    // of it (all its immediates landed before another rank failed); its
    // version word may say so only if those bytes are right.
    for (int32_t rank : EnginesClaiming(s_, v)) {
      Status ok = s_.Verify(v, nullptr, rank);
      if (!ok.ok()) {
        ++out->silently_wrong;
        Log("version " + std::to_string(v) + ": SILENTLY WRONG: inference rank " + std::to_string(rank) +
            " claims it complete: " + ok.message());
        return;
      }
    }
    ++out->failed_reported;
  }

  // The update after a fault must complete and verify.
  Status Recover(uint64_t v, ChaosResult* out) {
    ++out->attempted;
    StatusOr<UpdateReport> r = s_.Update(v);
    if (!r.ok()) {
      ++out->not_recovered;
      ++out->hangs;
      return r.status().WithContext("recovery update " + std::to_string(v));
    }
    if (r->state == "complete" && s_.Verify(v, nullptr).ok()) {
      ++out->completed;
      return Status::Ok();
    }
    ++out->not_recovered;
    Judge(v, false, out);
    Log("version " + std::to_string(v) + ": not recovered: " + r->state + " " + r->failure);
    return Status::Ok();
  }

  std::mt19937_64& rng() { return rng_; }

 private:
  const ChaosOptions& o_;
  LocalSync& s_;
  std::mt19937_64 rng_;
};

}  // namespace

nlohmann::json ChaosResult::ToJson() const {
  return {{"attempted", attempted},   {"completed", completed},   {"failed_reported", failed_reported},
          {"silently_wrong", silently_wrong}, {"hangs", hangs}, {"faults", faults},
          {"not_recovered", not_recovered},   {"by_kind", by_kind}, {"seconds", seconds}};
}

StatusOr<ChaosResult> RunChaos(const ChaosOptions& o) {
  const auto t0 = Clock::now();
  WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<LocalSync> sync, LocalSync::Start(o.sync));
  LocalSync& s = *sync;
  Run run(o, s);
  ChaosResult out;
  uint64_t v = 0;
  // One clean update first: how long an update takes sets the kill window.
  const auto u0 = Clock::now();
  WSYNC_RETURN_IF_ERROR(run.Recover(++v, &out));
  if (out.completed != 1) return Internal("chaos: the first update, before any fault, did not complete and verify");
  const double update_s = std::max(0.05, std::chrono::duration<double>(Clock::now() - u0).count());
  const int trainers = static_cast<int>(s.specs().trainer.ranks.size());
  const int engines = static_cast<int>(s.specs().inference.ranks.size());
  for (int f = 0; f < o.faults; ++f) {
    if (o.max_seconds > 0 && std::chrono::duration<double>(Clock::now() - t0).count() > o.max_seconds) break;
    const uint64_t pick = run.rng()() % 3;
    const Kind kind = pick == 0 ? Kind::kTrainerAgent : pick == 1 ? Kind::kInferenceAgent : Kind::kController;
    const int32_t rank = static_cast<int32_t>(run.rng()() % (kind == Kind::kTrainerAgent ? trainers : engines));
    // Anywhere from before the agents pick the version up to about when it lands.
    const auto delay = std::chrono::milliseconds(run.rng()() % static_cast<uint64_t>(update_s * 1000 + 1));
    run.Log("fault " + std::to_string(f + 1) + "/" + std::to_string(o.faults) + ": version " + std::to_string(v + 1) +
            ", kill " + KindName(kind) + (kind == Kind::kController ? "" : " " + std::to_string(rank)) + " after " +
            std::to_string(delay.count()) + " ms");
    WSYNC_RETURN_IF_ERROR(run.Fault(++v, kind, rank, delay, &out));
    WSYNC_RETURN_IF_ERROR(run.Recover(++v, &out));
  }
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return out;
}

}  // namespace wsync::demo
