// Whole deployments from real processes (controller, trainer agents,
// inference agents, libfabric shm on loopback) put through what a user of
// wsync would run into: updates in a row, a trainer agent killed mid-update,
// a missing inference agent, mismatched metadata, a controller restart and a
// small memory watermark. Every complete version is checked bit for bit
// against demo::Reference; a version that did not land must never be called
// complete, by the controller or in the engine's version word.
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "demo/local_sync.h"
#include "inference_agent/engine_view.h"
#include "routing/rank_plan.h"
#include "tests/sanitizer_slowdown.h"

namespace wsync::demo {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

const std::string kCluster = std::string(WSYNC_SOURCE_DIR) + "/examples/small-moe-fp8-4x2/cluster.json";

LocalSyncOptions Options(const std::string& test) {
  LocalSyncOptions o;
  o.binary = WSYNC_BINARY;
  o.cluster = kCluster;
  o.job = "it" + std::to_string(getpid()) + test;
  o.work_dir = (fs::temp_directory_path() / ("wsync-" + o.job)).string();
  o.version_timeout_s = 30 * testing::kSanitizerSlowdown;
  o.gloo_timeout_s = 5 * testing::kSanitizerSlowdown;
  o.heartbeat_timeout_s = 3 * testing::kSanitizerSlowdown;
  return o;
}

std::unique_ptr<LocalSync> StartOrDie(const LocalSyncOptions& o) {
  StatusOr<std::unique_ptr<LocalSync>> s = LocalSync::Start(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(*s) : nullptr;
}

uint64_t EngineVersion(LocalSync& s, int32_t rank) {
  StatusOr<inference::EngineView> view = inference::EngineView::Open(s.InferenceShmName(rank));
  return view.ok() ? view->complete_version() : ~0ull;
}

void ExpectCompleteAndVerified(LocalSync& s, uint64_t version) {
  StatusOr<UpdateReport> r = s.Update(version);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->state, "complete") << r->failure;

  Status v = s.Verify(version, &*r);
  ASSERT_TRUE(v.ok()) << v.ToString();
  EXPECT_EQ(r->verified_bytes, r->wire_bytes) << "every byte written is a byte checked";
}

std::string TrainerLogText(LocalSync& s, int32_t rank) {
  std::ifstream in(s.TrainerLog(rank));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(SyncScenarios, ThreeUpdatesInARowLandBitForBit) {
  auto s = StartOrDie(Options("three"));
  ASSERT_NE(s, nullptr);
  for (uint64_t v = 1; v <= 3; ++v) ExpectCompleteAndVerified(*s, v);
  // The weights really changed between versions: version 2's bytes are not
  // version 3's (the reference for 2 no longer matches).
  EXPECT_FALSE(s->Verify(2, nullptr).ok());
}

// Verification stays honest however fast it is: one wrong bit anywhere (a
// weight's first byte, another rank's last byte, an fp8 block scale) fails
// it, naming the rank, the tensor and the byte; put back, it passes again.
TEST(SyncScenarios, VerificationCatchesASingleWrongByte) {
  auto s = StartOrDie(Options("wrongbyte"));
  ASSERT_NE(s, nullptr);
  ExpectCompleteAndVerified(*s, 1);
  struct Spot {
    int32_t rank;
    std::string tensor;
    uint64_t byte;
  };
  std::vector<Spot> spots;
  {
    StatusOr<inference::EngineView> v0 = inference::EngineView::Open(s->InferenceShmName(0));
    StatusOr<inference::EngineView> v1 = inference::EngineView::Open(s->InferenceShmName(1));
    ASSERT_TRUE(v0.ok() && v1.ok());
    const inference::EngineTensor& first = v0->tensors().front();
    const inference::EngineTensor& last = v1->tensors().back();
    spots.push_back({0, first.name, 0});
    spots.push_back({1, last.name, last.bytes - 1});
    for (const inference::EngineTensor& t : v1->tensors()) {
      if (t.name.find("_scale_inv") != std::string::npos && t.bytes > 8) {
        spots.push_back({1, t.name, t.bytes / 2});
        break;
      }
    }
    ASSERT_EQ(spots.size(), 3u) << "the small fp8 model has block scales";
  }
  for (const Spot& spot : spots) {
    StatusOr<inference::EngineView> view = inference::EngineView::Open(s->InferenceShmName(spot.rank), true);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    const inference::EngineTensor* t = view->Find(spot.tensor);
    ASSERT_NE(t, nullptr);
    t->data[spot.byte] ^= 0x01;
    Status bad = s->Verify(1, nullptr);
    EXPECT_FALSE(bad.ok()) << "a flipped bit in rank " << spot.rank << " '" << spot.tensor << "' byte " << spot.byte;
    EXPECT_NE(bad.message().find("inference rank " + std::to_string(spot.rank) + ": tensor '" + spot.tensor +
                                 "' differs from the reference at byte " + std::to_string(spot.byte) + " "),
              std::string::npos)
        << bad.message();
    t->data[spot.byte] ^= 0x01;
    Status good = s->Verify(1, nullptr);
    EXPECT_TRUE(good.ok()) << good.ToString();
  }
}

// The integrity check end to end: trainers hash every write they post
// (--checksums), and each inference agent compares what landed with that
// before the version is complete there (--verify-checksums). Versions still
// complete, bit for bit, and each rank says it checked them.
TEST(SyncScenarios, InferenceAgentsVerifyTheTrainersChecksumsBeforeAVersionIsComplete) {
  LocalSyncOptions o = Options("checksums");
  o.extra_trainer_args = {"--checksums"};
  o.extra_inference_args = {"--verify-checksums"};
  auto s = StartOrDie(o);
  ASSERT_NE(s, nullptr);
  for (uint64_t v = 1; v <= 2; ++v) ExpectCompleteAndVerified(*s, v);
  for (int32_t rank = 0; rank < 2; ++rank) {
    std::ifstream in(s->InferenceLog(rank));
    const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (uint64_t v = 1; v <= 2; ++v) {
      const std::string version = "version " + std::to_string(v) + ": ";
      const size_t held = log.find(version + "every write landed");
      EXPECT_NE(held, std::string::npos) << log;
      EXPECT_NE(log.find("; held until checked", held), std::string::npos) << log;
      EXPECT_TRUE(std::regex_search(log, std::regex(version + "[1-9][0-9]* checksums verified in ")))
          << "rank " << rank << " did not check version " << v << ":\n" << log;
    }
  }
}

TEST(SyncScenarios, KilledTrainerAgentFailsItsVersionNamingItAndARestartRecovers) {
  auto s = StartOrDie(Options("kill"));
  ASSERT_NE(s, nullptr);
  ExpectCompleteAndVerified(*s, 1);

  ASSERT_TRUE(s->FillShards(2).ok());
  s->KillTrainerAgent(1, SIGKILL);  // dies with version 2 about to run
  ASSERT_TRUE(s->Publish(2).ok());
  StatusOr<controller::VersionStatus> v2 = s->WaitVersion(2, 60);
  ASSERT_TRUE(v2.ok()) << v2.status().ToString();
  EXPECT_EQ(v2->state, "failed");
  // Its peers fail the version at once ("lost a peer"); the controller names
  // the dead rank once its heartbeats stop (3 s here, 4x that under sanitizers).
  bool names_rank_1 = false;
  for (int i = 0; i < 100 * testing::kSanitizerSlowdown && !names_rank_1; ++i) {
    for (const auto& f : v2->failures) names_rank_1 |= f.role == "trainer" && f.rank == 1;
    if (names_rank_1) break;
    std::this_thread::sleep_for(milliseconds(100));
    StatusOr<controller::VersionStatus> again = s->client().GetVersion(2);
    if (again.ok()) v2 = again;
  }
  EXPECT_TRUE(names_rank_1) << v2->raw.dump();
  EXPECT_EQ(v2->state, "failed") << "a failed version stays failed";
  // The engine never saw version 2 as complete.
  EXPECT_EQ(EngineVersion(*s, 0), 1u);
  EXPECT_EQ(EngineVersion(*s, 1), 1u);

  ASSERT_TRUE(s->StartTrainerAgent(1).ok());
  ASSERT_TRUE(s->trainer_agent(1).WaitForLine("ready", std::chrono::seconds(60)).ok());
  ExpectCompleteAndVerified(*s, 3);
}

TEST(SyncScenarios, MissingInferenceAgentIsNamedAndNothingIsWritten) {
  LocalSyncOptions o = Options("missing");
  o.absent_inference = {1};
  o.world_timeout_s = 2;
  o.wait_ready = false;
  auto s = StartOrDie(o);
  ASSERT_NE(s, nullptr);
  nlohmann::json status;
  for (int i = 0; i < 100; ++i) {
    StatusOr<nlohmann::json> st = s->client().GetStatus();
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    status = *st;
    // Agents that start late (slow machines, sanitizers: inference agent 0
    // once missed the 2 s under TSan) still register after the timeout;
    // what must stay missing is inference 1.
    if (status.value("phase", "") == "failed_to_assemble" && status["missing"]["trainer"].empty() &&
        status["missing"]["inference"] == nlohmann::json::array({1})) {
      break;
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_EQ(status["phase"], "failed_to_assemble") << status.dump();
  EXPECT_EQ(status["missing"]["inference"], nlohmann::json::array({1})) << status.dump();
  EXPECT_EQ(status["missing"]["trainer"], nlohmann::json::array()) << status.dump();
  EXPECT_TRUE(status["plan"].is_null());
  // The present inference rank's weights were never written or announced.
  EXPECT_EQ(EngineVersion(*s, 0), inference::kNoVersion);
}

TEST(SyncScenarios, MismatchedMetadataIsOneClearErrorAndNothingIsWritten) {
  LocalSyncOptions o = Options("mismatch");
  // Trainer rank 2 believes in a model with another expert width.
  const fs::path dir = fs::path(o.work_dir) / "other";
  fs::create_directories(dir);
  nlohmann::json model = nlohmann::json::parse(std::ifstream(std::string(WSYNC_SOURCE_DIR) + "/configs/models/small-moe.json"));
  model["moe_intermediate_size"] = 384;
  std::ofstream(dir / "model.json") << model.dump();
  nlohmann::json cluster = nlohmann::json::parse(std::ifstream(kCluster));
  cluster["model"] = (dir / "model.json").string();
  cluster["mapping"] = std::string(WSYNC_SOURCE_DIR) + "/configs/mappings/qwen3_moe.json";
  std::ofstream(dir / "cluster.json") << cluster.dump();
  o.trainer_cluster[2] = (dir / "cluster.json").string();
  o.wait_ready = false;
  auto s = StartOrDie(o);
  ASSERT_NE(s, nullptr);

  // Rank 2's agent exits non-zero, its last log line naming the problem.
  StatusOr<int> code = s->trainer_agent(2).Wait(std::chrono::seconds(60));
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_NE(*code, 0);
  const std::string log = s->trainer_agent(2).LogTail(2000);
  EXPECT_NE(log.find("error"), std::string::npos) << log;
  EXPECT_NE(log.find("mlp.experts"), std::string::npos) << "the error names the tensor: " << log;
  // The controller never planned, so nothing was written anywhere.
  StatusOr<nlohmann::json> st = s->client().GetStatus();
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE((*st)["plan"].is_null()) << st->dump();
  EXPECT_EQ(EngineVersion(*s, 0), inference::kNoVersion);
  EXPECT_EQ(EngineVersion(*s, 1), inference::kNoVersion);
}

TEST(SyncScenarios, RestartedInferenceAgentRegistersAgainAndTheNextVersionCompletes) {
  auto s = StartOrDie(Options("reregister"));
  ASSERT_NE(s, nullptr);
  ExpectCompleteAndVerified(*s, 1);
  StatusOr<nlohmann::json> before = s->client().GetStatus();
  ASSERT_TRUE(before.ok());
  EXPECT_EQ((*before)["plan"]["epoch"], 1);

  // A new agent process over the same weight store: the same layout in a
  // new registration (new endpoint, new keys), after the plan exists.
  s->KillInferenceAgent(1, SIGKILL);
  ASSERT_TRUE(s->StartInferenceAgent(1, /*attach=*/true).ok());
  ASSERT_TRUE(s->inference_agent(1).WaitForLine("ready", std::chrono::seconds(60)).ok());
  StatusOr<nlohmann::json> after = s->client().GetStatus();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ((*after)["plan"]["epoch"], 2);
  EXPECT_EQ((*after)["plan"]["plan_id"], (*before)["plan"]["plan_id"]);

  // The trainer agents hold the old descriptors: their start of version 2
  // is refused, they fetch the new slice, re-import and write into the new
  // registration; every byte is checked.
  ExpectCompleteAndVerified(*s, 2);
  for (int32_t r = 0; r < static_cast<int32_t>(s->specs().trainer.ranks.size()); ++r) {
    const std::string log = TrainerLogText(*s, r);
    EXPECT_NE(log.find("re-imported the plan of epoch 2"), std::string::npos) << s->TrainerLog(r) << ":\n" << log;
  }
  ExpectCompleteAndVerified(*s, 3);
}

// Trainers writing into an inference agent that died: the version fails,
// every trainer rank leaves it (today when its own writes time out, the
// engine's 30 s; the controller knows within its heartbeat timeout), and
// once the agent is back the next version completes. Without the engine
// replacement that version stalled (libfabric's shm, once writes to a dead
// peer were outstanding, completed no later write to anyone: 45 of 69
// arrivals on both ranks, the live one too).
TEST(SyncScenarios, WritersToAKilledInferenceAgentFailTheVersionAndTheNextCompletesOnceItIsBack) {
  auto s = StartOrDie(Options("killinf"));
  ASSERT_NE(s, nullptr);
  ExpectCompleteAndVerified(*s, 1);

  s->KillInferenceAgent(1, SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<UpdateReport> r2 = s->Update(2);
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(r2->state, "failed");
  const double failed_after = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Rank 0 may be ahead of the controller, but only with whole bytes
  // (docs/CONTROL_PLANE.md): it claims version 2 only if every write of it
  // landed there; rank 1 never does.
  const uint64_t rank0 = EngineVersion(*s, 0);
  EXPECT_TRUE(rank0 == 1u || rank0 == 2u) << rank0;
  if (rank0 == 2u) {
    Status whole = s->Verify(2, nullptr, /*only_rank=*/0);
    EXPECT_TRUE(whole.ok()) << "rank 0 claims version 2 with bytes it lacks: " << whole.ToString();
  }

  // Every trainer rank has left version 2 (its log says how).
  auto left = [&] {
    int n = 0;
    for (int32_t r = 0; r < static_cast<int32_t>(s->specs().trainer.ranks.size()); ++r) {
      const std::string log = TrainerLogText(*s, r);
      n += log.find("version 2 failed") != std::string::npos || log.find("version 2 skipped") != std::string::npos;
    }
    return n == static_cast<int>(s->specs().trainer.ranks.size());
  };
  bool all_reported = false;
  for (int i = 0; i < 1800 && !(all_reported = left()); ++i) std::this_thread::sleep_for(milliseconds(100));
  const double reported_after = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("version 2 failed after %.1f s; every trainer rank reported after %.1f s\n", failed_after,
              reported_after);
  EXPECT_TRUE(all_reported) << "a trainer rank is still in version 2 after " << reported_after << " s";

  ASSERT_TRUE(s->StartInferenceAgent(1, /*attach=*/true).ok());
  ASSERT_TRUE(s->inference_agent(1).WaitForLine("ready", std::chrono::seconds(60)).ok());
  ExpectCompleteAndVerified(*s, 3);
  for (int32_t r = 0; r < static_cast<int32_t>(s->specs().trainer.ranks.size()); ++r) {
    const std::string log = TrainerLogText(*s, r);
    EXPECT_NE(log.find("replaced the transport engine"), std::string::npos) << s->TrainerLog(r) << ":\n" << log;
  }
}

// Shadow mode (--shadow): the same failure leaves the live rank's weights
// exactly at the last complete version, whatever of version 2 reached it,
// and the engine's word stays there; versions that complete are copied out
// into the store and land bit for bit, before and after.
TEST(SyncScenarios, InShadowModeAFailedVersionLeavesTheLastCompleteOneIntact) {
  LocalSyncOptions o = Options("shadow");
  o.extra_inference_args = {"--shadow"};
  auto s = StartOrDie(o);
  ASSERT_NE(s, nullptr);
  ExpectCompleteAndVerified(*s, 1);

  s->KillInferenceAgent(1, SIGKILL);
  StatusOr<UpdateReport> r2 = s->Update(2);
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(r2->state, "failed");
  // Rank 0 heard that version 2 failed (it leaves it within its deadline).
  for (int i = 0; i < 300; ++i) {
    std::ifstream in(s->InferenceLog(0));
    const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (log.find("version 2: not complete") != std::string::npos ||
        log.find("version 2 failed") != std::string::npos || log.find("version 2 is already failed") != std::string::npos)
      break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_EQ(EngineVersion(*s, 0), 1u);
  Status intact = s->Verify(1, nullptr, /*only_rank=*/0);
  EXPECT_TRUE(intact.ok()) << "rank 0's weights are not version 1 any more: " << intact.ToString();

  ASSERT_TRUE(s->StartInferenceAgent(1, /*attach=*/true).ok());
  ASSERT_TRUE(s->inference_agent(1).WaitForLine("ready", std::chrono::seconds(60)).ok());
  ExpectCompleteAndVerified(*s, 3);
  std::ifstream in(s->InferenceLog(0));
  const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(log.find("version 3: complete ("), std::string::npos) << log;
  EXPECT_NE(log.find("bytes copied out of the shadow"), std::string::npos) << log;
}

TEST(SyncScenarios, ControllerRestartBetweenUpdatesServesTheSamePlan) {
  auto s = StartOrDie(Options("restart"));
  ASSERT_NE(s, nullptr);
  ExpectCompleteAndVerified(*s, 1);
  StatusOr<nlohmann::json> before = s->client().GetStatus();
  ASSERT_TRUE(before.ok());
  s->StopController();
  ASSERT_TRUE(s->StartController().ok());
  StatusOr<nlohmann::json> after = s->client().GetStatus();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ((*after)["plan"]["plan_id"], (*before)["plan"]["plan_id"]);
  EXPECT_EQ((*after)["latest_complete_version"], 1);
  ExpectCompleteAndVerified(*s, 2);
}

TEST(SyncScenarios, SmallWatermarkRecyclesMemoryAndNeverExceedsIt) {
  // The ~1 GB demo model: each trainer rank writes ~134 MB per update
  // through a 100 MiB watermark (its largest source needs ~94 MiB), so
  // temporary memory must be recycled within the version.
  LocalSyncOptions o = Options("watermark");
  o.cluster = std::string(WSYNC_SOURCE_DIR) + "/examples/demo-moe-4x2/cluster.json";
  o.watermark = 100ull << 20;
  auto s = StartOrDie(o);
  ASSERT_NE(s, nullptr);
  uint64_t waits = 0;
  for (uint64_t v = 1; v <= 1; ++v) {
    StatusOr<UpdateReport> r = s->Update(v);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->state, "complete") << r->failure << "\n" << s->trainer_agent(0).LogTail(1500);
    ASSERT_TRUE(s->Verify(v, &*r).ok());
    ASSERT_EQ(r->trainer_stats.size(), 4u) << r->trainer_stats.dump();
    for (const auto& [rank, st] : r->trainer_stats.items()) {
      EXPECT_LE(st["peak_temp_bytes"].get<uint64_t>(), o.watermark) << "rank " << rank;
      EXPECT_EQ(st["watermark_bytes"].get<uint64_t>(), o.watermark);
      EXPECT_GT(st["written_bytes"].get<uint64_t>(), o.watermark) << "rank " << rank << " never had to recycle";
      waits += st["watermark_waits"].get<uint64_t>();
    }
  }
  // Whether a source had to block depends on write completion timing.
  std::fprintf(stderr, "sources that waited for memory: %llu\n", static_cast<unsigned long long>(waits));
}

// The planned exchange between real agent processes (controller
// --exchange, Gloo alltoallv), on a model whose stacked experts' FSDP shards
// (192 of 384 rows) cut an fp8 block: each block's writer receives the rows
// it lacks of every expert of its slice. Bit for bit, and the bytes the
// agents received are those the controller's plan says they receive.
TEST(SyncScenarios, ThePlannedExchangeOfStackedExpertsLandsBitForBit) {
  LocalSyncOptions o = Options("exchange");
  fs::create_directories(o.work_dir);
  std::ifstream in(std::string(WSYNC_SOURCE_DIR) + "/configs/models/small-moe.json");
  nlohmann::json model = nlohmann::json::parse(in);
  model["hidden_size"] = 384;
  model["_source"] = "configs/models/small-moe.json with hidden_size 384 (sync_scenarios_test)";
  std::ofstream(o.work_dir + "/model.json") << model.dump();
  std::ifstream cin(kCluster);
  nlohmann::json cluster = nlohmann::json::parse(cin);
  cluster["model"] = "model.json";
  cluster["mapping"] = std::string(WSYNC_SOURCE_DIR) + "/configs/mappings/qwen3_moe.json";
  o.cluster = o.work_dir + "/cluster.json";
  std::ofstream(o.cluster) << cluster.dump();
  o.exchange = true;
  auto s = StartOrDie(o);
  ASSERT_NE(s, nullptr);
  StatusOr<nlohmann::json> status = s->client().GetStatus();
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  const nlohmann::json plan = (*status)["plan"];
  ASSERT_EQ(plan.value("unshard", ""), "exchange") << plan.dump();
  const uint64_t planned = plan.value("exchange_bytes", uint64_t{0});
  EXPECT_GT(planned, 0u);
  // The case this test is for: a source whose exchanged rows span several
  // experts, where the pipeline used to gather the whole slice instead.
  int stacked = 0;
  for (const TrainerRank& rank : s->specs().trainer.ranks) {
    StatusOr<TrainerRankPlan> rp = ExtractTrainerRankPlan(s->table(), s->specs().trainer, s->specs().inference, rank.rank);
    ASSERT_TRUE(rp.ok()) << rp.status().ToString();
    for (const RankMeshGroup& g : rp->groups)
      for (const RankSource& src : g.sources) stacked += src.exchange() && src.gather_dim > 0 && src.held.size[0] > 1;
  }
  EXPECT_GT(stacked, 0);
  for (uint64_t v = 1; v <= 2; ++v) {
    ExpectCompleteAndVerified(*s, v);
    if (HasFailure()) return;
  }
  StatusOr<UpdateReport> r = s->Update(3);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->state, "complete") << r->failure;
  ASSERT_TRUE(s->Verify(3, &*r).ok());
  uint64_t received = 0;
  for (const auto& [rank, st] : r->trainer_stats.items()) received += st.value("exchanged_bytes", uint64_t{0});
  EXPECT_EQ(received, planned) << r->trainer_stats.dump();
}


// Delta versions (docs/DELTAS.md) through what breaks them: every version,
// delta or whole, is checked bit for bit against the reference; a receiver
// that registered again, a failed version and a restarted trainer each lead
// to whole writes where a delta would build on bytes nobody can vouch for,
// and the controller's record says which ranks took deltas against what.
TEST(SyncScenarios, DeltaVersionsLandBitForBitAndGoWholeWhereTheBaseIsUnknown) {
  LocalSyncOptions o = Options("delta");
  o.full_every = 4;
  o.drift = 30;  // about 3% of the bf16 weights change per version
  auto s = StartOrDie(o);
  ASSERT_NE(s, nullptr);
  const int32_t trainers = static_cast<int32_t>(s->specs().trainer.ranks.size());
  // One version, verified; the controller's delta decision and the bytes
  // the trainers put on the wire against the weights' whole bytes.
  struct Sent {
    std::vector<int32_t> delta_ranks;
    uint64_t base = 0, wire = 0, whole = 0, delta_writes = 0;
    std::map<int32_t, uint64_t> deltas_by_trainer;
    uint64_t received = 0, applied = 0;  // by the inference ranks' account
  };
  auto run = [&](uint64_t v) -> Sent {
    Sent out;
    ExpectCompleteAndVerified(*s, v);
    StatusOr<controller::VersionStatus> st = s->client().GetVersion(v);
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    if (!st.ok()) return out;
    out.delta_ranks = st->delta_ranks;
    out.base = st->delta_base;
    const nlohmann::json stats = st->raw.contains("trainer_stats") ? st->raw["trainer_stats"] : nlohmann::json::object();
    for (const auto& [rank, t] : stats.items()) {
      EXPECT_TRUE(t.is_object()) << "trainer rank " << rank << " reported no stats: " << st->raw.dump();
      if (!t.is_object()) continue;
      out.wire += t.value("written_bytes", uint64_t{0});
      out.whole += t.value("write_bytes", uint64_t{0});
      out.delta_writes += t.value("delta_writes", uint64_t{0});
      out.deltas_by_trainer[std::stoi(rank)] = t.value("delta_writes", uint64_t{0});
    }
    // Each receiver reports what it applied at commit, and in how long.
    const nlohmann::json got = st->raw.value("inference_stats", nlohmann::json::object());
    EXPECT_EQ(got.size(), 2u) << st->raw.dump();
    for (const auto& [rank, r] : got.items()) {
      out.received += r.value("wire_bytes", uint64_t{0});
      out.applied += r.value("delta_writes", uint64_t{0});
      EXPECT_GE(r.value("apply_seconds", -1.0), 0.0) << "inference rank " << rank << ": " << r.dump();
    }
    EXPECT_EQ(out.received, out.wire) << "the receivers' bytes off the wire are the trainers' bytes on it";
    EXPECT_EQ(out.applied, out.delta_writes) << "every delta sent was applied";
    std::printf("version %llu: delta ranks %zu (base %llu), %llu delta writes, %.2f of %.2f MiB on the wire (%.1f%%)\n",
                static_cast<unsigned long long>(v), out.delta_ranks.size(), static_cast<unsigned long long>(out.base),
                static_cast<unsigned long long>(out.delta_writes), out.wire / 1048576.0, out.whole / 1048576.0,
                out.whole ? 100.0 * out.wire / out.whole : 0.0);
    return out;
  };
  const std::vector<int32_t> both = {0, 1};

  Sent v1 = run(1);  // nothing complete yet: whole
  EXPECT_TRUE(v1.delta_ranks.empty());
  EXPECT_EQ(v1.delta_writes, 0u);
  EXPECT_EQ(v1.wire, v1.whole);
  Sent v2 = run(2);
  EXPECT_EQ(v2.delta_ranks, both);
  EXPECT_EQ(v2.base, 1u);
  EXPECT_GT(v2.delta_writes, 0u);
  EXPECT_LT(v2.wire * 4, v2.whole) << "a ~3% drift should send well under a quarter of the bytes";
  if (HasFailure()) return;

  // A receiver registered again holds nothing the controller can vouch
  // for: it gets the next version whole, the other rank a delta (the
  // trainers' executors, rebuilt for the new registration epoch, keep
  // their copies).
  s->KillInferenceAgent(1, SIGKILL);
  ASSERT_TRUE(s->StartInferenceAgent(1, /*attach=*/true).ok());
  ASSERT_TRUE(s->inference_agent(1).WaitForLine("ready", std::chrono::seconds(60)).ok());
  Sent v3 = run(3);
  EXPECT_EQ(v3.delta_ranks, std::vector<int32_t>{0});
  EXPECT_GT(v3.delta_writes, 0u);
  EXPECT_GT(v3.wire * 3, v3.whole) << "rank 1's half must go whole";
  Sent v4 = run(4);  // rank 1 took version 3 whole: both take deltas again
  EXPECT_EQ(v4.delta_ranks, both);
  EXPECT_EQ(v4.base, 3u);
  Sent v5 = run(5);  // --full-every 4: three deltas in a row, then whole
  EXPECT_TRUE(v5.delta_ranks.empty());
  EXPECT_EQ(v5.wire, v5.whole);
  Sent v6 = run(6);
  EXPECT_EQ(v6.delta_ranks, both);
  if (HasFailure()) return;

  // A failed version: some of its writes may have landed anywhere, so the
  // next one goes whole to everyone.
  s->KillInferenceAgent(1, SIGKILL);
  StatusOr<UpdateReport> r7 = s->Update(7);
  ASSERT_TRUE(r7.ok()) << r7.status().ToString();
  EXPECT_EQ(r7->state, "failed");
  ASSERT_TRUE(s->StartInferenceAgent(1, /*attach=*/true).ok());
  ASSERT_TRUE(s->inference_agent(1).WaitForLine("ready", std::chrono::seconds(60)).ok());
  Sent v8 = run(8);
  EXPECT_TRUE(v8.delta_ranks.empty());
  EXPECT_EQ(v8.wire, v8.whole);
  if (HasFailure()) return;

  // A restarted trainer remembers nothing it sent: whatever the controller
  // allows, its writes go whole; its peers' (rebuilt for the new epoch,
  // copies kept) go as deltas.
  s->KillTrainerAgent(0, SIGKILL);
  ASSERT_TRUE(s->StartTrainerAgent(0).ok());
  ASSERT_TRUE(s->trainer_agent(0).WaitForLine("ready", std::chrono::seconds(60)).ok());
  Sent v9 = run(9);
  EXPECT_EQ(v9.delta_ranks, both);
  EXPECT_EQ(v9.deltas_by_trainer[0], 0u);
  for (int32_t r = 1; r < trainers; ++r) EXPECT_GT(v9.deltas_by_trainer[r], 0u) << "trainer " << r;
  Sent v10 = run(10);
  for (int32_t r = 0; r < trainers; ++r)
    EXPECT_GT(v10.deltas_by_trainer[r], 0u) << "trainer " << r << " sent version 9 itself: its copies hold it";
}

// Where everything changes (drift 1: every element, every version), no
// delta fits its slot: the controller allows deltas, the trainers fall back
// to whole writes, and every byte is still right.
TEST(SyncScenarios, DeltasThatWouldNotFitTheirSlotsGoWhole) {
  LocalSyncOptions o = Options("deltafull");
  o.full_every = 10;
  o.drift = 1;
  auto s = StartOrDie(o);
  ASSERT_NE(s, nullptr);
  for (uint64_t v = 1; v <= 3; ++v) {
    ExpectCompleteAndVerified(*s, v);
    if (HasFailure()) return;
    StatusOr<controller::VersionStatus> st = s->client().GetVersion(v);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_EQ(st->delta_ranks.size(), v == 1 ? 0u : 2u);
    for (const auto& [rank, t] : st->raw["trainer_stats"].items()) {
      EXPECT_EQ(t.value("delta_writes", uint64_t{1}), 0u) << "trainer " << rank << ", version " << v;
      EXPECT_EQ(t.value("written_bytes", uint64_t{0}), t.value("write_bytes", uint64_t{1}));
      EXPECT_GT(t.value("delta_copy_bytes", uint64_t{0}), 0u);
    }
  }
}

// In shadow mode the deltas land in the shadow's inboxes and are applied to
// the shadow, which the commit copies out: the engine's weights only ever
// hold whole, verified versions.
TEST(SyncScenarios, DeltaVersionsInShadowModeLandBitForBit) {
  LocalSyncOptions o = Options("deltashadow");
  o.full_every = 10;
  o.drift = 30;
  o.extra_inference_args = {"--shadow"};
  auto s = StartOrDie(o);
  ASSERT_NE(s, nullptr);
  for (uint64_t v = 1; v <= 3; ++v) {
    ExpectCompleteAndVerified(*s, v);
    if (HasFailure()) return;
    for (int32_t rank = 0; rank < 2; ++rank) EXPECT_EQ(EngineVersion(*s, rank), v);
  }
  for (int32_t rank = 0; rank < 2; ++rank) {
    std::ifstream in(s->InferenceLog(rank));
    const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(std::regex_search(log, std::regex("version 3: [1-9][0-9]* deltas applied in ")))
        << "rank " << rank << " applied no delta:\n" << log;
  }
  if (HasFailure()) return;

  // A shadow rollback: version 4 fails, rank 0's engine keeps version 3
  // while its shadow may hold part of 4. Nobody can vouch for those bytes,
  // so version 5 goes whole to both ranks; version 6 is a delta again.
  s->KillInferenceAgent(1, SIGKILL);
  StatusOr<UpdateReport> r4 = s->Update(4);
  ASSERT_TRUE(r4.ok()) << r4.status().ToString();
  EXPECT_EQ(r4->state, "failed");
  EXPECT_EQ(EngineVersion(*s, 0), 3u);
  ASSERT_TRUE(s->StartInferenceAgent(1, /*attach=*/true).ok());
  ASSERT_TRUE(s->inference_agent(1).WaitForLine("ready", std::chrono::seconds(60)).ok());
  for (uint64_t v = 5; v <= 6; ++v) {
    ExpectCompleteAndVerified(*s, v);
    if (HasFailure()) return;
    StatusOr<controller::VersionStatus> st = s->client().GetVersion(v);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    const std::vector<int32_t> want = v == 5 ? std::vector<int32_t>() : std::vector<int32_t>({0, 1});
    EXPECT_EQ(st->delta_ranks, want) << st->raw.dump();
    for (int32_t rank = 0; rank < 2; ++rank) EXPECT_EQ(EngineVersion(*s, rank), v);
  }
}

}  // namespace
}  // namespace wsync::demo
