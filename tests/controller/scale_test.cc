// The controller at the reference scale (issue #11): Kimi-K2 from 256
// trainer ranks to 128 inference ranks, 384 agents (threads here, each with
// its own signed client) registering at once against the real controller
// server over HTTP on loopback, then each asking for its plan slice.
//
// What an operator would notice is asserted: every rank is accepted, every
// rank gets a slice that is its own (role, rank, one plan_id for all) and
// correct (its writes are exactly the planner's writes for it, run directly
// on the same specs; the peers it writes to carry those ranks' own
// descriptors), and the slices together are the whole table. Time is only
// printed: `wsync bench controller` measures it against its limit.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "controller/client.h"
#include "controller/controller.h"
#include "controller/http_server.h"
#include "models/generate.h"
#include "routing/planner.h"

namespace wsync::controller {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A descriptor as long as a real one, unique to (rank, region): a slice that
// carries another rank's memory would show it.
std::string FakeDescriptor(int32_t rank, const std::string& region) {
  std::string d = "scale-test:" + std::to_string(rank) + ":" + region + ":";
  d.resize(160, 'f');
  return d;
}

TEST(ControllerScaleTest, KimiK2_384AgentsRegisterAtOnceAndEachGetsItsOwnSlice) {
  const auto t_gen = Clock::now();
  StatusOr<GeneratedSpecs> specs =
      GenerateFromClusterFile(std::string(WSYNC_SOURCE_DIR) + "/examples/kimi-k2-256x128/cluster.json");
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  for (InferenceRank& r : specs->inference.ranks)
    for (MemoryRegion& m : r.regions) m.descriptor = FakeDescriptor(r.rank, m.id);
  const int32_t trainers = static_cast<int32_t>(specs->trainer.ranks.size());
  const int32_t inference = static_cast<int32_t>(specs->inference.ranks.size());
  ASSERT_EQ(trainers, 256);
  ASSERT_EQ(inference, 128);

  // The expected table: the planner run directly, not through the controller.
  StatusOr<RoutingTable> table = Plan(specs->trainer, specs->inference, specs->mapping);
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  std::vector<uint64_t> want_src_writes(trainers), want_src_bytes(trainers);
  std::vector<uint64_t> want_dst_writes(inference), want_dst_bytes(inference);
  std::vector<std::set<int32_t>> want_peers(trainers);
  for (const WriteOp& op : table->ops) {
    want_src_writes[op.src_rank] += op.planes;  // the writes that land
    want_src_bytes[op.src_rank] += op.bytes;
    want_dst_writes[op.dst_rank] += op.planes;
    want_dst_bytes[op.dst_rank] += op.bytes;
    want_peers[op.src_rank].insert(op.dst_rank);
  }
  std::printf("generated and planned directly in %.2f s: %zu writes\n", Since(t_gen), table->ops.size());

  StatusOr<JobSecret> secret = JobSecret::FromBytes("kimi-k2-scale-test-secret-0123456789abcdef");
  ASSERT_TRUE(secret.ok());
  const std::string state_dir = ::testing::TempDir() + "wsync_scale_test_" + std::to_string(::getpid());
  ControllerOptions o;
  o.trainers = trainers;
  o.inference = inference;
  o.mapping = specs->mapping;
  o.state_dir = state_dir;
  o.world_timeout_s = 600;
  std::string planned_line;
  std::mutex log_mu;
  o.log = [&](const std::string& line) {
    if (line.rfind("world complete", 0) == 0) {
      std::lock_guard<std::mutex> lock(log_mu);
      planned_line = line;
    }
  };
  StatusOr<std::unique_ptr<Controller>> controller = Controller::Create(o);
  ASSERT_TRUE(controller.ok()) << controller.status().ToString();
  ServerOptions so;
  so.secret = *secret;
  so.threads = 2 * (trainers + inference) + 16;  // what `wsync controller` picks
  so.request_timeout_s = 60;
  // 384 agents on one loopback address stand for 48 hosts of 8 GPUs: the
  // cap per source address is for one host's agents, not for all of them.
  so.max_connections_per_address = 1024;
  HttpServer server(controller->get(), so);
  ASSERT_TRUE(server.Start().ok());

  // Every agent: register, then wait for its slice, as the agents do.
  ClientOptions co;
  co.secret = *secret;
  co.retry_for_s = 60;
  co.request_timeout_s = 120;
  const int32_t n = trainers + inference;
  std::vector<Status> registered(n, Status::Ok());
  std::vector<StatusOr<TrainerPlanSlice>> trainer_slices(trainers, Internal("not asked"));
  std::vector<StatusOr<InferencePlanSlice>> inference_slices(inference, Internal("not asked"));
  std::vector<double> done_at(n, 0);
  std::atomic<int> ready{0};
  std::promise<void> go;
  std::shared_future<void> started = go.get_future().share();
  std::vector<std::thread> agents;
  Clock::time_point t0;
  for (int32_t i = 0; i < n; ++i) {
    agents.emplace_back([&, i] {
      ControllerClient client("127.0.0.1", server.port(), co);
      ready.fetch_add(1);
      started.wait();
      const Clock::time_point deadline = Clock::now() + std::chrono::seconds(120);
      if (i < trainers) {
        StatusOr<json> r = client.RegisterTrainer(specs->trainer.ranks[i], specs->trainer.mesh_groups);
        registered[i] = r.status();
        if (r.ok()) trainer_slices[i] = client.FetchTrainerPlan(i, deadline);
      } else {
        const int32_t rank = i - trainers;
        StatusOr<json> r = client.RegisterInference(specs->inference.ranks[rank]);
        registered[i] = r.status();
        if (r.ok()) inference_slices[rank] = client.FetchInferencePlan(rank, deadline);
      }
      done_at[i] = Since(t0);
    });
  }
  while (ready.load() < n) std::this_thread::yield();
  t0 = Clock::now();
  go.set_value();
  for (std::thread& t : agents) t.join();
  const double all_served = Since(t0);

  StatusOr<json> status = ControllerClient("127.0.0.1", server.port(), co).GetStatus();
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  std::printf("384 agents: every slice served %.2f s after the first registration; %s\n", all_served,
              planned_line.c_str());

  // Every rank was accepted and got its own, correct slice.
  for (int32_t i = 0; i < n; ++i) ASSERT_TRUE(registered[i].ok()) << "agent " << i << ": " << registered[i].ToString();
  EXPECT_EQ((*status)["phase"], "planned");
  const std::string plan_id = (*status)["plan"]["plan_id"].get<std::string>();
  ASSERT_FALSE(plan_id.empty());
  std::map<int32_t, const InferenceRank*> inference_by_rank;
  for (const InferenceRank& r : specs->inference.ranks) inference_by_rank[r.rank] = &r;
  uint64_t total_writes = 0;
  for (int32_t r = 0; r < trainers; ++r) {
    const StatusOr<TrainerPlanSlice>& s = trainer_slices[r];
    ASSERT_TRUE(s.ok()) << "trainer rank " << r << ": " << s.status().ToString();
    EXPECT_EQ(s->raw["role"], "trainer") << r;
    EXPECT_EQ(s->raw["rank"], r);
    EXPECT_EQ(s->plan.rank, r);
    EXPECT_EQ(s->plan_id, plan_id) << "trainer rank " << r;
    uint64_t writes = 0, bytes = 0;
    std::set<int32_t> dsts;
    for (const RankMeshGroup& g : s->plan.groups)
      for (const RankSource& src : g.sources)
        for (const RankWrite& w : src.writes) writes += w.planes, bytes += w.bytes, dsts.insert(w.dst_rank);
    EXPECT_EQ(writes, want_src_writes[r]) << "trainer rank " << r;
    EXPECT_EQ(bytes, want_src_bytes[r]) << "trainer rank " << r;
    EXPECT_EQ(dsts, want_peers[r]) << "trainer rank " << r;
    EXPECT_EQ(s->plan.writes, writes) << "trainer rank " << r;
    total_writes += writes;
    // The memory it writes into is each peer's own.
    std::set<int32_t> peer_ranks;
    for (const InferencePeer& p : s->plan.peers) {
      peer_ranks.insert(p.rank);
      const InferenceRank& owner = *inference_by_rank.at(p.rank);
      EXPECT_EQ(p.host, owner.host);
      for (const auto& [region, descriptor] : p.region_descriptors)
        EXPECT_EQ(descriptor, FakeDescriptor(p.rank, region)) << "trainer rank " << r << " -> " << p.rank;
    }
    EXPECT_EQ(peer_ranks, want_peers[r]) << "trainer rank " << r;
  }
  EXPECT_EQ(total_writes, WriteCount(table->ops));  // together, the whole table
  for (int32_t r = 0; r < inference; ++r) {
    const StatusOr<InferencePlanSlice>& s = inference_slices[r];
    ASSERT_TRUE(s.ok()) << "inference rank " << r << ": " << s.status().ToString();
    EXPECT_EQ(s->raw["role"], "inference") << r;
    EXPECT_EQ(s->raw["rank"], r);
    EXPECT_EQ(s->plan.rank, r);
    EXPECT_EQ(s->plan_id, plan_id) << "inference rank " << r;
    EXPECT_EQ(s->expected_writes, want_dst_writes[r]) << "inference rank " << r;
    EXPECT_EQ(s->expected_bytes, want_dst_bytes[r]) << "inference rank " << r;
    EXPECT_EQ(WriteCount(s->plan), want_dst_writes[r]) << "inference rank " << r;
  }
  server.Stop();
  std::filesystem::remove_all(state_dir);
}

}  // namespace
}  // namespace wsync::controller
