// Stage times of the executor on the ~1 GB demo model (examples/demo-moe-4x2:
// 4 trainer ranks, fsdp 2 x ep 2, to 2 fp8 inference ranks at TP 2), ranks as
// threads over shm. Not a check (a figure, measured on whatever CPU runs it):
// disabled by default, run with
//   [WSYNC_DEMO_WATERMARK_MIB=96] trainer_agent_test --gtest_also_run_disabled_tests --gtest_filter='*DemoMoe*'
// The only assertions: every version succeeds, every planned byte is written,
// temporary memory stays under the watermark.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include "models/generate.h"
#include "pipeline/collectives.h"
#include "pipeline/executor.h"
#include "routing/planner.h"
#include "routing/rank_plan.h"
#include "trainer_agent/shard_export.h"
#include "transport/libfabric/libfabric_engine.h"

namespace wsync {
namespace {

using std::chrono::milliseconds;

std::string Hex(const std::string& raw) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

transport::fabric::LibfabricOptions Fabric() {
  transport::fabric::LibfabricOptions o;
  o.provider = "shm";
  o.num_nics = 1;
  return o;
}

TEST(DemoMoeTiming, DISABLED_StageTimesPerRank) {
  const char* cluster = std::getenv("WSYNC_DEMO_CLUSTER");
  StatusOr<GeneratedSpecs> gen =
      GenerateFromClusterFile(cluster ? cluster : WSYNC_SOURCE_DIR "/examples/demo-moe-4x2/cluster.json");
  ASSERT_TRUE(gen.ok()) << gen.status().ToString();
  const int trainers = static_cast<int>(gen->trainer.ranks.size());

  // Receivers: every inference region registered with its own engine.
  std::vector<std::unique_ptr<transport::Engine>> receiver_engines;
  std::vector<std::vector<uint8_t>> receiver_memory;
  std::vector<std::unique_ptr<transport::MemoryRegion>> receiver_regions;
  for (InferenceRank& r : gen->inference.ranks) {
    auto engine = transport::fabric::CreateLibfabricEngine(Fabric());
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    for (MemoryRegion& region : r.regions) {
      receiver_memory.emplace_back(region.size);
      auto mr = (*engine)->Register(receiver_memory.back().data(), region.size);
      ASSERT_TRUE(mr.ok()) << mr.status().ToString();
      region.descriptor = Hex((*mr)->descriptor().Serialize());
      receiver_regions.push_back(std::move(mr).value());
    }
    receiver_engines.push_back(std::move(engine).value());
  }
  StatusOr<RoutingTable> table = Plan(gen->trainer, gen->inference, gen->mapping);
  ASSERT_TRUE(table.ok()) << table.status().ToString();

  // Trainer side: one shard export per rank, filled with finite bf16 values.
  std::vector<std::unique_ptr<trainer_agent::ShardExport>> exports;
  std::vector<std::unique_ptr<trainer_agent::ShardView>> views;
  uint64_t shard_bytes = 0;
  for (int r = 0; r < trainers; ++r) {
    const std::string name = "/wsync-test-demo-" + std::to_string(getpid()) + "-" + std::to_string(r);
    auto e = trainer_agent::ShardExport::Create(name, gen->trainer.ranks[r]);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    for (const TrainerParam& p : gen->trainer.ranks[r].params) {
      auto t = (*e)->Tensor(p.name);
      auto* bits = static_cast<uint16_t*>(t->data);
      for (uint64_t i = 0; i < t->bytes / 2; ++i) bits[i] = static_cast<uint16_t>(0x3C00 + (i * 2654435761u >> 20) % 0x700);
      shard_bytes += t->bytes;
    }
    auto v = trainer_agent::ShardView::Open(name, gen->trainer.ranks[r]);
    ASSERT_TRUE(v.ok());
    exports.push_back(std::move(e).value());
    views.push_back(std::move(v).value());
  }

  auto store = MakeInMemoryRendezvousStore();
  std::vector<std::unique_ptr<transport::Engine>> engines;
  std::vector<std::unique_ptr<GroupFactory>> groups;
  std::vector<std::unique_ptr<PlanExecutor>> executors;
  uint64_t plan_bytes = 0;
  const char* wm = std::getenv("WSYNC_DEMO_WATERMARK_MIB");
  const uint64_t watermark = (wm ? std::strtoull(wm, nullptr, 10) : 256ull) << 20;
  for (int r = 0; r < trainers; ++r) {
    auto plan = ExtractTrainerRankPlan(*table, gen->trainer, gen->inference, r);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    plan_bytes += plan->write_bytes;
    auto engine = transport::fabric::CreateLibfabricEngine(Fabric());
    ASSERT_TRUE(engine.ok());
    ExecutorOptions o;
    o.watermark_bytes = watermark;
    GlooGroupOptions gloo;
    gloo.timeout = milliseconds(120000);
    groups.push_back(MakeGlooGroupFactory(store.get(), gloo));
    auto ex = PlanExecutor::Create(std::move(plan).value(), engine->get(), groups.back().get(), o);
    ASSERT_TRUE(ex.ok()) << ex.status().ToString();
    engines.push_back(std::move(engine).value());
    executors.push_back(std::move(ex).value());
  }
  std::fprintf(stderr, "demo: %d trainer ranks, %.1f MiB of shards, %.1f MiB written per version, watermark %.0f MiB\n",
               trainers, shard_bytes / 1048576.0, plan_bytes / 1048576.0, watermark / 1048576.0);

  for (uint64_t v = 1; v <= 2; ++v) {
    for (auto& e : exports) ASSERT_TRUE(e->Publish(v).ok());
    std::vector<std::optional<StatusOr<VersionReport>>> out(trainers);
    std::vector<std::thread> threads;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < trainers; ++r) {
      threads.emplace_back([&, r] { out[r].emplace(executors[r]->Run(v, *views[r])); });
    }
    for (auto& t : threads) t.join();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    uint64_t written = 0;
    for (int r = 0; r < trainers; ++r) {
      ASSERT_TRUE(out[r]->ok()) << out[r]->status().ToString();
      const VersionReport& rep = **out[r];
      written += rep.written_bytes;
      EXPECT_LE(rep.peak_temp_bytes, watermark);
      std::fprintf(stderr, "  rank %d %s\n", r, rep.Summary().c_str());
    }
    EXPECT_EQ(written, plan_bytes);
    std::fprintf(stderr, "demo version %llu: %.3f s wall for %.1f MiB (%.2f GB/s)\n",
                 static_cast<unsigned long long>(v), wall, written / 1048576.0, written / wall / 1e9);
  }
  executors.clear();
  engines.clear();
  receiver_regions.clear();
}

}  // namespace
}  // namespace wsync
