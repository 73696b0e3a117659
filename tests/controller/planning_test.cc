// Planning runs without the controller's lock: while the rank that completes
// the world waits for its plan, every other request is answered. The
// controller is held inside its planning pass by an injected hook (no
// sleeps): the test knows planning is in progress because the hook said so,
// and lets it finish when it has seen what it wanted.
#include <future>
#include <map>
#include <set>
#include <thread>

#include "controller_fixture.h"

namespace wsync::controller::testing {
namespace {

// Blocks the first planning pass until released; counts passes.
struct PlanningGate {
  std::promise<void> entered;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> passes{0};

  // The hook waits on its own copy of `released`: the pass it holds may
  // still be inside that wait (TSan saw its read) when the test, released,
  // has ended and destroyed the gate.
  std::function<void()> Hook() {
    return [this, released = released] {
      if (passes.fetch_add(1) == 0) {
        entered.set_value();
        released.wait();
      }
    };
  }
};

class PlanningTest : public ControllerTest {
 protected:
  // Starts the server with `gate` as its planning hook and registers every
  // rank; the last registration (inference rank 1, in the background)
  // completes the world and plans. Returns once that pass is held in the
  // gate, with the last registration's reply to come.
  std::future<StatusOr<json>> CompleteTheWorldHeldInPlanning(PlanningGate& gate) {
    std::future<void> entered = gate.entered.get_future();
    ControllerOptions o = Options();
    o.planning_hook = gate.Hook();
    StartServer(o);
    for (int r = 0; r < world_.trainers(); ++r) EXPECT_TRUE(client_->RegisterTrainerJson(world_.TrainerBody(r)).ok());
    EXPECT_TRUE(client_->RegisterInferenceJson(world_.InferenceBody(0)).ok());
    std::future<StatusOr<json>> last = std::async(std::launch::async, [this] {
      ControllerClient other("127.0.0.1", server_->port());
      return other.RegisterInferenceJson(world_.InferenceBody(1));
    });
    EXPECT_EQ(entered.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "planning never started";
    return last;
  }
};

TEST_F(PlanningTest, RequestsAreAnsweredWhileThePlanIsComputed) {
  PlanningGate gate;
  std::future<StatusOr<json>> last = CompleteTheWorldHeldInPlanning(gate);
  ASSERT_FALSE(HasFailure());

  // Planning is in progress (the hook holds it). Status, heartbeats, the KV
  // store and metrics are answered meanwhile.
  json s = Status();
  EXPECT_EQ(s["phase"], "planning");
  EXPECT_EQ(s["missing"]["trainer"], json::array());
  EXPECT_EQ(s["missing"]["inference"], json::array());
  EXPECT_TRUE(s["plan"].is_null());
  ASSERT_TRUE(client_->Heartbeat(Role::kTrainer, 0).ok());
  ASSERT_TRUE(client_->KvSet("during-planning", "x").ok());
  StatusOr<std::string> kv = client_->KvGet("during-planning", std::chrono::milliseconds(1000));
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  EXPECT_EQ(*kv, "x");
  EXPECT_TRUE(client_->GetMetrics().ok());
  // A plan asked for now is not there yet, and the answer says why.
  StatusOr<json> early = client_->FetchPlan(Role::kTrainer, 0, In(0));
  ASSERT_FALSE(early.ok());
  EXPECT_NE(early.status().message().find("plan being computed"), std::string::npos) << early.status().message();
  // A rank whose agent restarted registers again: answered at once, and the
  // pass in flight plans again with it.
  StatusOr<json> again = client_->RegisterTrainerJson(world_.TrainerBody(1));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)["phase"], "planning");
  EXPECT_EQ(last.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout)
      << "the plan finished while the hook still held it";

  gate.release.set_value();
  StatusOr<json> reply = last.get();
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ((*reply)["phase"], "planned");
  EXPECT_EQ(gate.passes.load(), 2);  // the re-registration made a second pass
  s = Status();
  EXPECT_EQ(s["phase"], "planned");
  EXPECT_GT(s["plan"]["plan_seconds"].get<double>(), 0.0);
  for (int r = 0; r < world_.trainers(); ++r) {
    StatusOr<TrainerPlanSlice> slice = client_->FetchTrainerPlan(r, In(5));
    ASSERT_TRUE(slice.ok()) << slice.status().ToString();
    EXPECT_EQ(slice->plan.rank, r);
  }
}

TEST_F(PlanningTest, BrokenRankRegisteredDuringPlanningIsDroppedByTheNextPass) {
  PlanningGate gate;
  std::future<StatusOr<json>> last = CompleteTheWorldHeldInPlanning(gate);
  ASSERT_FALSE(HasFailure());
  // Trainer rank 1 comes back with a typo only the whole-world loader sees.
  json typo = world_.TrainerBody(1);
  typo["params"][0]["placement"] = typo["params"][0]["placements"];
  ASSERT_TRUE(client_->RegisterTrainerJson(typo).ok());
  gate.release.set_value();

  // The pass plans again, finds rank 1 at fault and drops it, not the
  // registration that completed the world.
  StatusOr<json> reply = last.get();
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  json s = Status();
  EXPECT_EQ(s["phase"], "assembling");
  EXPECT_EQ(s["missing"]["trainer"], json({1}));
  StatusOr<json> plan = client_->FetchPlan(Role::kTrainer, 1, In(5));
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("'placement'"), std::string::npos) << plan.status().message();
  ASSERT_TRUE(client_->RegisterTrainerJson(world_.TrainerBody(1)).ok());
  EXPECT_EQ(Status()["phase"], "planned");
}

// Agents asking for the same slice at once get one build of it, shared: a
// slice is built once per rank however many ask (each build's JSON tree is
// several times its text; see Controller::building_).
TEST_F(PlanningTest, ConcurrentRequestsForOneSliceShareOneBuild) {
  StartServer();
  RegisterAll();
  std::vector<std::future<StatusOr<std::shared_ptr<const std::string>>>> asks;
  for (int i = 0; i < 16; ++i) {
    asks.push_back(std::async(std::launch::async, [this] {
      return controller_->PlanSliceText(Role::kTrainer, 0, std::chrono::seconds(5));
    }));
  }
  std::set<const std::string*> texts;
  for (auto& a : asks) {
    StatusOr<std::shared_ptr<const std::string>> t = a.get();
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    texts.insert(t->get());
  }
  EXPECT_EQ(texts.size(), 1u);
}

// More requests than build slots, for every rank of both roles at once, each
// rank asked several times: each request gets its own rank's slice, and each
// rank's slice is built once (the slots are handed on in turn, and a request
// that queued behind another of its rank takes that one's build).
TEST_F(PlanningTest, RequestsForEveryRankAtOnceEachGetTheirOwnSlice) {
  StartServer();
  RegisterAll();
  struct Ask {
    Role role;
    int32_t rank;
    std::future<StatusOr<std::shared_ptr<const std::string>>> text;
  };
  std::vector<Ask> asks;
  for (int round = 0; round < 8; ++round)
    for (const Role role : {Role::kTrainer, Role::kInference})
      for (int32_t rank = 0; rank < (role == Role::kTrainer ? world_.trainers() : world_.inference_ranks()); ++rank)
        asks.push_back({role, rank, std::async(std::launch::async, [this, role, rank] {
                          return controller_->PlanSliceText(role, rank, std::chrono::seconds(5));
                        })});
  std::map<std::pair<Role, int32_t>, std::set<const std::string*>> texts;
  for (Ask& a : asks) {
    StatusOr<std::shared_ptr<const std::string>> t = a.text.get();
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    const json slice = json::parse(**t);
    EXPECT_EQ(slice["role"], RoleName(a.role));
    EXPECT_EQ(slice["rank"], a.rank);
    texts[{a.role, a.rank}].insert(t->get());
  }
  EXPECT_EQ(texts.size(), static_cast<size_t>(world_.trainers() + world_.inference_ranks()));
  for (const auto& [who, built] : texts) EXPECT_EQ(built.size(), 1u) << RoleName(who.first) << " " << who.second;
}

}  // namespace
}  // namespace wsync::controller::testing
