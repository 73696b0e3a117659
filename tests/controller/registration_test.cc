// Registration, world assembly and plan slices over real HTTP.
#include <algorithm>
#include <thread>
#include <tuple>

#include "controller_fixture.h"
#include "routing/planner.h"

namespace wsync::controller::testing {
namespace {

TEST_F(ControllerTest, SmallWorldAssemblesAndPlans) {
  StartServer();
  ASSERT_TRUE(client_->Healthy());
  StatusOr<json> first = client_->RegisterTrainerJson(world_.TrainerBody(0));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ((*first)["phase"], "assembling");

  json s = Status();
  EXPECT_EQ(s["phase"], "assembling");
  EXPECT_EQ(s["missing"]["trainer"], json({1}));
  EXPECT_EQ(s["missing"]["inference"], json({0, 1}));

  // Asking for the plan early names who is missing.
  StatusOr<json> early = client_->FetchPlan(Role::kTrainer, 0, In(0.2));
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(early.status().message().find("missing trainer ranks [1], inference ranks [0,1]"), std::string::npos)
      << early.status().message();

  RegisterAll();
  s = Status();
  EXPECT_EQ(s["phase"], "planned");
  EXPECT_EQ(s["missing"]["trainer"], json::array());
  EXPECT_GT(s["plan"]["ops"].get<int>(), 0);
  EXPECT_GT(s["plan"]["wire_bytes"].get<uint64_t>(), 0u);
}

TEST_F(ControllerTest, PlanWaitsForTheLastRegistration) {
  StartServer();
  for (int r = 0; r < world_.trainers(); ++r) ASSERT_TRUE(client_->RegisterTrainerJson(world_.TrainerBody(r)).ok());
  ASSERT_TRUE(client_->RegisterInferenceJson(world_.InferenceBody(0)).ok());
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ControllerClient other("127.0.0.1", server_->port());
    EXPECT_TRUE(other.RegisterInferenceJson(world_.InferenceBody(1)).ok());
  });
  StatusOr<TrainerPlanSlice> slice = client_->FetchTrainerPlan(1, In(10));
  late.join();
  ASSERT_TRUE(slice.ok()) << slice.status().ToString();
  EXPECT_EQ(slice->plan.rank, 1);
  EXPECT_FALSE(slice->plan_id.empty());
}

TEST_F(ControllerTest, MissingRankIsNamedAfterTheWorldTimeout) {
  ControllerOptions o = Options();
  // The clock runs from Create: starting the server and three registrations
  // must fit in it (0.3 s did not under TSan, and the log then named every rank).
  o.world_timeout_s = 1.0;
  StartServer(o);
  ASSERT_TRUE(client_->RegisterTrainerJson(world_.TrainerBody(0)).ok());
  ASSERT_TRUE(client_->RegisterInferenceJson(world_.InferenceBody(0)).ok());
  ASSERT_TRUE(client_->RegisterInferenceJson(world_.InferenceBody(1)).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1300));

  json s = Status();
  EXPECT_EQ(s["phase"], "failed_to_assemble");
  EXPECT_EQ(s["missing"]["trainer"], json({1}));
  EXPECT_EQ(s["missing"]["inference"], json::array());
  StatusOr<json> plan = client_->FetchPlan(Role::kInference, 0, In(0));
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("missing trainer ranks [1]"), std::string::npos) << plan.status().message();
  StatusOr<std::string> metrics = client_->GetMetrics();
  ASSERT_TRUE(metrics.ok());
  EXPECT_NE(metrics->find("wsync_world_assembly_failed 1\n"), std::string::npos) << *metrics;
  {
    std::lock_guard<std::mutex> lock(log_mu_);
    EXPECT_TRUE(std::any_of(log_.begin(), log_.end(), [](const std::string& l) {
      return l.find("failed to assemble") != std::string::npos && l.find("trainer ranks [1]") != std::string::npos;
    }));
  }
  // A late rank still completes the world.
  ASSERT_TRUE(client_->RegisterTrainerJson(world_.TrainerBody(1)).ok());
  EXPECT_EQ(Status()["phase"], "planned");
}

TEST_F(ControllerTest, MismatchedTensorIsRejectedNamingRankAndTensor) {
  StartServer();
  ASSERT_TRUE(client_->RegisterTrainerJson(world_.TrainerBody(0)).ok());
  json bad = world_.TrainerBody(1);
  for (json& p : bad["params"])
    if (p["name"] == "model.norm.weight") p["global_shape"] = {16};
  StatusOr<json> reply = client_->RegisterTrainerJson(bad);
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), StatusCode::kInvalidArgument);  // HTTP 400
  const std::string& msg = reply.status().message();
  EXPECT_NE(msg.find("trainer rank 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.norm.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("global_shape"), std::string::npos) << msg;

  json s = Status();
  ASSERT_EQ(s["errors"].size(), 1u);
  EXPECT_EQ(s["errors"][0]["rank"], 1);
  EXPECT_EQ(s["errors"][0]["error"], msg);
  EXPECT_EQ(s["registered"]["trainer"], json({0}));  // nothing half-registered

  // A local shard that does not match its placement is caught on arrival too.
  json shard = world_.TrainerBody(1);
  for (json& p : shard["params"])
    if (p["name"] == "model.layers.0.self_attn.q_proj.weight") p["local_offset"] = {0, 0};
  reply = client_->RegisterTrainerJson(shard);
  ASSERT_FALSE(reply.ok());
  EXPECT_NE(reply.status().message().find("q_proj.weight"), std::string::npos) << reply.status().message();
  EXPECT_NE(reply.status().message().find("local_offset"), std::string::npos) << reply.status().message();

  // The corrected rank is accepted.
  EXPECT_TRUE(client_->RegisterTrainerJson(world_.TrainerBody(1)).ok());
}

TEST_F(ControllerTest, WorldThatDoesNotPlanRejectsTheLastRegistration) {
  StartServer();
  for (int r = 0; r < world_.trainers(); ++r) ASSERT_TRUE(client_->RegisterTrainerJson(world_.TrainerBody(r)).ok());
  ASSERT_TRUE(client_->RegisterInferenceJson(world_.InferenceBody(0)).ok());
  // Replica 1 claims a norm of 9 elements: the routing library must refuse
  // it, naming the tensor, and the world must stay unplanned.
  json bad = world_.InferenceBody(1);
  for (json& t : bad["tensors"])
    if (t["name"] == "model.norm.weight") t["shape"] = {9};
  StatusOr<json> reply = client_->RegisterInferenceJson(bad);
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(reply.status().message().find("model.norm.weight"), std::string::npos) << reply.status().message();
  json s = Status();
  EXPECT_EQ(s["phase"], "assembling");
  EXPECT_EQ(s["missing"]["inference"], json({1}));
  EXPECT_EQ(s["assembly_error"], reply.status().message());

  ASSERT_TRUE(client_->RegisterInferenceJson(world_.InferenceBody(1)).ok());
  EXPECT_EQ(Status()["phase"], "planned");
}

TEST_F(ControllerTest, BrokenRankFoundAtAssemblyIsDroppedNotTheLastOne) {
  StartServer();
  ASSERT_TRUE(client_->RegisterTrainerJson(world_.TrainerBody(0)).ok());
  // A typo only the strict loader catches, and only on the whole world.
  json typo = world_.TrainerBody(1);
  typo["params"][0]["placement"] = typo["params"][0]["placements"];
  ASSERT_TRUE(client_->RegisterTrainerJson(typo).ok());
  ASSERT_TRUE(client_->RegisterInferenceJson(world_.InferenceBody(0)).ok());
  // The last registration is fine: it is accepted, the typo rank dropped.
  StatusOr<json> last = client_->RegisterInferenceJson(world_.InferenceBody(1));
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  json s = Status();
  EXPECT_EQ(s["phase"], "assembling");
  EXPECT_EQ(s["missing"]["trainer"], json({1}));
  EXPECT_NE(s["assembly_error"].get<std::string>().find("rank 1"), std::string::npos) << s;

  // The agent at fault hears it when it asks for its plan, at once.
  StatusOr<json> plan = client_->FetchPlan(Role::kTrainer, 1, In(10));
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("'placement'"), std::string::npos) << plan.status().message();

  ASSERT_TRUE(client_->RegisterTrainerJson(world_.TrainerBody(1)).ok());
  EXPECT_EQ(Status()["phase"], "planned");
}

TEST_F(ControllerTest, InferenceRankIsValidatedOnArrival) {
  StartServer();
  json bad = world_.InferenceBody(1);
  for (json& t : bad["tensors"])
    if (t["name"] == "model.norm.weight") t["dtype"] = "fp8_e4m3";
  StatusOr<json> reply = client_->RegisterInferenceJson(bad);
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(reply.status().message().find("inference registrations: rank 1: tensor 'model.norm.weight'"),
            std::string::npos)
      << reply.status().message();
  EXPECT_EQ(Status()["registered"]["inference"], json::array());
}

TEST_F(ControllerTest, RankOutsideTheWorldIsRejected) {
  StartServer();
  json body = world_.TrainerBody(0);
  body["rank"] = 7;
  StatusOr<json> reply = client_->RegisterTrainerJson(body);
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(reply.status().message().find("rank 7 is outside 0..1"), std::string::npos) << reply.status().message();
}

// A write as the receiver sees it: where its bytes land.
using Landing = std::tuple<int32_t, int, std::string, uint64_t, uint64_t>;

TEST_F(ControllerTest, TrainerSlicesPartitionTheFullTable) {
  StartServer();
  RegisterAll();

  // The expected table comes from the planner run directly on the files,
  // not through the controller.
  StatusOr<TrainerSpec> trainer = ParseTrainerSpec(world_.trainer, "trainer");
  StatusOr<InferenceSpec> inference = ParseInferenceSpec(world_.inference, "inference");
  ASSERT_TRUE(trainer.ok() && inference.ok());
  StatusOr<RoutingTable> table = Plan(*trainer, *inference, world_.mapping);
  ASSERT_TRUE(table.ok()) << table.status().ToString();

  size_t total = 0;
  for (int r = 0; r < world_.trainers(); ++r) {
    std::vector<Landing> want;
    for (const WriteOp& op : table->ops) {
      if (op.src_rank != r) continue;
      const DestTensor& d = table->destinations[op.dst];
      const bool scale = op.kind == WriteKind::kScale;
      want.emplace_back(op.dst_rank, static_cast<int>(op.kind), scale ? d.scale_where.region : d.where.region,
                        (scale ? d.scale_where.offset : d.where.offset) + op.dst_offset, op.bytes);
    }
    StatusOr<TrainerPlanSlice> slice = client_->FetchTrainerPlan(r, In(5));
    ASSERT_TRUE(slice.ok()) << slice.status().ToString();
    std::vector<Landing> got;
    for (const RankMeshGroup& g : slice->plan.groups)
      for (const RankSource& s : g.sources)
        for (const RankWrite& w : s.writes)
          got.emplace_back(w.dst_rank, static_cast<int>(w.kind), w.region, w.region_offset, w.bytes);
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, want) << "trainer rank " << r;
    EXPECT_FALSE(want.empty()) << "trainer rank " << r << " writes nothing; the test proves little";
    total += got.size();
  }
  EXPECT_EQ(total, table->ops.size());  // the union is the whole table

  for (int r = 0; r < world_.inference_ranks(); ++r) {
    uint64_t writes = 0, bytes = 0;
    for (const WriteOp& op : table->ops)
      if (op.dst_rank == r) writes += 1, bytes += op.bytes;
    StatusOr<InferencePlanSlice> slice = client_->FetchInferencePlan(r, In(5));
    ASSERT_TRUE(slice.ok()) << slice.status().ToString();
    EXPECT_EQ(slice->expected_writes, writes);
    EXPECT_EQ(slice->expected_bytes, bytes);
    // Every byte of the replica is written exactly once per version.
    uint64_t dest_bytes = 0;
    for (const DestTensor& d : table->destinations)
      if (d.rank == r) dest_bytes += d.bytes + (d.has_scale ? d.scale_bytes : 0);
    EXPECT_EQ(bytes, dest_bytes);
  }
}

// A refused registration names the problem, not the payload: a 4 MB
// unknown key used to come back whole in the 400, in stderr and in the
// status' error list (#29).
TEST_F(ControllerTest, ARefusedRegistrationQuotesAnExcerptOfItsBody) {
  StartServer();
  json body = world_.InferenceBody(0);
  body[std::string(4 << 20, 'K')] = 1;
  StatusOr<json> reply = client_->RegisterInferenceJson(body);
  ASSERT_FALSE(reply.ok());
  EXPECT_NE(reply.status().message().find("unknown key"), std::string::npos) << reply.status().message().substr(0, 200);
  EXPECT_LT(reply.status().message().size(), 2048u);
  json s = Status();
  ASSERT_FALSE(s["errors"].empty());
  EXPECT_LT(s.dump().size(), 16384u) << "the error list keeps an excerpt";
  std::lock_guard<std::mutex> lock(log_mu_);
  for (const std::string& line : log_) EXPECT_LT(line.size(), 2048u);
}

}  // namespace
}  // namespace wsync::controller::testing
