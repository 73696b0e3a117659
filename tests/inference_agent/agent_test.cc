// The inference agent against real libfabric and real processes: a writer
// process (a trainer stand-in driving the transport engine directly) writes
// known random bytes with imm = version into the agent's weight store per
// the rank's plan; an engine process reads them back through EngineView.
// What a user would notice: a version announced before its last write
// landed, a version with a missing write announced at all, or bytes that
// differ from what the trainer sent.
#include "inference_agent/agent.h"

#include <unistd.h>

#include <thread>

#include <gtest/gtest.h>

#include "common/checksum.h"
#include "inference_agent/descriptor_text.h"
#include "inference_agent/engine_view.h"
#include "tests/inference_agent/child_process.h"
#include "tests/inference_agent/test_roles.h"
#include "transport/libfabric/libfabric_engine.h"

namespace wsync::inference::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr uint64_t kSplit = 64 << 10;  // writes from 64 KiB up are split across NICs
constexpr uint64_t kSeed = 20261130;

struct Write {
  uint64_t offset, bytes;
};

// One inference rank: tensors in one "weights" region, and the writes that
// fill them (a tensor may take several, one write is large enough to be
// split across NICs, the last is small).
InferenceRank TestRank() {
  InferenceRank r;
  r.rank = 0;
  r.regions = {{"weights", 512 << 10, ""}};
  auto tensor = [](std::string name, Shape shape, DType dtype, uint64_t offset) {
    InferenceTensor t;
    t.name = std::move(name);
    t.shape = std::move(shape);
    t.dtype = dtype;
    t.where = {"weights", offset};
    return t;
  };
  r.tensors.push_back(tensor("model.embed_tokens.weight", {256, 128}, DType::kBF16, 0));
  r.tensors.push_back(tensor("model.layers.0.mlp.experts.w13_weight", {4, 128, 256}, DType::kBF16, 65536));
  InferenceTensor qkv = tensor("model.layers.0.self_attn.qkv_proj.weight", {384, 128}, DType::kFP8E4M3, 327680);
  qkv.scale = ScaleTensor{"model.layers.0.self_attn.qkv_proj.weight_scale_inv", {3, 1}, DType::kFP32,
                          {"weights", 376832}};
  r.tensors.push_back(qkv);
  r.tensors.push_back(tensor("model.norm.weight", {128}, DType::kBF16, 380928));
  return r;
}

const std::vector<Write> kWrites = {{0, 32768},     {32768, 32768}, {65536, 262144}, {327680, 16384},
                                    {344064, 16384}, {360448, 16384}, {376832, 12},   {380928, 256}};

// NAME:OFFSET:BYTES of every tensor, from the spec (for the engine process).
std::vector<std::string> TensorArgs() {
  return {"model.embed_tokens.weight:0:65536", "model.layers.0.mlp.experts.w13_weight:65536:262144",
          "model.layers.0.self_attn.qkv_proj.weight:327680:49152",
          "model.layers.0.self_attn.qkv_proj.weight_scale_inv:376832:12", "model.norm.weight:380928:256"};
}

std::string Indices(size_t first, size_t last) {
  std::string s;
  for (size_t i = first; i < last; ++i) {
    if (!s.empty()) s += ',';
    s += std::to_string(i);
  }
  return s;
}

struct Transport {
  std::string provider;
  uint32_t nics;
};
// For test names in ctest (no ';', a CMake list separator).
void PrintTo(const Transport& t, std::ostream* os) {
  std::string p = t.provider;
  for (char& c : p) if (c == ';') c = '+';
  *os << p << " x" << t.nics;
}

class InferenceAgentTest : public ::testing::TestWithParam<Transport> {
 protected:
  void SetUp() override {
    static int counter = 0;
    shm_name_ = "/wsync-test-infer-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    options_.provider = GetParam().provider;
    options_.num_nics = GetParam().nics;
    options_.split_threshold = kSplit;
    if (options_.provider.rfind("tcp", 0) == 0) options_.node = "127.0.0.1";
    // The writer first: fork before this process has engine threads.
    writer_ = std::make_unique<ChildProcess>(std::vector<std::string>{
        "writer", options_.provider, std::to_string(options_.num_nics), options_.node.empty() ? "-" : options_.node,
        std::to_string(kSplit)});
    ASSERT_EQ(writer_->ReadLine(), "ready");

    StatusOr<WeightStore> store = WeightStore::Create(shm_name_, TestRank());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto engine = transport::fabric::CreateLibfabricEngine(options_);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    InferenceAgentOptions agent_options;
    agent_options.log = [](const std::string& line) { fprintf(stderr, "agent: %s\n", line.c_str()); };
    agent_options.hold = hold_;
    auto agent = InferenceAgent::Create(std::move(engine).value(), std::move(store).value(), TestRank(),
                                        agent_options);
    ASSERT_TRUE(agent.ok()) << agent.status().ToString();
    agent_ = std::move(agent).value();

    InferenceRankPlan plan;
    plan.rank = 0;
    for (const Write& w : kWrites) {
      plan.writes.push_back({"weights", w.offset, w.bytes, "tensor at " + std::to_string(w.offset)});
      plan.bytes += w.bytes;
    }
    ASSERT_TRUE(agent_->SetPlan(plan).ok());

    ASSERT_EQ(agent_->rank().regions.size(), 1u);
    ASSERT_FALSE(agent_->rank().regions[0].descriptor.empty());
    ASSERT_TRUE(writer_->Send("desc " + agent_->rank().regions[0].descriptor));
    ASSERT_EQ(writer_->ReadLine(), "ok");
    std::string plan_line = "plan";
    for (const Write& w : kWrites) plan_line += " " + std::to_string(w.offset) + ":" + std::to_string(w.bytes);
    ASSERT_TRUE(writer_->Send(plan_line));
    ASSERT_EQ(writer_->ReadLine(), "ok");
  }

  void TearDown() override {
    writer_.reset();
    agent_.reset();
  }

  // Sends writes [first, last) of version v; "done" once posted and locally complete.
  std::string WriteVersion(uint64_t v, size_t first, size_t last) {
    if (!writer_->Send("write " + std::to_string(v) + " " + std::to_string(kSeed) + " " + Indices(first, last))) {
      return "writer gone";
    }
    return writer_->ReadLine();
  }

  // An engine process that waits for complete_version == v and checks every
  // tensor holds version v's bytes.
  std::string EngineReads(uint64_t v) {
    std::vector<std::string> args = {"engine", shm_name_, std::to_string(v), std::to_string(kSeed), "10000"};
    for (std::string& t : TensorArgs()) args.push_back(t);
    ChildProcess engine(args);
    return engine.ReadLine(seconds(20));
  }

  std::string Peek() {
    ChildProcess peek({"peek", shm_name_});
    return peek.ReadLine(seconds(10));
  }

  static std::string Words(uint64_t complete, uint64_t failed) {
    return "complete " + std::to_string(complete) + " failed " + std::to_string(failed);
  }

  bool hold_ = false;  // InferenceAgentOptions::hold
  transport::fabric::LibfabricOptions options_;
  std::string shm_name_;
  std::unique_ptr<ChildProcess> writer_;
  std::unique_ptr<InferenceAgent> agent_;
};

TEST_P(InferenceAgentTest, ArrivalsPerVersionCountSplitWrites) {
  // The 256 KiB write is split across NICs and each piece carries the imm.
  EXPECT_EQ(agent_->arrivals_per_version(), kWrites.size() - 1 + options_.num_nics);
}

TEST_P(InferenceAgentTest, VersionCompletesOnlyAfterItsLastWriteLanded) {
  ASSERT_TRUE(agent_->BeginVersion(1, Clock::now() + seconds(30)).ok());
  ASSERT_EQ(WriteVersion(1, 0, kWrites.size() - 1), "done");
  std::this_thread::sleep_for(milliseconds(400));
  EXPECT_EQ(Peek(), Words(kNoVersion, kNoVersion)) << "announced before the last write";
  EXPECT_FALSE(agent_->WaitVersion(1, milliseconds(0)).ok());

  ASSERT_EQ(WriteVersion(1, kWrites.size() - 1, kWrites.size()), "done");
  StatusOr<VersionOutcome> out = agent_->WaitVersion(1, seconds(10));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_TRUE(out->status.ok()) << out->status.ToString();
  EXPECT_EQ(out->expected, agent_->arrivals_per_version());
  EXPECT_EQ(EngineReads(1), "ok");

  // Version 2 lands entirely before the agent hears it started: arrivals
  // that came first still count.
  ASSERT_EQ(WriteVersion(2, 0, kWrites.size()), "done");
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(Peek(), Words(1, kNoVersion));
  ASSERT_TRUE(agent_->BeginVersion(2, Clock::now() + seconds(30)).ok());
  out = agent_->WaitVersion(2, seconds(10));
  ASSERT_TRUE(out.ok() && out->status.ok()) << (out.ok() ? out->status.ToString() : out.status().ToString());
  EXPECT_EQ(EngineReads(2), "ok");

  const std::vector<VersionOutcome> taken = agent_->TakeOutcomes(milliseconds(0));
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_EQ(taken[0].version, 1u);
  EXPECT_EQ(taken[1].version, 2u);
}

TEST_P(InferenceAgentTest, VersionWithAMissingWriteFailsAndIsNeverComplete) {
  ASSERT_TRUE(agent_->BeginVersion(1, Clock::now() + seconds(30)).ok());
  ASSERT_EQ(WriteVersion(1, 0, kWrites.size()), "done");
  ASSERT_TRUE(agent_->WaitVersion(1, seconds(10)).ok());
  ASSERT_EQ(EngineReads(1), "ok");

  // Version 2 loses its last write (the trainer died).
  ASSERT_TRUE(agent_->BeginVersion(2, Clock::now() + milliseconds(1500)).ok());
  ASSERT_EQ(WriteVersion(2, 0, kWrites.size() - 1), "done");
  StatusOr<VersionOutcome> out = agent_->WaitVersion(2, seconds(10));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->status.code(), StatusCode::kDeadlineExceeded) << out->status.ToString();
  const std::string seen = "saw " + std::to_string(agent_->arrivals_per_version() - 1) + " of " +
                           std::to_string(agent_->arrivals_per_version());
  EXPECT_NE(out->status.message().find(seen), std::string::npos) << out->status.ToString();
  EXPECT_NE(out->status.message().find("version 2"), std::string::npos) << out->status.ToString();
  EXPECT_EQ(Peek(), Words(1, 2));

  // Its missing write turning up late changes nothing.
  ASSERT_EQ(WriteVersion(2, kWrites.size() - 1, kWrites.size()), "done");
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(Peek(), Words(1, 2));

  // The next update succeeds.
  ASSERT_TRUE(agent_->BeginVersion(3, Clock::now() + seconds(30)).ok());
  ASSERT_EQ(WriteVersion(3, 0, kWrites.size()), "done");
  out = agent_->WaitVersion(3, seconds(10));
  ASSERT_TRUE(out.ok() && out->status.ok()) << (out.ok() ? out->status.ToString() : out.status().ToString());
  EXPECT_EQ(EngineReads(3), "ok");
  EXPECT_EQ(Peek(), Words(3, 2));
}

TEST_P(InferenceAgentTest, VersionFailedElsewhereIsNeverCompleteEvenIfItsWritesAllLand) {
  ASSERT_TRUE(agent_->BeginVersion(1, Clock::now() + seconds(30)).ok());
  ASSERT_EQ(WriteVersion(1, 0, kWrites.size()), "done");
  ASSERT_TRUE(agent_->WaitVersion(1, seconds(10)).ok());

  ASSERT_TRUE(agent_->BeginVersion(2, Clock::now() + seconds(30)).ok());
  ASSERT_EQ(WriteVersion(2, 0, kWrites.size() - 1), "done");
  EXPECT_TRUE(agent_->AbandonVersion(2, "trainer rank 3: killed"));
  EXPECT_FALSE(agent_->AbandonVersion(2, "again"));
  EXPECT_EQ(Peek(), Words(1, 2));  // the engine hears of the failure at once
  ASSERT_EQ(WriteVersion(2, kWrites.size() - 1, kWrites.size()), "done");
  StatusOr<VersionOutcome> out = agent_->WaitVersion(2, seconds(10));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_FALSE(out->status.ok());
  EXPECT_NE(out->status.message().find("trainer rank 3: killed"), std::string::npos) << out->status.ToString();
  EXPECT_EQ(Peek(), Words(1, 2));
}

TEST_P(InferenceAgentTest, ShutdownWithAVersionPendingMarksItFailedNotComplete) {
  StatusOr<EngineView> view = EngineView::Open(shm_name_);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  ASSERT_TRUE(agent_->BeginVersion(7, Clock::now() + seconds(30)).ok());
  ASSERT_EQ(WriteVersion(7, 0, 3), "done");
  agent_.reset();
  EXPECT_EQ(view->complete_version(), kNoVersion);
  EXPECT_EQ(view->failed_version(), 7u);
}

// An agent that holds landed versions until they are checked
// (InferenceAgentOptions::hold, what --verify-checksums runs).
class HoldingAgentTest : public InferenceAgentTest {
 protected:
  void SetUp() override {
    hold_ = true;
    InferenceAgentTest::SetUp();
  }

  // What a trainer would have hashed: writes [first, last) of version v's
  // pattern, from PatternByte (the writer's bytes), not from the agent's memory.
  static std::vector<WriteChecksum> Sent(uint64_t v, size_t first, size_t last) {
    std::vector<WriteChecksum> out;
    for (size_t i = first; i < last; ++i) {
      std::vector<uint8_t> bytes(kWrites[i].bytes);
      for (uint64_t b = 0; b < bytes.size(); ++b) bytes[b] = testing::PatternByte(kSeed, v, kWrites[i].offset + b);
      out.push_back({0, "weights", kWrites[i].offset, kWrites[i].bytes, Checksum64(bytes.data(), bytes.size())});
    }
    return out;
  }
};

// Every write lands, but the version is not complete until it is checked:
// the engine sees nothing; bytes that differ from what was sent fail it,
// naming the tensor, and it never becomes complete; the next version,
// checked clean, does.
TEST_P(HoldingAgentTest, ALandedVersionIsCompleteOnlyOnceItsChecksumsMatch) {
  ASSERT_TRUE(agent_->BeginVersion(1, Clock::now() + seconds(30)).ok());
  ASSERT_EQ(WriteVersion(1, 0, kWrites.size()), "done");
  StatusOr<VersionOutcome> out = agent_->WaitVersion(1, seconds(10));
  ASSERT_TRUE(out.ok() && out->status.ok()) << (out.ok() ? out->status.ToString() : out.status().ToString());
  EXPECT_TRUE(out->held);
  EXPECT_EQ(Peek(), Words(kNoVersion, kNoVersion)) << "complete before it was checked";

  // A stray write (or a corrupted transfer) changed one byte of the fp8 tensor.
  std::vector<WriteChecksum> sent = Sent(1, 0, kWrites.size());
  ASSERT_TRUE(agent_->Verify(1, sent).ok());
  StatusOr<EngineView> view = EngineView::Open(shm_name_, /*writable=*/true);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  const EngineTensor* qkv = view->Find("model.layers.0.self_attn.qkv_proj.weight");
  ASSERT_NE(qkv, nullptr);
  const_cast<uint8_t*>(qkv->data)[20000] ^= 0x40;
  Status s = agent_->Verify(1, sent);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find("tensor 'tensor at 344064'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("bytes [344064, 360448)"), std::string::npos) << s.message();
  agent_->Reject(1, s);
  EXPECT_EQ(Peek(), Words(kNoVersion, 1));
  const_cast<uint8_t*>(qkv->data)[20000] ^= 0x40;

  // A checksum missing, or one for bytes the plan does not write here.
  std::vector<WriteChecksum> fewer(sent.begin(), sent.end() - 1);
  s = agent_->Verify(1, fewer);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("no checksum from the trainers for tensor 'tensor at 380928'"), std::string::npos)
      << s.message();
  std::vector<WriteChecksum> more = sent;
  more.push_back({0, "weights", 384000, 8, 0});
  s = agent_->Verify(1, more);
  EXPECT_NE(s.message().find("which the plan does not write here"), std::string::npos) << s.message();

  ASSERT_TRUE(agent_->BeginVersion(2, Clock::now() + seconds(30)).ok());
  ASSERT_EQ(WriteVersion(2, 0, kWrites.size()), "done");
  out = agent_->WaitVersion(2, seconds(10));
  ASSERT_TRUE(out.ok() && out->held) << (out.ok() ? out->status.ToString() : out.status().ToString());
  s = agent_->Verify(2, Sent(2, 0, kWrites.size()));
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(agent_->Commit(2).ok());
  EXPECT_EQ(EngineReads(2), "ok");
}

INSTANTIATE_TEST_SUITE_P(Providers, HoldingAgentTest, ::testing::Values(Transport{"shm", 2}),
                         [](const ::testing::TestParamInfo<Transport>&) { return std::string("shm_2nic"); });

INSTANTIATE_TEST_SUITE_P(Providers, InferenceAgentTest,
                         ::testing::Values(Transport{"shm", 1}, Transport{"shm", 2}, Transport{"tcp;ofi_rxm", 2}),
                         [](const ::testing::TestParamInfo<Transport>& p) {
                           return (p.param.provider == "shm" ? std::string("shm") : std::string("tcp")) + "_" +
                                  std::to_string(p.param.nics) + "nic";
                         });

TEST(InferenceAgentSetupTest, PlanOfAnotherRankAndVersionBeforePlanAreRefused) {
  StatusOr<WeightStore> store = WeightStore::Create("/wsync-test-infer-setup-" + std::to_string(getpid()), TestRank());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  transport::fabric::LibfabricOptions options;
  auto engine = transport::fabric::CreateLibfabricEngine(options);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  auto agent = InferenceAgent::Create(std::move(engine).value(), std::move(store).value(), TestRank());
  ASSERT_TRUE(agent.ok()) << agent.status().ToString();
  EXPECT_EQ((*agent)->BeginVersion(1, Clock::now() + seconds(1)).code(), StatusCode::kFailedPrecondition);
  InferenceRankPlan other;
  other.rank = 3;
  Status s = (*agent)->SetPlan(other);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rank 3"), std::string::npos) << s.ToString();
}

TEST(InferenceAgentSetupTest, PlanWritingOutsideTheRegisteredRegionsIsRefused) {
  StatusOr<WeightStore> store = WeightStore::Create("/wsync-test-infer-scope-" + std::to_string(getpid()), TestRank());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto engine = transport::fabric::CreateLibfabricEngine(transport::fabric::LibfabricOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  auto agent = InferenceAgent::Create(std::move(engine).value(), std::move(store).value(), TestRank());
  ASSERT_TRUE(agent.ok()) << agent.status().ToString();
  const uint64_t size = TestRank().regions[0].size;

  InferenceRankPlan past_the_end;
  past_the_end.rank = 0;
  past_the_end.writes = {{"weights", 0, 4096, "a"}, {"weights", size - 100, 256, "model.norm.weight"}};
  Status s = (*agent)->SetPlan(past_the_end);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("region 'weights' (" + std::to_string(size) + " bytes) for tensor 'model.norm.weight'"),
            std::string::npos)
      << s.ToString();
  EXPECT_FALSE((*agent)->has_plan()) << "a refused plan must not arm the agent";

  InferenceRankPlan wraps;  // offset + bytes overflowing 64 bits must not pass as small
  wraps.rank = 0;
  wraps.writes = {{"weights", 64, ~uint64_t{0} - 10, "x"}};
  EXPECT_EQ((*agent)->SetPlan(wraps).code(), StatusCode::kOutOfRange);

  InferenceRankPlan unknown;
  unknown.rank = 0;
  unknown.writes = {{"somebody-elses", 0, 16, "y"}};
  s = (*agent)->SetPlan(unknown);
  EXPECT_NE(s.message().find("region 'somebody-elses', which this rank did not register"), std::string::npos)
      << s.ToString();

  InferenceRankPlan inside;
  inside.rank = 0;
  inside.writes = {{"weights", 0, size, "everything"}};
  EXPECT_TRUE((*agent)->SetPlan(inside).ok());
}

TEST(InferenceAgentSetupTest, EveryRegionIsRegisteredAndPublishedWithItsOwnDescriptor) {
  InferenceRank rank = TestRank();
  rank.regions.push_back({"scales", 8192, ""});
  rank.tensors[2].scale->where = {"scales", 0};
  StatusOr<WeightStore> store = WeightStore::Create("/wsync-test-infer-regions-" + std::to_string(getpid()), rank);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto engine = transport::fabric::CreateLibfabricEngine(transport::fabric::LibfabricOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  auto agent = InferenceAgent::Create(std::move(engine).value(), std::move(store).value(), rank);
  ASSERT_TRUE(agent.ok()) << agent.status().ToString();
  ASSERT_EQ((*agent)->rank().regions.size(), 2u);
  for (const MemoryRegion& r : (*agent)->rank().regions) {
    StatusOr<transport::MemoryDescriptor> d = DescriptorFromText(r.descriptor);
    ASSERT_TRUE(d.ok()) << r.id << ": " << d.status().ToString();
    EXPECT_EQ(d->length, r.size) << r.id;
  }
  EXPECT_NE((*agent)->rank().regions[0].descriptor, (*agent)->rank().regions[1].descriptor);
}

}  // namespace
}  // namespace wsync::inference::testing
